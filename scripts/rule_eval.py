"""Snakemake script for rule `eval_matrix`: thin wrapper, logic in trajsft.report.matrix."""

from trajsft.report.matrix import rule_eval

rule_eval(snakemake)  # noqa: F821 (injected by Snakemake)
