"""Rule ``report_curves`` (rules/report.smk): its entry reads the job's inputs and params (no step)."""

from trajsft import rule_job
from trajsft.report.curves import rule_curves

if __name__ == "__main__":
    rule_job.run_report(snakemake, rule_curves)  # noqa: F821 (injected by Snakemake)
