"""Snakemake script for rule `check_fit`: thin wrapper, logic in trajsft.steps."""

from trajsft.steps import run_rule

run_rule(snakemake)  # noqa: F821 (injected by Snakemake)
