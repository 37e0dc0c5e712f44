"""The ``levanter.main.train_lm`` config of a training run, built from the plan's typed specs.

The rule process never imports jax or Levanter (issue 10: the train rule's own overhead stays within
1.05x of bare ``train_lm``, and ``import levanter.main.train_lm`` alone costs 5-16 s of CPU). So the
config is built in Levanter's own wire format: the dict that ``train_lm --config_path`` reads and
draccus decodes into ``TrainLmConfig`` in the child. It is built by one small function per section,
each named after the Levanter dataclass it encodes; ``tests/test_levanter_config.py`` decodes every
section into that dataclass with draccus (an unknown or misspelled key fails) and round-trips the
whole dict through ``TrainLmConfig``:

==========================  =================================================================
``train_lm_config``         ``levanter.main.train_lm.TrainLmConfig`` (epoch, HF export, init)
``data_config``             ``UrlSingleDatasetLMConfig`` (one teacher) or ``LMMixtureDatasetConfig``
``source_config``           ``UrlDatasetSourceConfig`` (one per teacher of a mixture)
``chat_format``             ``ChatLmDatasetFormat`` (``type: chat``)
``qwen3_config``            ``levanter.models.qwen.Qwen3Config`` (``type: qwen3``)
``trainer_config``          ``levanter.trainer.TrainerConfig``
``wandb_config``            ``WandbConfig`` (``type: wandb``), followed by ``JsonLoggerConfig``
``checkpointer_config``     ``levanter.checkpoint.CheckpointerConfig``
``adam_config``             ``levanter.optim.AdamConfig`` (``type: adam``)
==========================  =================================================================

What the specs hash (:class:`~trajsft.plan.specs.TrainingSpec`, :class:`~trajsft.plan.specs.StudentSpec`,
the target's teacher weights) comes from the :class:`~trajsft.plan.specs.TargetSpec`; everything else
(ids and paths, the tokenized data, the step count, cosmetic W&B and checkpoint settings) from a
:class:`RunInputs`. The plan-to-inputs side is :func:`trajsft.train.target.train_lm_config_for`.
``write_config`` dumps a config as YAML; ``resolve_hub_refs`` pins Hub references to local snapshots.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..data.cache import chat_format, resolve_tokenizer
from ..io import is_remote, write_text
from ..plan.specs import StudentSpec, TargetSpec, TrainingSpec
from . import remat


_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# Levanter Qwen3 fields that are the same for every student (its dimensions are in StudentSpec.model).
QWEN3_FIXED: dict = {"layer_norm_epsilon": 1e-6, "tie_word_embeddings": False, "use_bias": False}
# Mixture sampling granularity (Levanter's default).
MIXTURE_BLOCK_SIZE = 2048


@dataclass(frozen=True)
class DataSource:
    """A tokenized teacher as training reads it (from its tokenize manifest)."""

    cache_dir: str
    packed_sequences: int  # the seq_len sequences Levanter packs from the train split


@dataclass(frozen=True)
class WandbSettings:
    """W&B tracking (cosmetic: never hashed). The run id is :attr:`RunInputs.run_id`."""

    mode: str = "offline"  # offline, online or disabled
    project: str = "trajsft"
    entity: Optional[str] = None
    tags: tuple[str, ...] = ()
    group: Optional[str] = None  # the sweep a run is a cell of (W&B groups its runs)


@dataclass(frozen=True)
class RunInputs:
    """What a run's config needs besides its specs (none of it is hashed by the run).

    ``tokenizer`` is the student's tokenizer (``StudentSpec.tokenizer``) as this launch reads it: a local
    dir, relative to the job's working dir on Ray, or ``repo@revision``. ``sources`` maps each teacher of
    the target to its tokenized data. ``num_train_steps`` comes from :mod:`trajsft.plan.schedule`
    (``epochs``, ``epochs_of`` and ``max_steps`` over rows or packed sequences). ``keep_every`` keeps a
    permanent checkpoint every that many steps (the final step always); ``hf_save_steps`` exports every
    that many (default: only at the end). ``watch_interval`` is Levanter's grad/param-norm logging period
    (0 = off, saves a compile); ``jax_compilation_cache_dir`` enables JAX's persistent compilation cache.
    ``init_weights`` is where an ``init: hf`` student's checkpoint is read from: its ``models/`` artifact
    under the storage root (None: the checkpoint reference itself, ``repo@revision``).
    """

    run_id: str
    run_dir: str
    tokenizer: str
    chat_template: str
    sources: Mapping[str, DataSource]
    num_train_steps: int
    accelerator: str = "cpu"
    save_interval: str = "30m"
    keep_every: Optional[int] = None
    hf_save_steps: Optional[int] = None
    hf_save_dtype: Optional[str] = None
    watch_interval: int = 10
    jax_compilation_cache_dir: Optional[str] = None
    wandb: WandbSettings = field(default_factory=WandbSettings)
    init_weights: Optional[str] = None


def resolve_hub_refs(cfg: dict) -> dict:
    """``cfg`` with pinned Hub tokenizer refs replaced by local snapshots (for one launch)."""
    for section in ("data", "model"):
        ref = (cfg.get(section) or {}).get("tokenizer")
        if isinstance(ref, str):
            cfg[section]["tokenizer"] = resolve_tokenizer(ref)
    return cfg


# --------------------------------------------------------------------------------------
# the sections
# --------------------------------------------------------------------------------------


def source_config(teacher: str, source: DataSource, chat_template: str) -> dict:
    """``UrlDatasetSourceConfig`` of one teacher: its prebuilt cache (no URLs: nothing to rebuild from),
    tagged with the teacher's name (Levanter's eval reports per tag)."""
    if not source.cache_dir:
        raise ValueError(f"source {teacher!r} has no cache_dir")
    return {"cache_dir": source.cache_dir, "format": chat_format(chat_template), "train_urls": [],
            "validation_urls": [], "tags": [teacher]}


def data_config(target: TargetSpec, run: RunInputs) -> dict:
    """One teacher: ``UrlSingleDatasetLMConfig`` (its source fields at the top level). Several:
    ``LMMixtureDatasetConfig`` with one ``configs`` entry per teacher, ``train_weights`` from the target's
    (normalised) weights and stop strategy ``restart`` (the mixture never runs out)."""
    if not run.sources:
        raise ValueError("no data sources")
    common = {"tokenizer": run.tokenizer, "chat_template": run.chat_template}
    if len(run.sources) == 1:
        (teacher, source), = run.sources.items()
        return {**common, **source_config(teacher, source, run.chat_template), "shuffle": True,
                "permutation_type": "feistel"}
    weights = dict(target.weights)
    return {
        **common,
        "cache_dir": None,
        "configs": {t: source_config(t, s, run.chat_template) for t, s in run.sources.items()},
        "train_weights": {t: float(weights[t]) for t in run.sources},
        "stop_strategy": "restart",
        "mixture_block_size": MIXTURE_BLOCK_SIZE,
        "shuffle": True,
        "permutation_type": "feistel",
    }


def initialize_from_hf(student: StudentSpec, run: RunInputs) -> Optional[str]:
    """The pretrained weights of an ``init: hf`` student: its snapshot under the storage root
    (``run.init_weights``), else Levanter's ``RepoRef`` of the checkpoint (``repo@revision``)."""
    if student.init == "random":
        return None
    return run.init_weights or student.hf_checkpoint.hub_ref()


def qwen3_config(student: StudentSpec, training: TrainingSpec, run: RunInputs) -> dict:
    """``Qwen3Config``: the student's dimensions, our ``seq_len`` and rope theta.

    ``reference_checkpoint`` (what Levanter's HF export copies ``architectures`` from) is the initial
    checkpoint, or for a random-init student ``<run_dir>/hf_reference``, which ``run_training`` fills with
    a minimal config.json (otherwise Levanter would try the Hub). ``tokenizer`` is ours, so Levanter never
    loads one from the reference."""
    return {
        "type": "qwen3",
        "seq_len": int(training.seq_len),
        **student.model.dims(),
        **QWEN3_FIXED,
        "gradient_checkpointing": remat.levanter_value(training.remat),  # auto: full until fit decides
        "rope": {"type": "default", "theta": float(student.rope_theta)},
        "reference_checkpoint": initialize_from_hf(student, run) or os.path.join(_run_dir(run), "hf_reference"),
        "tokenizer": run.tokenizer,
    }


def wandb_config(run: RunInputs) -> dict:
    """``WandbConfig``: ``id = name = run_id`` and ``resume: allow`` (a retry continues the same run); its
    directory comes from ``WANDB_DIR``, which ``run_training`` points at the run dir."""
    w = run.wandb
    return {"type": "wandb", "mode": w.mode, "project": w.project, "entity": w.entity, "id": run.run_id,
            "name": run.run_id, "tags": list(w.tags), "resume": "allow", "save_code": False,
            **({"group": w.group} if w.group else {})}


def checkpointer_config(run: RunInputs) -> dict:
    """``CheckpointerConfig``: checkpoints in ``<run_dir>/checkpoints/step-<k>`` (no run id appended).

    ``save_interval`` writes temporary (rotating) checkpoints; ``keep`` keeps a permanent one every
    ``keep_every`` steps and ALWAYS at the final step: Levanter's end-of-training hooks call the
    checkpointer without ``force``, so the keep policy ``[{every: keep_every, until: N-2}, {every: N-1}]``
    makes the final step (index N-1) a scheduled one."""
    last = int(run.num_train_steps) - 1  # 0-based index of the final step (what hooks / checkpoint names use)
    k = run.keep_every
    if k and 0 < k < last and last - 1 >= 1:
        keep = [{"every": int(k), "until": last - 1}, {"every": last, "until": None}]
    else:
        keep = [{"every": last, "until": None}]
    return {"base_path": os.path.join(_run_dir(run), "checkpoints"), "save_interval": run.save_interval,
            "keep": keep, "append_run_id_to_base_path": False}


def trainer_config(training: TrainingSpec, run: RunInputs) -> dict:
    """``TrainerConfig``: the whole batch per step (``per_device_parallelism: -1``, no accumulation),
    f32 on CPU (``require_accelerator: false``) and ``p=f32,c=bfloat16`` on TPU/GPU, an eval every
    ~N/10 steps (when a validation split exists, and at the end), trackers ``[wandb, json_logger]``
    (the JSON lines in the log are where ``read_metrics`` reads the losses back), and no Ray cluster
    started inside training (the caches are prebuilt)."""
    accelerator = run.accelerator.lower()
    if accelerator not in ("cpu", "tpu", "gpu"):
        raise ValueError("accelerator must be cpu, tpu or gpu")
    n = int(run.num_train_steps)
    trainer: dict[str, Any] = {
        "id": run.run_id,
        "seed": int(training.seed),
        "mp": "f32" if accelerator == "cpu" else "p=f32,c=bfloat16",
        "train_batch_size": int(training.batch_size),
        "per_device_parallelism": -1,
        "per_device_eval_parallelism": -1,
        "num_train_steps": n,
        "steps_per_eval": max(1, n // 10),
        "max_eval_batches": None,
        "require_accelerator": accelerator != "cpu",
        "log_dir": os.path.join(_run_dir(run), "logs"),
        "log_jaxprs": False,
        "log_xla_hlo": False,
        "tracker": [wandb_config(run), {"type": "json_logger"}],
        "checkpointer": checkpointer_config(run),
        "ray": {"auto_start_cluster": False},
    }
    if run.jax_compilation_cache_dir:
        trainer["jax_compilation_cache_dir"] = run.jax_compilation_cache_dir
    if int(run.watch_interval) != 10:
        # grad/param norm logging (a JIT hook): every step where it fires uses a second compiled
        # variant of the train step; 0 disables it (one compile only; useful on CPU)
        trainer["watch"] = {"interval": int(run.watch_interval)}
    return trainer


def adam_config(training: TrainingSpec) -> dict:
    """``AdamConfig``: every optimizer field of the training spec."""
    t = training
    return {
        "type": "adam",
        "learning_rate": float(t.learning_rate),
        "lr_schedule": t.lr_schedule,
        "warmup": float(t.warmup),
        "decay": None if t.decay is None else float(t.decay),
        "min_lr_ratio": float(t.min_lr_ratio),
        "weight_decay": float(t.weight_decay),
        "max_grad_norm": None if t.max_grad_norm is None else float(t.max_grad_norm),
        "beta1": float(t.beta1),
        "beta2": float(t.beta2),
        "epsilon": float(t.epsilon),
    }


def epoch(training: TrainingSpec, run: RunInputs) -> int:
    """``TrainLmConfig.epoch``: passes Levanter cycles a single teacher's data for (its loader stops at the
    end of the data otherwise): the smallest ``e`` whose ``ceil(e * P / B)`` batches (the last one padded
    with zero-loss examples) cover N steps; 0 for one pass. A mixture is infinite (``restart``) and
    Levanter rejects epochs for it: 0."""
    if len(run.sources) != 1:
        return 0
    (source,) = run.sources.values()
    passes = (int(run.num_train_steps) - 1) * int(training.batch_size) // int(source.packed_sequences) + 1
    return passes if passes > 1 else 0


def train_lm_config(target: TargetSpec, run: RunInputs) -> dict:
    """``TrainLmConfig``: the full ``train_lm`` config of a target as a plain (YAML-dumpable) dict.

    HF exports go to ``<run_dir>/hf/step-<k>`` every ``hf_save_steps`` (the forced end-of-training hooks
    always export the final step). An ``init: hf`` student starts from ``initialize_from_hf`` with
    ``use_hf_model_config: false`` on purpose: when on, Levanter replaces the *whole* model config by the
    HF one, including ``seq_len := max_position_embeddings`` (40960 for Qwen3-8B)."""
    if not _RUN_ID_RE.match(run.run_id):
        raise ValueError(f"run_id {run.run_id!r} must match {_RUN_ID_RE.pattern} (used as W&B id and dir name)")
    n = int(run.num_train_steps)
    if n < 2:
        raise ValueError("num_train_steps must be >= 2 (Levanter never checkpoints step 0)")
    training, student = target.training, target.student
    cfg: dict[str, Any] = {
        "data": data_config(target, run),
        "model": qwen3_config(student, training, run),
        "trainer": trainer_config(training, run),
        "optimizer": adam_config(training),
        "epoch": epoch(training, run),
        "hf_save_path": os.path.join(_run_dir(run), "hf"),
        "hf_save_steps": int(run.hf_save_steps or n),
    }
    if run.hf_save_dtype:
        cfg["hf_save_dtype"] = run.hf_save_dtype
    init = initialize_from_hf(student, run)
    if init:
        cfg["initialize_from_hf"] = init
        cfg["use_hf_model_config"] = False
    return cfg


def _run_dir(run: RunInputs) -> str:
    return run.run_dir if is_remote(run.run_dir) else os.path.abspath(run.run_dir)


# --------------------------------------------------------------------------------------
# the file train_lm reads
# --------------------------------------------------------------------------------------


def write_config(config: Mapping, path: str) -> str:
    """Dump a config dict as YAML (atomically) for ``--config_path``; returns ``path``."""
    import yaml

    text = yaml.safe_dump(plain_data(config), sort_keys=False, default_flow_style=False, width=10_000)
    write_text(path, text)
    return path


def plain_data(x):
    if isinstance(x, Mapping):
        return {str(k): plain_data(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain_data(v) for v in x]
    return x
