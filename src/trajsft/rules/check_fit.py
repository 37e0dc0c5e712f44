"""Rule ``check_fit`` (rules/train.smk, Ray profiles): the target's train step compiled for its TPU slice here
(libtpu, no TPU) -> the fit summary (its output; no artifact)."""

from trajsft import rule_job
from trajsft.cluster.check_fit import check_fit
from trajsft.io import write_json
from trajsft.plan import step_configs


def run(job, snakemake) -> dict:
    result = check_fit(step_configs.train(job.plan, job.name))
    write_json(snakemake.output[0], result)
    return result


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
