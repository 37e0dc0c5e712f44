"""Rule ``report_agent`` (rules/report.smk): its entry reads the job's inputs and params (no step)."""

from trajsft import rule_job
from trajsft.agent.report import rule_agent

if __name__ == "__main__":
    rule_job.run_report(snakemake, rule_agent)  # noqa: F821 (injected by Snakemake)
