"""The grader: a patch (a git diff) applied to a fresh copy of the task's repository with the bug in it, the task's
test command run in a sandbox, its log read, and the task resolved iff every FAIL_TO_PASS test passes and every
PASS_TO_PASS test still passes (SWE-smith's rule). A patch that does not apply, or tests killed at their limit,
leave the task unresolved with the reason kept."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ..errors import DataError, one_line
from . import docker
from .record import Task
from .sandbox import Limits, for_task

# cargo test's verdict lines (SWE-smith's Rust log parser reads the same): `test tests::name ... ok`
_VERDICT = re.compile(r"^test (.+?) \.\.\. (ok|FAILED|ignored)\b", re.M)  # a doctest: `src/lib.rs - f (line 3)`
_STATUS = {"ok": "passed", "FAILED": "failed", "ignored": "ignored"}
# safe.directory: an episode's copy belongs to the sandbox's user (nobody) when we read its diff
_GIT = ["git", "-c", "user.name=trajsft", "-c", "user.email=trajsft@localhost", "-c", "commit.gpgsign=false",
        "-c", "safe.directory=*"]


def parse_test_log(text: str) -> dict[str, str]:
    """Test name -> passed | failed | ignored, from a cargo test log (a name seen twice keeps its last verdict)."""
    return {name: _STATUS[verdict] for name, verdict in _VERDICT.findall(text)}


def git(cwd: Path, *args: str, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """git in ``cwd``, a repository of its own (never the one above it), with an identity to commit as."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CEILING_DIRECTORIES": str(cwd.parent),
           "HOME": str(cwd.parent)}
    return subprocess.run([*_GIT, *args], cwd=cwd, input=input, capture_output=True, text=True, env=env)


def checkout(src: Path, dest: Path, patch: str = "", build_output: bool = False) -> Optional[str]:
    """A git repository at ``dest`` holding a copy of ``src`` with ``patch`` applied and committed, so that its ``git
    diff`` is what changed since; None, or why ``patch`` does not apply. Cargo's build output (``target/``) is left out,
    or with ``build_output`` copied as it is (``cp -a``: its and the sources' times kept, so cargo rebuilds only what
    the patch changed); it is never part of the history or of a diff."""
    if build_output:
        dest.mkdir(parents=True)
        copied = subprocess.run(["cp", "-a", "--reflink=auto", f"{src}/.", str(dest)], capture_output=True, text=True)
        if copied.returncode != 0:
            raise OSError(f"copy of {src}: {one_line(copied.stderr, 200)}")
        shutil.rmtree(dest / ".git", ignore_errors=True)
    else:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("target", ".git"))
    git(dest, "init", "-q")
    (dest / ".git/info/exclude").write_text("target/\n")  # cargo's build output is never part of a submission
    why = apply(patch, dest)
    if why is None:
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "-m", "start")
    return why


def source(task: Task, repos: Path) -> Path:
    """Where ``task``'s repository is read from: its image's ``/testbed`` (copied out once per image) when it names
    one, else ``repos / task.repo``."""
    if task.image_name:
        try:
            return docker.repository(task.image_name)
        except OSError as e:
            raise DataError(f"{task.instance_id}: {one_line(e, 300)}") from None
    return repos / task.repo


def prepare(task: Task, repos: Path, dest: Path) -> Path:
    """A fresh copy of ``task``'s repository (:func:`source`) at ``dest`` with the bug applied and committed: a git
    repository whose ``git diff`` is what was changed since (an agent's submission). An image's repository comes with
    the build output the image was made with (SWE-smith's images ran the tests when made)."""
    src = source(task, repos)
    if not src.is_dir():
        raise DataError(f"{task.instance_id}: repository {src} does not exist")
    try:
        why = checkout(src, dest, task.patch, build_output=task.image_name is not None)
    except OSError as e:  # a full disk: the copy of a large target/
        raise DataError(f"{task.instance_id}: {one_line(e, 300)}") from None
    if why is not None:
        raise DataError(f"{task.instance_id}: its bug patch does not apply to {src}: {why}")
    return dest


def apply(patch: str, repo: Path) -> Optional[str]:
    """Apply ``patch`` (a git diff; empty: nothing) in ``repo``; None, or why it does not apply."""
    if not patch.strip():
        return None
    done = git(repo, "apply", "--whitespace=nowarn", "-", input=patch if patch.endswith("\n") else patch + "\n")
    return None if done.returncode == 0 else (one_line(done.stderr, 300) or f"git apply exited {done.returncode}")


def submission(repo: Path) -> str:
    """What an agent changed in its copy since it started (every file, new ones too, build output aside): the diff
    graded as its submission, however its episode ended."""
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached").stdout


def gold_patch(task: Task, repos: Path) -> str:
    """The gold fix: the bug patch reversed, as the diff a fix would submit."""
    with tempfile.TemporaryDirectory(prefix="trajsft-gold-") as tmp:
        repo = prepare(task, repos, Path(tmp) / "repo")
        undone = git(repo, "apply", "-R", "--whitespace=nowarn", "-", input=task.patch)
        if undone.returncode != 0:
            raise DataError(f"{task.instance_id}: its bug patch does not reverse: {one_line(undone.stderr, 200)}")
        return git(repo, "diff").stdout


@dataclass
class Graded:
    """One task's row: was the patch applied, what the tests said, and whether the task is resolved."""

    instance_id: str
    resolved: bool
    applied: bool
    reason: Optional[str] = None  # why not resolved, when it is not the tests' verdict alone
    passed: int = 0
    failed: int = 0
    seconds: float = 0.0
    tests: dict = field(default_factory=dict)  # name -> passed | failed | ignored
    fail_to_pass: dict = field(default_factory=dict)  # each FAIL_TO_PASS test's status (missing: not run)
    pass_to_pass: dict = field(default_factory=dict)

    def row(self) -> dict:
        return asdict(self)


def verdict(task: Task, tests: dict[str, str]) -> tuple[bool, dict, dict]:
    """(resolved, FAIL_TO_PASS statuses, PASS_TO_PASS statuses): a test the log does not show is ``missing``."""
    f2p = {t: tests.get(t, "missing") for t in task.FAIL_TO_PASS}
    p2p = {t: tests.get(t, "missing") for t in task.PASS_TO_PASS}
    return all(s == "passed" for s in f2p.values()) and all(s == "passed" for s in p2p.values()), f2p, p2p


def grade(task: Task, patch: str, repos: Path, *, sandbox: str = "bubblewrap", limits: Limits = Limits(),
          workdir: Optional[Path] = None) -> Graded:
    """``patch`` applied to a fresh copy of ``task``'s repository (the bug in it), the task's tests run in a
    ``sandbox`` under ``limits``: the task's :class:`Graded` row."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trajsft-grade-", dir=workdir) as tmp:
        os.chmod(tmp, 0o711)  # the sandbox's user (nobody) reaches the copy inside, and lists nothing
        repo = prepare(task, repos, Path(tmp) / "repo")
        why = apply(patch, repo)
        if why is not None:
            return Graded(task.instance_id, False, False, f"the patch does not apply: {why}",
                          seconds=round(time.monotonic() - started, 3))
        ran = for_task(task, repo, sandbox, limits).run(task.test_cmd)
    tests = parse_test_log(ran.output)
    resolved, f2p, p2p = verdict(task, tests)
    reason = None
    if ran.timed_out:
        resolved, reason = False, f"the tests were killed at their limit ({limits.command_s:g} s)"
    elif not tests:
        reason = f"the test command ran no test (exit {ran.returncode}): {one_line(ran.output[-400:], 300)}"
    return Graded(task.instance_id, resolved, True, reason,
                  passed=sum(s == "passed" for s in tests.values()), failed=sum(s == "failed" for s in tests.values()),
                  seconds=round(time.monotonic() - started, 3), tests=tests, fail_to_pass=f2p, pass_to_pass=p2p)


def resolve_rate(rows: Iterable[Graded]) -> tuple[float, int, int]:
    """(rate, resolved, tasks)."""
    rows = list(rows)
    n = sum(r.resolved for r in rows)
    return (n / len(rows) if rows else 0.0), n, len(rows)
