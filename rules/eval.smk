# The cross-teacher matrix (opt-in: config `eval:`): held-out loss of every trained target on every
# teacher's held-out split. Logic in trajsft.report.matrix (Levanter's own evaluator).
#
# Needs from rules/common.smk: PLAN, STATE_DIR, eval_matrix_inputs. For `rule all`: EVAL_OUTPUTS.

from trajsft.report import matrix as eval_matrix

# the matrix outputs when the config has an `eval:` section, else nothing
EVAL_OUTPUTS = (
    list(eval_matrix.outputs(STATE_DIR).values())
    if config.get("eval") is not None
    else []
)


rule eval_matrix:
    input:
        unpack(eval_matrix_inputs),
    output:
        json=report(
            f"{STATE_DIR}/eval/matrix.json",
            caption="../report/eval_json.rst",
            category="Cross-teacher matrix",
            labels={"file": "matrix.json"},
        ),
        png=report(
            f"{STATE_DIR}/eval/matrix.png",
            caption="../report/eval.rst",
            category="Cross-teacher matrix",
            labels={"file": "matrix.png"},
        ),
        html=report(
            f"{STATE_DIR}/eval/matrix.html",
            caption="../report/eval_table.rst",
            category="Cross-teacher matrix",
            labels={"file": "matrix.html"},
        ),
    log:
        "logs/eval/matrix.log",
    benchmark:
        "benchmarks/eval/matrix.tsv"
    threads: 2
    resources:
        mem_mb=16000,  # runs here (not on the cluster): a Qwen3-8B row needs ~40 GB
    params:
        # rows' runs, columns, the tokenized artifact of every cell, options: a change reruns it
        spec=lambda w: eval_matrix.matrix_spec(step_configs.eval_matrix(PLAN)),
        step=job_step("eval_matrix"),
    script:
        "../scripts/rule.py"
