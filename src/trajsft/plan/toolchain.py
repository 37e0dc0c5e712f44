"""The toolchain a task set's tests run with, as the plan hashes it: ``cargo --version`` of Debian's cargo (the
tests' outcome depends on it), called with ``PATH=/usr/bin:/bin`` so that a rustup cargo earlier on the caller's
PATH never answers. Asked once per process, and only where a task set is configured; a missing cargo is an
identity too (``cargo missing``): the plan never fails on it, the task set's rule says in one line what to install.

A dataset's instances run with the toolchain of their images and the test command of their repository's SWE-smith
profile (:func:`test_command`: swesmith 0.0.9, ``swesmith/profiles/rust.py``, 51 Rust profiles, 8 with a command of
their own; every other runs RustProfile's ``cargo test --verbose``). A workspace, a crate whose tests need features or
a Makefile target is graded by the command its instances were made with: run with the default instead, its gold fix
fails and the task is excluded by its control. Keyed by SWE-smith's mirror name (an instance's ``repo`` is
``swesmith/<owner>__<name>.<commit[:8]>``: a profile is one commit's). The commands run as written in the instance's
image (the docker sandbox sets ``CARGO_NET_OFFLINE``), except SWE-smith's ``~/testbed`` (the image's working dir, not
root's home), written ``/testbed``. The table is part of a dataset set's identity (:data:`IMAGES`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from typing import Optional

CARGO = "/usr/bin/cargo"
PATH = "/usr/bin:/bin"  # Debian's toolchain, never a rustup one

SWESMITH_TEST_COMMANDS = {
    "clap-rs__clap.3716f9f4": "make test-full ARGS=--verbose",
    "hyperium__hyper.c88df788": "cargo test --verbose --features full",
    "rust-itertools__itertools.041c733c": "cargo test --verbose --all-features",
    "tokio-rs__tokio.ab3ff69c": "cargo test --verbose --features full -- --skip try_exists",
    "uuid-rs__uuid.2fd9b614": "cargo test --verbose --all-features",
    "rust-lang__mdBook.37273ba8": "cargo test --workspace --verbose",
    "BurntSushi__ripgrep.3b7fd442": "cargo test --all --verbose",
    "huggingface__tokenizers.ecad3f18": "cd /testbed/tokenizers && cargo test --verbose",
}


def images() -> str:
    """A dataset task set's toolchain: its tests run with the toolchain of their images and the profiles' commands
    (the table's digest: a changed command changes the set's hash)."""
    table = hashlib.sha256(json.dumps(SWESMITH_TEST_COMMANDS, sort_keys=True).encode()).hexdigest()[:10]
    return f"each instance's docker image, tests as swesmith 0.0.9's Rust profiles ({table})"


IMAGES = images()


def test_command(repo: str) -> Optional[str]:
    """The test command SWE-smith's profile gives the instances of ``repo`` (``swesmith/<mirror>``), or None where
    the profile keeps the default."""
    owner, _, mirror = repo.partition("/")
    return SWESMITH_TEST_COMMANDS.get(mirror) if owner == "swesmith" else None


@functools.lru_cache(maxsize=None)
def cargo_version() -> str:
    if not os.path.exists(CARGO):
        return f"cargo missing: {CARGO}"
    ran = subprocess.run([CARGO, "--version"], capture_output=True, text=True, env={"PATH": PATH})
    if ran.returncode != 0:
        return f"{CARGO} --version failed: {(ran.stderr or ran.stdout).strip()[:200]}"
    return ran.stdout.strip()
