"""Submit, attach to, follow and stop Ray jobs (Ray Jobs API, Ray 2.60).

This is the only place where ``trajsft`` talks to a Ray cluster.  Everything
goes through the dashboard's HTTP API (``ray.job_submission.JobSubmissionClient``
plus a few plain REST calls); we never ``ray.init()`` as a driver.

Public API
----------
``submission_id(content_hash, attempt)``
    Deterministic Ray submission id ``trajsft-<hash>-a<attempt>``.
``submit_or_attach(address, entrypoint, submission_id, runtime_env,
entrypoint_resources, metadata, env_vars) -> (job_id, attached)``
    Submit unless a job with that id exists; PENDING/RUNNING/SUCCEEDED jobs are
    attached to (``attached=True``), FAILED/STOPPED raise
    :class:`JobAlreadyTerminal` so the caller can move to the next attempt id.
``follow(address, job_id, log_path, poll_s) -> status``
    Stream the job's driver log into ``log_path`` until the job is terminal.
``stop(address, job_id, wait_s) -> status``
    Ask Ray to stop the job and wait until it is terminal.
``run_job(...) -> JobResult``
    What the pipeline uses: pick the attempt id, submit-or-attach, follow,
    stop the Ray job on SIGINT/SIGTERM (raising :class:`JobInterrupted`), and
    succeed iff the job SUCCEEDED (else :class:`JobFailed`).
``preflight(address, required_env, resources, storage_root) -> [problem, ...]``
    One line per problem; empty list means OK.
``cluster_summary(address) -> dict``
    Reachability, running/pending jobs (ours = ``trajsft-`` prefix), TPU totals.
``python -m trajsft.cluster.jobs run|stop|summary|preflight ...``
    Small CLI around the above (``run`` exits 0 on SUCCEEDED, 1 on failure,
    128+signal when interrupted).

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

Secrets (HF_TOKEN, WANDB_API_KEY, ...)
-------------------------------------
``runtime_env["env_vars"]`` is stored verbatim in the GCS job table and served
by ``get_job_info``/``list_jobs`` (the dashboard redacts it only for *browser*
requests), and the entrypoint string is echoed into the first line of the job
log.  So secret values must go neither there nor into metadata.  Instead,
``submit_or_attach`` delivers them like this:

1. Every variable named in ``env_vars`` (values taken from our environment, or
   given explicitly in a mapping), plus any secret-looking name
   (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ...) found in the
   caller's ``runtime_env["env_vars"]``, is written to ``secrets.json`` (mode
   0600) inside a throw-away Python package ``trajsft_secrets_<random>``
   created in a private ``mkdtemp`` directory (mode 0700) *outside* any
   workdir.
2. That directory is appended to ``runtime_env["py_modules"]``.  The Ray client
   zips it and uploads it over the authenticated dashboard connection into the
   cluster's GCS as ``gcs://_ray_pkg_<content-hash>.zip`` (a random nonce in
   the package makes the hash unique and unguessable; Ray's hash ignores the
   directory name).  The local directory is deleted right after the upload,
   whether or not the submission succeeded.
3. The entrypoint becomes ``python -m trajsft_secrets_<random> '<original>'``.
   That wrapper (stdlib only) reads ``secrets.json``, deletes it from the
   extracted package directory, puts the values into ``os.environ``, removes
   its own package from the job config that the driver passes on to its
   tasks/actors (``RAY_JOB_CONFIG_JSON_ENV_VAR``, so worker nodes never
   download the bundle), and ``exec``\\ s ``/bin/sh -c '<original>'``.

What Ray shows (job info, list_jobs, state API, job log) therefore contains
only the variable *names* (metadata ``trajsft_forwarded_env``), the wrapper
module name and the package URI.  ``follow`` additionally replaces any
occurrence of a forwarded value in the streamed log with ``<redacted:NAME>``
(defence in depth against a job printing its own environment), and
``submit_or_attach`` refuses to submit if a secret value occurs in the
entrypoint, metadata or the remaining runtime_env.

The wrapper also exports the package URI (``TRAJSFT_SECRETS_URI``) and the
delivered names (``TRAJSFT_SECRET_NAMES``); the training driver
(:mod:`trajsft.cluster.entrypoint`) deletes the zip from the GCS internal KV as soon
as it has connected, and hands the values to its hosts through an actor on its
own node (:func:`trajsft.cluster.slices.driver_channel`).

Residual exposure (inherent to Ray, documented rather than hidden): the values
live in the driver process environment and in the memory of the hosts' training
processes.  Anyone who
can authenticate to the cluster can run arbitrary code on it and could read
both, so cluster access is equivalent to secret access either way; what this
scheme guarantees is that secrets are not *displayed* by job listings,
dashboards, ``ray job`` CLI output, job logs or the files we write.  The
driver's children inherit the variables; if the driver forwards them to remote
tasks via a task-level ``runtime_env`` they become visible in the state API
for those tasks -- the training code must not do that.

Logs and re-attaching
---------------------
``follow`` uses the websocket log tail (``tail_job_logs``), which always
replays the driver log from its start.  We count the characters of the job
log already written to ``log_path`` and persist the count in a sidecar file
``<log_path>.offsets.json`` keyed by ``<submission_id>@<start_time>`` (so a
re-used id on a restarted cluster starts from zero).  On re-attach (or after a
dropped websocket) the replayed prefix is skipped.  Lines are written only
once complete (a partial last line is held back until its newline arrives or
the job ends) and the file is flushed per chunk; the offset is updated after
each flush together with the file size; if we were killed between the two,
the unrecorded tail is truncated on the next open, so lines are neither
duplicated nor lost.  If the websocket keeps failing, ``follow`` falls back to
polling ``get_job_logs`` (full text, delta written).  Short ``[trajsft] ...``
marker lines are written when following starts and ends.  ``log_path`` must be
written by ``follow`` only (do not redirect our own stderr into it): bytes
appended by someone else after our last write would be cut as "unrecorded".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import secrets as _secrets
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import tenacity

from ..errors import ClusterError

log = logging.getLogger(__name__)

SUBMISSION_PREFIX = "trajsft-"
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
ACTIVE_STATUSES = frozenset({"PENDING", "RUNNING"})
DEFAULT_PORT = 8265
MAX_ATTEMPTS = 50  # attempt ids a0..a49 per content hash
STOP_WAIT_S = 120.0  # after a signal: how long to wait for the stopped job to be terminal
SECRET_NAME_RE = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)",
    re.IGNORECASE,
)
_SID_HASH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_WRAPPER_PREFIX = "trajsft_secrets_"


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


def _http(
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
        reason = "connection failed"
        cause: BaseException | None = e
        while cause is not None:
            if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
                reason = "connection refused (nothing listening; is the head up / port-forward running?)"
                break
            if isinstance(cause, TimeoutError) or "timed out" in str(cause).lower():
                reason = "connection timed out"
                break
            nxt = cause.__cause__ or cause.__context__
            if nxt is None and cause.args and isinstance(cause.args[-1], BaseException):
                nxt = cause.args[-1]
            cause = nxt if nxt is not cause else None
        if "Name or service not known" in str(e) or "nodename nor servname" in str(e):
            reason = "host name does not resolve"
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
    r = _http(address, "GET", "/api/version", headers, timeout=timeout)
    if r.status_code != 200:
        raise ClusterUnreachable(
            f"Ray dashboard {address} answered HTTP {r.status_code} to /api/version (not a Ray dashboard?)"
        )
    try:
        return r.json()
    except ValueError:
        raise ClusterUnreachable(f"{address}/api/version did not return JSON (not a Ray dashboard?)") from None


class _Conn:
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
        r = _http(self.address, "GET", path, self.headers, timeout=timeout)
        if r.status_code != 200:
            raise RayJobsError(f"GET {path} -> HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    # The calls below use plain REST with timeouts (Ray's SDK has none: a head
    # that vanished without a TCP reset would hang us and our signal handling).
    # Only submit_job (package upload) and the websocket log tail use Ray's SDK.

    def job_info(self, job_id: str) -> JobView | None:
        """The job's details (``GET /api/jobs/<id>``) or None if no such job."""
        r = _http(self.address, "GET", f"/api/jobs/{quote(job_id, safe='')}", self.headers, timeout=30.0)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RayJobsError(f"get job {job_id}: HTTP {r.status_code}: {r.text[:200]}")
        return JobView(r.json())

    def list_jobs(self) -> list[JobView]:
        return [JobView(d) for d in self.get("/api/jobs/", timeout=30.0)]

    def job_logs(self, job_id: str) -> str:
        r = _http(self.address, "GET", f"/api/jobs/{quote(job_id, safe='')}/logs", self.headers, timeout=120.0)
        if r.status_code == 404:
            raise JobNotFound(f"Ray job {job_id} does not exist on {self.address}")
        if r.status_code != 200:
            raise RayJobsError(f"get logs of {job_id}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json().get("logs") or ""

    def stop_job(self, job_id: str) -> bool:
        r = _http(self.address, "POST", f"/api/jobs/{quote(job_id, safe='')}/stop", self.headers, timeout=30.0)
        if r.status_code == 404:
            raise JobNotFound(f"Ray job {job_id} does not exist on {self.address}")
        if r.status_code != 200:
            raise RayJobsError(f"stop {job_id}: HTTP {r.status_code}: {r.text[:200]}")
        return bool(r.json().get("stopped"))

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


# --------------------------------------------------------------------------- secrets


_WRAPPER_MAIN = r'''"""trajsft secret-delivery wrapper (generated; see trajsft.cluster.jobs)."""
import json
import os
import sys

def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "secrets.json")
    try:
        with open(path) as f:
            values = json.load(f)
    except FileNotFoundError:
        sys.stderr.write("trajsft: secret bundle already consumed or missing\n")
        sys.exit(97)
    try:
        os.unlink(path)
    except OSError:
        pass
    os.environ.update({str(k): str(v) for k, v in values.items()})
    pkg = os.path.basename(os.path.dirname(here))  # _ray_pkg_<hash>
    # the driver deletes the package from the cluster's KV store as soon as it is connected
    os.environ["TRAJSFT_SECRETS_URI"] = "gcs://" + pkg + ".zip"
    os.environ["TRAJSFT_SECRET_NAMES"] = ",".join(sorted(str(k) for k in values))
    # Keep the bundle out of the job config the driver hands to its workers, so
    # tasks/actors on other nodes never download (and keep) the secrets file.
    cfg = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if cfg:
        try:
            conf = json.loads(cfg)
            renv = conf.get("runtime_env") or {}
            mods = renv.get("py_modules") or []
            keep = [m for m in mods if not str(m).rstrip("/").endswith(pkg + ".zip")]
            if len(keep) != len(mods):
                if keep:
                    renv["py_modules"] = keep
                else:
                    renv.pop("py_modules", None)
                os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps(conf)
        except Exception:
            pass
    os.execv("/bin/sh", ["/bin/sh", "-c", sys.argv[1]])

_main()
'''


def _collect_secrets(
    env_vars: Mapping[str, str] | Iterable[str] | None,
    runtime_env: dict,
) -> dict[str, str]:
    """Secret name -> value; moves secret-looking runtime_env env_vars out."""
    out: dict[str, str] = {}
    if env_vars:
        if isinstance(env_vars, Mapping):
            items = list(env_vars.items())
        else:
            items = []
            for name in env_vars:
                if name not in os.environ:
                    raise ValueError(
                        f"env var {name} is to be forwarded to the Ray job but is not set: export {name}=..."
                    )
                items.append((name, os.environ[name]))
        for name, value in items:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"invalid environment variable name {name!r}")
            out[name] = str(value)
    renv_vars = runtime_env.get("env_vars")
    if isinstance(renv_vars, dict):
        for name in [n for n in renv_vars if SECRET_NAME_RE.search(n)]:
            out.setdefault(name, str(renv_vars[name]))
            del renv_vars[name]
        if not renv_vars:
            runtime_env.pop("env_vars")
    return out


def _assert_not_leaked(secrets: Mapping[str, str], **places: str) -> None:
    for name, value in secrets.items():
        if not value:
            continue
        for where, text in places.items():
            if value in text:
                raise ValueError(
                    f"the value of {name} appears in the job {where}; refusing to submit "
                    "(secrets are only delivered through the secret bundle)"
                )


@contextlib.contextmanager
def _secret_bundle(values: Mapping[str, str]):
    """Yield (module_name, dir) of a temporary package holding secrets.json."""
    tmp = tempfile.mkdtemp(prefix="trajsft-sec-")  # 0700, outside any workdir
    try:
        name = _WRAPPER_PREFIX + _secrets.token_hex(16)
        pkg = Path(tmp) / name
        pkg.mkdir(mode=0o700)
        # Ray's package URI hashes file contents but not the top-level directory
        # name: without a nonce, two bundles with equal secrets would share a URI,
        # and the second job would find the (already consumed) cached copy.
        (pkg / "__init__.py").write_text(f"NONCE = {_secrets.token_hex(16)!r}\n")
        (pkg / "__main__.py").write_text(_WRAPPER_MAIN)
        fd = os.open(pkg / "secrets.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(values), f)
        yield name, str(pkg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    _conn: _Conn | None = None,
) -> tuple[str, bool]:
    """Submit ``entrypoint`` as ``submission_id`` unless that job already exists.

    Returns ``(job_id, attached)``; ``attached`` is True when an existing
    PENDING/RUNNING/SUCCEEDED job was found (check its status to tell them
    apart).  Raises :class:`JobAlreadyTerminal` if it is FAILED/STOPPED.

    ``env_vars``: names to forward from our environment (or a name->value
    mapping); delivered via the secret bundle, never via job info.  Non-secret
    variables can go into ``runtime_env["env_vars"]`` directly (secret-looking
    names there are moved to the bundle).  ``python`` is the interpreter used
    for the (stdlib-only) wrapper on the cluster.
    """
    conn = _conn or _Conn(address, auth_token)
    existing = conn.job_info(submission_id)
    if existing is not None:
        return _handle_existing(existing)

    renv: dict[str, Any] = copy.deepcopy(dict(runtime_env or {}))
    secret_values = _collect_secrets(env_vars, renv)
    md = {str(k): str(v) for k, v in (metadata or {}).items()}
    md.update(
        {
            "trajsft": "1",
            "trajsft_entrypoint_sha256": hashlib.sha256(entrypoint.encode()).hexdigest(),
        }
    )
    if secret_values:
        md["trajsft_forwarded_env"] = ",".join(sorted(secret_values))
    _assert_not_leaked(
        secret_values,
        entrypoint=entrypoint,
        metadata=json.dumps(md),
        runtime_env=json.dumps(renv, default=str),
    )

    with contextlib.ExitStack() as stack:
        final_entrypoint = entrypoint
        if secret_values:
            mod, path = stack.enter_context(_secret_bundle(secret_values))
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
            raise RayJobsError(f"submitting Ray job {submission_id} failed: {_scrub(str(e), secret_values)}") from None
    log.info("submitted Ray job %s to %s", submission_id, conn.address)
    return submission_id, False


def _scrub(text: str, secret_values: Mapping[str, str]) -> str:
    for name, value in secret_values.items():
        if value:
            text = text.replace(value, f"<redacted:{name}>")
    return text


# --------------------------------------------------------------------------- follow


class _LogWriter:
    """Appends one job's log to a file, skipping already-written characters.

    Sidecar ``<log>.offsets.json``: ``{"file_bytes": N, "jobs": {key: chars}}``
    -- the log file's size after our last complete write and, per job, how many
    characters of the Ray job log that covers.  If we died between writing and
    saving the sidecar, the log is longer than ``file_bytes``; that unrecorded
    tail is cut off on the next open, so re-attaching never duplicates lines.
    (If the log is shorter -- e.g. the user truncated it -- nothing is cut.)
    """

    MAX_PENDING = 1 << 16

    def __init__(self, log_path: str | os.PathLike, key: str, redact: Mapping[str, str] | None):
        self.path = Path(log_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.offsets_path = self.path.with_name(self.path.name + ".offsets.json")
        self.key = key
        self.redact = {k: v for k, v in (redact or {}).items() if v}
        state = self._load()
        recorded = state.get("file_bytes")
        with contextlib.suppress(OSError):
            if isinstance(recorded, int) and self.path.stat().st_size > recorded:
                os.truncate(self.path, recorded)
        self.committed = int(state["jobs"].get(key, 0))
        self.pending = ""
        self.f = open(self.path, "a", encoding="utf-8", errors="replace")

    def _load(self) -> dict:
        try:
            data = json.loads(self.offsets_path.read_text())
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
            return {"jobs": {}}
        return data

    def _save(self) -> None:
        data = self._load()
        data["jobs"][self.key] = self.committed
        data["file_bytes"] = os.fstat(self.f.fileno()).st_size
        tmp = self.offsets_path.with_name(self.offsets_path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=0, sort_keys=True))
        os.replace(tmp, self.offsets_path)

    @property
    def consumed(self) -> int:
        return self.committed + len(self.pending)

    def marker(self, text: str) -> None:
        self.f.write(_scrub(f"[trajsft] {text}\n", self.redact))
        self.f.flush()
        self._save()

    def feed(self, stream_pos: int, chunk: str) -> int:
        """Feed ``chunk`` found at ``stream_pos`` of the job log; returns end pos."""
        end = stream_pos + len(chunk)
        if end > self.consumed:
            self.pending += chunk[max(0, self.consumed - stream_pos):]
            cut = self.pending.rfind("\n") + 1
            if cut == 0 and len(self.pending) > self.MAX_PENDING:
                cut = len(self.pending)
            if cut:
                self._commit(cut)
        return end

    def _commit(self, n: int) -> None:
        text, self.pending = self.pending[:n], self.pending[n:]
        self.f.write(_scrub(text, self.redact))
        self.f.flush()
        self.committed += len(text)
        self._save()

    def finish(self) -> None:
        if self.pending:
            self._commit(len(self.pending))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.f.close()


async def _follow_async(
    conn: _Conn,
    job_id: str,
    writer: _LogWriter,
    poll_s: float,
    should_stop: Callable[[], bool],
    unreachable_grace_s: float,
) -> str:
    client = conn.client
    failures = 0
    use_tail = True
    unreachable_since: float | None = None

    async def status_or_none() -> str | None:
        """Job status; None while the dashboard is briefly unreachable."""
        nonlocal unreachable_since
        try:
            st = await asyncio.to_thread(conn.status, job_id)
        except ClusterUnreachable as e:
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                log.warning("%s; retrying for up to %gs", e, unreachable_grace_s)
            if now - unreachable_since > unreachable_grace_s:
                raise
            return None
        unreachable_since = None
        return st

    while True:
        if should_stop():
            raise FollowInterrupted(job_id)
        if use_tail:
            queue: asyncio.Queue = asyncio.Queue()
            done = object()

            async def produce(q: asyncio.Queue = queue) -> None:
                try:
                    async for chunk in client.tail_job_logs(job_id):
                        await q.put(chunk)
                    await q.put(done)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # websocket dropped, head restarting...
                    await q.put(e)

            task = asyncio.create_task(produce())
            pos = 0
            got_data = False
            next_check = time.monotonic() + poll_s
            try:
                while True:
                    if should_stop():
                        raise FollowInterrupted(job_id)
                    if time.monotonic() >= next_check:
                        # Ray closes the tail only a few seconds after the job
                        # ended; polling the status lets us finish sooner (the
                        # final get_job_logs below delivers the rest).
                        next_check = time.monotonic() + poll_s
                        if await status_or_none() in TERMINAL_STATUSES:
                            break
                    try:
                        item = await asyncio.wait_for(queue.get(), timeout=min(poll_s, 1.0))
                    except asyncio.TimeoutError:
                        continue
                    if item is done:
                        break
                    if isinstance(item, Exception):
                        failures += 0 if got_data else 1
                        log.warning("log tail for %s interrupted (%s); reconnecting", job_id, item)
                        break
                    got_data = True
                    failures = 0
                    pos = writer.feed(pos, item)
            finally:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            if failures >= 3:
                log.warning("log tail for %s keeps failing; polling get_job_logs instead", job_id)
                use_tail = False
        else:
            with contextlib.suppress(ClusterUnreachable):
                text = await asyncio.to_thread(conn.job_logs, job_id)
                writer.feed(0, text)

        status = await status_or_none()
        if status in TERMINAL_STATUSES:
            # Catch up on anything the tail did not deliver (full text, delta only).
            with contextlib.suppress(Exception):
                text = await asyncio.to_thread(conn.job_logs, job_id)
                writer.feed(0, text)
            writer.finish()
            return status
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline:
            if should_stop():
                raise FollowInterrupted(job_id)
            await asyncio.sleep(min(0.2, poll_s))


def follow(
    address: str,
    job_id: str,
    log_path: str | os.PathLike,
    poll_s: float = 2.0,
    *,
    redact: Mapping[str, str] | None = None,
    should_stop: Callable[[], bool] | None = None,
    unreachable_grace_s: float = 300.0,
    auth_token: str | None = None,
    _conn: _Conn | None = None,
) -> str:
    """Append the job's log to ``log_path`` until it is terminal; return the status.

    A dashboard that is unreachable for longer than ``unreachable_grace_s``
    (e.g. the head was preempted -- its jobs are gone then) raises
    :class:`ClusterUnreachable`; shorter outages are ridden out.

    Safe to call again after an interruption: already written characters are
    skipped (see module docstring).  ``redact`` maps names to values that are
    replaced by ``<redacted:NAME>`` in the file.  When ``should_stop()`` turns
    true, :class:`FollowInterrupted` is raised (the job keeps running).
    """
    conn = _conn or _Conn(address, auth_token)
    info = conn.job_info(job_id)
    if info is None:
        raise JobNotFound(f"Ray job {job_id} does not exist on {conn.address}")
    key = f"{info.submission_id or job_id}@{info.start_time or 0}"
    writer = _LogWriter(log_path, key, redact)
    try:
        writer.marker(
            f"following Ray job {job_id} on {conn.address} (status {info.status}, "
            f"resuming at log char {writer.committed})"
        )
        status = asyncio.run(
            _follow_async(
                conn, job_id, writer, poll_s, should_stop or (lambda: False), unreachable_grace_s
            )
        )
        writer.marker(f"Ray job {job_id} finished: {status}")
        return status
    except FollowInterrupted:
        writer.finish()
        raise
    finally:
        writer.close()


# --------------------------------------------------------------------------- stop


def stop(
    address: str,
    job_id: str,
    wait_s: float = 60.0,
    *,
    poll_s: float = 0.5,
    auth_token: str | None = None,
    _conn: _Conn | None = None,
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
    conn = _conn or _Conn(address, auth_token)
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


# --------------------------------------------------------------------------- run_job


@contextlib.contextmanager
def _signal_flag(enabled: bool):
    """Record SIGINT/SIGTERM instead of raising; yields a one-element list."""
    got: list[int] = []
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum, _frame):
        if got:
            log.warning("got %s again; still stopping the Ray job", signal.Signals(signum).name)
        else:
            log.warning("got %s; stopping the Ray job", signal.Signals(signum).name)
        got.append(signum)

    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_job(
    address: str,
    entrypoint: str,
    content_hash: str,
    log_path: str | os.PathLike,
    *,
    runtime_env: Mapping[str, Any] | None = None,
    entrypoint_resources: Mapping[str, float] | None = None,
    metadata: Mapping[str, str] | None = None,
    env_vars: Mapping[str, str] | Iterable[str] | None = None,
    python: str = "python",
    retries: int = 0,
    poll_s: float = 2.0,
    handle_signals: bool = True,
    auth_token: str | None = None,
) -> JobResult:
    """Run (or re-attach to) the job for ``content_hash``; succeed iff SUCCEEDED.

    Attempt ids ``trajsft-<hash>-a<n>`` are scanned from a0 (at most ``MAX_ATTEMPTS``):
    FAILED/STOPPED attempts are skipped, a PENDING/RUNNING/SUCCEEDED one is
    attached to, the first unused id is submitted.  If the job then fails,
    up to ``retries`` further attempts are submitted (e.g. after preemption).

    On SIGINT/SIGTERM (main thread only, ``handle_signals``) the Ray job is
    stopped, we wait for it to be terminal, and :class:`JobInterrupted` is
    raised.  Otherwise returns :class:`JobResult` on SUCCEEDED or raises
    :class:`JobFailed`.
    """
    conn = _Conn(address, auth_token)
    conn.check()
    if isinstance(env_vars, Mapping):
        redact = dict(env_vars)
    else:
        env_vars = list(env_vars or [])
        redact = {n: os.environ.get(n, "") for n in env_vars}
    for k, v in ((runtime_env or {}).get("env_vars") or {}).items():
        if SECRET_NAME_RE.search(k):
            redact[k] = str(v)
    want_sha = hashlib.sha256(entrypoint.encode()).hexdigest()

    attempt = 0
    retries_left = retries
    current: str | None = None
    with _signal_flag(handle_signals) as got:
        try:
            while True:
                if attempt >= MAX_ATTEMPTS:
                    raise RayJobsError(f"no usable attempt id for {content_hash} in a0..a{MAX_ATTEMPTS - 1}")
                current = submission_id(content_hash, attempt)
                try:
                    job_id, attached = submit_or_attach(
                        conn.address,
                        entrypoint,
                        current,
                        runtime_env=runtime_env,
                        entrypoint_resources=entrypoint_resources,
                        metadata=metadata,
                        env_vars=env_vars,
                        python=python,
                        _conn=conn,
                    )
                except JobAlreadyTerminal as e:
                    log.info("attempt %s is %s; trying the next attempt id", current, e.status)
                    attempt += 1
                    continue
                if attached:
                    info = conn.job_info(job_id)
                    sha = (info.metadata or {}).get("trajsft_entrypoint_sha256") if info else None
                    if sha and sha != want_sha:
                        log.warning("attached job %s was submitted with a different entrypoint", job_id)
                if got:
                    raise FollowInterrupted(job_id)
                status = follow(
                    conn.address,
                    job_id,
                    log_path,
                    poll_s,
                    redact=redact,
                    should_stop=lambda: bool(got),
                    _conn=conn,
                )
                if status == "SUCCEEDED":
                    return JobResult(job_id, status, attached, attempt)
                info = conn.job_info(job_id)
                message = (info.message or "") if info else ""
                if retries_left > 0 and status == "FAILED":
                    retries_left -= 1
                    log.warning("Ray job %s FAILED (%s); retrying as next attempt", job_id, message)
                    attempt += 1
                    continue
                raise JobFailed(job_id, status, message)
        except FollowInterrupted:
            pass
        # Only reached when a signal arrived.
        signum = got[0] if got else signal.SIGINT
        status = None
        if current is not None:
            try:
                status = stop(conn.address, current, STOP_WAIT_S, _conn=conn)
            except JobNotFound:
                pass
            except RayJobsError as e:
                log.error(
                    "could not stop Ray job %s (%s); it may still be running: "
                    "python -m trajsft.cluster.jobs stop --address %s %s", current, e, conn.address, current,
                )
            else:
                # Best effort: write the tail of the log (stop messages etc.).
                with contextlib.suppress(Exception):
                    info = conn.job_info(current)
                    w = _LogWriter(log_path, f"{current}@{info.start_time or 0}", redact)
                    try:
                        w.feed(0, conn.job_logs(current))
                        w.finish()
                        w.marker(f"Ray job {current} stopped on {signal.Signals(signum).name}: {status}")
                    finally:
                        w.close()
        if status == "PENDING":
            log.warning(
                "Ray job %s is still PENDING (not scheduled); Ray will stop it as soon "
                "as it gets scheduled", current,
            )
        raise JobInterrupted(current, signum, status)


# --------------------------------------------------------------------------- cluster info


def _cluster_resources(conn: _Conn) -> tuple[dict[str, float], dict[str, float]]:
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
        conn = _Conn(address, auth_token, timeout=timeout_s)
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
                if j.submission_id.startswith(SUBMISSION_PREFIX):
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


# --------------------------------------------------------------------------- preflight


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_STORAGE_HOSTS = {"gs": "storage.googleapis.com", "gcs": "storage.googleapis.com", "s3": "s3.amazonaws.com"}


def _resolves(host: str, timeout_s: float) -> bool:
    """DNS lookup bounded in time (getaddrinfo itself has no timeout)."""
    import socket

    out: list[bool] = []

    def work() -> None:
        try:
            socket.getaddrinfo(host, 443)
            out.append(True)
        except OSError:
            out.append(False)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout_s)
    return bool(out and out[0])


def _check_storage(storage_root: str, timeout_s: float) -> str | None:
    probe_name = f".trajsft-preflight-{uuid.uuid4().hex}"
    if "://" not in storage_root or storage_root.startswith("file://"):
        root = Path(storage_root.removeprefix("file://")).expanduser()
        try:
            root.mkdir(parents=True, exist_ok=True)
            p = root / probe_name
            p.write_bytes(b"ok")
            p.unlink()
        except OSError as e:
            return f"storage root {storage_root} is not writable: {e.strerror or e}"
        return None
    host = _STORAGE_HOSTS.get(storage_root.split("://", 1)[0])
    if host and not _resolves(host, min(3.0, timeout_s)):
        # without this, gcsfs retries the failed connection with backoff for about a minute
        return f"storage root {storage_root} unreachable: cannot resolve {host} (no network, or DNS down)"

    result: list[str | None] = []

    def work() -> None:
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(storage_root)
            target = path.rstrip("/") + "/" + probe_name
            fs.pipe_file(target, b"ok")
            fs.rm_file(target)
            result.append(None)
        except Exception as e:  # noqa: BLE001 - report anything as a problem line
            result.append(f"storage root {storage_root} is not writable: {type(e).__name__}: {e}")

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout_s)
    if not result:
        return f"storage root {storage_root}: write probe timed out after {timeout_s:g}s (credentials? `gcloud auth application-default login`)"
    return result[0]


def _check_cluster(address: str, auth_token: str | None, timeout_s: float, wait_for: Mapping[str, float],
                   notes: list[str]) -> list[str]:
    problems: list[str] = []
    try:
        conn = _Conn(address, auth_token, timeout=timeout_s)
        conn.check()
    except ClusterUnauthorized as e:
        return [_one_line(f"unauthorized: {e}")]
    except ClusterUnreachable as e:
        return [_one_line(f"unreachable: {e}")]
    except ValueError as e:
        return [_one_line(f"bad Ray address: {e}")]
    if not wait_for:
        return problems
    try:
        total, avail = _cluster_resources(conn)
    except Exception as e:  # noqa: BLE001
        return [_one_line(f"cannot read cluster resources from {conn.address}: {e}")]
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
) -> list[str]:
    """Check everything a training submission needs; one line per problem.

    Env vars are checked at once; the cluster and the storage root are probed concurrently, each
    with a short timeout. ``resources`` are waited for, not required: missing ones become lines in
    ``notes`` ("waiting for a slice").
    """
    from concurrent.futures import ThreadPoolExecutor

    problems: list[str] = []
    for var in required_env:
        if not os.environ.get(var):
            problems.append(f"env var {var} is not set (needed by the training job): export {var}=...")
    notes = notes if notes is not None else []
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        cluster = pool.submit(_check_cluster, address, auth_token, timeout_s, resources, notes)
        store = pool.submit(_check_storage, storage_root, storage_timeout_s)
        problems.extend(cluster.result())
        err = store.result()
    finally:
        pool.shutdown(wait=False)
    if err:
        problems.append(_one_line(err))
    return problems


# --------------------------------------------------------------------------- CLI


def _parse_kv_floats(items: list[str]) -> dict[str, float]:
    out = {}
    for it in items or []:
        k, _, v = it.partition("=")
        out[k] = float(v or 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trajsft.cluster.jobs")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="submit-or-attach, follow, stop on SIGINT/SIGTERM")
    r.add_argument("--address", required=True)
    r.add_argument("--hash", required=True, dest="content_hash")
    r.add_argument("--log", required=True)
    r.add_argument("--resource", action="append", default=[], help="NAME=QTY entrypoint resource")
    r.add_argument("--env", action="append", default=[], help="env var NAME to forward (secret)")
    r.add_argument("--runtime-env-json", default=None)
    r.add_argument("--retries", type=int, default=0)
    r.add_argument("--poll", type=float, default=2.0)
    r.add_argument("--python", default="python")
    r.add_argument("entrypoint", nargs=argparse.REMAINDER)
    s = sub.add_parser("stop")
    s.add_argument("--address", required=True)
    s.add_argument("--wait", type=float, default=60.0)
    s.add_argument("job_id")
    c = sub.add_parser("summary")
    c.add_argument("--address", required=True)
    f = sub.add_parser("preflight")
    f.add_argument("--address", required=True)
    f.add_argument("--require-env", action="append", default=[])
    f.add_argument("--resource", action="append", default=[])
    f.add_argument("--storage-root", required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    if a.cmd == "run":
        ep = a.entrypoint[1:] if a.entrypoint[:1] == ["--"] else a.entrypoint
        if not ep:
            p.error("missing entrypoint (after --)")
        entrypoint = ep[0] if len(ep) == 1 else shlex.join(ep)
        try:
            res = run_job(
                a.address,
                entrypoint,
                a.content_hash,
                a.log,
                runtime_env=json.loads(a.runtime_env_json) if a.runtime_env_json else None,
                entrypoint_resources=_parse_kv_floats(a.resource) or None,
                env_vars=a.env or None,
                retries=a.retries,
                poll_s=a.poll,
                python=a.python,
            )
        except JobInterrupted as e:
            log.error("%s", e)
            return 128 + e.signum
        except RayJobsError as e:
            log.error("%s", e)
            return 1
        log.info("Ray job %s SUCCEEDED", res.job_id)
        return 0
    if a.cmd == "stop":
        st = stop(a.address, a.job_id, a.wait)
        print(st)
        return 0 if st in TERMINAL_STATUSES else 1
    if a.cmd == "summary":
        print(json.dumps(cluster_summary(a.address), indent=2))
        return 0
    if a.cmd == "preflight":
        probs = preflight(a.address, a.require_env, _parse_kv_floats(a.resource), a.storage_root)
        for line in probs:
            print(line)
        return 1 if probs else 0
    return 2


if __name__ == "__main__":
    sys.exit(main())


# --------------------------------------------------------------------------- queries for status/logs


def run_jobs(address: str, content_hash: str, *, auth_token: str | None = None, timeout_s: float = 5.0) -> list[dict]:
    """All attempts ``trajsft-<hash>-a<n>`` on a cluster, oldest attempt first."""
    conn = _Conn(address, auth_token, timeout=timeout_s)
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
    return _Conn(address, auth_token).job_logs(job_id)
