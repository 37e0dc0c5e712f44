"""The session guard of tests/checkout_guard.py fails a run whose tests change the checkout: a pytest run in a
scratch git checkout that holds a demo's done marker, with one test that writes or rewrites there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MARKER = {"hash": "4a31a8c394", "checkpoint_dir": "results/checkpoints/demo-4a31a8c394"}


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "clone"
    root.mkdir()
    (root / ".gitignore").write_text("results/\ncheckpoints/\nevals/\n__pycache__/\n.pytest_cache/\n")
    (root / "conftest.py").write_text('pytest_plugins = ["checkout_guard"]\n')
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    _commit(root)
    (root / "checkpoints/demo").mkdir(parents=True)
    (root / "checkpoints/demo/done").write_text(json.dumps(MARKER))  # the demo ran in this checkout
    return root


def _commit(root: Path) -> None:
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c"], cwd=root, check=True)


def _pytest(root: Path, body: str) -> subprocess.CompletedProcess:
    """One test file of ``body``, committed, run by pytest in ``root`` with the guard."""
    (root / "test_it.py").write_text("from pathlib import Path\n\n\ndef test_it(tmp_path):\n    " + body + "\n")
    _commit(root)
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "test_it.py"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_a_test_writing_only_its_own_temp_dir_passes(checkout):
    p = _pytest(checkout, "(tmp_path / 'results').mkdir(); Path('checkpoints/demo/done').read_text()")
    assert p.returncode == 0 and "1 passed" in p.stdout and "changed the checkout" not in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("body,said", [
    ("Path('results/fit').mkdir(parents=True); Path('results/fit/x.json').write_text('{}')", "results/fit/x.json: new"),
    ("Path('checkpoints/demo/done').write_text('{}')", "checkpoints/demo/done: changed"),
    ("Path('dag.png').write_bytes(b'')", "dag.png: new"),
], ids=["ignored-output", "demo-marker", "untracked"])
def test_a_test_writing_into_the_checkout_fails_the_session_naming_the_path(checkout, body, said):
    p = _pytest(checkout, body)
    assert p.returncode == 1 and "1 passed" in p.stdout, p.stdout + p.stderr
    assert "the tests changed the checkout" in p.stdout and f"  {said}" in p.stdout, p.stdout
