"""Entrypoint of the training Ray job (runs on the TPU slice head).

``python -m trajsft.remote_train --config <run_dir>/levanter_config.json --run-dir <run_dir>``

Runs :func:`trajsft.levanter_run.run_training` (which resumes from the latest checkpoint
in ``<run_dir>/checkpoints``, or does nothing if the run is already complete), streams the
Levanter log to stdout (which Ray captures as the job log, and the submitting Snakemake
job streams into its ``log:`` file), and writes ``<run_dir>/training_result.json``.
The run dir may be local or ``gs://``; Levanter reads/writes gs:// natively.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

from . import levanter_run as LR
from . import storage
from .config import is_remote, join

ALLOW_CPU_ENV = "TRAJSFT_ALLOW_CPU_TRAINING"  # set on a test Ray head only, never by a profile


def _tee(path: str, stop: threading.Event) -> None:
    """Copy what run_training appends to ``path`` onto stdout as it arrives."""
    pos = 0
    while True:
        done = stop.is_set()
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        if done:
            return
        time.sleep(0.5)


def _absolute_local_refs(cfg: dict) -> None:
    """Local tokenizer paths come relative to the job's working dir (the uploaded workflow)."""
    for section in ("data", "model"):
        ref = cfg.get(section, {}).get("tokenizer")
        if isinstance(ref, str) and not is_remote(ref) and os.path.exists(ref):
            cfg[section]["tokenizer"] = os.path.abspath(ref)


def _cpu_backend() -> bool:
    import jax

    return jax.default_backend() == "cpu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trajsft.remote_train")
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args(argv)
    cfg = json.loads(storage.read_bytes(args.config))
    _absolute_local_refs(cfg)
    node_wandb_mode = os.environ.get("WANDB_MODE")
    if node_wandb_mode in ("offline", "disabled"):  # a node without internet access can force it
        for t in cfg["trainer"].get("tracker") or []:
            if t.get("type") == "wandb" and t.get("mode") != node_wandb_mode:
                print(f"[trajsft.remote_train] WANDB_MODE={node_wandb_mode} on this node: W&B {node_wandb_mode}", flush=True)
                t["mode"] = node_wandb_mode
    if os.environ.get(ALLOW_CPU_ENV) == "1" and _cpu_backend():
        print(f"[trajsft.remote_train] {ALLOW_CPU_ENV}=1 and no accelerator: training on CPU", flush=True)
        cfg["trainer"]["require_accelerator"] = False
    # run_training keeps its own small files (config copy, log, W&B dir) on local disk;
    # checkpoints and HF exports go wherever the config says (the run dir, possibly gs://)
    work = args.run_dir if not is_remote(args.run_dir) else tempfile.mkdtemp(prefix="trajsft-run-")
    log_path = os.path.join(work, f"job-{os.environ.get('RAY_JOB_SUBMISSION_ID', os.getpid())}.log")
    stop = threading.Event()
    tee = threading.Thread(target=_tee, args=(log_path, stop), daemon=True)
    tee.start()
    try:
        result = LR.run_training(cfg, work, log_path)
    finally:
        stop.set()
        tee.join(timeout=30)
    result["wandb_mode"] = next((t.get("mode") for t in cfg["trainer"].get("tracker") or [] if t.get("type") == "wandb"), None)
    storage.write_bytes(join(args.run_dir, "training_result.json"), json.dumps(result, indent=2).encode())
    print("[trajsft.remote_train] result " + json.dumps({k: result.get(k) for k in ("steps", "final_loss", "hf_export", "resumed_from_step")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
