"""Following a Ray job's driver log into a file.

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
duplicated nor lost.  Short ``[trajsft] ...``
marker lines are written when following starts and ends.  ``log_path`` must be
written by ``follow`` only (do not redirect our own stderr into it): bytes
appended by someone else after our last write would be cut as "unrecorded".

Reconnecting (tenacity)
-----------------------
``_Follower.tail_policy`` reconnects the websocket every ``poll_s`` (a session that ends before the
job is terminal is retried; the status is checked after each session and every ``poll_s`` during
one). After three drops in a row that delivered nothing it gives up and ``poll_policy`` polls
``get_job_logs`` (full text, delta written) every ``poll_s`` instead. The sleeps between attempts
check ``should_stop``. A dashboard outage is ridden out for ``unreachable_grace_s``: that window is
hand-written (``_Follower.status``) because it must not block: the follower keeps draining the tail
and writing the log between status calls, where a tenacity retry would wait until the dashboard
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import tenacity

from .jobs import TERMINAL_STATUSES, Conn, ClusterUnreachable, FollowInterrupted, JobNotFound
from .secrets import scrub

log = logging.getLogger("trajsft.rayjobs")  # the name in log lines, as before the re-layout


# --------------------------------------------------------------------------- follow


class LogWriter:
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
        self.f.write(scrub(f"[trajsft] {text}\n", self.redact))
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
        self.f.write(scrub(text, self.redact))
        self.f.flush()
        self.committed += len(text)
        self._save()

    def finish(self) -> None:
        if self.pending:
            self._commit(len(self.pending))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.f.close()


class _TailDropped(Exception):
    """The websocket tail failed (dropped, head restarting...) and the job is not terminal yet."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class _TailEnded(Exception):
    """The tail ended (Ray closes it a few seconds after the job) but the status is not terminal yet."""


class _NotTerminal(Exception):
    """Polling: the job is not terminal yet."""


class _Follower:
    """The retry policies of :func:`follow`, on a job's log writer (see the module docstring)."""

    MAX_EMPTY_DROPS = 3  # consecutive tail sessions that dropped before delivering anything: poll instead

    def __init__(self, conn: Conn, job_id: str, writer: LogWriter, poll_s: float, should_stop: Callable[[], bool],
                 unreachable_grace_s: float):
        self.conn, self.job_id, self.writer = conn, job_id, writer
        self.poll_s, self.should_stop, self.grace_s = poll_s, should_stop, unreachable_grace_s
        self.empty_drops = 0
        self.unreachable_since: float | None = None

    def check_stop(self) -> None:
        if self.should_stop():
            raise FollowInterrupted(self.job_id)

    async def sleep(self, seconds: float) -> None:
        """tenacity's sleep between attempts: checks ``should_stop`` every 0.2 s."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check_stop()
            await asyncio.sleep(min(0.2, self.poll_s))
        self.check_stop()

    def _retrying(self, retry, stop=tenacity.stop_never, **kw) -> tenacity.AsyncRetrying:
        return tenacity.AsyncRetrying(retry=retry, stop=stop, wait=tenacity.wait_fixed(self.poll_s), sleep=self.sleep,
                                      reraise=True, **kw)

    def tail_policy(self) -> tenacity.AsyncRetrying:
        """Reconnect the tail every ``poll_s`` until the job is terminal; after MAX_EMPTY_DROPS drops in a row
        without data, give up (returns None: poll instead). A session that delivered data resets the count."""

        def log_drop(rs: tenacity.RetryCallState) -> None:
            e = rs.outcome.exception()
            if isinstance(e, _TailDropped):
                log.warning("log tail for %s interrupted (%s); reconnecting", self.job_id, e.cause)

        def give_up(rs: tenacity.RetryCallState) -> None:
            log.warning("log tail for %s keeps failing; polling get_job_logs instead", self.job_id)

        return self._retrying(tenacity.retry_if_exception_type((_TailDropped, _TailEnded)),
                              stop=lambda rs: self.empty_drops >= self.MAX_EMPTY_DROPS, after=log_drop,
                              retry_error_callback=give_up)

    def poll_policy(self) -> tenacity.AsyncRetrying:
        """Poll the full log every ``poll_s`` until the job is terminal."""
        return self._retrying(tenacity.retry_if_exception_type(_NotTerminal))

    async def status(self) -> str | None:
        """Job status; None while the dashboard is unreachable, for up to ``unreachable_grace_s``.

        Hand-written, not a tenacity policy: the grace window is a deadline checked at each status call,
        while the caller keeps draining the tail and writing the log in between; a tenacity retry would
        block the caller until the dashboard answers."""
        try:
            st = await asyncio.to_thread(self.conn.status, self.job_id)
        except ClusterUnreachable as e:
            now = time.monotonic()
            if self.unreachable_since is None:
                self.unreachable_since = now
                log.warning("%s; retrying for up to %gs", e, self.grace_s)
            if now - self.unreachable_since > self.grace_s:
                raise
            return None
        self.unreachable_since = None
        return st

    async def tail_session(self) -> str:
        """One websocket session; returns the terminal status, else raises _TailDropped or _TailEnded."""
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def produce() -> None:
            try:
                async for chunk in self.conn.client.tail_job_logs(self.job_id):
                    await queue.put(chunk)
                await queue.put(done)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # websocket dropped, head restarting...
                await queue.put(e)

        task = asyncio.create_task(produce())
        pos, got_data, dropped = 0, False, None
        next_check = time.monotonic() + self.poll_s
        try:
            while True:
                self.check_stop()
                if time.monotonic() >= next_check:
                    # Ray closes the tail only a few seconds after the job ended; polling the status
                    # lets us finish sooner (the final get_job_logs delivers the rest).
                    next_check = time.monotonic() + self.poll_s
                    if await self.status() in TERMINAL_STATUSES:
                        break
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=min(self.poll_s, 1.0))
                except asyncio.TimeoutError:
                    continue
                if item is done:
                    break
                if isinstance(item, Exception):
                    self.empty_drops += 0 if got_data else 1
                    dropped = item
                    break
                got_data = True
                self.empty_drops = 0
                pos = self.writer.feed(pos, item)
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        status = await self.status()
        if status in TERMINAL_STATUSES:
            return status
        raise _TailDropped(dropped) if dropped is not None else _TailEnded()

    async def poll_once(self) -> str:
        """The full log (delta written); returns the terminal status, else raises _NotTerminal."""
        with contextlib.suppress(ClusterUnreachable):
            self.writer.feed(0, await asyncio.to_thread(self.conn.job_logs, self.job_id))
        status = await self.status()
        if status in TERMINAL_STATUSES:
            return status
        raise _NotTerminal()

    async def run(self) -> str:
        self.check_stop()
        status = await self.tail_policy()(self.tail_session)
        if status is None:  # the tail kept failing
            await self.sleep(self.poll_s)
            status = await self.poll_policy()(self.poll_once)
        # Catch up on anything the tail did not deliver (full text, delta only).
        with contextlib.suppress(Exception):
            self.writer.feed(0, await asyncio.to_thread(self.conn.job_logs, self.job_id))
        self.writer.finish()
        return status


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
    _conn: Conn | None = None,
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
    conn = _conn or Conn(address, auth_token)
    info = conn.job_info(job_id)
    if info is None:
        raise JobNotFound(f"Ray job {job_id} does not exist on {conn.address}")
    key = f"{info.submission_id or job_id}@{info.start_time or 0}"
    writer = LogWriter(log_path, key, redact)
    try:
        writer.marker(
            f"following Ray job {job_id} on {conn.address} (status {info.status}, "
            f"resuming at log char {writer.committed})"
        )
        follower = _Follower(conn, job_id, writer, poll_s, should_stop or (lambda: False), unreachable_grace_s)
        status = asyncio.run(follower.run())
        writer.marker(f"Ray job {job_id} finished: {status}")
        return status
    except FollowInterrupted:
        writer.finish()
        raise
    finally:
        writer.close()
