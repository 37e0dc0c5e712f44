"""Nothing a test does lands in the checkout, and what a user's runs left there is theirs.

The README's two commands run in one checkout: the demo (``checkpoints/demo/done``, ``evals/``, ``results/``), then
the tests. A test that writes into the checkout, or reads it and finds a user's outputs, breaks that order; so the
session compares the checkout before and after (in the controller under xdist): every file ``git status`` shows
(untracked or modified) and every file under the users' output directories (:data:`USER_OUTPUTS`, ignored by git).
A difference fails the session, naming the paths. ``.ci/run`` runs the demo first, so CI's tests see a demo's
outputs in their checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

USER_OUTPUTS = ("checkpoints", "evals", "agent", "results", "sweeps")


def checkout_state(root: Path) -> dict[str, tuple]:
    """Path -> (git status code or None, size, mtime) of the files git shows and of the users' outputs."""
    state: dict[str, tuple] = {}
    p = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--no-renames"], cwd=root,
                       capture_output=True, text=True)
    shown = p.stdout.splitlines() if p.returncode == 0 else []  # not a git checkout: the outputs only
    for line in shown:
        path = root / line[3:]
        st = path.stat() if path.is_file() else None
        state[line[3:]] = (line[:2], st and st.st_size, st and st.st_mtime_ns)
    for top in USER_OUTPUTS:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                state.setdefault(path.relative_to(root).as_posix(), (None, st.st_size, st.st_mtime_ns))
    return state


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """One line per path that appeared, went or changed."""
    return [f"{k}: {'new' if k not in before else 'gone' if k not in after else 'changed'}"
            for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)]


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        session.config._checkout_before = checkout_state(Path(session.config.rootpath))


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_checkout_before", None)
    if before is None:
        return
    found = changes(before, checkout_state(Path(session.config.rootpath)))
    if found:
        more = f"\n  ... and {len(found) - 30} more" if len(found) > 30 else ""
        session.config.get_terminal_writer().line(
            f"\nthe tests changed the checkout {session.config.rootpath} (give the test that writes or reads there a "
            "working directory of its own):\n" + "\n".join(f"  {c}" for c in found[:30]) + more, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
