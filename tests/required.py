"""Tests that need something of the machine (Chromium, `mount -t tmpfs` as root): skipped where it is missing, unless
the variable that requires it is "1" (``.ci/run`` sets them where it runs as root), where a missing tool is a failure.
``tests/test_required.py`` shows both."""

from __future__ import annotations

import os

import pytest


def required(var: str) -> bool:
    return os.environ.get(var) == "1"


def skip_unless(available: bool, var: str, reason: str) -> pytest.MarkDecorator:
    """A marker: skip when not ``available`` and ``var`` does not require it; when required, the test runs (and
    meets the missing tool itself)."""
    return pytest.mark.skipif(not available and not required(var), reason=f"{reason} (set {var}=1 to require it)")


def skip_or_fail(var: str, reason: str) -> None:
    """Inside a test that found its tool missing: skip, or fail when ``var`` requires it."""
    if required(var):
        pytest.fail(f"{var}=1 requires it: {reason}", pytrace=False)
    pytest.skip(f"{reason} (set {var}=1 to require it)")
