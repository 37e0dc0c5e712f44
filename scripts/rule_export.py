"""Snakemake script for rule `export`: thin wrapper, logic in trajsft.export_data."""

from trajsft.export_data import run_rule

run_rule(snakemake)  # noqa: F821 (injected by Snakemake)
