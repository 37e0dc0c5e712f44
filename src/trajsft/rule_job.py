"""The rule-job harness: each rule's script is its own module, ``trajsft/rules/<rule>.py`` (one hop from the rule to
its code), which gives :func:`run_rule` an :class:`Entry` (its step, and what differs about its job); the harness
runs it with logging, stop handling, user errors as one line and the artifact's manifest. The report rules run
their entry through :func:`run_report`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from . import io, storage
from .data import transform
from .errors import RULE_JOB_ERRORS, StorageFault, network_cause
from .io import is_remote, write_json
from .runtime import signals


log = logging.getLogger("trajsft")


@dataclass(frozen=True)
class Entry:
    """What a rule's module gives the harness: ``run(job, snakemake)`` runs the step of ``job`` (the
    :class:`trajsft.plan.step.Step` trajsft.workflow resolved) and returns the manifest's fields (None: no manifest);
    the rest is what its job does differently from the others."""

    run: Callable[[Any, Any], Optional[dict]]
    # (job, the rule's log path) -> the log the job writes (train: a link to the run's durable training log)
    rule_log: Optional[Callable[[Any, str], str]] = None
    # (job) -> what to call when Snakemake vanishes (train on Ray: detach from the job, which lives on), or None
    on_snakemake_gone: Optional[Callable[[Any], Optional[Callable[[], None]]]] = None
    user_errors: tuple[type[BaseException], ...] = ()  # more exceptions said in one line (the matrix: a deleted run)
    manifest: bool = True  # write the artifact's manifest from the result (train writes its done marker itself)
    # (job) -> what a stop leaves for the rerun (train: the step it resumes from), said in the stop's line, or None
    stop_note: Optional[Callable[[Any], Optional[str]]] = None


def build(job, cfg, step: Callable[[Any], dict]) -> dict:
    """An artifact's step on its typed config, through :func:`trajsft.storage.build` (a sealed payload is reused)."""
    return storage.build(job.plan, job.artifact, lambda: step(cfg))


def run_report(snakemake, entry: Callable[[Any], None]) -> None:
    """A report rule's job: its log, then its entry, which reads the job's inputs and params (no step)."""
    from . import logs

    logs.setup(snakemake.log[0] if snakemake.log else None, snakemake.config.get("log_level", "INFO"))
    entry(snakemake)


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_rule(snakemake, entry: Entry) -> None:
    """A rule job (the script of every rule but the reports: ``trajsft/rules/<rule>.py``): runs ``entry`` on the job's
    step; user errors become one line, exit 1; SIGINT/SIGTERM or a vanished Snakemake end it as stopped, nothing
    marked complete.

    The step comes from ``snakemake.params.step`` (a :class:`trajsft.plan.step.Step` that trajsft.workflow
    resolved once from the workflow's plan); an artifact's manifest goes to ``snakemake.output``.
    """
    from . import logs

    job = snakemake.params.step
    step, name, plan = job.step, job.name, job.plan
    cfg = plan.cfg
    label = f"trajsft {step} {name}".rstrip()
    log_path = snakemake.log[0] if snakemake.log else None
    if entry.rule_log and log_path:
        log_path = entry.rule_log(job, log_path)
    logs.setup(log_path, cfg.get("log_level", "INFO"))
    # die with our Snakemake run (even after `kill -9` of Snakemake), cleaning up like on SIGTERM
    signals.install_stop_handler()
    on_gone = entry.on_snakemake_gone(job) if entry.on_snakemake_gone else None
    signals.watch_snakemake(on_gone=on_gone, log_path=log_path)
    user_errors = (*transform.USER_ERRORS, *RULE_JOB_ERRORS, *entry.user_errors)
    started = time.time()
    try:
        result = entry.run(job, snakemake)
    except user_errors as e:
        _exit_in_one_line(f"{label}: {e}", snakemake.log[0] if isinstance(e, StorageFault) and log_path else None)
    except KeyboardInterrupt as e:  # SIGINT, SIGTERM (signals.SnakemakeGone), or our Snakemake died
        note = _stop_note(entry, job)
        msg = f"{label}: stopped ({e or 'SIGINT'}); {note or 'nothing was marked complete'}"
        # once on the terminal; a linked rule log (the training's, which keeps the details) becomes the line, so
        # that is what Snakemake shows of it
        _say_once(msg, snakemake.log[0] if entry.rule_log and snakemake.log else None)
        sys.exit(130)
    except SystemExit as e:  # a local Ray's SIGTERM handler is sys.exit(15)
        if e.code != signal.SIGTERM:
            raise
        msg = f"{label}: stopped (got SIGTERM); nothing was marked complete"
        log.error(msg)
        with contextlib.suppress(OSError):
            print(msg, file=sys.stderr)
        sys.exit(143)
    except Exception as e:
        fault = io.write_fault(e)
        if fault is not None:  # full, over quota, read-only, refused: one line, no trace (it would only say where)
            _exit_in_one_line(f"{label}: {io.fault_line(cfg['storage_root'], *fault)}")
        why = network_cause(e)
        if why is not None:  # a host that does not resolve, refuses, does not answer: the place, not our code
            _to_log_file(f"{label} failed:\n{traceback.format_exc()}")  # the details, for trajsft logs
            _exit_in_one_line(f"{label}: {type(e).__name__}: {why}")
        log.error("%s failed:\n%s", label, traceback.format_exc())
        raise
    art = job.artifact
    if art is not None and entry.manifest:
        manifest = {
            "kind": art.kind, "name": art.name, "hash": art.hash, "location": art.location,
            "hash_inputs": art.inputs, "seconds": round(time.time() - started, 3), **result,
        }
        if is_remote(art.location):
            io.write_bytes(f"{art.location}/manifest.json", json.dumps(manifest, indent=2).encode())
        write_json(snakemake.output[0], manifest)
    # this process's own CPU (children not included: a train_lm child has its own log)
    log.info("%s done in %.1fs (rule process: %.2f CPU-s)", label.removeprefix("trajsft "), time.time() - started,
             _cpu_seconds())


def _stop_note(entry: Entry, job) -> Optional[str]:
    try:
        return entry.stop_note(job) if entry.stop_note else None
    except Exception:  # noqa: BLE001 - a note, never a second failure on the way out
        return None


def _exit_in_one_line(msg: str, linked_rule_log: str | None = None) -> None:
    """A user error: its line to the rule's log file and, once, to stderr; exit 1. ``linked_rule_log``: a
    training's rule log, a link to the run's whole training log (the executor's process_log, trajsft.executor), which
    Snakemake shows on a failure when asked (--show-failed-logs; trajsft's profiles do not): for a storage fault it
    becomes the one line instead (the
    training's log, named in the line, keeps everything; the next attempt links the rule log again)."""
    _say_once(msg, linked_rule_log)
    sys.exit(1)


def _say_once(msg: str, linked_rule_log: str | None = None) -> None:
    """``msg`` to the rule's log file and, once and bare, to stderr; a linked rule log becomes the line."""
    from . import logs

    _to_log_file(msg)  # stderr gets the line once, below, bare
    with contextlib.suppress(OSError):
        print(logs.redact(msg), file=sys.stderr)
        if linked_rule_log and os.path.islink(linked_rule_log):
            os.unlink(linked_rule_log)
            Path(linked_rule_log).write_text(msg + "\n")


def _to_log_file(msg: str) -> None:
    """``msg`` as an ERROR record to the rule's log file only (not the terminal)."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, msg, None, None)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.handle(record)
