# The resumable Levanter checkpoint directory (<storage_root>/checkpoints/<target>-<hash>/)
# is deliberately NOT an output: Snakemake deletes outputs of failed jobs. Only the small
# `done` marker is; `params.run` (the content-addressed run name) re-triggers training
# when any hashed setting changes.
rule train:
    input:
        tokenized_manifests,
    output:
        report(
            "checkpoints/{target}/done",
            caption="../report/done.rst",
            category="Checkpoints",
            subcategory="{target}",
            labels={"target": "{target}", "file": "done"},
        ),
    log:
        "logs/train/{target}.log",
    conda:
        "../envs/trajsft.yaml"
    params:
        run=run_name,
    script:
        "../scripts/rule_train.py"
