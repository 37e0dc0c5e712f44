"""What a run will write under its storage root, from the sizes the plan knows, against the root's free space.

Counted per artifact not yet at the root (shared data once), as an upper bound:

* ``models`` (``init: hf``): the student's parameters in bfloat16 (the Hub's safetensors);
* ``tokenized``: ``rows x seq_len`` tokens (a chat longer than ``seq_len`` is cut to it) in two int32 arrays
  (ids, assistant mask), in the source cache and the packed one (compressed, and most chats are shorter: the
  demo's are 37% of it);
* ``checkpoints``: a Levanter checkpoint is the parameters and Adam's two moments in float32, 12 bytes per
  parameter; the run keeps one every ``keep_every`` steps plus the latest, and writes the next before it
  deletes the one before; its HF exports are the parameters in ``hf_save_dtype``, one every ``hf_save_steps``
  and the final one. Before the data is tokenized the steps come from the rows (a packed sequence holds at
  least one chat, so never fewer steps).

Raw downloads, shards and the on-request exports and evaluations are not estimated (the Hub does not say a
dataset's size offline; they are small beside a checkpoint). ``trajsft plan``, ``trajsft preflight`` and the
start of a local Snakemake run say the figure beside the root's free space (:func:`line`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import io, storage
from ..errors import ConfigError, DataError
from ..plan import schedule
from ..plan.step_configs import TrainConfig
from ..train.target import explain
from . import check as fit_check, flops

CHECKPOINT_BYTES_PER_PARAM = 12  # float32 parameters + Adam's mu and nu
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
TOKENIZER_ALLOWANCE = 16 << 20
TOKEN_BYTES = 4 * 2 * 2  # int32 ids and assistant mask, in the source cache and the packed cache


@dataclass(frozen=True)
class Item:
    kind: str
    name: str
    bytes: int
    how: str  # how the figure was reached, for `trajsft plan --json`


@dataclass
class Footprint:
    items: list[Item] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # kind/name already at the root: nothing to write

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            out[i.kind] = out.get(i.kind, 0) + i.bytes
        return out


def parameters(cfg: TrainConfig) -> int:
    """The student's parameter count: the matmuls (``flops.matmul_params``, the LM head included), the token
    embedding and the RMS norms (two per layer, q and k norms, the final one)."""
    m = cfg.spec.student.model
    dims = {k: int(getattr(m, k)) for k in ("hidden_dim", "intermediate_dim", "num_layers", "num_heads",
                                             "num_kv_heads", "head_dim")}
    vocab = fit_check.vocab_size(cfg)
    h, layers = dims["hidden_dim"], dims["num_layers"]
    norms = layers * (2 * h + 2 * dims["head_dim"]) + h
    return flops.matmul_params(dims, vocab) + vocab * h + norms


def _run_items(cfg: TrainConfig, params: int) -> list[Item]:
    spec, training = cfg.run.spec, cfg.run.spec["training"]
    B = int(training["batch_size"])
    steps = explain(cfg)["steps"]  # None: packed sequences, not tokenized yet
    how_steps = f"{steps} steps"
    if steps is None:  # packed sequences not known yet: never more than the rows
        steps = schedule.train_steps({**training, "epochs_of": "rows"}, spec["rows"])
        how_steps = f"at most {steps} steps (from the rows; not tokenized yet)"
    ck = cfg.workflow["checkpointing"]
    keep = schedule.resolve_every(ck["keep_every_steps"], spec["rows"], B)
    hf_every = schedule.resolve_every(ck["hf_export_every_steps"], spec["rows"], B)
    kept = steps // keep + 2  # every keep_every, the latest, and the next while it is written
    exports = steps // hf_every + 1  # every hf_save_steps and the final one
    dtype = ck["hf_save_dtype"]
    one = params * CHECKPOINT_BYTES_PER_PARAM
    extra, what = _tokenizer_bytes(cfg)
    return [Item("checkpoints", cfg.run.name, kept * one,
                 f"{kept} checkpoints x {params} parameters x {CHECKPOINT_BYTES_PER_PARAM} bytes ({how_steps}, "
                 f"keep every {keep})"),
            Item("hf exports", cfg.run.name, exports * (params * DTYPE_BYTES[dtype] + extra),
                 f"{exports} HF exports x ({params} parameters in {dtype} + {what}) (every {hf_every} steps and "
                 "the final one)")]


def _tokenizer_bytes(cfg: TrainConfig) -> tuple[int, str]:
    """What an HF export holds beside its weights (the tokenizer, the config): a local tokenizer's files, else an
    allowance (Qwen3's tokenizer.json is 11 MB)."""
    local = cfg.spec.student.tokenizer.local
    if local and os.path.isdir(local):
        n = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs) + 64 * 1024
        return n, f"{size(n)} of tokenizer and config"
    return TOKENIZER_ALLOWANCE, f"{size(TOKENIZER_ALLOWANCE)} allowed for the tokenizer and config"


def estimate(trainings: list[TrainConfig], *, look: bool = True) -> Footprint:
    """What training ``trainings`` writes under their storage root, shared artifacts once; an artifact already
    there (a sealed payload, a finished run: :func:`trajsft.storage.where_in`) counts 0 (``look=False``: not asked,
    everything counts)."""
    fp, seen = Footprint(), set()
    for cfg in trainings:
        params = parameters(cfg)
        todo: list[tuple] = []  # (artifact, its items; None: the run's, worked out only if it is to be written)
        if cfg.model is not None:
            todo.append((cfg.model, [Item("models", cfg.model.name, params * 2, f"{params} parameters in bfloat16")]))
        seq = int(cfg.run.spec["training"]["seq_len"])
        for teacher, tok in cfg.tokenized.items():
            rows = int(cfg.run.spec["rows"][teacher])
            todo.append((tok, [Item("tokenized", tok.name, rows * seq * TOKEN_BYTES,
                                    f"at most {rows} rows x {seq} tokens x {TOKEN_BYTES} bytes")]))
        todo.append((cfg.run, None))
        for art, items in todo:
            key = (art.kind, art.name)
            if key in seen:
                continue
            seen.add(key)
            if look and storage.where_in([storage.absolute(cfg.workflow["storage_root"])], art):
                fp.present.append(f"{art.kind}/{art.name}")
                continue
            fp.items.extend(items if items is not None else _run_items(cfg, params))
    return fp


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def line(root: str, fp: Footprint) -> tuple[str, bool]:
    """``(line, short)``: the root's free space against what the run writes; ``short`` when it will not fit.
    A bucket has no free space to compare: the line says what is written."""
    parts = ", ".join(f"{k} {size(v)}" for k, v in fp.by_kind().items()) or "nothing: every artifact is there"
    writes = f"this run writes up to {size(fp.total)} ({parts})"
    free = io.free_bytes(root)
    if free is None:
        return f"storage root {root}: {writes}", False
    short = free < fp.total
    head = f"storage root {root}: {size(free)} free; {writes}"
    return (head + ("; it will not fit: free space or point storage_root elsewhere" if short else "")), short


def check(root: str, trainings: list[TrainConfig], *, probe: bool = True, look: bool = True,
          timeout_s: float = 20.0) -> dict:
    """The storage root for ``trajsft plan``, ``preflight`` and a Snakemake run's start: can it be written (one
    probe object written and deleted, :func:`trajsft.storage.probe_write`; ``probe=False``: not asked), its free
    space (a local root) and what training ``trainings`` writes there (``look``: see :func:`estimate`). ``lines``:
    what to print, the problem first."""
    root = storage.absolute(root)
    problem = storage.probe_write(root, timeout_s) if probe else None
    try:
        fp = estimate(trainings, look=look)
    except (DataError, ConfigError) as e:  # e.g. a Hub tokenizer with no vocab_size in the config
        fp = None
        text, short = f"storage root {root}: what this run writes is not estimated: {e}", False
    else:
        text, short = line(root, fp)
    return {"root": root, "problem": problem, "free_bytes": io.free_bytes(root),
            "writes_bytes": fp and fp.total, "writes": fp and [i.__dict__ for i in fp.items],
            "present": fp and fp.present, "short": short, "lines": [x for x in (problem, text) if x]}
