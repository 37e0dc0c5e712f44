"""How long a target trains: optimizer steps, passes over the data, tokens seen, checkpoint cadence.

Two definitions of an epoch (``training.epochs_of``):

* ``rows`` (the reference run): ``steps = ceil(epochs * rows / batch_size)`` over the teacher's
  dataset rows as the reference counted them, i.e. the configured ``rows`` of the teacher (the HF
  dataset's row count, which the ``download`` rule checks), not the rows kept after validation.
  1730 / 2298 / 634 steps for gpt-5-mini / minimax-m2.5 / gemini-3-flash at 7 epochs, batch 16.
  Known offline, before anything is downloaded.
* ``packed_sequences``: ``steps = ceil(epochs * packed / batch_size)`` over the ``seq_len``
  sequences Levanter packs out of the tokenized cache (several chats per sequence), i.e. true passes
  over the training data. Known once the teacher is tokenized.

A mixture counts the sum over its teachers (rows or packed sequences): an epoch has as many steps as
training on the concatenated teachers; the weights decide each teacher's share of those steps, so a
teacher's own passes are ``steps * batch * weight / its packed sequences`` (``explain``).
``max_steps`` overrides both.

Pure functions on plain data; ``train.target`` and ``trajsft plan --explain`` use them.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

EPOCHS_OF = ("rows", "packed_sequences")
QUARTER_EPOCH = "quarter_epoch"  # the reference run's checkpoint cadence, (rows // batch) // 4 steps


def steps_over(count: int, batch_size: int, epochs: float) -> int:
    """``ceil(epochs * count / batch_size)``, at least 1."""
    if count <= 0:
        raise ValueError("count must be > 0")
    return max(1, math.ceil(float(epochs) * int(count) / int(batch_size)))


def train_steps(training: Mapping, rows: Mapping[str, int], packed: Optional[Mapping[str, int]] = None) -> Optional[int]:
    """Optimizer steps of a target; None when ``epochs_of: packed_sequences`` and a packed count is
    not known yet (the teacher is not tokenized)."""
    if training.get("max_steps"):
        return int(training["max_steps"])
    of = training.get("epochs_of", "packed_sequences")
    if of not in EPOCHS_OF:
        raise ValueError(f"epochs_of must be one of {', '.join(EPOCHS_OF)}, not {of!r}")
    counts = rows if of == "rows" else packed
    if counts is None or any(counts.get(t) is None for t in rows):
        return None
    return steps_over(sum(int(counts[t]) for t in rows), int(training["batch_size"]), float(training["epochs"]))


def quarter_epoch_steps(rows: Mapping[str, int], batch_size: int) -> int:
    """The reference run's checkpoint cadence: ``(rows // batch) // 4`` steps (at least 1)."""
    return max(1, (sum(int(r) for r in rows.values()) // int(batch_size)) // 4)


def resolve_every(value, rows: Mapping[str, int], batch_size: int) -> int:
    """A checkpointing cadence from the config: an integer, or ``quarter_epoch``."""
    if value == QUARTER_EPOCH:
        return quarter_epoch_steps(rows, batch_size)
    return int(value)


def explain(training: Mapping, weights: Mapping[str, float], rows: Mapping[str, int],
            data: Optional[Mapping[str, Mapping]] = None) -> dict:
    """Steps, passes over each teacher's data and tokens seen, for ``trajsft plan --explain``.

    ``data[teacher]`` (from the tokenized manifest, when built): ``packed_sequences`` and
    ``tokens_in_window`` (training tokens inside the ``seq_len`` windows, i.e. after truncation).
    Figures that need it are None until the teacher is tokenized.
    """
    data = data or {}
    packed = {t: (data.get(t) or {}).get("packed_sequences") for t in rows}
    steps = train_steps(training, rows, packed)
    batch = int(training["batch_size"])
    total_w = sum(weights.values()) or 1.0
    out = {"epochs": float(training["epochs"]), "epochs_of": training.get("epochs_of", "packed_sequences"),
           "max_steps": training.get("max_steps"), "batch_size": batch, "seq_len": int(training["seq_len"]),
           "rows": dict(rows), "steps": steps, "sequences": None if steps is None else steps * batch,
           "teachers": {}, "tokens_seen": None}
    tokens_total = 0
    for t in rows:
        share = weights[t] / total_w
        seqs = None if steps is None else steps * batch * share
        p, tok = packed[t], (data.get(t) or {}).get("tokens_in_window")
        passes = None if seqs is None or not p else seqs / p
        tokens = None if passes is None or tok is None else passes * tok
        out["teachers"][t] = {"weight": share, "rows": int(rows[t]), "packed_sequences": p, "sequences": seqs,
                              "passes": passes, "tokens_seen": tokens}
        tokens_total = None if tokens is None or tokens_total is None else tokens_total + tokens
    out["tokens_seen"] = tokens_total
    return out


def render(target: str, e: dict) -> list[str]:
    """Human-readable lines of :func:`explain`."""
    how = (f"max_steps {e['max_steps']}" if e["max_steps"] else
           f"{e['epochs']:g} epochs of {e['epochs_of']}, batch {e['batch_size']}")
    steps = f"{e['steps']} steps" if e["steps"] is not None else "? steps (known once tokenized)"
    lines = [f"  training: {steps} ({how}; seq_len {e['seq_len']})"]
    for t, d in e["teachers"].items():
        passes = "?" if d["passes"] is None else f"{d['passes']:.2f}"
        toks = "?" if d["tokens_seen"] is None else f"{d['tokens_seen'] / 1e6:.1f}M"
        packed = "? packed sequences" if d["packed_sequences"] is None else f"{d['packed_sequences']} packed sequences"
        lines.append(f"    {t}: weight {d['weight']:.2f}, {d['rows']} rows, {packed}: {passes} passes, {toks} tokens seen")
    if e["tokens_seen"] is not None:
        lines.append(f"    tokens seen in total: {e['tokens_seen'] / 1e6:.1f}M")
    return lines
