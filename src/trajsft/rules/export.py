"""Rule ``export`` (rules/export.smk): a target's training data as other trainers read it -> an ``exports``
artifact; every row the sharegpt export could not hold is listed next to its manifest."""

import logging
from pathlib import Path

from trajsft import io, rule_job
from trajsft.data.export import export
from trajsft.plan import step_configs

log = logging.getLogger("trajsft")


def run(job, snakemake) -> dict:
    result = rule_job.build(job, step_configs.export(job.plan, job.name), export)
    io.write_bytes(str(Path(snakemake.output[0]).parent / "skipped.jsonl"),
                   io.read_bytes(f"{job.artifact.location}/llamafactory/skipped.jsonl"))
    log.info("export %s: %d llamafactory skip(s): %s", job.name, result["llamafactory"]["skipped_total"],
             [s["reason"] for s in result["llamafactory"]["skipped_examples"]])
    return result


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
