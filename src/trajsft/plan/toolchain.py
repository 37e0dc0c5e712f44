"""The toolchain a task set's tests run with, as the plan hashes it: ``cargo --version`` of Debian's cargo (the
tests' outcome depends on it), called with ``PATH=/usr/bin:/bin`` so that a rustup cargo earlier on the caller's
PATH never answers. Asked once per process, and only where a task set is configured; a missing cargo is an
identity too (``cargo missing``): the plan never fails on it, the task set's rule says in one line what to install."""

from __future__ import annotations

import functools
import os
import subprocess

CARGO = "/usr/bin/cargo"
PATH = "/usr/bin:/bin"  # Debian's toolchain, never a rustup one
IMAGES = "each instance's docker image"  # a dataset's task set: its tests run with the toolchain of their images


@functools.lru_cache(maxsize=None)
def cargo_version() -> str:
    if not os.path.exists(CARGO):
        return f"cargo missing: {CARGO}"
    ran = subprocess.run([CARGO, "--version"], capture_output=True, text=True, env={"PATH": PATH})
    if ran.returncode != 0:
        return f"{CARGO} --version failed: {(ran.stderr or ran.stdout).strip()[:200]}"
    return ran.stdout.strip()
