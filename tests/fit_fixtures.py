"""The demo's step compiled for a v5p-8 by the real TPU compiler, once per test session.

``demo_fit`` is the first compile of that setting in the session, whichever test asks for it first:
tests/test_fit.py checks the compile itself (``cached`` is False) and the cache, tests/test_tpu_profile.py
reads the cached result through the CLI (remat full; ``demo_fit_auto``'s other policies are test_fit's alone).
Both ask for the fixture, so neither depends on the other running first; the compile lands in the session's fit
cache (``TRAJSFT_FIT_CACHE``, set in conftest.py).
``oversized_fit`` is the same for the student no v5p-8 holds: test_fit checks the CLI's refusal, and
test_tpu_profile's check_fit rule then reads that compile from the cache instead of compiling it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OVERSIZED = REPO / "tests" / "data" / "fit_oversized.yaml"  # a student no v5p-8 holds
ALIGNED = REPO / "tests" / "data" / "fit_aligned.yaml"  # the demo student made tile-aligned: it fits


def fit_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", "fit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=1200)


@pytest.fixture(scope="session")
def demo_fit(tmp_path_factory):
    """(cwd, the CLI's JSON summary, wall seconds) of ``trajsft fit demo --tpu-type v5p-8`` on ALIGNED."""
    cwd = tmp_path_factory.mktemp("fit")
    t0 = time.time()
    p = fit_cli("demo", "--tpu-type", "v5p-8", "--json", "--configfile", str(ALIGNED), cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    [s] = json.loads(p.stdout)
    return cwd, s, time.time() - t0


@pytest.fixture(scope="session")
def demo_fit_auto(demo_fit, tmp_path_factory):
    """``trajsft fit demo --tpu-type v5p-8 --remat auto`` on ALIGNED, after ``demo_fit`` (its full-remat compile is
    read from the session's fit cache; the two other policies are compiled): the CLI's JSON summary."""
    p = fit_cli("demo", "--tpu-type", "v5p-8", "--remat", "auto", "--json", "--configfile", str(ALIGNED),
                cwd=tmp_path_factory.mktemp("fit-auto"))
    assert p.returncode == 0, p.stderr[-3000:]
    [s] = json.loads(p.stdout)
    return s


@pytest.fixture(scope="session")
def oversized_fit(tmp_path_factory) -> subprocess.CompletedProcess:
    """``trajsft fit demo --tpu-type v5p-8`` on OVERSIZED: the CLI's refusal (exit 1, the line, the JSON)."""
    return fit_cli("demo", "--tpu-type", "v5p-8", "--json", "--configfile", str(OVERSIZED),
                   cwd=tmp_path_factory.mktemp("fit-oversized"))
