# Export a target's validated shards for other trainers (trajsft.data.export): a LLaMA-Factory
# sharegpt dataset (dataset_info.json + jsonl) and a TRL / HF datasets `messages` jsonl.
# The payload is content-addressed (<storage_root>/exports/<target>-<hash>/, Plan._export); the
# local manifest is per target, and `params.name` reruns the rule when that hash changes.


rule export:
    input:
        artifact_inputs("exports"),
    output:
        f"{STATE_DIR}/exports/{{target}}/manifest.json",
    log:
        "logs/export/{target}.log",
    benchmark:
        "benchmarks/export/{target}.tsv"
    threads: job_resources("exports").threads
    resources:
        mem_mb=job_resources("exports").mem_mb,
    params:
        name=artifact_name("exports"),
        location=payload_location("exports"),
        step=job_step("export"),
    script:
        "../src/trajsft/rules/export.py"
