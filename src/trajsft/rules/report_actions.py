"""Rule ``report_actions`` (rules/report.smk): its entry reads the job's inputs and params (no step)."""

from trajsft import rule_job
from trajsft.report.actions import rule_actions

if __name__ == "__main__":
    rule_job.run_report(snakemake, rule_actions)  # noqa: F821 (injected by Snakemake)
