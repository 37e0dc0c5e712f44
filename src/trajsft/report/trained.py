"""A trained target's model: which one (its run's newest, or its HF export at a step) and where (whichever storage
root holds the run, the current one first). ``trajsft serve`` serves it, the next-action evaluation
(:mod:`trajsft.report.actions`) scores it; :func:`locate` needs no jax and says in one line why there is none."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

from .. import io, storage
from ..errors import ConfigError, one_line
from ..fit.facts import HF_KEYS
from ..plan.config import Plan
from ..plan.step_configs import TrainConfig
from .matrix import hf_exports, model_source


@dataclass(frozen=True)
class Trained:
    """One model of a target's run."""

    target: str
    name: str  # the run's content-addressed name (the model name ``trajsft serve`` answers to)
    run_dir: str  # where the run was found (the current storage root first)
    source: dict  # {"kind": "hf_export"|"checkpoint", "path", "step"} (trajsft.report.matrix.model_source)
    train_cfg: dict  # the run's train_lm config, its paths pointing at run_dir
    # the tools each of the target's teachers' chats trained with (None: a teacher without tools), in teacher order
    tools: tuple = ()


def locate(train: TrainConfig, step: Optional[int] = None) -> Trained:
    """The model of ``train``'s target: its newest (trainer checkpoint or HF export), or its HF export at ``step``,
    from whichever storage root holds the run (the current one first). ConfigError, one line: not trained, no such
    step, an HF export of another architecture than the run's."""
    target, run = train.target, train.run
    here = storage.absolute(run.location).rstrip("/")
    roots = storage.roots_of(train.workflow["storage_root"], train.workflow.get("copy_from"), train.results)
    places = [io.join(root, "checkpoints", run.name) for root in storage.where_in(roots, run)]
    train_cfg, run_dir = None, None
    for loc in dict.fromkeys([*places, here]):
        try:
            train_cfg, run_dir = io.read_json(io.join(loc, "provenance", "config.json"))["levanter"], loc
            break
        except (FileNotFoundError, KeyError, ValueError):
            continue
    if train_cfg is None:
        raise ConfigError(f"{target} is not trained: no run {run.name} under {here} or the other storage roots "
                          f"(train it: snakemake {Plan.done_path(target)})")
    # the run's own paths, wherever it was found (the config names the root it trained on)
    train_cfg = copy.deepcopy(train_cfg)
    train_cfg["hf_save_path"] = io.join(run_dir, "hf")
    train_cfg["trainer"]["checkpointer"]["base_path"] = io.join(run_dir, "checkpoints")
    if step is None:
        source = model_source(train_cfg, "latest")
        if source is None:
            raise ConfigError(f"{target} is not trained: run {run.name} at {run_dir} has no checkpoint or HF export "
                              f"yet (train it: snakemake {Plan.done_path(target)})")
    else:
        exports = dict(hf_exports(train_cfg["hf_save_path"]))
        if step not in exports:
            have = ", ".join(str(s) for s in sorted(exports)) or "none"
            raise ConfigError(f"{target}: run {run.name} has no HF export at step {step} under "
                              f"{train_cfg['hf_save_path']} (complete exports at steps: {have})")
        source = {"kind": "hf_export", "path": exports[step], "step": step}
    if source["kind"] == "hf_export":
        check_architecture(train_cfg["model"], source["path"])
    return Trained(target=target, name=run.name, run_dir=run_dir, source=source, train_cfg=train_cfg,
                   tools=tuple(tok.spec.get("tools") for tok in train.tokenized.values()))


def check_architecture(model: dict, hf_export: str) -> None:
    """An HF export whose ``config.json`` is not the run's model: one line naming what differs."""
    try:
        hf = io.read_json(io.join(hf_export, "config.json"))
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{hf_export}: no readable config.json ({one_line(e)})") from None
    if hf.get("model_type") not in (None, model.get("type")):
        raise ConfigError(f"{hf_export} holds a {hf.get('model_type')} checkpoint, the run trained a {model.get('type')}")
    wrong = [f"{k} {model[k]} but config.json {hf_key} {hf[hf_key]}" for k, hf_key in HF_KEYS.items()
             if k in model and hf_key in hf and int(hf[hf_key]) != int(model[k])]
    if wrong:
        raise ConfigError(f"{hf_export} is a checkpoint of another architecture than the run's model: " + "; ".join(wrong))
