"""Read-only probes of a Ray cluster: ``preflight`` (one line per problem: cluster unreachable, missing
env, resources, storage) and ``cluster_summary`` (reachability, our running/pending jobs, TPU totals)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import gce, storage
from ..errors import one_line
from .jobs import (
    ACTIVE_STATUSES, SUBMISSION_PREFIX, Conn, ClusterUnauthorized, ClusterUnreachable,
    RayJobsError,
)


# --------------------------------------------------------------------------- cluster info


def _cluster_resources(conn: Conn) -> tuple[dict[str, float], dict[str, float]]:
    """(total, available) logical resources, via the dashboard (no driver)."""
    total: dict[str, float] = {}
    used: dict[str, float] = {}
    with contextlib.suppress(Exception):
        data = conn.get("/api/cluster_status", timeout=10.0)
        usage = data["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
        for name, (u, t) in usage.items():
            if name.startswith("node:"):
                continue
            total[name] = float(t)
            used[name] = float(u)
    if not total:  # fallback: state API (totals only)
        data = conn.get("/api/v0/nodes?detail=true&limit=10000", timeout=10.0)
        for node in data["data"]["result"]["result"]:
            if node.get("state") != "ALIVE":
                continue
            for name, t in (node.get("resources_total") or {}).items():
                if not name.startswith("node:"):
                    total[name] = total.get(name, 0.0) + float(t)
    avail = {k: v - used.get(k, 0.0) for k, v in total.items()}
    return total, avail


def cluster_summary(address: str, *, auth_token: str | None = None, timeout_s: float = 5.0) -> dict:
    """Reachability, jobs and TPU resources of one cluster (never raises on cluster errors).

    ``jobs``: submission ids of PENDING/RUNNING jobs, ``ours_*`` restricted to the
    ``trajsft-`` prefix.  ``resources``/``tpu``: logical totals and free amounts
    from the autoscaler's load report (``/api/cluster_status``; a few seconds
    stale), falling back to the state API's node totals.
    """
    out: dict[str, Any] = {
        "address": address,
        "reachable": False,
        "authenticated": None,
        "error": None,
        "ray_version": None,
        "jobs": {"running": [], "pending": [], "ours_running": [], "ours_pending": []},
        "resources": {"total": {}, "available": {}},
        "tpu": {},
    }
    try:
        conn = Conn(address, auth_token, timeout=timeout_s)
        out["address"] = conn.address
        out["ray_version"] = conn.check().get("ray_version")
        out["reachable"] = True
        out["authenticated"] = True
        jobs = conn.list_jobs()
        for j in jobs:
            if not j.submission_id:
                continue
            st = j.status
            if st in ACTIVE_STATUSES:
                k = st.lower()
                out["jobs"][k].append(j.submission_id)
                if j.submission_id.startswith(SUBMISSION_PREFIX) and not (j.metadata or {}).get("trajsft_probe"):
                    out["jobs"]["ours_" + k].append(j.submission_id)
        total, avail = _cluster_resources(conn)
        out["resources"] = {"total": total, "available": avail}
        out["tpu"] = {
            k: {"total": total[k], "free": avail.get(k, 0.0)} for k in sorted(total) if "TPU" in k.upper()
        }
    except ClusterUnauthorized as e:
        out["reachable"] = True if e.status_code else None  # 0: our token source is broken
        out["authenticated"] = False
        out["error"] = str(e)
    except (RayJobsError, ValueError, RuntimeError, OSError) as e:
        out["error"] = str(e)
    return out


def nodes_on_this_machine(address: str, auth_token: str | None = None, timeout_s: float = 3.0) -> bool | None:
    """Whether every alive node of the cluster runs on this machine (its hostname is this machine's: the
    nodes share this disk), asked of the head (``/nodes?view=hostNameList``); None when it does not answer."""
    import socket

    try:
        data = Conn(address, auth_token, timeout=timeout_s).get("/nodes?view=hostNameList", timeout=timeout_s)
    except (RayJobsError, ValueError, OSError):
        return None
    payload = data.get("data") or {} if isinstance(data, dict) else {}
    names = payload.get("hostNameList", payload.get("host_name_list"))
    if not isinstance(names, list) or not names:
        return None
    return set(names) == {socket.gethostname()}


def our_ray_version() -> str:
    """The Ray this project is locked to (the one installed here: ``uv sync --locked``)."""
    import importlib.metadata as md

    return md.version("ray")


def ray_version_problem(theirs: str | None, address: str, ours: str | None = None) -> str | None:
    """One line when the head's Ray is not the lock's minor version, else None. The driver and the hosts run
    the cluster image's Ray, and this project uses Ray internals (the internal KV store, the worker stdstream
    dispatcher, the job config env var) and token auth: only the lock's minor version is supported."""
    ours = ours or our_ray_version()
    supported = ".".join(ours.split(".")[:2])
    if not theirs:
        return (f"Ray on {address} did not say its version (/api/version has no ray_version): this project "
                f"runs Ray {supported}.x (the lock's {ours})")
    if ".".join(str(theirs).split(".")[:2]) != supported:
        return (f"Ray {theirs} on {address}, but this project runs Ray {supported}.x (the lock's {ours}): "
                f"use a cluster whose image has Ray {supported}, nothing was submitted")
    return None


PROBE_METADATA = {"trajsft_probe": "python"}  # tags the probe job: status, clusters and tests tell it from training
_PROBE_MARK = "TRAJSFT_PROBE"
# what the probe job runs on the head with the image's Python: its version, and the head VM's zone and project from
# its GCE metadata server (urllib: no package needed; honours http_proxy / no_proxy as requests does)
_PROBE_CODE = f"""import json, sys, urllib.request
def md(path):
    try:
        req = urllib.request.Request("{gce.METADATA_URL}" + path, headers={{"Metadata-Flavor": "Google"}})
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.read().decode().strip() or None
    except Exception:
        return None
print("{_PROBE_MARK}", json.dumps({{"python": sys.version.split()[0], "zone": md("instance/zone"),
                                   "project": md("project/project-id")}}))
"""


def our_python() -> str:
    """The Python minor version the lock is for (pyproject's ``requires-python``, e.g. ``==3.11.*``)."""
    import re
    import tomllib

    from ..plan.config import REPO_DIR

    spec = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]["requires-python"]
    m = re.search(r"(\d+)\.(\d+)", spec)
    return f"{m.group(1)}.{m.group(2)}" if m else spec


def _probe_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trajsft" / "cluster-probe.json"


def cluster_probe(conn: Conn, session: str, timeout_s: float = 30.0) -> dict | None:
    """What the head says of itself, read by a probe job of a few seconds (tagged with :data:`PROBE_METADATA`) once
    per head session (cached here): ``python`` (the image's Python: what the driver and the hosts run), ``zone``
    and ``project`` (the head VM's, from its GCE metadata server; None off GCE). None if it told nothing."""
    import base64
    import json
    import time

    key = f"{conn.address}|{session}"
    cache = _probe_cache()
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(cache.read_text())
        if isinstance(known.get(key), dict):
            return known[key]
    sid = f"{SUBMISSION_PREFIX}probe-{uuid.uuid4().hex[:10]}"
    code = base64.b64encode(_PROBE_CODE.encode()).decode()
    body = {"entrypoint": f"python -c 'exec(__import__(\"base64\").b64decode(\"{code}\"))'",
            "submission_id": sid, "metadata": dict(PROBE_METADATA)}
    from .jobs import http_request, TERMINAL_STATUSES

    r = http_request(conn.address, "POST", "/api/jobs/", conn.headers, timeout=min(timeout_s, 15.0), json=body)
    if r.status_code != 200:
        raise RayJobsError(f"the probe job was refused: HTTP {r.status_code}: {r.text[:200]}")
    deadline = time.monotonic() + timeout_s
    while conn.status(sid) not in TERMINAL_STATUSES:
        if time.monotonic() > deadline:
            with contextlib.suppress(RayJobsError):
                conn.stop_job(sid)
            return None
        time.sleep(0.5)
    found = None
    for ln in conn.job_logs(sid).splitlines():
        if ln.startswith(_PROBE_MARK + " "):
            with contextlib.suppress(ValueError):
                found = json.loads(ln[len(_PROBE_MARK) + 1:])
    if not isinstance(found, dict):
        return None
    with contextlib.suppress(OSError, ValueError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        known = json.loads(cache.read_text()) if cache.exists() else {}
        known[key] = found
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, cache)
    return found


def python_problem(theirs: str | None, address: str, ours: str | None = None) -> str | None:
    ours = ours or our_python()
    if theirs and ".".join(theirs.split(".")[:2]) != ours:
        return (f"Python {theirs} on the cluster at {address} (its image, as the driver and the hosts run it), but "
                f"this project's lock is for Python {ours}: use an image with Python {ours}, nothing was submitted")
    return None


def zone_problem(want: str | None, head_zone: str | None, address: str) -> str | None:
    """One line when the head's zone (its GCE metadata server) is not the profile's ``ray.zone``: a zone must be
    the same zone, a region (``us-central1``) takes any zone of it. None when either is unknown."""
    if not want or not head_zone:
        return None
    same = head_zone == want if len(want.split("-")) >= 3 else gce.region_of(head_zone) == gce.region_of(want)
    if same:
        return None
    return (f"the Ray head at {address} is in {head_zone} (its GCE metadata server), but this profile's cluster is in "
            f"{want} (ray.zone): is the tunnel open to another region's cluster? nothing was submitted")


def _check_cluster(address: str, auth_token: str | None, timeout_s: float, wait_for: Mapping[str, float],
                   notes: list[str], tunnel_hint: str | None = None, probe: bool = False,
                   zone: str | None = None) -> list[str]:
    problems: list[str] = []
    try:
        conn = Conn(address, auth_token, timeout=timeout_s)
        version = conn.check()  # the first thing asked: nothing else of a head on another Ray needs to answer
    except ClusterUnauthorized as e:
        return [one_line(f"unauthorized: {e}")]
    except ClusterUnreachable as e:
        return [one_line(f"unreachable: {e}") + (f"; {tunnel_hint}" if tunnel_hint else "")]
    except ValueError as e:
        return [one_line(f"bad Ray address: {e}")]
    wrong = ray_version_problem(version.get("ray_version") if isinstance(version, dict) else None, conn.address)
    if wrong:
        return [wrong]
    if probe:
        found: dict = {}
        try:
            found = cluster_probe(conn, str(version.get("session_name") or "")) or {}
        except RayJobsError as e:
            notes.append(one_line(f"the cluster's Python and zone were not checked: {e}"))
        head_zone = gce.zone(lambda _: found.get("zone"))
        wrong = python_problem(found.get("python"), conn.address) or zone_problem(zone, head_zone, conn.address)
        if wrong:
            return [wrong]
        if zone and found and not head_zone:
            notes.append(f"the Ray head at {conn.address} did not say its zone (no GCE metadata server): "
                         f"ray.zone {zone} was not checked")
    if not wait_for:
        return problems
    try:
        total, avail = _cluster_resources(conn)
    except Exception as e:  # noqa: BLE001
        return [one_line(f"cannot read cluster resources from {conn.address}: {e}")]
    for name, qty in wait_for.items():
        if total.get(name, 0.0) < float(qty):
            # autoscaled clusters (min_workers: 0) and clusters right after a preemption have no live
            # slice: the job waits for one, this is not an error
            notes.append(f"no live {name} on {conn.address} now: the job will be waiting for a slice "
                         f"(autoscaler / after a preemption)")
        elif avail.get(name, 0.0) < float(qty):
            notes.append(f"every {name} on {conn.address} is busy now: the job will be waiting for a slice")
    return problems


def preflight(
    address: str,
    required_env: Iterable[str],
    resources: Mapping[str, float],
    storage_root: str,
    *,
    auth_token: str | None = None,
    timeout_s: float = 5.0,
    storage_timeout_s: float = 20.0,
    notes: list[str] | None = None,
    tunnel_hint: str | None = None,
    probe: bool = False,
    zone: str | None = None,
) -> list[str]:
    """Check everything a training submission needs; one line per problem.

    Env vars are checked at once; the cluster and the storage root are probed concurrently, each
    with a short timeout. ``resources`` are waited for, not required: missing ones become lines in
    ``notes`` ("waiting for a slice"). The cluster's Ray version is its first question (a head on another
    Ray is refused in one line); ``tunnel_hint`` ends the line of an unreachable head (how to open the tunnel).
    ``probe``: then the image's Python (:func:`cluster_probe`, a probe job once per head session) must be
    the lock's minor version, and the head must be in ``zone`` (a zone, or a region) when its metadata server
    says where it is; a ``gs://`` storage root in one region must be in the zone's region (:func:`bucket_problem`).
    """
    from concurrent.futures import ThreadPoolExecutor

    problems: list[str] = []
    for var in required_env:
        if not os.environ.get(var):
            problems.append(f"env var {var} is not set (needed by the training job): export {var}=...")
    notes = notes if notes is not None else []
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        cluster = pool.submit(_check_cluster, address, auth_token, timeout_s, resources, notes, tunnel_hint,
                              probe, zone)
        store = pool.submit(storage.probe_write, storage_root, storage_timeout_s, zone if probe else None)
        problems.extend(cluster.result())
        err = store.result()
    finally:
        pool.shutdown(wait=False)
    if err:
        problems.append(one_line(err))
    return problems
