"""A sandbox per episode: a task's working copy run under bubblewrap with no network (every namespace unshared:
only ``lo`` inside, no DNS), as ``nobody`` when we are root, the host's file system read-only but for the copy
(``/work``) and a private ``/tmp``, limits on time (per command and in all), memory (address space) and processes,
and the toolchain Debian installs (``/usr/bin/cargo``, cargo-web) called with ``PATH=/usr/bin:/bin`` and a
CARGO_HOME of its own: a rustup cargo earlier on the caller's PATH does not leak in. ``kind="none"`` (the user's
``sandbox: none``) runs the same commands in the plain directory, said in one line. A task that names a docker image
runs in containers of it instead (``kind="docker"``, :mod:`trajsft.tasks.docker`: the same limits, no network, the
copy at ``/testbed``): :func:`for_task` picks."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from ..plan.toolchain import CARGO, PATH, cargo_version
from . import docker
from .record import Task

log = logging.getLogger("trajsft")

KINDS = ("bubblewrap", "none")  # the config's choice; "docker" is a task's, when it names an image
DOCKER = "docker"
NOBODY = 65534
# what a sandbox needs, and the Debian package that brings it
NEEDS = {"bwrap": "bubblewrap", "setpriv": "util-linux", "prlimit": "util-linux", CARGO: "cargo-web rustc-web"}


@dataclass(frozen=True)
class Limits:
    command_s: float = 120.0  # one command, then it is killed with everything it started
    total_s: float = 900.0  # an episode's commands together
    memory_mb: int = 2048  # every process's address space (RLIMIT_AS): rustc builds a small crate in far less
    processes: int = 256  # the sandbox user's processes (RLIMIT_NPROC: a fork bomb stops there)
    output_chars: int = 200_000  # of one command's output kept (its head and tail)


@dataclass(frozen=True)
class Ran:
    """One command's outcome: ``returncode`` None when it was killed at its time limit (``timed_out``)."""

    command: str
    returncode: Optional[int]
    output: str
    seconds: float
    timed_out: bool = False


def missing(kind: str, needs_cargo: bool = True) -> list[str]:
    """The tools a sandbox of ``kind`` lacks here, as ``<tool> (apt-get install <package>)``."""
    if kind == DOCKER:
        return docker.missing()
    tools = ([] if kind == "none" else ["bwrap"] + (["setpriv"] if os.geteuid() == 0 else [])) + ["prlimit"] + (
        [CARGO] if needs_cargo else [])
    gone = [t for t in tools if not (os.path.exists(t) if t.startswith("/") else shutil.which(t, path=PATH))]
    return [f"{t} (apt-get install {NEEDS[t]})" for t in gone]


def toolchain() -> str:
    """``cargo --version`` of the sandbox's cargo: part of a task set's identity (the tests' outcome depends on it)."""
    return cargo_version()


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


class Sandbox:
    """Commands in ``workdir`` (a fresh copy of a task's repository), each under :class:`Limits`."""

    def __init__(self, workdir: str | os.PathLike, kind: str = "bubblewrap", limits: Limits = Limits(),
                 needs_cargo: bool = True, image: Optional[str] = None):
        if image is not None:
            kind = DOCKER
        elif kind not in KINDS:
            raise ConfigError(f"sandbox: {kind!r} is not a sandbox (one of: {', '.join(KINDS)})")
        lacking = missing(kind, needs_cargo)
        if lacking:
            raise ConfigError(f"sandbox {kind}: missing {', '.join(lacking)}")
        self.workdir, self.kind, self.limits, self.image = Path(workdir).resolve(), kind, limits, image
        self.cwd = docker.TESTBED if kind == DOCKER else "/work"  # where the commands run, as they see it
        self.spent = 0.0
        self.last_container: Optional[str] = None
        self.as_nobody = kind == "bubblewrap" and os.geteuid() == 0
        if self.as_nobody:  # the copy is the only place the sandbox user writes
            shut = next((d for d in self.workdir.parents if not os.stat(d).st_mode & 0o001), None)
            if shut is not None:
                raise ConfigError(f"sandbox: {self.workdir} cannot be reached by the sandbox's user (nobody): {shut} "
                                  f"is mode {os.stat(shut).st_mode & 0o777:o}; make the task's copy under a "
                                  "directory others may traverse (as the grader does)")
            for p in [self.workdir, *self.workdir.rglob("*")]:
                os.lchown(p, NOBODY, NOBODY)
        if kind == "none":
            log.warning("sandbox: none: the task's commands run in %s on this machine, without isolation "
                        "(no network limit, no read-only file system)", self.workdir)

    def argv(self, command: str, name: str = "trajsft") -> list[str]:
        """The command line of ``command``: its limits set by prlimit (inherited by everything it starts; no Python
        runs between fork and exec, so a caller with threads, JAX's, is safe), then the sandbox; in docker, a
        container ``name`` with the same limits."""
        if self.kind == DOCKER:
            return docker.run_argv(self.image, self.workdir, command, name, memory_mb=self.limits.memory_mb,
                                   processes=self.limits.processes)
        mem = self.limits.memory_mb * 2**20
        limits = ["prlimit", f"--as={mem}", f"--nproc={self.limits.processes}", "--"]
        return limits + self._inner(command)

    def _inner(self, command: str) -> list[str]:
        if self.kind == "none":
            return ["/bin/bash", "-c", command]
        bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                 "--bind", str(self.workdir), "/work", "--chdir", "/work", "--unshare-all", "--die-with-parent",
                 "--new-session", "--clearenv", "--setenv", "PATH", PATH, "--setenv", "HOME", "/tmp",
                 "--setenv", "CARGO_HOME", "/tmp/cargo-home", "--setenv", "CARGO_TERM_COLOR", "never",
                 "--", "/bin/bash", "-c", command]
        if self.as_nobody:
            return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *bwrap]
        return bwrap

    def _env(self) -> dict:
        if self.kind == DOCKER:  # the docker client's (the container gets only what run_argv gives it)
            return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG")}
        if self.kind == "none":
            return {"PATH": PATH, "HOME": str(self.workdir), "CARGO_HOME": str(self.workdir / ".cargo-home"),
                    "CARGO_TERM_COLOR": "never"}
        return {"PATH": PATH}

    def run(self, command: str, timeout_s: Optional[float] = None) -> Ran:
        """``command`` (bash) in the sandbox, killed with everything it started at the command's limit or when the
        episode's time is used up."""
        left = self.limits.total_s - self.spent
        if left <= 0:
            return Ran(command, None, f"the episode's {self.limits.total_s:g} s are used up", 0.0, True)
        limit = min(self.limits.command_s, left, timeout_s or float("inf"))
        started = time.monotonic()
        name = self.last_container = f"trajsft-{uuid.uuid4().hex[:16]}"  # docker's: the command's container
        p = subprocess.Popen(self.argv(command, name), cwd=self.workdir, env=self._env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            out, _ = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            if self.kind == DOCKER:  # the container outlives its client
                docker.kill(name)
            os.killpg(p.pid, signal.SIGKILL)  # bwrap, and with it (--die-with-parent) its pid namespace
            out, _ = p.communicate()
        seconds = time.monotonic() - started
        self.spent += seconds
        text = _cut(out.decode(errors="replace"), self.limits.output_chars)
        if timed_out:
            text += f"\n[killed at its limit of {limit:g} s]"
        return Ran(command, None if timed_out else p.returncode, text, seconds, timed_out)


def for_task(task: Task, workdir: str | os.PathLike, kind: str, limits: Limits = Limits()) -> Sandbox:
    """The sandbox of ``task``'s commands in ``workdir``: a container of its image when it names one, else ``kind``
    (the task set's setting)."""
    return Sandbox(workdir, kind, limits, image=task.image_name)
