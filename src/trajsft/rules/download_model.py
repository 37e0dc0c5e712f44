"""Rule ``download_model`` (rules/train.smk): the student's checkpoint at its pinned revision -> a ``models``
snapshot every training host initialises from."""

from trajsft import rule_job
from trajsft.plan import step_configs
from trajsft.train.model_snapshot import download_model


def run(job, snakemake) -> dict:
    return rule_job.build(job, step_configs.download_model(job.plan, job.name), download_model)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
