"""A resumable local ``train_lm`` run: prepare the run dir, lock it, launch, resume, collect the result.

``run_training(config_dict, run_dir, log_path, env=None, ...) -> dict`` runs ``train_lm`` in a
killable subprocess (:mod:`trajsft.train.launch`), skips relaunching finished runs, guarantees a
final trainer checkpoint and a final HF export (:mod:`trajsft.train.hf_export`), and parses loss
values back from the log (:mod:`trajsft.train.metrics`).

Step numbering (Levanter convention, important when reading paths):
after ``N`` optimizer steps the trainer state has ``step == N`` but hooks see the 0-based
index of the last completed step, ``N - 1``; checkpoints and HF exports are written to
``.../step-{N-1}`` and ``metadata.json`` says ``"step": N-1``.  Resuming from ``step-K``
restores ``state.step == K + 1`` and Levanter logs "Resuming training from step K+1".
Metrics (``train/loss``) are logged with the 0-based step index.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import os
from typing import Mapping, Optional

from ..data.cache import split_finished
from ..errors import JobEnvironmentError, SingleProcessOnPod, TrainingFailed
from ..io import is_remote, write_json
from ..logs import last_exception
from .checkpoints import CUT_OFF, hf_export_complete, latest_checkpoint, set_aside_cut_checkpoints
from .hf_export import chat_template_of, write_chat_template, export_hf
from .launch import TRAIN_CHILD, exit_reason, run_subprocess, levanter_env
from .levanter_config import plain_data, resolve_hub_refs, write_config
from .metrics import eval_losses, LAUNCH_MARK, loss_history, read_metrics
from .progress import Progress, shown_while
from . import tracking


_RESULT_FILE = "training_result.json"
_CONFIG_FILE = "levanter_config.yaml"


@contextlib.contextmanager
def _run_lock(run_dir: str):
    import fcntl

    path = os.path.join(run_dir, ".trajsft_training.lock")
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrainingFailed(f"another run_training holds {path}: a training of this run is still running") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_reference_checkpoint(cfg: dict) -> None:
    """For random-init models Levanter's HF export still needs ``reference_checkpoint`` (it copies
    ``architectures`` from its config.json, going to the Hub if it is not a local dir). Create a
    minimal local one if the configured local path has none."""
    if cfg.get("initialize_from_hf"):
        return
    ref = cfg["model"].get("reference_checkpoint")
    if not ref or is_remote(ref):
        return
    if not (os.path.isabs(ref) or ref.startswith(".")):
        # looks like a hub repo id; leave it alone
        if not os.path.exists(ref):
            return
    cfg_path = os.path.join(ref, "config.json")
    if os.path.exists(cfg_path):
        return
    write_json(cfg_path, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, indent=1, sort_keys=False, end="")


def _check_caches(cfg: dict) -> None:
    data = cfg["data"]
    entries = list(data["configs"].values()) if "configs" in data else [data]
    for e in entries:
        d = os.path.join(e["cache_dir"], "train")
        if not split_finished(d) and not e.get("train_urls"):
            raise FileNotFoundError(
                f"no finished Levanter cache at {d} (and no train_urls to build one); run build_chat_cache first"
            )


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A train_lm config made ready to launch in ``run_dir``, and where its outputs go."""

    cfg: dict
    run_dir: str
    num_steps: int
    checkpoint_dir: str
    hf_base: str

    @property
    def final_hf(self) -> str:
        return os.path.join(self.hf_base, f"step-{self.num_steps - 1}")

    @property
    def levanter_log(self) -> str:
        """Levanter's own log file (it appends ".log" twice), appended across launches."""
        tr = self.cfg["trainer"]
        return os.path.join(tr["log_dir"], f"{tr['id']}.log.log")

    def complete(self) -> Optional[dict]:
        """The final trainer checkpoint if the run already covers ``num_steps`` (else None)."""
        ckpt = latest_checkpoint(self.checkpoint_dir)
        return ckpt if ckpt is not None and ckpt["completed_steps"] >= self.num_steps else None


def prepare_run(config_dict: Mapping, run_dir: str, log_dir: Optional[str] = None) -> PreparedRun:
    """Normalise a train_lm config for a launch whose local files (logs, W&B, generated tiny-model
    reference) live in ``run_dir``; checkpoints and HF exports go where the config says."""
    cfg = copy.deepcopy(plain_data(config_dict))
    tr = cfg["trainer"]
    run_dir = os.path.abspath(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    # Levanter's log file is a plain logging.FileHandler: it must be local (a gs:// log_dir would
    # silently become a local directory called "gs:"). Same for the generated tiny-model reference.
    if log_dir:
        tr["log_dir"] = os.path.abspath(log_dir)
    elif not tr.get("log_dir") or is_remote(str(tr["log_dir"])):
        tr["log_dir"] = os.path.join(run_dir, "logs")
    ref = cfg["model"].get("reference_checkpoint") or ""
    if not cfg.get("initialize_from_hf") and is_remote(ref) and ref.rstrip("/").endswith("/hf_reference"):
        cfg["model"]["reference_checkpoint"] = os.path.join(run_dir, "hf_reference")
    ckpt_dir = tr["checkpointer"]["base_path"]
    hf_base = cfg.get("hf_save_path")
    if not hf_base:
        raise ValueError("config has no hf_save_path")
    if tr["checkpointer"].get("append_run_id_to_base_path", True):
        ckpt_dir = os.path.join(ckpt_dir, tr["id"])
        hf_base = os.path.join(hf_base, tr["id"])
    return PreparedRun(cfg, run_dir, int(tr["num_train_steps"]), ckpt_dir, hf_base)


def collect_result(run: PreparedRun, log_path: str, ckpt: dict, *, launched: bool, returncode: Optional[int],
                   config_path: str) -> dict:
    """``training_result.json`` of a run from its launch log and Levanter's own log."""
    metrics = read_metrics(log_path)
    # Levanter's own log file is appended across launches and has every metric line even if
    # log_path was rotated; prefer its steps.
    lev_metrics = read_metrics(run.levanter_log)
    if len(lev_metrics["steps"]) >= len(metrics["steps"]):
        metrics["steps"] = lev_metrics["steps"]
    history = loss_history(metrics)
    final_loss = None
    for s, loss in history:
        if s == run.num_steps - 1:
            final_loss = loss
    resumed_from = None
    if launched:
        train_launches = [x for x in metrics["launches"] if x["kind"] == "train_lm"]
        launch = train_launches[-1] if train_launches else {}
        resumed_from = launch.get("resumed_from_step")
        if resumed_from is None:
            resumed_from = launch.get("first_step") or 0
    return {
        "run_id": run.cfg["trainer"]["id"],
        "steps": int(ckpt["completed_steps"]),
        "final_loss": final_loss,
        "checkpoint_dir": ckpt["path"],
        "hf_export": run.final_hf,
        "resumed_from_step": resumed_from,
        "launched": launched,
        "returncode": returncode,
        "eval_loss": eval_losses(metrics),
        "loss_history": history,
        "config_path": config_path,
        "log_path": log_path,
    }



def _last_launch(log_path: str) -> str:
    """What the last launch in the training log ``log_path`` wrote ("" if it cannot be read)."""
    try:
        with open(log_path, errors="replace") as f:
            return f.read().rsplit(LAUNCH_MARK, 1)[-1]
    except OSError:
        return ""


def launch_cause(log_path: str) -> Optional[str]:
    """The W&B line (:mod:`trajsft.train.tracking`) the last launch in ``log_path`` ended with, if any."""
    line = tracking.line_of(_last_launch(log_path))
    return f"W&B: {line}" if line else None


def child_cause(log_path: str) -> str:
    """`` (<the exception>)`` the last launch in ``log_path`` died of (:func:`trajsft.logs.last_exception`), else
    ``""``: the cause in the training's one line, as the log is not echoed on the terminal."""
    raised = last_exception(_last_launch(log_path))
    return f" ({raised})" if raised else ""


def refuse_single_process_on_pod(env: Optional[Mapping[str, str]] = None, get=None) -> None:
    """Fail fast where a single train_lm would hang: on a host of a multi-host slice, jax.distributed
    auto-detects every host of the slice and waits for processes nobody started. The host knows its
    slice as a TPU VM does (:func:`trajsft.gce.tpu_identity`: the GCE metadata server, or ``TPU_*``)."""
    from .. import gce

    ident = gce.tpu_identity(env, get or gce.metadata)
    if ident.num_hosts > 1:
        raise SingleProcessOnPod(
            f"this is worker {'?' if ident.worker_id is None else ident.worker_id} of the {ident.num_hosts}-host "
            f"TPU slice {ident.slice_name or '?'} ({ident.accelerator_type or '?'}): one training process alone "
            "would wait for the other hosts and time out; training runs one process per host through the "
            "trajsft.cluster.entrypoint driver (Levanter's run_on_pod), which must not be pinned to a "
            "TPU-<type>-head resource"
        )


def run_training(
    config_dict: Mapping,
    run_dir: str,
    log_path: str,
    env: Optional[Mapping[str, str]] = None,
    *,
    timeout: Optional[float] = None,
    export_chat_template: bool = True,
    progress: Optional[str] = None,
) -> dict:
    """Run (or resume, or just verify) a Levanter ``train_lm`` run.

    1. Writes the config to ``<run_dir>/levanter_config.yaml`` and checks the data caches exist.
    2. If the latest checkpoint (see ``latest_checkpoint``) already covers ``num_train_steps``
       the run is complete and NOT relaunched (Levanter would exit 1: "No training steps were
       executed"). Otherwise launches ``train_lm`` (same code as ``python -m
       levanter.main.train_lm --config_path <yaml>``) in a subprocess, stdout+stderr appended to
       ``log_path``; killing it (even SIGKILL) is safe: relaunching resumes from the latest
       checkpoint (same ``trainer.id`` + checkpoint path), data position included. The child sets
       PR_SET_PDEATHSIG so it dies with the launching process; if run_training itself is
       interrupted (KeyboardInterrupt / timeout) it terminates the child. ``run_dir`` must be
       local (logs, lock file, W&B dir); checkpoints / HF exports may be on gs://.
    3. Afterwards it requires a trainer checkpoint at the final step (guaranteed by the keep
       policy of ``train_lm_config_for``) and ensures a complete HF export at ``<hf_dir>/step-{N-1}``;
       if it is missing / incomplete (e.g. killed during the export) it is re-exported from the
       final checkpoint (``export_hf``). With ``export_chat_template`` the export's tokenizer gets
       the training chat template.
    4. Parses losses from ``log_path`` (json_logger lines), writes
       ``<run_dir>/training_result.json`` and returns it:

       ``{"steps": N (completed optimizer steps), "final_loss": train/loss of the last step,
       "checkpoint_dir": final trainer checkpoint, "hf_export": final HF export dir,
       "resumed_from_step": completed steps this launch started from (0 = fresh start, None = not
       launched), "launched": bool, "returncode": int|None, "eval_loss": {...}, "loss_history":
       [[step, loss], ...], "config_path", "log_path"}``
    """
    refuse_single_process_on_pod()
    run = prepare_run(config_dict, run_dir)
    cfg, tr, N = run.cfg, run.cfg["trainer"], run.num_steps
    run_dir, ckpt_dir, final_hf = run.run_dir, run.checkpoint_dir, run.final_hf
    log_path = os.path.abspath(log_path)

    with _run_lock(run_dir):
        config_path = write_config(resolve_hub_refs(cfg), os.path.join(run_dir, _CONFIG_FILE))
        ensure_reference_checkpoint(cfg)

        for cut in set_aside_cut_checkpoints(ckpt_dir):
            print(f"[trajsft] {cut}: its metadata.json was cut off mid-save (killed while saving): set aside "
                  f"as {CUT_OFF}, resuming from the checkpoint before", flush=True)
        ckpt = latest_checkpoint(ckpt_dir)
        launched = False
        rc: Optional[int] = None
        if ckpt is None or ckpt["completed_steps"] < N:
            _check_caches(cfg)
            launched = True
            header = (
                f"{LAUNCH_MARK} train_lm id={tr['id']} at {_dt.datetime.now().isoformat()} "
                f"(latest checkpoint: {ckpt['path'] if ckpt else None})"
            )
            # ``progress``: the label of a line on this process's stderr at a bounded rate (train/progress.py)
            with shown_while(Progress(progress, log_path, N)) if progress else contextlib.nullcontext():
                rc = run_subprocess(
                    [*TRAIN_CHILD, "--config_path", config_path],
                    log_path,
                    levanter_env(run_dir, {**tracking.child_env(cfg), **(env or {})}),
                    run_dir,
                    header,
                    timeout=timeout,
                )
            if rc == tracking.EXIT_CODE:  # W&B refused the run: every relaunch would be refused the same way
                raise JobEnvironmentError(launch_cause(log_path) or "train_lm could not start its W&B run")
            ckpt = latest_checkpoint(ckpt_dir)
            if ckpt is None or ckpt["completed_steps"] < N:
                got = ckpt["completed_steps"] if ckpt else 0
                why = (
                    exit_reason(rc) + child_cause(log_path)
                    if rc != 0
                    else "train_lm exited 0 before num_train_steps (data exhausted? check epochs / num_train_steps)"
                )
                raise TrainingFailed(f"{why}; latest checkpoint covers {got}/{N} steps. See {log_path}")
            # rc != 0 with a final checkpoint: crashed after the last step (e.g. in the HF export or
            # tracker shutdown); we repair the export below.

        if not hf_export_complete(final_hf):
            export_hf(cfg, ckpt["path"], final_hf, env=env, log_path=log_path, cwd=run_dir)
        if export_chat_template and not is_remote(final_hf):
            tmpl = chat_template_of(cfg)
            if tmpl:
                write_chat_template(final_hf, tmpl)

        result = collect_result(run, log_path, ckpt, launched=launched, returncode=rc, config_path=config_path)
        write_json(os.path.join(run_dir, _RESULT_FILE), result, indent=1, sort_keys=False, end="")
        return result
