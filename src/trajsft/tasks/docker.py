"""A task that names a docker image (a SWE-smith instance's ``image_name``: its repository at ``/testbed``, the
toolchain and the dependencies its tests need) is checked out of that image and runs its commands in containers of
it. Pulling the image is this host's job (:func:`ensure`: a failed pull is one line, the task's reason); the image's
``/testbed`` is copied out once per image id into this machine's cache (:func:`repository`), and the grader and the
episodes work on copies of it as they do on a task set's own repositories. Each command is a fresh container with
the copy mounted at ``/testbed``, run as bubblewrap's are: no network (``--network none``), the same memory and
process limits, a time limit per command (the container killed there), no capabilities, and nothing kept but
``/testbed`` between commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Optional

from .. import io
from ..errors import one_line

TESTBED = "/testbed"  # where SWE-smith's images hold the repository
PULL_SECONDS = 900.0


def _docker(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def missing() -> list[str]:
    """What this host lacks to run docker sandboxes, each in words that say what to do."""
    if shutil.which("docker") is None:
        return ["docker (apt-get install docker.io)"]
    try:
        ran = _docker("version", "--format", "{{.Server.Version}}", timeout=30)
    except subprocess.TimeoutExpired:
        return ["a docker daemon that answers (docker version took over 30 s)"]
    if ran.returncode != 0:
        return [f"a running docker daemon (start it: dockerd &; docker said: {one_line(ran.stderr.decode(), 160)})"]
    return []


def image_id(image: str) -> Optional[str]:
    """The id of ``image`` when this host has it, else None."""
    ran = _docker("image", "inspect", "--format", "{{.Id}}", image)
    return ran.stdout.decode().strip() or None if ran.returncode == 0 else None


def ensure(image: str, pull_seconds: float = PULL_SECONDS) -> tuple[Optional[str], Optional[str]]:
    """(the image's id, None) once this host has ``image`` (pulled when it has not), else (None, why: one line)."""
    have = image_id(image)
    if have:
        return have, None
    try:
        ran = _docker("pull", "-q", image, timeout=pull_seconds)
    except subprocess.TimeoutExpired:
        return None, f"image {image} could not be pulled in {pull_seconds:g} s"
    if ran.returncode != 0:
        return None, f"image {image} could not be pulled: {one_line(ran.stderr.decode() or ran.stdout.decode(), 240)}"
    have = image_id(image)
    return (have, None) if have else (None, f"image {image} is not on this host after its pull")


def repository(image: str) -> Path:
    """The image's ``/testbed``, copied out once per image id into ``<cache>/docker-testbeds/<id>/testbed`` with its
    build output (SWE-smith's images ran the tests when made: their ``target/`` makes a fresh copy's first test run
    an incremental build, not one from scratch) and without ``.git`` (the grader makes its own history); the image
    must be on this host (:func:`ensure`)."""
    have = image_id(image)
    if have is None:
        raise FileNotFoundError(f"image {image} is not on this host (pull it first)")
    dest = io.cache_root() / "docker-testbeds" / have.split(":")[-1][:32] / "testbed"
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    name = f"trajsft-copy-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="trajsft-testbed-", dir=dest.parent) as tmp:
        made = _docker("create", "--name", name, image, "true")
        if made.returncode != 0:
            raise OSError(f"docker create {image}: {one_line(made.stderr.decode(), 200)}")
        try:
            archive = Path(tmp) / "testbed.tar"
            with open(archive, "wb") as out:
                copied = subprocess.run(["docker", "cp", f"{name}:{TESTBED}", "-"], stdout=out,
                                        stderr=subprocess.PIPE, timeout=1800)
            if copied.returncode != 0:
                raise OSError(f"docker cp {image}:{TESTBED}: {one_line(copied.stderr.decode(), 200)}")
        finally:
            _docker("rm", "-f", name)
        with tarfile.open(archive) as tar:
            keep = [m for m in tar.getmembers() if Path(m.name).parts[1:2] != (".git",)]
            tar.extractall(Path(tmp) / "out", members=keep, filter="tar")
        try:
            os.replace(Path(tmp) / "out" / Path(TESTBED).name, dest)
        except OSError:  # another process copied the same image meanwhile: theirs is the same
            if not dest.is_dir():
                raise
    return dest


# the command's stderr joined to its stdout inside the container, one pipe as in bubblewrap: docker carries the two
# streams apart and its client writes them in no fixed order, which split cargo's verdict lines (`test x ... ` from
# the test binary, then cargo's `error: test failed` on stderr, then `FAILED`)
JOINED = 'exec /bin/bash -c "$1" 2>&1'


def run_argv(image: str, workdir: Path, command: str, name: str, *, memory_mb: int, processes: int) -> list[str]:
    """``command`` (bash) in a fresh container of ``image`` named ``name``, ``workdir`` mounted at ``/testbed``, its
    stderr joined to its stdout."""
    return ["docker", "run", "--rm", "--name", name, "--network", "none", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", f"--memory={memory_mb}m", f"--memory-swap={memory_mb}m",
            f"--pids-limit={processes}", "--volume", f"{workdir}:{TESTBED}", "--workdir", TESTBED,
            "--env", "CARGO_TERM_COLOR=never", "--env", "CARGO_NET_OFFLINE=true", image,
            "/bin/sh", "-c", JOINED, "trajsft", command]


def kill(name: str) -> None:
    """The container ``name`` killed and removed (a command past its limit: killing the client leaves it running)."""
    _docker("rm", "-f", name, timeout=60)
