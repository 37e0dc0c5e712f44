"""Held-out loss of one trained model on several teachers' validation splits, with Levanter's own
evaluation (the ``TaggedEvaluator`` that ``train_lm`` runs every ``steps_per_eval`` steps) and its
own model loading (``HFCheckpointConverter.load_pretrained`` for an HF export, ``load_checkpoint``
for a trainer checkpoint, as ``levanter.main.eval_lm`` does).

The thin layer of ours: Levanter's ``EvalResult`` has no token counts, so :func:`evaluate` runs the
evaluator's own jitted ``accum_for_batch`` over its own loader (what ``TaggedEvaluator.evaluate``
does) and reads the per-tag totals of its running means: the loss-bearing (assistant) tokens of
every held-out split. Imported lazily: it pulls in jax/levanter.
"""

from __future__ import annotations

import copy
import glob
import logging
import os
import sys
import tempfile
from typing import Mapping, Optional

from ..io import is_remote
from ..plan.config import REPO_DIR
from . import levanter_config


def eval_config(train_cfg: Mapping, columns: Mapping[str, str], tokenizer: str,
                max_eval_batches: Optional[int] = None, log_dir: str = "logs/eval/levanter") -> dict:
    """The target's own ``train_lm`` config with ``data`` replaced by the held-out splits to score.

    ``columns`` maps a teacher name to a tokenized cache dir (its ``validation`` split is read);
    every column is a mixture component tagged with the teacher's name, in the chat format the
    target trained with (template, packing, assistant-only loss). Model, precision and batch sizes
    stay the target's. No tracker: results are returned, not logged to W&B; Levanter's own log goes
    to ``log_dir`` as ``eval-<run id>.log`` (never into the run's training log).
    """
    cfg = copy.deepcopy(levanter_config.plain_data(train_cfg))
    data = cfg["data"]
    fmt = data["configs"][next(iter(data["configs"]))]["format"] if "configs" in data else data["format"]
    cfg["data"] = {
        "tokenizer": tokenizer,
        "chat_template": data.get("chat_template"),
        "cache_dir": None,
        "configs": {t: {"cache_dir": d, "format": dict(fmt), "tags": [t]} for t, d in columns.items()},
        "train_weights": {t: 1.0 for t in columns},
        "stop_strategy": "restart",
        "shuffle": False,
    }
    cfg["model"]["tokenizer"] = tokenizer
    tr = cfg["trainer"]
    tr["tracker"] = []
    tr["id"] = f"eval-{tr['id']}"[:64]
    tr["log_dir"] = os.path.abspath(log_dir)
    tr["max_eval_batches"] = max_eval_batches
    tr.pop("watch", None)
    cfg.pop("hf_save_path", None)
    return cfg


def jax_platforms() -> Optional[str]:
    """``JAX_PLATFORMS`` for evaluation and generation: the caller's if set; none (JAX picks) on a machine with an accelerator
    device (a TPU VM's /dev/accel* or /dev/vfio, a GPU's /dev/nvidia*); else ``cpu``: libtpu is installed here
    for the fit check, and JAX would otherwise look for a TPU first."""
    if os.environ.get("JAX_PLATFORMS"):
        return os.environ["JAX_PLATFORMS"]
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or glob.glob("/dev/nvidia[0-9]*"):
        return None
    return "cpu"


def use_this_machines_platform() -> None:
    """JAX on :func:`jax_platforms` (the CPU where no accelerator is: libtpu, installed here for the fit check, then
    does not look for a TPU and print its lockfile / worker-hostname errors), also when jax is imported already
    (``datasets`` imports it; jax reads JAX_PLATFORMS at import), before any backend starts."""
    platforms = jax_platforms()
    if platforms:
        os.environ["JAX_PLATFORMS"] = platforms
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", platforms)


def initialize(cfg: Mapping):
    """``cfg`` (a plain train_lm config) parsed as Levanter's ``TrainLmConfig`` and Levanter initialized with it
    (jax config, trainer defaults such as the eval batch size, logging), as ``levanter.main.eval_lm`` starts; our
    own log handlers are kept (Levanter's logging set-up replaces every root handler but its file). A run trained on
    TPUs (``require_accelerator``) loads on CPU where ``JAX_PLATFORMS`` says cpu (this machine, an emulated host),
    and a tokenizer path relative to the repo (a Ray job's working dir) is found from any directory."""
    import draccus

    import levanter
    import levanter.config  # noqa: F401  (registers draccus codecs)
    from levanter.main.train_lm import TrainLmConfig

    use_this_machines_platform()
    cfg = copy.deepcopy(dict(cfg))
    if os.environ.get("JAX_PLATFORMS") == "cpu" and (cfg.get("trainer") or {}).get("require_accelerator"):
        cfg["trainer"]["require_accelerator"] = False  # else Levanter refuses: "No accelerator found"
    for section in ("data", "model"):  # a Ray run names the repo's tokenizer relative to its job's working dir
        ref = (cfg.get(section) or {}).get("tokenizer")
        if isinstance(ref, str) and ref and not is_remote(ref) and not os.path.isabs(ref) and (REPO_DIR / ref).exists():
            cfg[section]["tokenizer"] = str(REPO_DIR / ref)
    with tempfile.TemporaryDirectory(prefix="trajsft-eval-") as tmp:
        path = levanter_config.write_config(cfg, os.path.join(tmp, "eval.yaml"))
        config: TrainLmConfig = draccus.parse(config_class=TrainLmConfig, config_path=path, args=[])
    root = logging.getLogger()
    ours = list(root.handlers)
    levanter.initialize(config)
    for h in list(root.handlers):
        if not isinstance(h, logging.FileHandler):
            root.removeHandler(h)
    for h in ours:
        root.addHandler(h)
    return config


def load_model(config, tokenizer, *, hf_export: Optional[str] = None, checkpoint: Optional[str] = None):
    """The model of ``config`` (a ``TrainLmConfig``) from an HF export or a trainer checkpoint, with Levanter's own
    loading (``HFCheckpointConverter.load_pretrained``, ``load_checkpoint``: what ``levanter.main.eval_lm`` does).
    Call it inside the trainer's device mesh and parameter axis mapping."""
    import equinox as eqx
    import jax
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning

    from levanter.checkpoint import load_checkpoint
    from levanter.utils.jax_utils import is_inexact_arrayish

    if (hf_export is None) == (checkpoint is None):
        raise ValueError("give exactly one of hf_export and checkpoint")
    trainer = config.trainer
    if hf_export is not None:
        converter = config.model.hf_checkpoint_converter().replaced(reference_checkpoint=hf_export, tokenizer=tokenizer)
        return converter.load_pretrained(config.model.model_type, ref=hf_export, config=config.model,
                                         axis_mapping=trainer.parameter_axis_mapping, dtype=trainer.mp.compute_dtype)
    Vocab = round_axis_for_partitioning(Axis("vocab", len(tokenizer)), trainer.parameter_axis_mapping)
    shape = eqx.filter_eval_shape(config.model.build, Vocab, key=jax.random.PRNGKey(0))
    trainable, fixed = eqx.partition(shape, is_inexact_arrayish)
    trainable = load_checkpoint(trainable, checkpoint, subpath="model", discover_latest=False,
                                axis_mapping=trainer.parameter_axis_mapping, mesh=trainer.device_mesh)
    return eqx.combine(trainable, fixed)


def evaluate(cfg: Mapping, *, hf_export: Optional[str] = None, checkpoint: Optional[str] = None) -> dict:
    """``{teacher: {"loss": mean next-token loss over its loss tokens, "tokens": loss tokens,
    "sequences": packed eval sequences}}`` of the model at ``hf_export`` or trainer ``checkpoint``."""
    import haliax as hax
    import jax.numpy as jnp
    import numpy as np

    from levanter.eval import TaggedEvaluator, _EvalRunningMeans

    if (hf_export is None) == (checkpoint is None):
        raise ValueError("give exactly one of hf_export and checkpoint")
    config = initialize(cfg)
    trainer = config.trainer
    tokenizer = config.data.the_tokenizer
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.parameter_axis_mapping):
        datasets = config.data.tagged_eval_sets(config.model.Pos)
        found = {tags[-1] for _, tags in datasets}
        missing = sorted(set(config.data.configs) - found)
        if missing:
            raise FileNotFoundError(f"no validation split in the cache of {', '.join(missing)}")
        max_examples = None
        if trainer.max_eval_batches is not None:
            max_examples = trainer.max_eval_batches * trainer.eval_batch_size
        evaluator = TaggedEvaluator(trainer.EvalBatch, datasets, tokenizer, trainer.device_mesh,
                                    trainer.compute_axis_mapping, max_examples, mp=trainer.mp)
        model = load_model(config, tokenizer, hf_export=hf_export, checkpoint=checkpoint)
        # TaggedEvaluator.evaluate, keeping the per-tag token totals it discards
        state = hax.shard(_EvalRunningMeans.zeros_like(jnp.zeros(()),
                                                        hax.zeros(evaluator.dataset.Tag, dtype=np.float32)))
        for batch, tags in evaluator.loader:
            state = evaluator.accum_for_batch(model, state, batch, tags)
        loss = np.asarray(state.loss_per_tag.mean.array, dtype=np.float64)
        tokens = np.asarray(state.loss_per_tag.total.array, dtype=np.float64)
    sizes = {tags[-1]: len(ds.as_sync_dataset()) for ds, tags in datasets}
    out = {}
    for tag, i in evaluator.dataset.tag_to_index.items():
        if tag in config.data.configs:
            n = sizes[tag] if max_examples is None else min(sizes[tag], max_examples)
            out[tag] = {"loss": float(loss[i]) if tokens[i] > 0 else None, "tokens": int(round(tokens[i])),
                        "sequences": int(n)}
    return out
