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
duplicated nor lost.  If the websocket keeps failing, ``follow`` falls back to
polling ``get_job_logs`` (full text, delta written).  Short ``[trajsft] ...``
marker lines are written when following starts and ends.  ``log_path`` must be
written by ``follow`` only (do not redirect our own stderr into it): bytes
appended by someone else after our last write would be cut as "unrecorded".
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

from .jobs import TERMINAL_STATUSES, _Conn, ClusterUnreachable, FollowInterrupted, JobNotFound
from .secrets import _scrub

log = logging.getLogger("trajsft.rayjobs")  # the name in log lines, as before the re-layout


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
