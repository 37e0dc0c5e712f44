# Sweeps (config `sweeps:`, trajsft.plan.sweeps): every cell is a target; sweeps/<name>/done trains them all
# and compares them (trajsft.report.sweeps): results.csv/.md, the loss curves, the final metric per setting.
#
# Needs from rules/common.smk: W.


rule sweep:
    input:
        W.sweep_inputs,
    output:
        **W.sweep_outputs("{sweep}"),
    log:
        "logs/sweep/{sweep}.log",
    localrule: True
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../src/trajsft/rules/sweep.py"
