"""The ``levanter.main.train_lm`` config as a plain dict, and the model presets.

``levanter_config(...) -> dict`` builds it (dump it with ``write_config``); ``steps_for_epochs``
turns epochs into optimizer steps; ``resolve_hub_refs`` pins Hub references to local snapshots. The plan-to-config mapping is :func:`trajsft.train.step.levanter_config`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Mapping, Optional, Sequence

from ..data.cache import _chat_format, resolve_tokenizer
from ..io import is_remote, write_text
from ..plan.specs import MODEL_DIMS


_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# Qwen3 architectures expressed in Levanter's ``model`` (type: qwen3) fields: the students' dimensions
# (``tiny``: CPU demo / tests, random init, ~100k parameters with a small vocab; ``qwen3-8b``: Qwen/Qwen3-8B's
# config.json) live in the plan's specs, which hash them; these fields are the same for every student.
QWEN3_FIXED: dict = {"layer_norm_epsilon": 1e-6, "tie_word_embeddings": False, "use_bias": False}
MODEL_PRESETS: dict[str, dict] = {name: {**dims, **QWEN3_FIXED} for name, dims in MODEL_DIMS.items()}
_PRESET_HF_DEFAULT = {"qwen3-8b": "Qwen/Qwen3-8B"}


def resolve_hub_refs(cfg: dict) -> dict:
    """``cfg`` with pinned Hub tokenizer refs replaced by local snapshots (for one launch)."""
    for section in ("data", "model"):
        ref = (cfg.get(section) or {}).get("tokenizer")
        if isinstance(ref, str):
            cfg[section]["tokenizer"] = resolve_tokenizer(ref)
    return cfg


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------


def steps_for_epochs(packed_sequences: int, train_batch_size: int, epochs: float) -> int:
    """``ceil(epochs * packed_sequences / train_batch_size)`` (>= 1).

    An "example" is one packed ``seq_len`` sequence (what the data loader batches), so this is the
    exact number of optimizer steps for ``epochs`` passes. With ``epochs == 1`` the last batch is
    partial; Levanter pads it with zero-loss examples.
    """
    if packed_sequences <= 0:
        raise ValueError("packed_sequences must be > 0")
    return max(1, math.ceil(float(epochs) * packed_sequences / int(train_batch_size)))


def _normalize_sources(sources) -> dict[str, dict]:
    if isinstance(sources, str):
        return {"data": {"cache_dir": sources}}
    if isinstance(sources, Mapping):
        out = {}
        for name, spec in sources.items():
            if isinstance(spec, str):
                spec = {"cache_dir": spec}
            out[str(name)] = dict(spec)
        return out
    raise TypeError("sources must be a cache dir or a mapping name -> {cache_dir, weight, ...}")


def levanter_config(
    *,
    run_id: str,
    run_dir: str,
    tokenizer: str,
    chat_template: str,
    sources,
    seq_len: int,
    train_batch_size: int,
    epochs: float = 1.0,
    num_train_steps: Optional[int] = None,
    model: str | Mapping = "tiny",
    initialize_from_hf: Optional[str] = None,
    use_hf_model_config: bool = False,
    reference_checkpoint: Optional[str] = None,
    rope_theta: float = 1_000_000.0,
    learning_rate: float = 1e-5,
    lr_schedule: str = "cosine",
    warmup: float = 0.03,
    decay: Optional[float] = None,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.0,
    max_grad_norm: Optional[float] = 1.0,
    beta1: float = 0.9,
    beta2: float = 0.95,
    epsilon: float = 1e-8,
    seed: int = 0,
    accelerator: str = "cpu",
    mp: Optional[str] = None,
    per_device_parallelism: int = -1,
    per_device_eval_parallelism: int = -1,
    checkpoint_dir: Optional[str] = None,
    hf_dir: Optional[str] = None,
    save_interval: str = "30m",
    keep_every: Optional[int] = None,
    hf_save_steps: Optional[int] = None,
    hf_save_dtype: Optional[str] = None,
    steps_per_eval: Optional[int] = None,
    max_eval_batches: Optional[int] = None,
    wandb_mode: str = "offline",
    wandb_project: str = "trajsft",
    wandb_entity: Optional[str] = None,
    wandb_tags: Sequence[str] = (),
    shuffle: bool = True,
    mixture_block_size: int = 2048,
    watch_interval: int = 10,
    jax_compilation_cache_dir: Optional[str] = None,
) -> dict:
    """The full ``levanter.main.train_lm`` config as a plain dict (YAML-dumpable).

    Data
        ``sources`` maps a teacher name to ``{"cache_dir": <prebuilt cache>, "weight": float,
        "packed_sequences": int, "train_urls": [...], "validation_urls": [...]}`` (only
        ``cache_dir`` is required; a bare string is a single cache dir). One source gives a
        ``UrlSingleDatasetLMConfig``-style ``data`` section; several give an
        ``LMMixtureDatasetConfig`` (one ``configs`` entry per teacher, each with its own
        ``cache_dir``, ``train_weights`` from ``weight`` (default 1.0), stop strategy ``restart``).
        Every source uses ``format: {type: chat, pack: true, mask_user_turns: true,
        chat_template: <ours>}``; the template must be in the *format* (``data.chat_template`` is
        also set but this Levanter version ignores it for chat caches). The URL lists are optional:
        the prebuilt cache is loaded when present; with URLs Levanter could rebuild a missing one.

    Steps / epochs
        If ``num_train_steps`` is None it is ``steps_for_epochs(sum(packed_sequences), B, epochs)``
        (``packed_sequences`` per source from ``build_chat_cache(..., seq_len=...)`` stats), i.e. one
        training example = one packed sequence. For a single source that needs more than one pass,
        top-level ``epoch`` is set to the number of passes so Levanter cycles the data
        (``EpochDataset``); without it the loader stops at the end of the data. Mixtures are
        infinite (``restart``), so ``epoch`` stays 0 (Levanter rejects epochs for mixtures) and
        "epochs" means passes over the *total* packed data, split between teachers by weight.

    Model (``type: qwen3``)
        ``model`` is a preset name from ``MODEL_PRESETS`` (``"tiny"`` random init for CPU,
        ``"qwen3-8b"``) or a dict of Levanter Qwen3 fields. ``seq_len`` and ``rope`` (theta) are
        always ours. ``initialize_from_hf`` (HF repo / local dir / gs:// path; defaults to
        ``Qwen/Qwen3-8B`` for the ``qwen3-8b`` preset) loads pretrained weights;
        ``reference_checkpoint`` defaults to it (for the tiny model to ``<run_dir>/hf_reference``,
        which ``run_training`` fills with a minimal config.json: Levanter's HF export copies
        ``architectures`` from the reference and would otherwise try the Hub). ``model.tokenizer``
        is set to our tokenizer so Levanter never loads one from the reference.
        ``use_hf_model_config`` is off by default on purpose: when on, Levanter replaces the
        *whole* model config by the HF one, including ``seq_len := max_position_embeddings``
        (40960 for Qwen3-8B) and our gradient-checkpointing / attention settings.

    Checkpoints / exports
        Trainer checkpoints go to ``checkpoint_dir`` (default ``<run_dir>/checkpoints``) and HF
        exports to ``hf_dir`` (default ``<run_dir>/hf``), both ``/step-<k>`` without the run id
        appended. ``save_interval`` writes temporary (rotating) checkpoints; ``keep`` keeps a
        permanent checkpoint every ``keep_every`` steps and ALWAYS at the final step (Levanter does
        not force a checkpoint at the end: its end-of-training forced hooks call the checkpointer
        without ``force``; the keep policy ``[{every: keep_every, until: N-2}, {every: N-1}]`` makes
        the final step a scheduled one). The HF export hook runs every ``hf_save_steps`` (default:
        only at the end; the forced end-of-training hooks always export the final step).

    Tracking
        ``trainer.tracker`` is ``[wandb, json_logger]``: W&B (``wandb_mode`` offline/online/disabled,
        ``id = name = run_id``, ``resume: allow``; its directory comes from ``WANDB_DIR`` which
        ``run_training`` points at ``run_dir``) plus Levanter's ``json_logger`` tracker, which writes
        every metric as a JSON line to the log, where ``read_metrics`` reads the losses back.

    ``watch_interval`` is Levanter's grad/param-norm logging period (0 = off, saves one compile).
    ``jax_compilation_cache_dir`` enables JAX's persistent compilation cache (relaunches skip
    recompiling).

    ``accelerator="cpu"`` sets ``require_accelerator: false`` and f32; "tpu"/"gpu" use
    ``mp: p=f32,c=bfloat16``. ``per_device_parallelism=-1`` means the whole batch at once (no
    gradient accumulation); set it to get micro-batching. Eval runs every ``steps_per_eval`` steps
    (default ~10 evals per run) when a validation split is configured (and at the end).
    """
    if not _RUN_ID_RE.match(run_id):
        raise ValueError(f"run_id {run_id!r} must match {_RUN_ID_RE.pattern} (used as W&B id and dir name)")
    srcs = _normalize_sources(sources)
    if not srcs:
        raise ValueError("no data sources")
    run_dir = run_dir if is_remote(run_dir) else os.path.abspath(run_dir)
    fmt = _chat_format(chat_template)
    B = int(train_batch_size)

    # ---- steps
    packed = {n: s.get("packed_sequences") for n, s in srcs.items()}
    if num_train_steps is None:
        missing = [n for n, p in packed.items() if not p]
        if missing:
            raise ValueError(
                f"num_train_steps not given and packed_sequences unknown for {missing}; pass "
                "build_chat_cache(..., seq_len=...)['train']['packed_sequences'] in sources"
            )
        num_train_steps = steps_for_epochs(sum(int(p) for p in packed.values()), B, epochs)
    N = int(num_train_steps)
    if N < 2:
        raise ValueError("num_train_steps must be >= 2 (Levanter never checkpoints step 0)")

    # ---- data
    def source_entry(name: str, spec: dict) -> dict:
        if not spec.get("cache_dir"):
            raise ValueError(f"source {name!r} has no cache_dir")
        return {
            "cache_dir": spec["cache_dir"],
            "format": dict(fmt),
            "train_urls": list(spec.get("train_urls") or []),
            "validation_urls": list(spec.get("validation_urls") or []),
            "tags": [name],
        }

    epoch = 0
    if len(srcs) == 1:
        (name, spec), = srcs.items()
        data = {
            "tokenizer": tokenizer,
            "chat_template": chat_template,
            **source_entry(name, spec),
            "shuffle": bool(shuffle),
            "permutation_type": "feistel",
        }
        p = packed[name]
        if p:
            # smallest number of passes e whose ceil(e * P / B) batches (last one padded) cover N steps
            passes = (N - 1) * B // int(p) + 1
            epoch = passes if passes > 1 else 0
    else:
        data = {
            "tokenizer": tokenizer,
            "chat_template": chat_template,
            "cache_dir": None,
            "configs": {n: source_entry(n, s) for n, s in srcs.items()},
            "train_weights": {n: float(s.get("weight", 1.0)) for n, s in srcs.items()},
            "stop_strategy": "restart",
            "mixture_block_size": int(mixture_block_size),
            "shuffle": bool(shuffle),
            "permutation_type": "feistel",
        }

    # ---- model
    if isinstance(model, str):
        if model not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {model!r}; known: {sorted(MODEL_PRESETS)}")
        if initialize_from_hf is None:
            initialize_from_hf = _PRESET_HF_DEFAULT.get(model)
        model_fields = dict(MODEL_PRESETS[model])
    else:
        model_fields = dict(model)
        model_fields.pop("type", None)
    if reference_checkpoint is None:
        reference_checkpoint = initialize_from_hf or os.path.join(run_dir, "hf_reference")
    model_cfg = {
        "type": "qwen3",
        "seq_len": int(seq_len),
        **model_fields,
        "rope": {"type": "default", "theta": float(rope_theta)},
        "reference_checkpoint": reference_checkpoint,
        "tokenizer": tokenizer,
    }

    # ---- trainer
    accelerator = accelerator.lower()
    if accelerator not in ("cpu", "tpu", "gpu"):
        raise ValueError("accelerator must be cpu, tpu or gpu")
    if mp is None:
        mp = "f32" if accelerator == "cpu" else "p=f32,c=bfloat16"
    ckpt_dir = checkpoint_dir or os.path.join(run_dir, "checkpoints")
    hf_dir = hf_dir or os.path.join(run_dir, "hf")
    last = N - 1  # 0-based index of the final step (what hooks / checkpoint names use)
    if keep_every and 0 < keep_every < last and last - 1 >= 1:
        keep = [{"every": int(keep_every), "until": last - 1}, {"every": last, "until": None}]
    else:
        keep = [{"every": last, "until": None}]
    if steps_per_eval is None:
        steps_per_eval = max(1, N // 10)

    trainer = {
        "id": run_id,
        "seed": int(seed),
        "mp": mp,
        "train_batch_size": B,
        "per_device_parallelism": int(per_device_parallelism),
        "per_device_eval_parallelism": int(per_device_eval_parallelism),
        "num_train_steps": N,
        "steps_per_eval": int(steps_per_eval),
        "max_eval_batches": max_eval_batches,
        "require_accelerator": accelerator != "cpu",
        "log_dir": os.path.join(run_dir, "logs"),
        "log_jaxprs": False,
        "log_xla_hlo": False,
        "tracker": [
            {
                "type": "wandb",
                "mode": wandb_mode,
                "project": wandb_project,
                "entity": wandb_entity,
                "id": run_id,
                "name": run_id,
                "tags": list(wandb_tags),
                "resume": "allow",
                "save_code": False,
            },
            {"type": "json_logger"},
        ],
        "checkpointer": {
            "base_path": ckpt_dir,
            "save_interval": save_interval,
            "keep": keep,
            "append_run_id_to_base_path": False,
        },
        # caches are prebuilt: don't start a Ray cluster inside training
        "ray": {"auto_start_cluster": False},
    }
    if jax_compilation_cache_dir:
        trainer["jax_compilation_cache_dir"] = jax_compilation_cache_dir
    if int(watch_interval) != 10:
        # grad/param norm logging (a JIT hook): every step where it fires uses a second compiled
        # variant of the train step; 0 disables it (one compile only; useful on CPU)
        trainer["watch"] = {"interval": int(watch_interval)}

    optimizer = {
        "type": "adam",
        "learning_rate": float(learning_rate),
        "lr_schedule": lr_schedule,
        "warmup": float(warmup),
        "decay": None if decay is None else float(decay),
        "min_lr_ratio": float(min_lr_ratio),
        "weight_decay": float(weight_decay),
        "max_grad_norm": None if max_grad_norm is None else float(max_grad_norm),
        "beta1": float(beta1),
        "beta2": float(beta2),
        "epsilon": float(epsilon),
    }

    cfg: dict[str, Any] = {
        "data": data,
        "model": model_cfg,
        "trainer": trainer,
        "optimizer": optimizer,
        "epoch": int(epoch),
        "hf_save_path": hf_dir,
        "hf_save_steps": int(hf_save_steps or N),
    }
    if hf_save_dtype:
        cfg["hf_save_dtype"] = hf_save_dtype
    if initialize_from_hf:
        cfg["initialize_from_hf"] = initialize_from_hf
        cfg["use_hf_model_config"] = bool(use_hf_model_config)
    return cfg


def write_config(config: Mapping, path: str) -> str:
    """Dump a config dict as YAML (atomically) for ``--config_path``; returns ``path``."""
    import yaml

    text = yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=False, width=10_000)
    write_text(path, text)
    return path


def _plain(x):
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
