"""Step ``train`` and the plan-to-Levanter-config inputs (``train_lm_config_for``). Imports neither jax nor
Levanter: ``train_lm`` runs in a child process (local) or on the cluster's hosts (Ray)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Protocol

from .. import io, storage
from ..data import template
from ..data.tokenize import cache_dir
from ..errors import DataError, JobEnvironmentError, SnakemakeStopping, StorageFault, TrainingFailed
from ..io import is_remote, join, write_json
from ..runtime import provenance
from ..plan import schedule
from ..plan.config import Artifact
from ..plan.specs import StudentSpec
from ..plan.step_configs import TrainConfig
from .levanter_config import DataSource, RunInputs, WandbSettings, train_lm_config
from .run import run_training

log = logging.getLogger("trajsft")


def train_data(tokenized: Artifact) -> dict:
    """What training needs of a tokenized teacher, from its manifest (no jax/levanter import):
    ``cache_dir``, ``packed_sequences`` (the ``seq_len`` sequences Levanter packs from the train split)
    and ``tokens_in_window`` (train tokens inside the ``seq_len`` windows)."""
    m = tokenized.read_manifest()
    tr = (m.get("stats") or {}).get("train") or {}
    if not tr.get("packed_sequences"):
        raise DataError(f"{tokenized.manifest} has no stats.train.packed_sequences: "
                        "rebuild it (delete the manifest and rerun)")
    return {"cache_dir": m.get("cache_dir") or cache_dir(tokenized.location),
            "packed_sequences": int(tr["packed_sequences"]),
            "tokens_in_window": int(tr["tokens"]) - int(tr.get("tokens_truncated") or 0)}


def explain(cfg: TrainConfig) -> dict:
    """Steps, passes and tokens seen of a target (``schedule.explain``), with whatever is tokenized."""
    spec = cfg.run.spec
    data = {}
    for teacher, tokenized in cfg.tokenized.items():
        try:
            data[teacher] = train_data(tokenized)
        except DataError:
            pass
    return schedule.explain(spec["training"], spec["weights"], spec["rows"], data)


def compilation_cache_dir(cfg: dict) -> str:
    """JAX's persistent compilation cache on the storage root (as marin does): retries, resumes and
    other runs of the same shapes skip compiling. A gs:// root stays a gs:// URL (JAX reads and
    writes it through etils/gcsfs); a local root is made absolute (train_lm runs in the run dir)."""
    root = cfg["storage_root"]
    return join(root if is_remote(root) else os.path.abspath(root), "jax-compilation-cache")


def train_lm_config_for(cfg: TrainConfig, *, accelerator: str | None = None, untokenized_ok: bool = False) -> dict:
    """The full train_lm config of a target (plain dict): its specs mapped by
    :func:`trajsft.train.levanter_config.train_lm_config`, with the step count from the tokenized manifests.

    ``accelerator`` overrides the executor's (``tpu`` on Ray, else ``cpu``). With ``untokenized_ok`` (the
    fit check, which compiles the step before any data exists) a teacher not tokenized yet gets a
    placeholder source: its cache dir and packed count only decide the data loader and the step count,
    never the shapes of the step; a step count that needs them is then a placeholder too."""
    run, spec, target, target_spec = cfg.run, cfg.run.spec, cfg.target, cfg.spec
    workflow, ck = cfg.workflow, cfg.workflow["checkpointing"]
    sources = {}
    for teacher, tokenized in cfg.tokenized.items():
        try:
            d = train_data(tokenized)
        except DataError:
            if not untokenized_ok:
                raise
            d = {"cache_dir": f"<{tokenized.name}: not tokenized yet>", "packed_sequences": spec["rows"][teacher]}
        sources[teacher] = DataSource(cache_dir=d["cache_dir"], packed_sequences=d["packed_sequences"])
    B = int(target_spec.training.batch_size)
    steps = schedule.train_steps(spec["training"], spec["rows"], {t: s.packed_sequences for t, s in sources.items()})
    wandb_project, wandb_entity = wandb_names(workflow)
    # init: hf: its snapshot under the storage root (rule download_model)
    init_weights = storage.absolute(cfg.model.location) if cfg.model else None
    inputs = RunInputs(
        run_id=run.hash,  # W&B run id and trainer id: a retry continues the same run
        run_dir=run.location,
        init_weights=init_weights,
        tokenizer=_tokenizer_ref(cfg, target_spec.student, init_weights),
        chat_template=template.load_template(),
        sources=sources,
        num_train_steps=max(2, steps) if untokenized_ok else steps,
        accelerator=accelerator or cfg.placement.accelerator,
        save_interval=f"{ck['save_interval_minutes']}m",
        keep_every=schedule.resolve_every(ck["keep_every_steps"], spec["rows"], B),
        hf_save_steps=schedule.resolve_every(ck["hf_export_every_steps"], spec["rows"], B),
        hf_save_dtype=ck["hf_save_dtype"],
        watch_interval=int(workflow["wandb"]["watch_interval"]),
        jax_compilation_cache_dir=compilation_cache_dir(workflow),
        # tags: the target, then every content-addressed input as kind:name (W&B filters on them); a sweep's cell:
        # the sweep as its group, and sweep:<name> and each swept value as tags
        wandb=WandbSettings(mode=workflow["wandb"]["mode"], project=wandb_project, entity=wandb_entity,
                            tags=(target, *(f"{kind}:{name}" for kind, name in run.deps), *sweep_tags(workflow, target)),
                            group=next(iter(cell_of(workflow, target)), None)),
    )
    return train_lm_config(target_spec, inputs)


def _tokenizer_ref(cfg: TrainConfig, student: StudentSpec, init_weights: str | None) -> str:
    """The student's tokenizer as the launch reads it: the initial weights' snapshot when it is the
    checkpoint's own (same repo and revision: no host goes to the Hub for it), a local dir (relative to the
    job's working dir on Ray, where it ships with the workflow code), else ``repo@revision``."""
    tokenizer = student.tokenizer
    if init_weights and student.hf_checkpoint is not None and tokenizer.identity() == student.hf_checkpoint.identity():
        return init_weights
    resolved = tokenizer.resolved()
    if cfg.placement.on_cluster and tokenizer.local is not None:
        return os.path.relpath(resolved, cfg.base_dir)
    return resolved


def cell_of(cfg: dict, target: str) -> dict:
    """The sweeps ``target`` is a cell of (its base too, when a cell changes nothing): sweep -> (axis, value)s."""
    from ..plan.sweeps import cells

    return {name: c.values for name, cs in cells(cfg).items() for c in cs if c.target == target}


def sweep_tags(cfg: dict, target: str) -> tuple[str, ...]:
    tags: list[str] = []
    for name, values in cell_of(cfg, target).items():
        tags += [f"sweep:{name}", *(f"{a.removeprefix('training.')}={v}" for a, v in values if a != "target")]
    return tuple(dict.fromkeys(tags))


def wandb_names(cfg: dict) -> tuple[str, str | None]:
    """(project, entity): the config's, else $WANDB_PROJECT / $WANDB_ENTITY (project default "trajsft")."""
    w = cfg["wandb"]
    return (w.get("project") or os.environ.get("WANDB_PROJECT") or "trajsft",
            w.get("entity") or os.environ.get("WANDB_ENTITY"))


def wandb_url(cfg: dict, run_id: str) -> str | None:
    """The run's W&B page (online runs with a known entity); the run id is the content hash."""
    project, entity = wandb_names(cfg)
    if cfg["wandb"]["mode"] != "online" or not entity:
        return None
    return f"https://wandb.ai/{entity}/{project}/runs/{run_id}"


def run_wandb_url(cfg: dict, run_id: str, run_dir: str) -> str | None:
    """The run's W&B page as the server gave it once the run started (:func:`tracking.read_record`), else
    the page the config names (:func:`wandb_url`)."""
    from .tracking import read_record

    rec = read_record(run_dir) if cfg["wandb"]["mode"] == "online" else None
    return rec["url"] if rec else wandb_url(cfg, run_id)


def storage_fault(cfg: TrainConfig, e: BaseException) -> StorageFault | None:
    """The training failed because a place could not be written (the exception says so, or for a local run the
    child's log does): the one-line :class:`StorageFault` naming the storage root, else None."""
    fault = io.write_fault(e)
    if fault is None and isinstance(e, TrainingFailed) and not cfg.placement.on_cluster and os.path.exists(cfg.log):
        cause = io.fault_in_text("\n".join(io.tail(cfg.log, 400)))
        fault = (cause, None) if cause else None
    if fault is None:
        return None
    line = io.fault_line(cfg.workflow["storage_root"], *fault)
    return StorageFault(f"the training could not write: {line} (the training's log: {cfg.log})")


class Trains(Protocol):
    """What :func:`train` needs of an executor (:class:`trajsft.executor.Executor`: it sits above this layer)."""

    def train_attempt(self, cfg: TrainConfig, lev: dict, attempt: int) -> dict: ...


def train_here(cfg: TrainConfig, lev: dict, attempt: int) -> dict:
    """One attempt of ``cfg``'s run on this machine: Levanter in a child process, on the CPU (the local config says
    so: f32, no accelerator required; with libtpu installed, the fit check's compiler, JAX would otherwise try, and
    log, a TPU first); its progress on this process's stderr (the terminal under Snakemake), not in the log."""
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS") or "cpu",
           "TRAJSFT_SAVE_ON_STOP": "1"}  # Ctrl-C saves a checkpoint first (trajsft.train.train_lm_main)
    return run_training(lev, cfg.run.location, cfg.log, env=env, progress=f"trajsft train {cfg.target}")


def check_strict(cfg: TrainConfig) -> None:
    """A strict teacher whose shard set was built leniently (shared with a lenient entry of its dataset) trains only
    if that set skipped no row: else one line (DataError) naming the teacher, the count, the reasons and the list."""
    for teacher, shards in cfg.strict_shards.items():
        made = shards.read_manifest()
        n = int(made.get("skipped_total") or 0)
        if n:
            why = ", ".join(f"{k}: {v}" for k, v in sorted((made.get("skipped") or {}).items()))
            listed = Path(shards.manifest).parent / str(made.get("skipped_list") or "skipped.jsonl")
            raise DataError(f"teacher {teacher} is strict, but its data shards/{shards.name} (shared with a lenient "
                            f"entry of the same dataset, so built once, leniently) skipped {n} row(s) ({why}; each one "
                            f"is listed in {listed}): fix the dataset, or set teachers.{teacher}.transform.strict: false")


def train(cfg: TrainConfig, done_path: str | None = None, *, executor: Trains | None = None) -> dict:
    """Train ``cfg.target`` once more (a new attempt of its run) on ``executor`` (the config's:
    :func:`trajsft.executor.executor_for`; None: :func:`train_here`): locally in a child process, or as a Ray job
    followed from here. A strict teacher's shared data is checked first (:func:`check_strict`)."""
    check_strict(cfg)
    run, target, run_dir = cfg.run, cfg.target, cfg.run.location
    os.makedirs(cfg.state_dir, exist_ok=True)
    lev = train_lm_config_for(cfg)
    provenance.write(run_dir, {"target": target, "run": run.name, "hash": run.hash, "hash_inputs": run.inputs,
                               "config": dict(cfg.workflow), "levanter": lev})
    where = cfg.placement
    from ..runtime.signals import snakemake_is_stopping

    if snakemake_is_stopping():
        raise SnakemakeStopping("Snakemake is shutting down (got SIGINT/SIGTERM): not starting another training attempt")
    running = provenance.running_attempt(run_dir)
    if running and not where.on_cluster:  # a Ray job is re-attached to
        raise TrainingFailed(f"attempt {running['attempt']} of {run.name} is still running (pid {running['pid']}, started "
                        f"{running['started']}): wait for it to end, or stop it with kill {running['pid']}")
    attempt = provenance.record_attempt(run_dir, executor=where.name)
    _CURRENT.update(run_dir=run_dir, attempt=attempt["attempt"])
    log.info("training %s -> %s (attempt %d, %s)", target, run_dir, attempt["attempt"], where.name)
    try:
        result = (executor.train_attempt if executor else train_here)(cfg, lev, attempt["attempt"])
    except KeyboardInterrupt as e:  # SIGINT / SIGTERM / our Snakemake died: the trainer was stopped
        provenance.finish_attempt(run_dir, attempt["attempt"], "interrupted", error=str(e or "SIGINT")[:500])
        raise
    except JobEnvironmentError as e:  # a configuration error (e.g. W&B refused the key): one line, not retried
        provenance.finish_attempt(run_dir, attempt["attempt"], "failed", error=str(e)[:500])
        raise
    except TrainingFailed as e:  # one line (killed by a signal, exit code, lock held)
        fault = storage_fault(cfg, e)
        provenance.finish_attempt(run_dir, attempt["attempt"], "failed", error=str(fault or e)[:500])
        if fault:
            raise fault from e
        raise
    except BaseException as e:
        fault = storage_fault(cfg, e)
        provenance.finish_attempt(run_dir, attempt["attempt"], "failed",
                                  error=str(fault) if fault else f"{type(e).__name__}: {e}"[:500])
        if fault:
            raise fault from e
        raise
    provenance.finish_attempt(run_dir, attempt["attempt"], "succeeded", steps=result.get("steps"),
                              resumed_from_step=result.get("resumed_from_step"), ray_job_id=result.get("ray_job_id"))
    hf = result.get("hf_export")
    if not hf or not io.exists(join(hf, "config.json")):
        raise TrainingFailed(f"training of {target} ended without a final HF export at {hf}")
    done = {
        "target": target,
        "hash": run.hash,
        "run": run.name,
        "checkpoint_dir": run_dir,
        "trainer_checkpoint": result.get("checkpoint_dir"),
        "hf_export": hf,
        "steps": result.get("steps"),
        "final_loss": result.get("final_loss"),
        "eval_loss": result.get("eval_loss"),
        "wandb_run_id": run.hash,
        "wandb_url": run_wandb_url(cfg.workflow, run.hash, run_dir) if result.get("wandb_mode", "online") == "online"
        else None,
        "wandb_mode": result.get("wandb_mode") or cfg.workflow["wandb"]["mode"],
        "attempts": attempt["attempt"],
        "executor": where.name,
        "cluster": where.cluster_name,
        "ray_job_id": result.get("ray_job_id"),
        "log": cfg.log,
        "finished": provenance.now(),
    }
    write_json(Path(cfg.state_dir, "manifest.json"), done)
    if is_remote(run_dir):
        io.write_bytes(join(run_dir, "done.json"), json.dumps(done, indent=2).encode())
    if done_path:
        write_json(done_path, done)
    return done


def resume_note(cfg: TrainConfig) -> str | None:
    """What a stopped training leaves for its rerun: the step its latest checkpoint holds (None: none yet)."""
    from .checkpoints import latest_checkpoint

    ck = latest_checkpoint(join(cfg.run.location, "checkpoints"))
    if not ck:
        return None
    return (f"its checkpoint of step {ck['completed_steps']}/{explain(cfg)['steps']} is kept: rerun the same command "
            f"to resume from it")


_CURRENT: dict = {}  # the attempt this process is running (for detach_from_ray_job)


def detach_from_ray_job(reason: str) -> None:
    """Our Snakemake died while a Ray job trains: leave the job running (a rerun of the same
    command re-attaches to it by its deterministic submission id), record that, and exit."""
    if _CURRENT:
        provenance.finish_attempt(_CURRENT["run_dir"], _CURRENT["attempt"], "detached",
                                  error=f"{reason}; the Ray job keeps running and a rerun re-attaches to it")
    log.error("%s; the Ray job keeps running, rerun the same command to re-attach", reason)
    logging.shutdown()
    os._exit(1)
