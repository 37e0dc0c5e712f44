"""A training job that fails before training starts: a configuration error, answered in one line, submitted once.

Causes: Ray could not set up the runtime env (pip/uv on a node), a package does not import (the
driver's or a host's), or an installed version is not the lock's (:func:`installed_mismatches`, checked
by the driver and by every host before ``train_lm`` starts). None of these is helped by another slice
or another Snakemake attempt: the slice loop stops at once (:mod:`trajsft.cluster.slices`), the driver
prints :data:`MARK` and the cause, and the Snakemake side (:mod:`trajsft.cluster.submit`) records
the failure under the run dir (:data:`RECORD`) with the :func:`fingerprint` of what could have caused
it. Snakemake calls the rule again (its ``retries``); while the fingerprint is unchanged the call
answers the same line at once, without resubmitting. Changing the code, the requirements, the runtime
env or the cluster's Ray version changes the fingerprint; ``trajsft retry <target>`` drops the record
(after a fix the fingerprint cannot see, e.g. in the cluster image).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from .. import io

MARK = "[trajsft.remote_train] configuration error:"  # the driver's line (cluster.entrypoint): MARK <cause>
RECORD = "config_failure.json"
OUTCOME = "configuration error"  # a slice attempt's outcome, and the status row's state
_IMPORT_RE = re.compile(r"\b(?:ModuleNotFoundError|ImportError|PackageNotFoundError)\b:?.*")
_RUNTIME_ENV_RE = re.compile(r"\bRuntimeEnvSetupError\b:?.*|[Rr]untime env(?:ironment)? (?:setup|set up|failed).*")


def installed_mismatches(requirements: str, env: Optional[Mapping[str, str]] = None) -> list[str]:
    """What this Python's installed packages get wrong against a requirements file of ``name==version``
    pins (markers evaluated for this machine): ``"jax 0.7.1 (the lock pins 0.7.2)"``,
    ``"tenacity missing (the lock pins 9.2.1)"``."""
    import importlib.metadata as md

    from packaging.markers import Marker

    out = []
    for ln in requirements.splitlines():
        spec = ln.split("#", 1)[0].strip()
        if not spec or "==" not in spec:
            continue
        spec, _, marker = spec.partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate(dict(env) if env else None):
            continue
        name, version = (s.strip() for s in spec.split("==", 1))
        name = name.split("[", 1)[0]
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            out.append(f"{name} missing (the lock pins {version})")
            continue
        if have != version:
            out.append(f"{name} {have} (the lock pins {version})")
    return out


ENV_RECORD = "python-env.txt"  # a host's record of its Python (:func:`python_environment`), beside its train log


def python_environment() -> str:
    """This Python as a freeze: its version and executable, where ``trajsft`` was imported from (the job's
    shipped code on a cluster, never an installed copy), then every installed distribution as
    ``name==version``, sorted. A host writes it before ``train_lm`` starts."""
    import importlib.metadata as md
    import os
    import platform
    import sys

    import trajsft

    dists = {f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata["Name"]}
    return (f"# python {platform.python_version()} {sys.executable}\n"
            f"# trajsft imported from {os.path.dirname(os.path.abspath(trajsft.__file__))}\n"
            + "".join(f"{d}\n" for d in sorted(dists, key=str.lower)))


def check_installed(where: str, requirements_path: str | Path) -> None:
    """Raise :class:`JobEnvironmentError` naming ``where`` when this Python is not the lock's."""
    from ..errors import JobEnvironmentError

    path = Path(requirements_path)
    if not path.exists():
        return
    bad = installed_mismatches(path.read_text())
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise JobEnvironmentError(f"{where}: {bad[0]}{more}: its Python is not {path.name} "
                                  f"(the runtime env did not install the lock?)")


def startup_error(log_text: str) -> Optional[str]:
    """The import error of a process that never started training, from its log; None if none."""
    hits = _IMPORT_RE.findall(log_text)
    return " ".join(hits[-1].split())[:300] if hits else None


def from_failed_job(info: Any, driver_log: str) -> Optional[str]:
    """The one-line cause when a FAILED training job never got to train, else None: the driver said so
    (:data:`MARK`), Ray could not set up the driver's runtime env, or the driver died on an import
    before its first slice attempt."""
    for ln in reversed(driver_log.splitlines()):
        if MARK in ln:
            return ln.split(MARK, 1)[1].strip()
    data = getattr(info, "data", None) or {}
    node = (data.get("driver_node_id") or "")[:12]
    where = f"the driver (node {node})" if node else "the driver"
    message = data.get("message") or ""
    if str(data.get("error_type") or "").endswith("RUNTIME_ENV_SETUP_FAILURE"):
        m = _RUNTIME_ENV_RE.search(message)
        return f"{where}: the runtime env could not be set up: " + " ".join((m.group(0) if m else message).split())[:300]
    if "slice attempt" not in driver_log:
        err = startup_error(driver_log + "\n" + message)
        if err:
            return f"{where}: {err}"
    return None


def fingerprint(runtime_env: Mapping[str, Any], ray_version: Optional[str], code_dir: str | Path) -> str:
    """What a configuration error depends on: the runtime env (requirements included), the cluster's
    Ray version and the code the job ships (every ``.py`` under ``code_dir``)."""
    h = hashlib.sha256()
    h.update(json.dumps({"runtime_env": runtime_env, "ray_version": ray_version}, sort_keys=True, default=str).encode())
    for f in sorted(Path(code_dir).rglob("*.py")):
        if "__pycache__" not in f.parts:
            h.update(str(f.relative_to(code_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def read(run_dir: str) -> Optional[dict]:
    path = io.join(run_dir, RECORD)
    try:
        rec = io.read_json(path)
    except (FileNotFoundError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("cause") else None


def write(run_dir: str, *, cause: str, fingerprint: str, job_id: str) -> dict:
    rec = {"cause": cause, "fingerprint": fingerprint, "ray_job_id": job_id,
           "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    io.write_json(io.join(run_dir, RECORD), rec)
    return rec


def clear(run_dir: str) -> Optional[dict]:
    """Drop the record (``trajsft retry``); the record that was there, if any."""
    rec = read(run_dir)
    path = io.join(run_dir, RECORD)
    if io.exists(path):
        fs, p = io.fs_and_path(path)
        fs.rm(p)
    return rec


def line(rec: Mapping[str, Any], *, repeated: bool = False) -> str:
    """The one line Snakemake prints."""
    tail = (f"not resubmitted: nothing it depends on changed since Ray job {rec['ray_job_id']} ({rec['at']}); "
            f"fix it, or after a fix outside the code and requirements run `trajsft retry <target>`") if repeated \
        else f"Ray job {rec['ray_job_id']}; not retried: fix it and rerun"
    return f"configuration error: {rec['cause']} ({tail})"
