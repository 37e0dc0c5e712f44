"""Rule ``make_tasks`` (rules/tasks.smk): a task set's crates -> the bug mutations that pass their controls
(``tasks/<name>-<hash>``: instances.jsonl, controls.json, repos/)."""

from trajsft import rule_job
from trajsft.plan import step_configs
from trajsft.tasks.taskset import make_tasks


def run(job, snakemake) -> dict:
    return rule_job.build(job, step_configs.make_tasks(job.plan, job.name), make_tasks)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
