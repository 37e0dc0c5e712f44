"""The cross-teacher matrix: held-out loss of every trained target on every teacher's held-out split.

Rows are trained targets (teachers and mixtures), columns teachers' held-out splits (config
``eval:``; :meth:`trajsft.plan.config.Plan.eval_cells` says which tokenized artifact each cell reads).
A cell is the mean next-token loss over the split's loss tokens (the assistant's output, as in
training) and the number of those tokens, computed by Levanter (:mod:`trajsft.train.eval`)
from the target's latest HF export or trainer checkpoint. Output: ``matrix.json``, a heatmap
``matrix.png`` and ``matrix.html`` (a table for the report).

``matrix_spec`` / ``eval_inputs`` / ``model_source`` / ``assemble`` / ``render_html`` /
``plot_heatmap`` are small and pure (or read files only); ``eval_matrix`` (the rule's step) runs the evaluation.
"""

from __future__ import annotations

import html as _html
import logging
import math
import os
import re
from typing import Mapping

from .. import io
from ..errors import ConfigError
from ..io import join, read_json, write_json, write_text
from ..plan.config import Plan
from ..plan.step_configs import EvalMatrixConfig

log = logging.getLogger("trajsft")

FORMAT = 1
MODEL_CHOICES = ("latest", "hf_export", "checkpoint")
_STEP_RE = re.compile(r"^step-(\d+)$")


def outputs(state_dir: str = "results") -> dict[str, str]:
    return {k: f"{state_dir}/eval/matrix.{k}" for k in ("json", "png", "html")}


def matrix_spec(cfg: EvalMatrixConfig) -> dict:
    """Everything the matrix depends on (the rule's params: a change reruns it)."""
    return {
        "format": FORMAT,
        "rows": {r: row.run.name for r, row in cfg.rows.items()},
        "columns": list(cfg.columns),
        "cells": {r: {c: row.cells[c].name for c in cfg.columns} for r, row in cfg.rows.items()},
        "max_eval_batches": cfg.max_eval_batches,
        "model": cfg.model,
    }


def eval_inputs(plan: Plan) -> dict[str, list[str]]:
    """Snakemake input: each row's done marker and each cell's tokenized manifest."""
    return {
        "done": [plan.done_path(r) for r in plan.eval_rows()],
        "tokenized": sorted({a.manifest for a in plan.eval_cells.values()}),
    }


def hf_exports(hf_dir: str) -> list[tuple[int, str]]:
    """The complete HF exports under ``hf_dir`` as (step, path), by step."""
    from ..train.checkpoints import hf_export_complete

    out = []
    for path in io.glob(join(hf_dir, "step-*")):
        m = _STEP_RE.match(os.path.basename(path.rstrip("/")))
        if m and hf_export_complete(path):
            out.append((int(m.group(1)), path))
    return sorted(out)


def model_source(train_cfg: Mapping, choice: str = "latest") -> dict:
    """Which model of a run to evaluate: ``{"kind": "hf_export"|"checkpoint", "path", "step"}``.

    ``latest``: the newer (by step) of the latest complete HF export and the latest trainer
    checkpoint, the HF export on a tie (it is the deliverable). Steps are 0-based step indices."""
    from ..train.checkpoints import latest_checkpoint

    if choice not in MODEL_CHOICES:
        raise ValueError(f"model must be one of {MODEL_CHOICES}")
    hf_dir = train_cfg.get("hf_save_path")
    exports = hf_exports(hf_dir) if hf_dir else []
    ck = latest_checkpoint(train_cfg["trainer"]["checkpointer"]["base_path"])
    hf = {"kind": "hf_export", "path": exports[-1][1], "step": exports[-1][0]} if exports else None
    tc = {"kind": "checkpoint", "path": ck["path"], "step": ck["step"]} if ck else None
    if choice == "hf_export":
        return hf
    if choice == "checkpoint":
        return tc
    if hf and tc:
        return hf if hf["step"] >= tc["step"] else tc
    return hf or tc


def _fmt_tokens(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else str(n)


def assemble(spec: Mapping, models: Mapping[str, Mapping], scores: Mapping[str, Mapping[str, Mapping]],
             chats: Mapping[str, int]) -> dict:
    """The matrix document. ``scores[row][col]`` = ``{"loss", "tokens", "sequences"}`` from Levanter,
    ``chats[tokenized name]`` = held-out chats in that artifact. ``same_chats[col]`` says whether
    every row read the same artifact for that column (same student and seq_len), i.e. the same
    chats and tokens; rows with a different tokenizer or seq_len see the same chats tokenized
    their way (their token counts differ)."""
    cols = list(spec["columns"])
    cells = {}
    for row in spec["rows"]:
        cells[row] = {}
        for col in cols:
            tok = spec["cells"][row][col]
            s = scores[row][col]
            cells[row][col] = {"loss": s["loss"], "tokens": s["tokens"], "sequences": s["sequences"],
                               "chats": chats.get(tok), "tokenized": tok}
    return {
        "format": FORMAT,
        "rows": list(spec["rows"]),
        "columns": cols,
        "runs": dict(spec["rows"]),
        "models": {r: dict(models[r]) for r in spec["rows"]},
        "cells": cells,
        "same_chats": {c: len({spec["cells"][r][c] for r in spec["rows"]}) == 1 for c in cols},
        "max_eval_batches": spec.get("max_eval_batches"),
        "loss": "mean next-token cross-entropy (nats) over the held-out split's assistant tokens",
    }


def render_html(doc: Mapping) -> str:
    esc = _html.escape
    cols = doc["columns"]
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = []
    for r in doc["rows"]:
        m = doc["models"][r]
        tds = []
        for c in cols:
            cell = doc["cells"][r][c]
            loss = "n/a" if cell["loss"] is None else f"{cell['loss']:.4f}"
            tds.append(f'<td><span class="loss">{loss}</span><br><span class="tok">{cell["tokens"]:,} tokens, '
                       f'{cell["chats"] if cell["chats"] is not None else "?"} chats</span></td>')
        body.append(f'<tr><th class="row">{esc(r)}<br><span class="tok">{esc(m["kind"])} step {m["step"]}</span>'
                    f"</th>{''.join(tds)}</tr>")
    notes = [c for c in cols if not doc["same_chats"][c]]
    note = (f"<p>Rows tokenize {', '.join(map(esc, notes))} differently (student or seq_len differ).</p>"
            if notes else "")
    css = ("body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse}"
           "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}.tok{color:#666;font-size:11px}"
           ".loss{font-weight:bold}caption{font-weight:bold;margin-bottom:4px}")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>trajsft cross-teacher matrix"
            f"</title><style>{css}</style></head><body>\n<table id=\"matrix\"><caption>Held-out loss: rows = trained "
            "targets, columns = teachers' held-out splits</caption>\n"
            f"<thead><tr><th>target \\ held-out</th>{head}</tr></thead>\n<tbody>\n" + "\n".join(body)
            + f"\n</tbody></table>\n<p>{esc(doc['loss'])}.</p>{note}\n</body></html>\n")


def render_text(doc: Mapping) -> str:
    """The matrix as a plain-text table (``trajsft eval``): loss (tokens) per cell."""
    cols = doc["columns"]
    cell = lambda c: "n/a" if c["loss"] is None else f"{c['loss']:.4f} ({_fmt_tokens(c['tokens'])})"  # noqa: E731
    table = [["target \\ held-out", *cols]] + [[r, *(cell(doc["cells"][r][c]) for c in cols)] for r in doc["rows"]]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    lines += [f"  {r}: {m['kind']} step {m['step']} {m['path']}" for r, m in doc["models"].items()]
    return "\n".join(lines)


def plot_heatmap(doc: Mapping, out_png: str) -> str:
    import numpy as np

    from .plots import pyplot, save_figure

    plt = pyplot()
    rows, cols = doc["rows"], doc["columns"]
    grid = np.array([[doc["cells"][r][c]["loss"] if doc["cells"][r][c]["loss"] is not None else np.nan
                      for c in cols] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.9 * len(cols) + 3), max(4.2, 0.9 * len(rows) + 2)))
    im = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(cols)), labels=cols, rotation=20, ha="right")
    ax.set_yticks(range(len(rows)), labels=rows)
    ax.set_xlabel("held-out split of teacher")
    ax.set_ylabel("trained target")
    finite = grid[np.isfinite(grid)]
    mid = float(finite.mean()) if finite.size else 0.0
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            cell = doc["cells"][r][c]
            txt = "n/a" if cell["loss"] is None else f"{cell['loss']:.3f}\n{_fmt_tokens(cell['tokens'])} tok"
            ax.text(j, i, txt, ha="center", va="center", fontsize=9,
                    color="white" if math.isfinite(grid[i, j]) and grid[i, j] > mid else "black")
    fig.colorbar(im, ax=ax, label="held-out loss (nats / token)")
    ax.set_title("Cross-teacher held-out loss (lower is better)")
    fig.tight_layout()
    return save_figure(fig, out_png)


def eval_matrix(cfg: EvalMatrixConfig, out: Mapping[str, str]) -> dict:
    """Evaluate every row's model on every column and write ``out["json"|"png"|"html"]``."""
    from ..train import eval as train_eval
    from ..data.tokenize import tokenized_cache_dir

    spec = matrix_spec(cfg)
    models, scores, chats = {}, {}, {}
    for tok in {a.name: a for row in cfg.rows.values() for a in row.cells.values()}.values():
        val = (tok.read_manifest().get("stats") or {}).get("validation")
        if not val:
            raise ConfigError(f"tokenized/{tok.name}: no held-out chat is left (every validation chat was dropped or "
                              "none was held out): raise heldout_fraction")
        chats[tok.name] = int(val["chats"])
    for row, r in cfg.rows.items():
        run = r.run
        prov = join(run.location, "provenance", "config.json")
        try:
            train_cfg = read_json(prov)["levanter"]
        except FileNotFoundError:
            raise ConfigError(f"{row}: {prov} is missing: train it first (snakemake {Plan.done_path(row)})") from None
        src = model_source(train_cfg, cfg.model)
        if src is None:
            raise ConfigError(f"{row}: no {'model' if cfg.model == 'latest' else cfg.model} of run {run.name} "
                              f"under {run.location}: train it first (snakemake {Plan.done_path(row)})")
        columns = {c: tokenized_cache_dir(r.cells[c]) for c in cfg.columns}
        ecfg = train_eval.eval_config(train_cfg, columns, r.tokenizer, cfg.max_eval_batches)
        log.info("eval %s (%s step %d, %s) on %s", row, src["kind"], src["step"], src["path"], ", ".join(columns))
        kw = {"hf_export": src["path"]} if src["kind"] == "hf_export" else {"checkpoint": src["path"]}
        scores[row] = train_eval.evaluate(ecfg, **kw)
        models[row] = src
        for c, s in scores[row].items():
            log.info("  %s on %s: loss %s over %d tokens (%d sequences)", row, c, s["loss"], s["tokens"], s["sequences"])
    doc = assemble(spec, models, scores, chats)
    write_json(out["json"], doc)
    if out.get("png"):
        plot_heatmap(doc, out["png"])
    if out.get("html"):
        write_text(out["html"], render_html(doc))
    return doc
