"""Make Ctrl-C / SIGTERM to Snakemake reach the rule jobs it is running.

Snakemake's local executor answers SIGINT/SIGTERM by waiting for running jobs to end
(a thread-pool shutdown), which for a multi-day TPU job means never. Installed from the
workflow's ``onstart`` hook (after Snakemake's own handlers), this forwards the signal to
our rule scripts first: the train step then stops its Ray job (or its local Levanter
process) and fails, and Snakemake exits with no orphaned TPU job.
"""

from __future__ import annotations

import signal

import psutil

SCRIPT_MARK = ".snakemake/scripts/"


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
