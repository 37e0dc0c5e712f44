# trajsft: SFT a student LLM on agent trajectories from several teacher models.
# Targets: checkpoints/<teacher-or-mixture>/done  (see README.md and docs/; `trajsft plan <target>`)
import os


configfile: os.path.join(workflow.basedir, "config", "config.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/export.smk"
include: "rules/report.smk"
include: "rules/eval.smk"
include: "rules/sweep.smk"
include: "rules/tasks.smk"


rule all:
    default_target: True
    input:
        done_targets(config["default_targets"]),
        REPORT_OUTPUTS,
        EVAL_OUTPUTS,
