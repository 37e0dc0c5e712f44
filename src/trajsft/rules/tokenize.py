"""Rule ``tokenize`` (rules/data.smk): a shard set rendered with the template and the teacher's tools -> a
``tokenized`` artifact (Levanter's chat cache, in packing order)."""

from trajsft import rule_job
from trajsft.data.tokenize import tokenize
from trajsft.plan import step_configs


def run(job, snakemake) -> dict:
    return rule_job.build(job, step_configs.tokenize(job.plan, job.name), tokenize)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
