"""Rule ``report_card`` (rules/report.smk): its entry reads the job's inputs and params (no step)."""

from trajsft import rule_job
from trajsft.report.build import rule_card

if __name__ == "__main__":
    rule_job.run_report(snakemake, rule_card)  # noqa: F821 (injected by Snakemake)
