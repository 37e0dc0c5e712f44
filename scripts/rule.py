"""The script of every rule (rules/*.smk): the job's code is trajsft.rule_job.run_rule, which runs the job's step."""

from trajsft.rule_job import run_rule

run_rule(snakemake)  # noqa: F821 (injected by Snakemake)
