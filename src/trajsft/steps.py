"""The rule-job harness of the rules download, shard, tokenize, download_model, check_fit and train: their
scripts call :func:`run_rule`, which runs one step (``data.download``, ``data.shard``, ``data.tokenize``,
``train.model_snapshot``, ``cluster.fit_step``, ``train.step``) with logging, stop handling, user errors as one
line and the artifact manifest. The export and eval_matrix rules have entries of their own
(:func:`trajsft.data.export.run_rule`, :func:`trajsft.report.matrix.rule_eval`)."""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import signal
import sys
import time
import traceback
from typing import Callable

from . import io, storage
from .data import transform
from .io import is_remote, write_json
from .runtime import signals
from .plan.config import Plan


log = logging.getLogger("trajsft")



# ---- rule entry point -------------------------------------------------------------------
def _step_function(step: str) -> Callable[[Plan, str], dict]:
    """The step's function, importing only its own module (a rule job pays no other step's imports)."""
    if step == "download":
        from .data.download import download

        return download
    if step == "shards":
        from .data.shard import shards

        return shards
    if step == "tokenize":
        from .data.tokenize import tokenize

        return tokenize
    if step == "model":
        from .train.model_snapshot import snapshot

        return snapshot
    if step == "fit":
        from .cluster.fit_step import fit

        return fit
    raise ValueError(f"unknown step {step!r}")


def _shards_skipped_listing(plan: Plan, name: str) -> None:
    """A shard set found sealed (here or under another root): its skipped rows next to its manifest."""
    from .data.shard import skipped_path

    src = io.join(plan.get("shards", name).location, "skipped.jsonl")
    if str(skipped_path(plan, name)) != src:
        io.write_bytes(skipped_path(plan, name), io.read_bytes(src))


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_rule(snakemake) -> None:
    """Run one step for a Snakemake ``script:`` job; user errors become one line, exit 1.

    The step comes from ``snakemake.params.step`` (a :class:`trajsft.plan.step.Step` that
    rules/common.smk resolved once from the workflow's plan); the result goes to ``snakemake.output``.
    """
    from . import logs

    job = snakemake.params.step
    step, name, plan = job.step, job.name, job.plan
    cfg = plan.cfg
    log_path = snakemake.log[0] if snakemake.log else None
    if step == "train":
        from .train import step as train_step  # never jax/levanter: train_lm runs in a child
    if step == "train" and log_path:
        log_path = train_step.link_rule_log(plan, name, log_path)
    logs.setup(log_path, cfg.get("log_level", "INFO"))
    # die with our Snakemake run (even after `kill -9` of Snakemake), cleaning up like on SIGTERM
    signals.install_stop_handler()
    detach = step == "train" and cfg.get("executor") == "ray"  # the Ray job lives on: a rerun re-attaches
    signals.watch_snakemake(on_gone=train_step.detach_from_ray_job if detach else None, log_path=log_path)
    started = time.time()
    try:
        if step == "train":
            on_ray = None
            if cfg.get("executor") == "ray":
                from .cluster.submit import train_on_ray as on_ray
            result = storage.train(plan, job.artifact,
                                   lambda: train_step.train(plan, name, done_path=snakemake.output[0], on_ray=on_ray))
        elif step == "fit":  # no artifact: the summary is the output
            result = _step_function(step)(plan, name)
            write_json(snakemake.output[0], result)
        else:
            result = storage.build(plan, job.artifact, lambda: _step_function(step)(plan, name))
            if step == "shards" and result["payload_from"] != "built":
                _shards_skipped_listing(plan, name)
    except transform.USER_ERRORS as e:
        msg = f"trajsft {step} {name}: {e}"
        log.error(msg)
        print(msg, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as e:  # SIGINT, SIGTERM (signals.SnakemakeGone), or our Snakemake died
        msg = f"trajsft {step} {name}: stopped ({e or 'SIGINT'}); nothing was marked complete"
        log.error(msg)
        with contextlib.suppress(OSError):
            print(msg, file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:  # a local Ray's SIGTERM handler is sys.exit(15)
        if e.code != signal.SIGTERM:
            raise
        msg = f"trajsft {step} {name}: stopped (got SIGTERM); nothing was marked complete"
        log.error(msg)
        with contextlib.suppress(OSError):
            print(msg, file=sys.stderr)
        sys.exit(143)
    except Exception:
        log.error("trajsft %s %s failed:\n%s", step, name, traceback.format_exc())
        raise
    if step not in ("train", "fit"):
        art = job.artifact
        manifest = {
            "kind": art.kind, "name": art.name, "hash": art.hash, "location": art.location,
            "hash_inputs": art.inputs, "seconds": round(time.time() - started, 3), **result,
        }
        if is_remote(art.location):
            io.write_bytes(f"{art.location}/manifest.json", json.dumps(manifest, indent=2).encode())
        write_json(snakemake.output[0], manifest)
    # this process's own CPU (children not included: a train_lm child has its own log)
    log.info("%s %s done in %.1fs (rule process: %.2f CPU-s)", step, name, time.time() - started, _cpu_seconds())
