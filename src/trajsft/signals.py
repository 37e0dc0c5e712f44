"""Make Ctrl-C / SIGTERM to Snakemake reach the rule jobs it is running.

Snakemake's local executor answers SIGINT/SIGTERM by waiting for running jobs to end
(a thread-pool shutdown), which for a multi-day TPU job means never. Installed from the
workflow's ``onstart`` hook (after Snakemake's own handlers), this forwards the signal to
our rule scripts first: the train step then stops its Ray job (or its local Levanter
process) and fails, and Snakemake exits with no orphaned TPU job.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

SCRIPT_MARK = ".snakemake/scripts/"
STOP_MARK = ".snakemake/trajsft-stopping-{pid}"


def mark_stopping() -> None:
    """Remember (in the workdir) that this Snakemake process was told to stop."""
    path = Path(STOP_MARK.format(pid=os.getpid()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def snakemake_is_stopping() -> bool:
    """True inside a rule job whose Snakemake got SIGINT/SIGTERM: a retry must not start
    (Snakemake retries failed jobs even while it shuts down after SIGTERM)."""
    try:
        ancestors = [p.pid for p in psutil.Process().parents()]
    except psutil.Error:
        return False
    return any(Path(STOP_MARK.format(pid=pid)).exists() for pid in ancestors)


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
