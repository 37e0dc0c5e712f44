# The student's initial weights (init: hf): its checkpoint at the pinned revision, snapshotted once
# into <storage_root>/models/<repo>-<hash>/ and verified; every training host initialises from there.
rule download_model:
    output:
        f"{STATE_DIR}/models/{{name}}/manifest.json",
    log:
        "logs/download_model/{name}.log",
    benchmark:
        "benchmarks/download_model/{name}.tsv"
    threads: job_resources("models").threads
    resources:
        mem_mb=job_resources("models").mem_mb,
    params:
        location=payload_location("models"),
        step=job_step("download_model"),
    script:
        "../src/trajsft/rules/download_model.py"


# Ray profiles (ray.fit_check, the default): the target's train step compiled for the profile's TPU
# slice here (libtpu, no TPU), while the data rules run. A step that does not fit fails this job in one
# line and the train rule never submits; without libtpu it says so and the run goes on (docs/fit.md).
rule check_fit:
    output:
        f"{STATE_DIR}/fit/{{target}}/preflight.json",
    log:
        "logs/check_fit/{target}.log",
    benchmark:
        "benchmarks/check_fit/{target}.tsv"
    threads: 1  # XLA's TPU compiler: ~3.3 GB peak RSS for Qwen3-8B on a v5p-32
    resources:
        mem_mb=6000,
    params:
        # rerun triggers: a new run (any hashed setting), another slice, another compiler
        run=artifact_name("checkpoints"),
        tpu_type=(config.get("ray") or {}).get("tpu_type"),
        versions=W.fit_versions,
        step=job_step("check_fit"),
    script:
        "../src/trajsft/rules/check_fit.py"


# The resumable Levanter checkpoint directory (<storage_root>/checkpoints/<target>-<hash>/)
# is deliberately NOT an output: Snakemake deletes outputs of failed jobs. Only the small
# `done` marker is; `params.run` (the content-addressed run name) re-triggers training
# when any hashed setting changes.
rule train:
    input:
        W.train_inputs,
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
    benchmark:
        "benchmarks/train/{target}.tsv"
    threads: job_resources("checkpoints").threads
    resources:
        **W.sweep_slots(),
        mem_mb=job_resources("checkpoints").mem_mb,
    params:
        run=artifact_name("checkpoints"),
        location=payload_location("checkpoints"),
        step=job_step("train"),
    script:
        "../src/trajsft/rules/train.py"


# A typo in the target (checkpoints/minimax/done, evals/minimax/done, agent/minimax/done): fail with the list of valid
# targets instead of Snakemake's MissingRuleException.
rule unknown_target:
    input:
        W.typo_target,
    output:
        "{marker}/{other}/done",
    log:
        "logs/unknown_target/{marker}/{other}.log",
    wildcard_constraints:
        marker="checkpoints|evals|agent",
        other=W.not_a_target(),
    localrule: True
    threads: 1
    resources:
        mem_mb=100,
    shell:
        "false"


ruleorder: train > unknown_target
ruleorder: eval_actions > unknown_target
ruleorder: eval_agent > unknown_target
