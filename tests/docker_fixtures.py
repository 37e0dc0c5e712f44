"""Docker images made on this machine for the docker sandbox's tests (no registry is reachable): a Rust base image
(Debian bookworm minbase with Debian's cargo, by ``debootstrap`` into a folder, then ``docker import``), and from it
an instance image in SWE-smith's shape (a repository at ``/testbed``) per crate. The base's root file system is kept
as a tarball under the project's cache dir (``$TRAJSFT_CACHE/docker``), so a machine runs debootstrap once: a
restarted daemon imports it again in seconds. Builds are serialized across pytest workers by a file lock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from trajsft import io
from trajsft.plan import hashing
from trajsft.tasks import docker

SUITE = "bookworm"
PACKAGES = "cargo,libc6-dev,git"  # libc6-dev: rustc's libc-dev (a virtual package debootstrap does not resolve); git:
# mini-swe-agent's submit command reads the diff in the container, as in SWE-smith's images
MIRROR = os.environ.get("TRAJSFT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# what the image does not need: the downloaded packages, documentation, translations
EXCLUDE = ["./var/cache/apt/archives", "./usr/share/doc", "./usr/share/man", "./usr/share/locale",
           "./var/lib/apt/lists"]
RECIPE = hashlib.sha256(f"{SUITE} {PACKAGES} minbase {EXCLUDE}".encode()).hexdigest()[:12]
BASE = f"trajsft-test/rust-{SUITE}:{RECIPE}"


def _run(*argv: str, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    ran = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if ran.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: exit {ran.returncode}: {(ran.stderr or ran.stdout)[-800:]}")
    return ran


@contextlib.contextmanager
def _locked(name: str):
    root = io.cache_root() / "docker"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield root


def base_image() -> str:
    """The Rust base image's tag, imported from the cached root tarball (made by debootstrap when missing)."""
    with _locked("base") as root:
        if docker.image_id(BASE):
            return BASE
        tarball = root / f"rust-{SUITE}-{RECIPE}.tar"
        if not tarball.exists():
            if shutil.which("debootstrap") is None:
                raise RuntimeError("debootstrap missing (apt-get install debootstrap)")
            with tempfile.TemporaryDirectory(prefix="trajsft-debootstrap-", dir=root) as tmp:
                rootfs = Path(tmp) / "root"
                _run("debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(rootfs), MIRROR,
                     timeout=1800)
                staged = Path(tmp) / "root.tar"
                _run("tar", "-C", str(rootfs), "-cf", str(staged), *[f"--exclude={x}" for x in EXCLUDE], ".")
                os.replace(staged, tarball)
        with open(tarball, "rb") as f:
            _run("docker", "import", "-", BASE, stdin=f)
        return BASE


# as SWE-smith's Dockerfiles end (`RUN <test_cmd> || true`): the image holds the tests' build output in target/
PREBUILD = f"cd {docker.TESTBED} && cargo test --offline --verbose > /dev/null 2>&1 || true"


def instance_image(crate: Path, name: str) -> str:
    """An image in SWE-smith's shape holding ``crate`` at ``/testbed``, its tests built once (its tag names its
    content)."""
    digest = hashlib.sha256(f"{hashing.tree_digest(crate)} {BASE} {PREBUILD}".encode()).hexdigest()[:12]
    tag = f"trajsft-test/swesmith-{name}:{digest}"
    base = base_image()
    with _locked(f"instance-{name}"):
        if docker.image_id(tag):
            return tag
        cid = f"trajsft-build-{uuid.uuid4().hex[:12]}"
        _run("docker", "create", "--name", cid, "--network", "none", base, "/bin/sh", "-c", PREBUILD)
        try:
            # the crate's sources only (a target/ a local run left is not the image's)
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copytree(crate, Path(tmp) / "src", ignore=shutil.ignore_patterns("target"))
                _run("docker", "cp", f"{tmp}/src/.", f"{cid}:{docker.TESTBED}")
            _run("docker", "start", "--attach", cid, timeout=600)
            _run("docker", "commit", cid, tag)
        finally:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return tag

