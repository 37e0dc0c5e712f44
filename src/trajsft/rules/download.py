"""Rule ``download`` (rules/data.smk): a teacher's rows at the pinned revision -> a ``raw`` artifact."""

from trajsft import rule_job
from trajsft.data.download import download
from trajsft.plan import step_configs


def run(job, snakemake) -> dict:
    return rule_job.build(job, step_configs.download(job.plan, job.name), download)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
