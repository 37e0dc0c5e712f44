"""Rule ``sweep`` (rules/sweep.smk): its entry reads the job's inputs and params (no step)."""

from trajsft import rule_job
from trajsft.report.sweeps import rule_sweep

if __name__ == "__main__":
    rule_job.run_report(snakemake, rule_sweep)  # noqa: F821 (injected by Snakemake)
