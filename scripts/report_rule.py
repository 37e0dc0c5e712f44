"""Snakemake script for the report rules (rules/report.smk): thin wrapper, logic in trajsft.report.build/curves."""

import sys

from trajsft.report import build, curves
from trajsft import logs

sm = snakemake  # noqa: F821 (injected by Snakemake)
logs.setup(sm.log[0] if sm.log else None, sm.config.get("log_level", "INFO"))
entry = {
    "report_card": build.rule_card,
    "report_table": build.rule_table,
    "report_curves": curves.rule_curves,
}.get(sm.rule)
if entry is None:
    sys.exit(f"scripts/report_rule.py: no entry point for rule {sm.rule!r}")
entry(sm)
