"""Snakemake script for rule `train`: thin wrapper, logic in trajsft.steps."""

from trajsft.steps import run_rule

run_rule("train", snakemake)  # noqa: F821 (injected by Snakemake)
