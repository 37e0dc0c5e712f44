"""Rule ``eval_actions`` (rules/eval.smk): a target's trained student scored on the held-out chats -> ``evals``
(``evals/<target>/done``): generation here, or, on a Ray profile, one Ray job on a single-host slice that this job
submits and follows."""

from trajsft import rule_job, storage
from trajsft.plan import step_configs
from trajsft.report.actions import eval_actions


def run(job, snakemake) -> dict:
    cfg = step_configs.eval_actions(job.plan, job.name)
    if job.plan.cfg.get("executor") == "ray":
        from trajsft.report.actions_job import submit

        return storage.build(job.plan, job.artifact, lambda: submit(cfg, snakemake.log[0]))
    return rule_job.build(job, cfg, eval_actions)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
