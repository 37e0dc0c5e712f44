# Export a target's validated shards for other trainers (trajsft.data.export): a LLaMA-Factory
# sharegpt dataset (dataset_info.json + jsonl) and a TRL / HF datasets `messages` jsonl.
# The payload is content-addressed (<storage_root>/exports/<target>-<hash>/, Plan._export); the
# local manifest is per target, and `params.name` reruns the rule when that hash changes.


rule export:
    input:
        export_inputs,
    output:
        f"{STATE_DIR}/exports/{{target}}/manifest.json",
    log:
        "logs/export/{target}.log",
    benchmark:
        "benchmarks/export/{target}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
    params:
        name=lambda wildcards: PLAN.target(wildcards.target)["export"].name,
        location=lambda wildcards: PLAN.target(wildcards.target)["export"].location,
        step=job_step("export"),
    script:
        "../scripts/rule.py"
