"""Entrypoint of the training Ray job: a light driver on a CPU node of the cluster.

``python -m trajsft.cluster.entrypoint --config <run_dir>/levanter_config.json --run-dir <run_dir>
--attempt N --tpu-type v5p-32 [--num-slices 1] [--max-preemptions 100] [--max-failures 2]``

The driver holds no TPU. It gets a slice through Levanter's ``run_on_pod`` and runs one
``train_lm`` process on every host of it (:mod:`trajsft.cluster.host`); a lost host or slice
starts a new attempt on the next slice, resuming from the latest checkpoint of the same run
(:mod:`trajsft.cluster.slices`). Every slice attempt goes into ``attempts.json`` under the
Snakemake attempt that submitted this job. When the run is complete the driver checks the final HF
export (written on the slice by Levanter's own hook) and, if a kill interrupted it, rewrites it as a
single-process CPU step on a node whose declared memory fits it, never on the head
(:mod:`trajsft.cluster.export_node`). The driver alone writes ``<run_dir>/training_result.json``.
Its output is the job log: the primary host's ``train_lm`` log (each line once, see ``host._tee``)
and this driver's lines, never files other programs leave in /tmp/tpu_logs
(:func:`only_our_workers_in_the_job_log`).

Secrets arrive in this process's environment through the secret bundle (see
:mod:`trajsft.cluster.secrets`); the driver deletes the bundle from the cluster's KV store at once and
hands the values to the hosts through an actor on its own node.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile

from ..errors import JobEnvironmentError
from ..io import is_remote, join  # stdlib only: every other module of ours is imported once the bundle is gone
from .setup_failure import MARK  # stdlib only, too

log = logging.getLogger("trajsft")

SECRETS_URI_ENV = "TRAJSFT_SECRETS_URI"  # set by the secret wrapper: the bundle's package URI
SECRET_NAMES_ENV = "TRAJSFT_SECRET_NAMES"  # set by the secret wrapper: the names it delivered


def absolute_local_refs(cfg: dict) -> None:
    """Local tokenizer paths come relative to the job's working dir (the uploaded workflow)."""
    for section in ("data", "model"):
        ref = cfg.get(section, {}).get("tokenizer")
        if isinstance(ref, str) and not is_remote(ref) and os.path.exists(ref):
            cfg[section]["tokenizer"] = os.path.abspath(ref)


def delete_secret_bundle() -> bool:
    """Remove the secret package from the cluster's KV store (the values are in our env now)."""
    uri = os.environ.pop(SECRETS_URI_ENV, None)
    if not uri:
        return False
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_exists

    _internal_kv_del(uri)
    if _internal_kv_exists(uri):
        raise RuntimeError("could not delete the secret bundle from the cluster's KV store")
    print("[trajsft.remote_train] secret bundle read and deleted from the cluster's KV store", flush=True)
    return True


def forwarded_secrets() -> dict[str, str]:
    names = [n for n in (os.environ.get(SECRET_NAMES_ENV) or "").split(",") if n]
    return {n: os.environ[n] for n in names if n in os.environ}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _record(run_dir: str, attempt: int):
    from ..runtime import provenance

    def progress(slice_attempts: list[dict]) -> None:
        preempted = sum(a["outcome"] == "preempted" for a in slice_attempts)
        failed = sum(a["outcome"] == "failed" for a in slice_attempts)
        provenance.update_attempt(run_dir, attempt, slice_attempts=slice_attempts, preemptions=preempted,
                                  failures=failed)
    return progress


def _from_a_worker(handle):
    def handle_worker_lines(data: dict) -> None:
        if not data.get("pid") and not data.get("job"):
            return
        handle(data)

    handle_worker_lines.__wrapped__ = handle
    return handle_worker_lines


def only_our_workers_in_the_job_log() -> None:
    """Keep lines no worker wrote out of this driver's output (the job log). Every Ray node's log
    monitor also publishes files that are not a worker's, with neither a pid nor a job: the libtpu logs
    in /tmp/tpu_logs (``$TPU_LOG_DIR``), which Ray symlinks into its log dir, so each line comes once
    per file name that reaches it (``tpu_driver.INFO`` and its target) and once per node on the
    machine, whichever program wrote it; and ``gcs_server.err``. Ray has no switch for this, so the
    driver's log handler (``ray_print_logs`` of Ray's stdstream dispatcher) skips those records;
    worker output (our host tasks' ``train_lm`` log) and the autoscaler's events pass unchanged."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    with dispatcher._lock:
        dispatcher.handlers = [(name, _from_a_worker(h) if name == "ray_print_logs" and not hasattr(h, "__wrapped__")
                                else h) for name, h in dispatcher.handlers]


def main(argv: list[str] | None = None) -> int:
    """The driver; a job whose environment cannot train ends with one :data:`setup_failure.MARK` line and
    exit code 3 (the Snakemake side reads that line: a configuration error, not resubmitted)."""
    try:
        return _main(argv)
    except JobEnvironmentError as e:
        print(f"{MARK} {e}", flush=True)
        return 3


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trajsft.cluster.entrypoint")
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--attempt", type=int, required=True, help="the Snakemake-side attempt in attempts.json")
    ap.add_argument("--tpu-type", required=True)
    ap.add_argument("--num-slices", type=int, default=1)
    ap.add_argument("--max-preemptions", type=int, default=100)
    ap.add_argument("--max-failures", type=int, default=2)
    ap.add_argument("--export-memory-gib", type=float, default=None,
                    help="memory the fallback HF export asks for (default: estimated from the checkpoint)")
    ap.add_argument("--failure-grace", type=float, default=90.0,
                    help="seconds a host whose trainer failed waits for news of a lost peer before calling it a failure")
    ap.add_argument("--stall-seconds", type=float, default=1800.0,
                    help="seconds a host's trainer may write nothing to its log before it is killed as hung and the "
                         "slice attempt retried (0: never)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[trajsft.remote_train] %(message)s", stream=sys.stdout)

    import ray

    ray.init(logging_level="WARNING")
    delete_secret_bundle()  # first: a driver that cannot go on leaves no secret in the cluster
    here = f"the driver on {socket.gethostname()}"
    try:
        from .. import io
        from ..train import checkpoints, hf_export, run as train_run
        from . import export_node, hooks, requirements, setup_failure, slices
        from .host import HostJob
    except ImportError as e:  # the job's environment lacks a package: a configuration error, in one line
        raise JobEnvironmentError(f"{here}: {type(e).__name__}: {e}") from None
    only_our_workers_in_the_job_log()
    hooks.setup()
    setup_failure.check_installed(here, requirements.REPO_DIR / requirements.OUT)
    channel = slices.driver_channel(forwarded_secrets())

    cfg = json.loads(io.read_bytes(args.config))
    absolute_local_refs(cfg)
    work = args.run_dir if not is_remote(args.run_dir) else tempfile.mkdtemp(prefix="trajsft-driver-")
    run = train_run.prepare_run(cfg, work)
    progress = _record(args.run_dir, args.attempt)

    def checkpoint_step():
        ck = checkpoints.latest_checkpoint(run.checkpoint_dir)
        return ck["completed_steps"] if ck else None

    def make_job(tag: str) -> HostJob:
        for cut in checkpoints.set_aside_cut_checkpoints(run.checkpoint_dir):  # before any host's Levanter looks
            print(f"[trajsft.remote_train] {cut}: its metadata.json was cut off mid-save: set aside as "
                  f"{checkpoints.CUT_OFF}, resuming from the checkpoint before", flush=True)
        return HostJob(levanter=cfg, run_dir=args.run_dir, attempt_tag=tag, coordinator_port=_free_port(),
                       channel=channel, num_slices=args.num_slices, failure_grace_s=args.failure_grace,
                       stall_s=args.stall_seconds or None)

    host_results: list[dict] = []
    ckpt = run.complete()
    if ckpt is None:
        host_results, _ = slices.run_on_slices(
            make_job, args.tpu_type, num_slices=args.num_slices,
            limits=slices.Limits(args.max_preemptions, args.max_failures), channel=channel,
            tag_prefix=f"a{args.attempt}-", progress=progress, checkpoint_step=checkpoint_step)
        ckpt = run.complete()
        if ckpt is None:
            got = checkpoint_step() or 0
            raise SystemExit(f"[trajsft.remote_train] every host finished but the latest checkpoint covers "
                             f"{got}/{run.num_steps} steps (data exhausted? check epochs / max_steps)")
    else:
        print(f"[trajsft.remote_train] run already complete at step {ckpt['completed_steps']}: not relaunched",
              flush=True)
    if not checkpoints.hf_export_complete(run.final_hf):
        # the slice's own export was interrupted: a single-process CPU step on a node whose memory fits it, never
        # on the head (this driver's node) and never as one host of a pod
        need = int(args.export_memory_gib * 2**30) if args.export_memory_gib else \
            export_node.memory_needed(ckpt["path"])
        export_node.export_on_a_node(run.cfg, ckpt["path"], run.final_hf, need=need,
                                     work_dir=None if is_remote(args.run_dir) else work)
    tmpl = hf_export.chat_template_of(run.cfg)
    if tmpl and not is_remote(run.final_hf):
        hf_export.write_chat_template(run.final_hf, tmpl)
    primary = next((h["result"] for h in host_results if "result" in h), None)
    result = primary or {"run_id": run.cfg["trainer"]["id"], "final_loss": None, "launched": False,
                         "resumed_from_step": None, "loss_history": []}
    result.update(steps=int(ckpt["completed_steps"]), checkpoint_dir=ckpt["path"], hf_export=run.final_hf,
                  hosts=[{k: h[k] for k in ("slice", "worker", "slice_id", "seconds")} for h in host_results])
    result["wandb_mode"] = next((t.get("mode") for t in run.cfg["trainer"].get("tracker") or []
                                 if t.get("type") == "wandb"), None)
    io.write_bytes(join(args.run_dir, "training_result.json"), json.dumps(result, indent=2).encode())
    print("[trajsft.remote_train] result " + json.dumps(
        {k: result.get(k) for k in ("steps", "final_loss", "hf_export", "resumed_from_step")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
