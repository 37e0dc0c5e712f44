"""The Ray Jobs API client: submit or attach to, stop and list Ray jobs (Ray 2.60).

Every call to a Ray cluster goes through here: the dashboard's HTTP API
(``ray.job_submission.JobSubmissionClient`` plus a few plain REST calls, the
connection in ``Conn``); we never ``ray.init()`` as a driver.

Public API
----------
``submission_id(content_hash, attempt)``
    Deterministic Ray submission id ``trajsft-<hash>-a<attempt>``.
``submit_or_attach(address, entrypoint, submission_id, runtime_env,
entrypoint_resources, metadata, env_vars) -> (job_id, attached)``
    Submit unless a job with that id exists; PENDING/RUNNING/SUCCEEDED jobs are
    attached to (``attached=True``), FAILED/STOPPED raise
    :class:`JobAlreadyTerminal` so the caller can move to the next attempt id.
``stop(address, job_id, wait_s) -> status``
    Ask Ray to stop the job and wait until it is terminal.
``run_jobs(address, content_hash) -> [job, ...]``, ``job_logs(address, job_id) -> text``
    The Ray jobs of one content hash (what ``trajsft status/logs/stop`` read), and a job's log.
The errors (``RayJobsError`` and its subclasses) and ``JobResult``.

Elsewhere: following a job's log into a file, :func:`trajsft.cluster.follow.follow`; running a job to
the end (attempt ids, submit-or-attach, follow, stop on SIGINT/SIGTERM), :func:`trajsft.cluster.run_job.run_job`;
preflight and the cluster summary, :mod:`trajsft.cluster.preflight`; the secrets, :mod:`trajsft.cluster.secrets`.
Users reach them through ``trajsft stop|clusters|preflight`` and the train rule.

Every function takes an optional keyword ``auth_token``; see below.

Authentication (Ray 2.60 token auth)
------------------------------------
Ray >= 2.52 has static bearer-token auth, selected by ``RAY_AUTH_MODE``
(``token`` / ``disabled``) in the environment of *every* Ray process.  In 2.60
``ray start --head``/``ray.init()`` enable it by default whenever a token is
available.  The token is looked up (C++ ``AuthenticationTokenLoader``) in this
order: ``$RAY_AUTH_TOKEN`` (the value itself), ``$RAY_AUTH_TOKEN_PATH`` (a file;
unreadable/empty is a fatal error), a Kubernetes service-account path, and
finally ``~/.ray/auth_token`` (what ``ray get-auth-token --generate`` writes).
The dashboard (jobs API, state API, ``/api/cluster_status``...) then requires
``Authorization: Bearer <token>`` (or ``X-Ray-Authorization``, or the
``ray-authentication-token`` cookie): no token -> HTTP 401, wrong token ->
HTTP 403.  Only a few paths are public (``/api/authentication_mode``,
``/api/healthz``...).

Ray's own ``JobSubmissionClient`` only adds the header when the *client*
process itself runs with ``RAY_AUTH_MODE=token`` (read once into a cached C++
config), which is fragile.  We therefore resolve the token ourselves with the
same precedence (explicit ``auth_token=`` > ``RAY_AUTH_TOKEN`` >
``RAY_AUTH_TOKEN_PATH`` > ``~/.ray/auth_token``; nothing if
``RAY_AUTH_MODE=disabled``) and always pass the header explicitly.  So clients
need only the token; ``RAY_AUTH_MODE`` on the client is optional.  Sending a
token to a cluster with auth disabled is harmless.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import re
import shlex
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import tenacity

from ..errors import ClusterError, network_cause
from .secrets import assert_not_leaked, collect_secrets, scrub, secret_bundle


log = logging.getLogger("trajsft.rayjobs")  # the name in log lines, as before the re-layout

SUBMISSION_PREFIX = "trajsft-"
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
ACTIVE_STATUSES = frozenset({"PENDING", "RUNNING"})
DEFAULT_PORT = 8265
MAX_ATTEMPTS = 50  # attempt ids a0..a49 per content hash
STOP_WAIT_S = 120.0  # after a signal: how long to wait for the stopped job to be terminal
_SID_HASH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# --------------------------------------------------------------------------- errors


class RayJobsError(ClusterError):
    """Base class of the errors raised by this module."""


class ClusterUnreachable(RayJobsError):
    """No HTTP connection to the Ray dashboard (refused, timeout, DNS...)."""


class ClusterUnauthorized(RayJobsError):
    """The dashboard answered 401 (no token sent) or 403 (token rejected)."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


class JobNotFound(RayJobsError):
    pass


class JobAlreadyTerminal(RayJobsError):
    """A job with this submission id exists and is FAILED or STOPPED."""

    def __init__(self, job_id: str, status: str, message: str = ""):
        super().__init__(f"Ray job {job_id} already exists with status {status}: {message}")
        self.job_id = job_id
        self.status = status
        self.message = message


class JobFailed(RayJobsError):
    """The job ended FAILED or STOPPED (or could not be started)."""

    def __init__(self, job_id: str, status: str, message: str = ""):
        super().__init__(f"Ray job {job_id} ended {status}: {message}".rstrip(": "))
        self.job_id = job_id
        self.status = status
        self.message = message


class JobInterrupted(RayJobsError):
    """run_job got SIGINT/SIGTERM; the Ray job was stopped (see ``status``)."""

    def __init__(self, job_id: str | None, signum: int, status: str | None):
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name}; Ray job {job_id} is {status}")
        self.job_id = job_id
        self.signum = signum
        self.status = status


class FollowInterrupted(RayJobsError):
    """``follow`` returned early because ``should_stop()`` became true."""


@dataclasses.dataclass(frozen=True)
class JobResult:
    job_id: str
    status: str
    attached: bool
    attempt: int


# --------------------------------------------------------------------------- ids


def submission_id(content_hash: str, attempt: int) -> str:
    """Deterministic Ray submission id for a content hash and attempt number."""
    if not isinstance(content_hash, str) or not _SID_HASH_RE.match(content_hash):
        raise ValueError(f"content_hash must match {_SID_HASH_RE.pattern!r}, got {content_hash!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"attempt must be a non-negative int, got {attempt!r}")
    return f"{SUBMISSION_PREFIX}{content_hash}-a{attempt}"


# --------------------------------------------------------------------------- auth / HTTP


def normalize_address(address: str | None) -> str:
    """``host[:port]`` or ``http(s)://host[:port]`` -> ``http(s)://host:port``."""
    if not address:
        address = os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ValueError("no Ray dashboard address given (e.g. http://127.0.0.1:8265)")
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = "http://" + address
    scheme, rest = address.split("://", 1)
    if scheme not in ("http", "https"):
        raise ValueError(f"Ray jobs address must be http(s)://host:port (dashboard), got {address!r}")
    hostport = rest.split("/", 1)[0]
    if ":" not in hostport.rsplit("]", 1)[-1]:
        address = f"{scheme}://{hostport}:{DEFAULT_PORT}" + rest[len(hostport):]
    return address


def resolve_auth_token(auth_token: str | None = None) -> str | None:
    """Find the Ray auth token like Ray does (see module docstring)."""
    if auth_token:
        return auth_token.strip()
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    env_tok = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if env_tok:
        return env_tok
    path = os.environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if path:
        try:
            tok = Path(path).expanduser().read_text().strip()
        except OSError as e:
            raise ClusterUnauthorized(
                f"RAY_AUTH_TOKEN_PATH={path} cannot be read ({e.strerror})", 0
            ) from None
        if not tok:
            raise ClusterUnauthorized(f"RAY_AUTH_TOKEN_PATH={path} is empty", 0)
        return tok
    default = Path.home() / ".ray" / "auth_token"
    try:
        tok = default.read_text().strip()
    except OSError:
        return None
    return tok or None


def _auth_headers(auth_token: str | None) -> dict[str, str]:
    tok = resolve_auth_token(auth_token)
    return {"Authorization": f"Bearer {tok}"} if tok else {}


_AUTH_HINT = (
    "export RAY_AUTH_TOKEN=<token> (or RAY_AUTH_TOKEN_PATH=<file>, or put it in "
    "~/.ray/auth_token; `ray get-auth-token` on the head prints it)"
)


def http_request(
    address: str,
    method: str,
    path: str,
    headers: Mapping[str, str],
    timeout: float = 10.0,
    **kw: Any,
) -> requests.Response:
    """One HTTP request to the dashboard with clear connection/auth errors."""
    url = address + path
    try:
        r = requests.request(
            method, url, headers=dict(headers), timeout=(min(timeout, 5.0), timeout), **kw
        )
    except requests.exceptions.ConnectionError as e:
        reason = network_cause(e) or "connection failed"
        if "refused the connection" in reason:
            reason += "; is the head up / port-forward running?"
        raise ClusterUnreachable(f"Ray dashboard {address} unreachable: {reason}") from None
    except requests.exceptions.Timeout:
        raise ClusterUnreachable(f"Ray dashboard {address} unreachable: timed out after {timeout:g}s") from None
    if r.status_code == 401:
        raise ClusterUnauthorized(
            f"Ray cluster {address} requires token auth and no token was sent: {_AUTH_HINT}", 401
        )
    if r.status_code == 403 and "token" in r.text.lower():
        raise ClusterUnauthorized(
            f"Ray cluster {address} rejected the auth token (HTTP 403): check RAY_AUTH_TOKEN / "
            "RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token matches the head's token",
            403,
        )
    return r


def _probe(address: str, headers: Mapping[str, str], timeout: float) -> dict:
    r = http_request(address, "GET", "/api/version", headers, timeout=timeout)
    if r.status_code != 200:
        raise ClusterUnreachable(
            f"Ray dashboard {address} answered HTTP {r.status_code} to /api/version (not a Ray dashboard?)"
        )
    try:
        return r.json()
    except ValueError:
        raise ClusterUnreachable(f"{address}/api/version did not return JSON (not a Ray dashboard?)") from None


class Conn:
    """Normalised address + auth headers + lazily created JobSubmissionClient."""

    def __init__(self, address: str, auth_token: str | None = None, timeout: float = 5.0):
        self.address = normalize_address(address)
        self.headers = _auth_headers(auth_token)
        self.timeout = timeout
        self.version: dict | None = None
        self._client = None

    def check(self) -> dict:
        if self.version is None:
            self.version = _probe(self.address, self.headers, self.timeout)
        return self.version

    @property
    def client(self):
        if self._client is None:
            self.check()  # fail fast (Ray's client has no HTTP timeouts)
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.address, headers=dict(self.headers))
        return self._client

    def get(self, path: str, timeout: float = 15.0) -> Any:
        r = http_request(self.address, "GET", path, self.headers, timeout=timeout)
        if r.status_code != 200:
            raise RayJobsError(f"GET {path} -> HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    # The calls below use plain REST with timeouts (Ray's SDK has none: a head
    # that vanished without a TCP reset would hang us and our signal handling).
    # Only submit_job (package upload) and the websocket log tail use Ray's SDK.

    def job_info(self, job_id: str) -> JobView | None:
        """The job's details (``GET /api/jobs/<id>``) or None if no such job."""
        r = http_request(self.address, "GET", f"/api/jobs/{quote(job_id, safe='')}", self.headers, timeout=30.0)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RayJobsError(f"get job {job_id}: HTTP {r.status_code}: {r.text[:200]}")
        return JobView(r.json())

    def list_jobs(self) -> list[JobView]:
        return [JobView(d) for d in self.get("/api/jobs/", timeout=30.0)]

    def _job_call(self, method: str, job_id: str, action: str, what: str, timeout: float) -> dict:
        """``<method> /api/jobs/<id>/<action>``'s JSON; a missing job is :class:`JobNotFound`."""
        r = http_request(self.address, method, f"/api/jobs/{quote(job_id, safe='')}/{action}", self.headers, timeout=timeout)
        if r.status_code == 404:
            raise JobNotFound(f"Ray job {job_id} does not exist on {self.address}")
        if r.status_code != 200:
            raise RayJobsError(f"{what} {job_id}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def job_logs(self, job_id: str) -> str:
        return self._job_call("GET", job_id, "logs", "get logs of", timeout=120.0).get("logs") or ""

    def stop_job(self, job_id: str) -> bool:
        return bool(self._job_call("POST", job_id, "stop", "stop", timeout=30.0).get("stopped"))

    def status(self, job_id: str) -> str:
        info = self.job_info(job_id)
        if info is None:
            raise JobNotFound(f"Ray job {job_id} does not exist on {self.address}")
        return info.status


class JobView:
    """Read-only view of the dashboard's job JSON (fields as in Ray's JobDetails)."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = dict(data)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["data"].get(name)
        except KeyError:
            raise AttributeError(name) from None

    @property
    def status(self) -> str:
        return _status_str(self.data.get("status"))

    def __repr__(self) -> str:
        return f"JobView({self.data!r})"


def _status_str(status: Any) -> str:
    return str(getattr(status, "value", status))


# --------------------------------------------------------------------------- submit


def _handle_existing(info: Any) -> tuple[str, bool]:
    sid = info.submission_id
    status = info.status
    if status in ACTIVE_STATUSES:
        log.info("Ray job %s already %s; attaching", sid, status)
        return sid, True
    if status == "SUCCEEDED":
        log.info("Ray job %s already SUCCEEDED", sid)
        return sid, True
    raise JobAlreadyTerminal(sid, status, info.message or "")


def submit_or_attach(
    address: str,
    entrypoint: str,
    submission_id: str,
    runtime_env: Mapping[str, Any] | None = None,
    entrypoint_resources: Mapping[str, float] | None = None,
    metadata: Mapping[str, str] | None = None,
    env_vars: Mapping[str, str] | Iterable[str] | None = None,
    *,
    entrypoint_num_cpus: float | None = None,
    python: str = "python",
    auth_token: str | None = None,
    identity: str | None = None,
    _conn: Conn | None = None,
) -> tuple[str, bool]:
    """Submit ``entrypoint`` as ``submission_id`` unless that job already exists.

    Returns ``(job_id, attached)``; ``attached`` is True when an existing
    PENDING/RUNNING/SUCCEEDED job was found (check its status to tell them
    apart).  Raises :class:`JobAlreadyTerminal` if it is FAILED/STOPPED.

    ``env_vars``: names to forward from our environment (or a name->value
    mapping); delivered via the secret bundle, never via job info.  Non-secret
    variables can go into ``runtime_env["env_vars"]`` directly (secret-looking
    names there are moved to the bundle).  ``python`` is the interpreter used
    for the (stdlib-only) wrapper on the cluster. ``identity`` (default ``entrypoint``) is hashed
    into the metadata as ``trajsft_entrypoint_sha256``: what a re-attach compares.
    """
    conn = _conn or Conn(address, auth_token)
    existing = conn.job_info(submission_id)
    if existing is not None:
        return _handle_existing(existing)

    renv: dict[str, Any] = copy.deepcopy(dict(runtime_env or {}))
    secret_values = collect_secrets(env_vars, renv)
    md = {str(k): str(v) for k, v in (metadata or {}).items()}
    md.update(
        {
            "trajsft": "1",
            "trajsft_entrypoint_sha256": hashlib.sha256((identity or entrypoint).encode()).hexdigest(),
        }
    )
    if secret_values:
        md["trajsft_forwarded_env"] = ",".join(sorted(secret_values))
    assert_not_leaked(
        secret_values,
        entrypoint=entrypoint,
        metadata=json.dumps(md),
        runtime_env=json.dumps(renv, default=str),
    )

    with contextlib.ExitStack() as stack:
        final_entrypoint = entrypoint
        if secret_values:
            mod, path = stack.enter_context(secret_bundle(secret_values))
            mods = renv.get("py_modules") or []
            renv["py_modules"] = list(mods) + [path]
            final_entrypoint = f"{shlex.quote(python)} -m {mod} {shlex.quote(entrypoint)}"
        try:
            conn.client.submit_job(
                entrypoint=final_entrypoint,
                submission_id=submission_id,
                runtime_env=renv or None,
                entrypoint_resources=dict(entrypoint_resources) if entrypoint_resources else None,
                entrypoint_num_cpus=entrypoint_num_cpus,
                metadata=md,
            )
        except RuntimeError as e:
            if "already exists" in str(e):  # lost a race with another submitter
                existing = conn.job_info(submission_id)
                if existing is not None:
                    return _handle_existing(existing)
            raise RayJobsError(f"submitting Ray job {submission_id} failed: {scrub(str(e), secret_values)}") from None
    log.info("submitted Ray job %s to %s", submission_id, conn.address)
    return submission_id, False


# --------------------------------------------------------------------------- stop


def stop(
    address: str,
    job_id: str,
    wait_s: float = 60.0,
    *,
    poll_s: float = 0.5,
    auth_token: str | None = None,
    _conn: Conn | None = None,
) -> str:
    """Request the job to stop and wait up to ``wait_s`` for a terminal status.

    Returns the last observed status (``STOPPED`` normally; ``SUCCEEDED`` /
    ``FAILED`` if it ended by itself first; still ``PENDING``/``RUNNING`` if
    Ray did not stop it in time -- callers should treat that as an error).
    Ray sends SIGTERM to the entrypoint's process group and SIGKILL after
    ``RAY_JOB_STOP_WAIT_TIME_S`` (cluster-side, default 3 s).

    Gotcha: a PENDING job whose supervisor actor cannot be scheduled yet (e.g.
    the TPU slice is not up) stays PENDING -- Ray queues the stop request on the
    supervisor actor, so when the job is eventually scheduled its entrypoint is
    started and immediately stopped (-> STOPPED); if it never gets scheduled it
    turns FAILED after ``RAY_JOB_START_TIMEOUT_SECONDS`` (default 15 min).
    """
    conn = _conn or Conn(address, auth_token)
    status = conn.status(job_id)
    if status in TERMINAL_STATUSES:
        return status
    conn.stop_job(job_id)
    status = tenacity.Retrying(  # poll until terminal; after wait_s, the last status seen
        retry=tenacity.retry_if_result(lambda st: st not in TERMINAL_STATUSES),
        stop=tenacity.stop_after_delay(wait_s),
        wait=tenacity.wait_fixed(poll_s),
        retry_error_callback=lambda state: state.outcome.result(),
    )(conn.status, job_id)
    if status not in TERMINAL_STATUSES:
        log.warning("Ray job %s still %s %gs after stop request", job_id, status, wait_s)
    return status


# --------------------------------------------------------------------------- preflight



# --------------------------------------------------------------------------- queries for status/logs


def run_jobs(address: str, content_hash: str, *, auth_token: str | None = None, timeout_s: float = 5.0) -> list[dict]:
    """All attempts ``trajsft-<hash>-a<n>`` on a cluster, oldest attempt first."""
    conn = Conn(address, auth_token, timeout=timeout_s)
    conn.check()
    prefix = f"{SUBMISSION_PREFIX}{content_hash}-a"
    out = []
    for j in conn.list_jobs():
        sid = j.submission_id or ""
        if sid.startswith(prefix) and sid[len(prefix):].isdigit():
            out.append({"submission_id": sid, "attempt": int(sid[len(prefix):]), "status": j.status,
                        "message": j.message or "", "start_time": j.start_time, "end_time": j.end_time,
                        "metadata": dict(j.metadata or {})})
    return sorted(out, key=lambda d: d["attempt"])


def job_logs(address: str, job_id: str, *, auth_token: str | None = None) -> str:
    return Conn(address, auth_token).job_logs(job_id)
