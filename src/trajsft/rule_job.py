"""The rule-job harness: every rule's script (``scripts/rule.py``) calls :func:`run_rule`, which runs the job's
step with logging, stop handling, user errors as one line and the artifact's manifest. An artifact's step
function comes from its kind's record (:data:`trajsft.plan.kinds.REGISTRY`); the two steps that write no artifact
are ``cluster.check_fit.check_fit`` (rule check_fit) and ``report.matrix.eval_matrix`` (rule eval_matrix), and the report rules
run their own entries (:data:`REPORT_RULES`)."""

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
from pathlib import Path

from . import io, storage
from .data import transform
from .errors import RULE_JOB_ERRORS, StorageFault
from .io import is_remote, write_json
from .runtime import signals
from .plan import step_configs
from .plan.kinds import BY_RULE, function  # function: "module:function", importing only that module


log = logging.getLogger("trajsft")



# ---- rule entry point -------------------------------------------------------------------
FIT = "trajsft.cluster.check_fit:check_fit"  # rule check_fit: no artifact, the summary is the output
EVAL = "trajsft.report.matrix:eval_matrix"  # rule eval_matrix: the matrix files are the outputs
# the report rules get no Step: their entries read the job's inputs and params
REPORT_RULES = {"report_card": "trajsft.report.build:rule_card", "report_table": "trajsft.report.build:rule_table",
                "report_curves": "trajsft.report.curves:rule_curves",
                "report_actions": "trajsft.report.actions:rule_actions", "sweep": "trajsft.report.sweeps:rule_sweep"}


def _shards_skipped_listing(cfg: step_configs.ShardConfig) -> None:
    """A shard set found sealed (here or under another root): its skipped rows next to its manifest."""
    src = io.join(cfg.location, "skipped.jsonl")
    if str(cfg.skipped_list) != src:
        io.write_bytes(cfg.skipped_list, io.read_bytes(src))


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_rule(snakemake) -> None:
    """The one entry of every rule job (``scripts/rule.py``): runs the job's step; user errors become one line,
    exit 1; SIGINT/SIGTERM or a vanished Snakemake end it as stopped, nothing marked complete.

    The step comes from ``snakemake.params.step`` (a :class:`trajsft.plan.step.Step` that rules/common.smk
    resolved once from the workflow's plan); an artifact's manifest goes to ``snakemake.output``. The report
    rules, which get no step, run their own entry (:data:`REPORT_RULES`).
    """
    from . import logs

    if snakemake.rule in REPORT_RULES:
        logs.setup(snakemake.log[0] if snakemake.log else None, snakemake.config.get("log_level", "INFO"))
        function(REPORT_RULES[snakemake.rule])(snakemake)
        return
    job = snakemake.params.step
    step, name, plan = job.step, job.name, job.plan
    cfg = plan.cfg
    label = f"trajsft {step} {name}".rstrip()
    log_path = snakemake.log[0] if snakemake.log else None
    if step == "train":
        from .train import target as train_target  # never jax/levanter: train_lm runs in a child
    if step == "train" and log_path:
        log_path = train_target.link_rule_log(BY_RULE[step].resolve(plan, name), log_path)
    logs.setup(log_path, cfg.get("log_level", "INFO"))
    # die with our Snakemake run (even after `kill -9` of Snakemake), cleaning up like on SIGTERM
    signals.install_stop_handler()
    detach = step == "train" and cfg.get("executor") == "ray"  # the Ray job lives on: a rerun re-attaches
    signals.watch_snakemake(on_gone=train_target.detach_from_ray_job if detach else None, log_path=log_path)
    # the matrix reads every row's provenance: a run deleted by hand is the user's to rebuild
    user_errors = (*transform.USER_ERRORS, *RULE_JOB_ERRORS) + ((FileNotFoundError,) if step == "eval_matrix" else ())
    started = time.time()
    try:
        result = _run_step(job, snakemake)
    except user_errors as e:
        _exit_in_one_line(f"{label}: {e}", snakemake.log[0] if isinstance(e, StorageFault) and log_path else None)
    except KeyboardInterrupt as e:  # SIGINT, SIGTERM (signals.SnakemakeGone), or our Snakemake died
        msg = f"{label}: stopped ({e or 'SIGINT'}); nothing was marked complete"
        log.error(msg)
        with contextlib.suppress(OSError):
            print(msg, file=sys.stderr)
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
        log.error("%s failed:\n%s", label, traceback.format_exc())
        raise
    art = job.artifact
    if art is not None and step != "train":  # train writes its done marker itself
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


def _exit_in_one_line(msg: str, linked_rule_log: str | None = None) -> None:
    """A user error: its line to the rule's log file and, once, to stderr; exit 1. ``linked_rule_log``: a
    training's rule log, a link to the run's whole training log (trajsft.train.target.link_rule_log), which
    Snakemake shows on a failure (show-failed-logs): for a storage fault it becomes the one line instead (the
    training's log, named in the line, keeps everything; the next attempt links the rule log again)."""
    from . import logs

    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, msg, None, None)
    for h in logging.getLogger().handlers:  # the rule's log file; stderr gets the line once, below, bare
        if isinstance(h, logging.FileHandler):
            h.handle(record)
    print(logs.redact(msg), file=sys.stderr)
    with contextlib.suppress(OSError):
        if linked_rule_log and os.path.islink(linked_rule_log):
            os.unlink(linked_rule_log)
            Path(linked_rule_log).write_text(msg + "\n")
    sys.exit(1)


def _run_step(job, snakemake) -> dict | None:
    """The job's step: an artifact built (or found sealed) through :mod:`trajsft.storage`, a training run, the fit
    summary or the matrix."""
    step, name, plan = job.step, job.name, job.plan
    if step == "check_fit":  # on its target's training config
        result = function(FIT)(BY_RULE["train"].resolve(plan, name))
        write_json(snakemake.output[0], result)
        return result
    if step == "eval_matrix":
        return function(EVAL)(step_configs.eval_matrix(plan), dict(snakemake.output.items()))
    kind = BY_RULE[step]
    cfg, run = kind.resolve(plan, name), kind.step_function()  # the step's typed config, resolved once
    if step == "train":
        on_ray = None
        if plan.cfg.get("executor") == "ray":
            from .cluster.submit import train_on_ray as on_ray
        return storage.train(plan, job.artifact, lambda: run(cfg, done_path=snakemake.output[0], on_ray=on_ray))
    if step == "eval_actions" and plan.cfg.get("executor") == "ray":  # a Ray job on a single-host slice
        from .report.actions_job import submit

        return storage.build(plan, job.artifact, lambda: submit(cfg, snakemake.log[0]))
    result = storage.build(plan, job.artifact, lambda: run(cfg))
    if step == "shard" and result["payload_from"] != "built":
        _shards_skipped_listing(cfg)
    if step == "export":  # every row the sharegpt export could not hold, next to the manifest (like shard's)
        io.write_bytes(str(Path(snakemake.output[0]).parent / "skipped.jsonl"),
                       io.read_bytes(f"{job.artifact.location}/llamafactory/skipped.jsonl"))
        log.info("export %s: %d llamafactory skip(s): %s", name, result["llamafactory"]["skipped_total"],
                 [s["reason"] for s in result["llamafactory"]["skipped_examples"]])
    return result
