"""Tie rule jobs to the exact Snakemake run that started them.

* Ctrl-C / SIGTERM to Snakemake reaches the rule jobs it is running. Snakemake's local
  executor answers SIGINT/SIGTERM by waiting for running jobs to end (a thread-pool
  shutdown), which for a multi-day TPU job means never. Installed from the workflow's
  ``onstart`` hook (after Snakemake's own handlers), :func:`forward_to_rule_jobs` forwards
  the signal to our rule scripts first: the train step then stops its Ray job (or its
  local Levanter process) and fails, and Snakemake exits with no orphaned TPU job.
* A run is identified by Snakemake's pid *and* process start time (``<pid>-<start>``),
  exported by ``onstart`` as ``$TRAJSFT_SNAKEMAKE_RUN`` (with the host name) to every rule job. So a reused pid or
  PID 1 (every process's ancestor) never matches another run.
* Stop marker ``.snakemake/trajsft-stopping-<pid>-<start>``: written when that run got
  SIGINT/SIGTERM (Snakemake retries failed jobs even while it shuts down, and a retry must not
  start a new training), removed when that run's process exits, and removed on the next
  ``onstart`` if its run is gone (SIGKILL).
* Rule jobs die with their Snakemake (:func:`watch_snakemake`): a rule job whose Snakemake
  vanished (even ``kill -9``) stops itself within seconds, cleaning up like on SIGTERM, so a
  rerun never meets an orphan still writing the same artifact.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

log = logging.getLogger("trajsft")

SCRIPT_MARK = ".snakemake/scripts/"
RUN_ENV = "TRAJSFT_SNAKEMAKE_RUN"
STOP_DIR = ".snakemake"
STOP_PREFIX = "trajsft-stopping-"
# after asking the job to stop (SIGTERM-like cleanup), the watchdog gives it this long
STOP_GRACE_S = 60.0


class SnakemakeGone(KeyboardInterrupt):
    """Raised in a rule job's main thread when its Snakemake run ended (or on SIGTERM)."""


# ---- run identity ------------------------------------------------------------------------
def run_id(proc: psutil.Process) -> str:
    """``<pid>-<start time in centiseconds>``: unique per process, unlike the pid."""
    return f"{proc.pid}-{round(proc.create_time() * 100)}"


def own_run_id() -> str:
    """This process's :func:`run_id`."""
    return run_id(psutil.Process())


def process_of(rid: str) -> psutil.Process | None:
    """The live process a run id names, or None (gone, or its pid now belongs to another one)."""
    try:
        pid = int(rid.split("-", 1)[0])
        proc = psutil.Process(pid)
        if run_id(proc) == rid and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (ValueError, psutil.Error):
        pass
    return None


def current_run() -> str | None:
    """The Snakemake run this rule job belongs to ($TRAJSFT_SNAKEMAKE_RUN = ``<host>/<run id>``,
    set by onstart); None if unset or from another host (a cluster executor forwarding env vars:
    that pid means nothing here)."""
    host, _, rid = (os.environ.get(RUN_ENV) or "").rpartition("/")
    return rid if rid and host == socket.gethostname() else None


def run_env(rid: str) -> str:
    return f"{socket.gethostname()}/{rid}"


def stop_marker(rid: str, workdir: str | os.PathLike = ".") -> Path:
    return Path(workdir, STOP_DIR, f"{STOP_PREFIX}{rid}")


# ---- in the Snakemake process ------------------------------------------------------------
def register_run(workdir: str | os.PathLike = ".") -> str:
    """``onstart``: export this run's id to the rule jobs; drop markers of runs that are gone."""
    rid = own_run_id()
    os.environ[RUN_ENV] = run_env(rid)
    remove_stale_markers(workdir)
    return rid


def remove_stale_markers(workdir: str | os.PathLike = ".") -> list[Path]:
    """Remove stop markers whose Snakemake run has ended (and old pid-only markers)."""
    removed = []
    for path in Path(workdir, STOP_DIR).glob(f"{STOP_PREFIX}*"):
        rid = path.name[len(STOP_PREFIX):]
        if "-" not in rid or process_of(rid) is None:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def mark_stopping(workdir: str | os.PathLike = ".") -> Path:
    """Remember (in the workdir) that this Snakemake run was told to stop; forgotten at exit."""
    # absolute: Snakemake runs in its --directory but is back in its start dir when it exits
    path = stop_marker(own_run_id(), workdir).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.touch()
        atexit.register(path.unlink, missing_ok=True)
    return path


def rule_script_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any(SCRIPT_MARK in part for part in p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def forward_to_rule_jobs(signals=(signal.SIGINT, signal.SIGTERM)) -> None:
    for sig in signals:
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            mark_stopping()
            for p in rule_script_processes():
                try:
                    p.send_signal(signum)
                except psutil.NoSuchProcess:
                    pass
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(sig, handler)


# ---- in a rule job -----------------------------------------------------------------------
def snakemake_is_stopping(workdir: str | os.PathLike = ".") -> bool:
    """True inside a rule job whose own Snakemake run got SIGINT/SIGTERM (or has ended)."""
    rid = current_run()
    if rid is None:
        return False
    return stop_marker(rid, workdir).exists() or process_of(rid) is None


def _raise_stop(signum, frame):
    raise SnakemakeGone(_gone_reason or f"got {signal.Signals(signum).name}")


_gone_reason: str | None = None


def install_stop_handler() -> None:
    """SIGINT and SIGTERM raise :class:`SnakemakeGone` (a KeyboardInterrupt), so the job's
    cleanup runs (stop the trainer, drop the half-built cache, record the attempt). (A local
    Ray started later replaces the SIGTERM handler with ``sys.exit(15)``; cleanup still runs.)"""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise_stop)
        signal.signal(signal.SIGTERM, _raise_stop)


def watch_snakemake(poll_s: float = 1.0, on_gone=None, grace_s: float = STOP_GRACE_S,
                    log_path: str | None = None) -> threading.Thread | None:
    """Make this rule job die with its Snakemake run (see module doc).

    When the run's process is gone, stdout/stderr (Snakemake's terminal or log, which nobody
    reads any more) are redirected to ``log_path``; ``on_gone(reason)`` is called if given (it
    may end the process itself), else the main thread gets SIGINT, i.e. :class:`SnakemakeGone`
    (SIGINT: a local Ray replaces the SIGTERM handler); if the process is still alive
    ``grace_s`` later it kills its children and exits (code 1).
    """
    rid = current_run()
    if rid is None:
        return None
    proc = process_of(rid)

    def gone(reason: str) -> None:
        global _gone_reason
        _gone_reason = reason
        if log_path:
            try:
                fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
            except OSError:
                pass
        log.error("%s", reason)
        if on_gone is not None:
            on_gone(reason)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(grace_s)
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
        print(f"trajsft: {reason}; cleanup took over {grace_s:.0f}s, exiting", file=sys.stderr)
        os._exit(1)

    def alive() -> bool:
        try:
            return proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def loop() -> None:
        while alive():
            time.sleep(poll_s)
        gone(f"Snakemake (run {rid}) is gone: stopping this job with it")

    t = threading.Thread(target=loop, name="trajsft-snakemake-watchdog", daemon=True)
    t.start()
    return t
