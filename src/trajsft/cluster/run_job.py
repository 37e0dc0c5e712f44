"""Running one Ray job to the end: pick the attempt id, submit-or-attach, follow, stop it on SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Callable

from .follow import LogWriter, follow
from .jobs import (
    MAX_ATTEMPTS, STOP_WAIT_S, Conn, FollowInterrupted, JobAlreadyTerminal, JobFailed, JobInterrupted,
    JobNotFound, JobResult, RayJobsError, stop, submission_id, submit_or_attach,
)
from .secrets import SECRET_NAME_RE

log = logging.getLogger("trajsft.rayjobs")  # the name in log lines, as before the re-layout


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
    identity: str | None = None,
    success_still_holds: Callable[[], bool] | None = None,
) -> JobResult:
    """Run (or re-attach to) the job for ``content_hash``; succeed iff SUCCEEDED.

    ``identity`` (default: ``entrypoint``) is what makes two submissions the same job; it is stored
    (hashed) in the job's metadata, and re-attaching to a job whose identity differs logs a warning.
    The entrypoint may carry more (the train rule's attempt number) without making every re-attach warn.

    Attempt ids ``trajsft-<hash>-a<n>`` are scanned from a0 (at most ``MAX_ATTEMPTS``):
    FAILED/STOPPED attempts are skipped, a PENDING/RUNNING/SUCCEEDED one is
    attached to, the first unused id is submitted. A SUCCEEDED one is skipped too when
    ``success_still_holds()`` says what it made is gone (e.g. its final export was deleted since).  If the job then fails,
    up to ``retries`` further attempts are submitted (e.g. after preemption).

    On SIGINT/SIGTERM (main thread only, ``handle_signals``) the Ray job is
    stopped, we wait for it to be terminal, and :class:`JobInterrupted` is
    raised.  Otherwise returns :class:`JobResult` on SUCCEEDED or raises
    :class:`JobFailed`.
    """
    conn = Conn(address, auth_token)
    conn.check()
    if isinstance(env_vars, Mapping):
        redact = dict(env_vars)
    else:
        env_vars = list(env_vars or [])
        redact = {n: os.environ.get(n, "") for n in env_vars}
    for k, v in ((runtime_env or {}).get("env_vars") or {}).items():
        if SECRET_NAME_RE.search(k):
            redact[k] = str(v)
    want_sha = hashlib.sha256((identity or entrypoint).encode()).hexdigest()

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
                        identity=identity,
                        _conn=conn,
                    )
                except JobAlreadyTerminal as e:
                    log.info("attempt %s is %s; trying the next attempt id", current, e.status)
                    attempt += 1
                    continue
                if attached:
                    info = conn.job_info(job_id)
                    if (info and info.status == "SUCCEEDED" and success_still_holds is not None
                            and not success_still_holds()):
                        log.info("attempt %s SUCCEEDED, but what it made is gone; trying the next attempt id", current)
                        attempt += 1
                        continue
                    sha = (info.metadata or {}).get("trajsft_entrypoint_sha256") if info else None
                    if sha and sha != want_sha:
                        log.warning("attached job %s was submitted with a different entrypoint (another "
                                    "config or code version?)", job_id)
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
                    "ray job stop --address %s %s", current, e, conn.address, current,
                )
            else:
                # Best effort: write the tail of the log (stop messages etc.).
                with contextlib.suppress(Exception):
                    info = conn.job_info(current)
                    w = LogWriter(log_path, f"{current}@{info.start_time or 0}", redact)
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
