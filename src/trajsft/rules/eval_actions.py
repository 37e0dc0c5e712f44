"""Rule ``eval_actions`` (rules/eval.smk): a target's trained student scored on the held-out chats -> ``evals``
(``evals/<target>/done``): generation here, or, on a Ray profile, one Ray job on a single-host slice that this job
submits and follows (the config's executor, trajsft.executor)."""

from trajsft import rule_job, storage
from trajsft.executor import executor_for
from trajsft.plan import step_configs
from trajsft.report import actions_job
from trajsft.report.actions import eval_actions


def run(job, snakemake) -> dict:
    cfg = step_configs.eval_actions(job.plan, job.name)
    work = executor_for(job.plan.cfg).on_eval_host(cfg, snakemake.log[0], eval_actions, actions_job.submit)
    return storage.build(job.plan, job.artifact, work)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
