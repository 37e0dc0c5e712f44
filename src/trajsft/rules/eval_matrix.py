"""Rule ``eval_matrix`` (rules/eval.smk): every evaluated run's held-out loss on every teacher's validation split
-> the matrix files (its outputs; no artifact). It reads each row's run: a run deleted by hand is one line."""

from trajsft import rule_job
from trajsft.plan import step_configs
from trajsft.report.matrix import eval_matrix


def run(job, snakemake) -> dict:
    return eval_matrix(step_configs.eval_matrix(job.plan), dict(snakemake.output.items()))


ENTRY = rule_job.Entry(run, user_errors=(FileNotFoundError,))

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
