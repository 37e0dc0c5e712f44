"""Snakemake script for rule `export`: thin wrapper, logic in trajsft.data.export."""

from trajsft.data.export import run_rule

run_rule(snakemake)  # noqa: F821 (injected by Snakemake)
