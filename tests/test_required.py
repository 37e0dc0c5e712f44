"""tests/required.py: a test whose tool is missing is skipped, and fails when the variable requires it (how
.ci/run, as root, makes the Chromium and tmpfs tests mandatory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

PROBE = '''
import required

@required.skip_unless(False, "TRAJSFT_REQUIRE_PROBE", "the probe tool is missing")
def test_marked():
    raise RuntimeError("the probe tool is missing")

def test_inside():
    required.skip_or_fail("TRAJSFT_REQUIRE_PROBE", "the probe tool is missing")
'''


def _pytest(tmp_path: Path, require: str | None) -> str:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRAJSFT_REQUIRE_PROBE"}
    if require is not None:
        env["TRAJSFT_REQUIRE_PROBE"] = require
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    return p.stdout + p.stderr


def test_a_missing_tool_skips_unless_required(tmp_path):
    out = _pytest(tmp_path, None)
    assert "2 skipped" in out and "failed" not in out, out
    assert "set TRAJSFT_REQUIRE_PROBE=1 to require it" in out
    out = _pytest(tmp_path, "0")
    assert "2 skipped" in out, out


def test_a_missing_tool_fails_when_required(tmp_path):
    out = _pytest(tmp_path, "1")
    assert "2 failed" in out, out
    assert "the probe tool is missing" in out and "TRAJSFT_REQUIRE_PROBE=1 requires it" in out, out
