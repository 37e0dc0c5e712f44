"""Rule ``report_table`` (rules/report.smk): its entry reads the job's inputs and params (no step)."""

from trajsft import rule_job
from trajsft.report.build import rule_table

if __name__ == "__main__":
    rule_job.run_report(snakemake, rule_table)  # noqa: F821 (injected by Snakemake)
