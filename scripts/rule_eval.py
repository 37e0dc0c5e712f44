"""Snakemake script for rule `eval_matrix`: thin wrapper, logic in trajsft.eval_matrix."""

from trajsft.eval_matrix import rule_eval

rule_eval(snakemake)  # noqa: F821 (injected by Snakemake)
