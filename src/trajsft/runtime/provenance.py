"""Run provenance: resolved config, code version, packages, host, and every attempt."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from .. import io
from ..plan.config import REPO_DIR, STATE_DIR

PACKAGES = ("trajsft", "levanter", "haliax", "jax", "jaxlib", "transformers", "tokenizers", "datasets",
            "huggingface_hub", "ray", "snakemake", "wandb", "gcsfs", "pyarrow", "pandas")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO_DIR, capture_output=True, text=True, check=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def code_version() -> dict:
    commit = _git("rev-parse", "HEAD")
    diff = _git("diff", "HEAD")
    status = _git("status", "--porcelain")
    return {
        "git_commit": commit.strip() if commit else None,
        "git_dirty": bool(status and status.strip()),
        "git_diff": diff or "",
    }


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict:
    """Installed version of each package (None: not installed)."""
    out = {}
    for p in packages:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def host() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "pid": os.getpid()}


def write(run_dir: str, resolved: dict) -> None:
    """Write (or refresh) <run_dir>/provenance/: config, code, packages, host."""
    base = f"{run_dir.rstrip('/')}/provenance"
    code = code_version()
    io.write_bytes(f"{base}/config.json", json.dumps(resolved, indent=2, sort_keys=True).encode())
    io.write_bytes(f"{base}/code.json", json.dumps({k: v for k, v in code.items() if k != "git_diff"}, indent=2).encode())
    io.write_bytes(f"{base}/uncommitted.diff", code["git_diff"].encode())
    io.write_bytes(f"{base}/packages.json", json.dumps(package_versions(), indent=2, sort_keys=True).encode())


def fallback_path(run_dir: str) -> str:
    """Where this workdir keeps a run's attempts when its run dir cannot be written (a full or read-only storage
    root): ``results/attempts/<run>-<hash of the run dir>.json`` under the working directory."""
    import hashlib

    name = run_dir.rstrip("/").rsplit("/", 1)[-1]
    return os.path.join(STATE_DIR, "attempts", f"{name}-{hashlib.sha256(run_dir.encode()).hexdigest()[:8]}.json")


def read_attempts(run_dir: str) -> list[dict]:
    """The run's attempts: its run dir's record, with what this workdir recorded when that could not be written."""
    path = f"{run_dir.rstrip('/')}/attempts.json"
    try:
        attempts = json.loads(io.read_bytes(path))
    except FileNotFoundError:
        attempts = []
    try:
        kept = json.loads(Path(fallback_path(run_dir)).read_text())
    except (OSError, ValueError):
        return attempts
    by_number = {a["attempt"]: a for a in attempts}
    by_number.update({a["attempt"]: a for a in kept})
    return [by_number[k] for k in sorted(by_number)]


def _write_attempts(run_dir: str, attempts: list[dict]) -> None:
    """Write the attempts to the run dir; if it cannot be written there (io.write_fault), to this workdir's fallback
    (:func:`fallback_path`), so the record of a failure survives its cause. Once the run dir takes it again, the
    fallback is folded in and removed."""
    blob = json.dumps(attempts, indent=2).encode()
    fallback = fallback_path(run_dir)
    try:
        io.write_bytes(f"{run_dir.rstrip('/')}/attempts.json", blob)
    except Exception as e:
        if io.write_fault(e) is None:
            raise
        io.write_bytes(fallback, blob)
        return
    if os.path.exists(fallback):
        os.unlink(fallback)


def attempt_alive(attempt: dict) -> bool:
    """True if the attempt's process still runs on this host (same pid *and* started before it)."""
    import psutil

    if attempt.get("hostname") != socket.gethostname():
        return False
    try:
        proc = psutil.Process(int(attempt.get("pid", -1)))
        started = dt.datetime.fromisoformat(attempt["started"]).timestamp()
        return proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= started + 1
    except (KeyError, TypeError, ValueError, psutil.Error):
        return False


def running_attempt(run_dir: str) -> dict | None:
    """The last attempt if it is recorded as running and its process is still alive here."""
    attempts = read_attempts(run_dir)
    if attempts and attempts[-1].get("outcome") == "running" and attempt_alive(attempts[-1]):
        return attempts[-1]
    return None


def record_attempt(run_dir: str, **fields) -> dict:
    """Append a new attempt (start time, host, ...) and return it."""
    attempts = read_attempts(run_dir)
    for a in attempts:
        if a.get("outcome") == "running" and not attempt_alive(a):  # died silently (SIGKILL, node loss)
            a.update(outcome="interrupted", error=a.get("error") or "killed (no end recorded)")
    attempt = {"attempt": len(attempts) + 1, "started": now(), "outcome": "running", **host(), **fields}
    attempts.append(attempt)
    _write_attempts(run_dir, attempts)
    return attempt


def update_attempt(run_dir: str, number: int, **fields) -> None:
    """Add fields to attempt ``number`` (the cluster driver records its slice attempts this way)."""
    attempts = read_attempts(run_dir)
    for a in attempts:
        if a["attempt"] == number:
            a.update(**fields)
    _write_attempts(run_dir, attempts)


def finish_attempt(run_dir: str, number: int, outcome: str, **fields) -> None:
    attempts = read_attempts(run_dir)
    for a in attempts:
        if a["attempt"] == number:
            a.update(ended=now(), outcome=outcome, **fields)
    _write_attempts(run_dir, attempts)
