# The resumable Levanter checkpoint directory (<storage_root>/checkpoints/<target>-<hash>/)
# is deliberately NOT an output: Snakemake deletes outputs of failed jobs. Only the small
# `done` marker is; `params.run` (the content-addressed run name) re-triggers training
# when any hashed setting changes.
rule train:
    input:
        tokenized_manifests,
    output:
        "checkpoints/{target}/done",
    params:
        run=run_name,
    conda:
        "../envs/trajsft.yaml"
    log:
        "logs/train/{target}.log",
    script:
        "../scripts/rule_train.py"
