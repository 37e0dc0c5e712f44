"""A sweep's comparison (rule ``sweep``, ``sweeps/<name>/``): one row per cell and two pictures.

- ``results.csv`` / ``results.md``: the cell (its target), only the settings that vary across the cells, its
  state, final train loss, final and best held-out loss (Levanter's ``eval/loss``), next-action ``tool_name`` and
  ``valid`` where that evaluation exists, tokens trained, estimated TPU chip-hours (the cached ``trajsft fit`` of
  the profile's slice, on a Ray profile), W&B URL and checkpoint path; the best cell (lowest final held-out loss,
  else final train loss) is marked;
- ``loss.png``: the held-out loss curves of every cell on one figure (train loss where a run has no held-out
  split); ``settings.png``: the final metric against each swept setting.
"""

from __future__ import annotations

import csv
import io as _io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .. import io
from ..plan import step_configs
from ..plan.placement import placement
from ..plan.config import Plan
from ..plan.sweeps import Cell, cells

log = logging.getLogger("trajsft")

FILES = {"done": "done", "csv": "results.csv", "md": "results.md", "curves": "loss.png", "settings": "settings.png"}


def outputs(sweep: str) -> dict[str, str]:
    return {k: f"sweeps/{sweep}/{f}" for k, f in FILES.items()}


def _read(path: str) -> Optional[dict]:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class _Record:
    """One cell as the comparison reads it, read once: its training config, the result of the attempt that trained
    its run, and the metrics of its train log (None: no log here)."""

    cell: Cell
    tc: Any
    trained: Optional[dict]
    metrics: Optional[dict]


def _records(plan: Plan, sweep: str) -> list[_Record]:
    from ..train import metrics

    out = []
    for c in cells(plan.cfg)[sweep]:
        tc = step_configs.train(plan, c.target)
        trained, log_path = _trained_record(plan, tc)
        out.append(_Record(c, tc, trained, metrics.read_metrics(log_path) if log_path else None))
    return out


def rows(plan: Plan, records: Sequence[_Record]) -> tuple[list[str], list[dict]]:
    """(the swept settings that vary, one row per cell) of a sweep's ``records``, the best cell marked."""
    from ..fit import check as fit
    from ..train.target import explain
    from .curves import summary

    axes = [a for a, _ in records[0].cell.values]
    varying = [a for a in axes if len({json.dumps(dict(r.cell.values).get(a), sort_keys=True) for r in records}) > 1]
    tpu_type = placement(plan.cfg).tpu_type
    out = []
    for rec in records:
        c, tc, trained = rec.cell, rec.tc, rec.trained
        done = _read(Plan.done_path(c.target))
        current = bool(done) and done.get("hash") == tc.run.hash
        if current and trained and (done or {}).get("final_loss") is None:  # weights copied here: the run's figures
            done = {**done, "final_loss": trained.get("final_loss"), "eval_loss": trained.get("eval_loss")}
        s = summary(rec.metrics) if rec.metrics is not None else {"eval": {}}
        ev = s["eval"].get("eval/loss") or {}
        steps = explain(tc)
        fitted = fit.cached_summary(tc, steps.get("steps"), tpu_type) if tpu_type else None
        actions = _read(Plan.evals_done_path(c.target))
        splits = list(((actions or {}).get("splits") or {}).values())
        row: dict[str, Any] = {"cell": c.target, **{a.removeprefix("training."): dict(c.values)[a] for a in varying},
                               "state": "done" if current else "not done",
                               "final_loss": (done or {}).get("final_loss") if current else s.get("final_train_loss"),
                               "final_eval_loss": ev.get("final", _done_eval_loss(done) if current else None),
                               "best_eval_loss": ev.get("min"),
                               "next_action_tool_name": _mean(sp.get("tool_name") for sp in splits),
                               "next_action_valid": _mean(sp.get("valid") for sp in splits),
                               "tokens_trained": None if steps.get("tokens_seen") is None
                               else int(round(steps["tokens_seen"])),
                               "tpu_chip_hours": (fitted or {}).get("chip_hours"),
                               "wandb_url": (done or {}).get("wandb_url") if current else None,
                               "checkpoint_dir": tc.run.location, "best": ""}
        out.append(row)
    key = "final_eval_loss" if any(r["final_eval_loss"] is not None for r in out) else "final_loss"
    scored = [r for r in out if r[key] is not None]
    if scored:
        min(scored, key=lambda r: r[key])["best"] = f"best ({key})"
    return [a.removeprefix("training.") for a in varying], out


def _trained_record(plan: Plan, tc) -> tuple[Optional[dict], Optional[str]]:
    """The result of the attempt that trained ``tc``'s run (``training_result.json`` with a final loss) and its local
    train log, from whichever storage root holds the run (the current one first): a run whose weights were copied
    here from another root (``copy_from``) did not train here."""
    from .. import storage

    roots = storage.roots_of(plan.cfg["storage_root"], plan.cfg.get("copy_from"), plan.state_dir)
    for root in roots:
        run_dir = io.join(root, "checkpoints", tc.run.name)
        try:
            result = io.read_json(io.join(run_dir, "training_result.json"))
        except (FileNotFoundError, ValueError, OSError):
            continue
        if result.get("final_loss") is None:
            continue
        log_path = tc.log if Path(tc.log).exists() and root == roots[0] else result.get("log_path")
        return result, log_path if log_path and not io.is_remote(log_path) and Path(log_path).exists() else None
    return None, tc.log if Path(tc.log).exists() else None


def _done_eval_loss(done: Optional[dict]) -> Optional[float]:
    """The final ``eval/loss`` a done marker records (``{"eval/loss": [step, loss], ...}``), for a run whose train
    log is not here (its weights copied from another root)."""
    ev = (done or {}).get("eval_loss")
    if isinstance(ev, dict):
        ev = ev.get("eval/loss")
    if isinstance(ev, (list, tuple)) and ev:
        ev = ev[-1]
    return float(ev) if isinstance(ev, (int, float)) else None


def _mean(values) -> Optional[float]:
    vs = [float(v) for v in values if isinstance(v, (int, float))]
    return round(sum(vs) / len(vs), 4) if vs else None


def _cell_text(column: str, v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if "loss" in column or column.startswith("next_action") else f"{v:g}"
    return str(v)


def to_csv(table: Sequence[Mapping]) -> str:
    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(table[0]), lineterminator="\n")
    w.writeheader()
    for r in table:
        w.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def to_markdown(sweep: str, table: Sequence[Mapping]) -> str:
    cols = list(table[0])
    lines = [f"# Sweep {sweep}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell_text(c, r[c]).replace("|", "\\|") for c in cols) + " |" for r in table]
    return "\n".join(lines) + "\n"


def plot_curves(sweep: str, records: Sequence[_Record], out_png: str) -> int:
    """Every cell's held-out loss curve (else its train loss) on one figure; the number of curves drawn."""
    from .curves import series
    from .plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = 0
    for rec in records:
        if rec.metrics is None:
            continue
        s = series(rec.metrics)
        pts, what = (s["eval"]["eval/loss"], "held-out") if "eval/loss" in s["eval"] else (s["train"], "train")
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30 else None,
                    label=f"{rec.cell.target} ({what})")
            drawn += 1
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"sweep {sweep}: loss of every cell")
    if drawn:
        ax.legend(fontsize=8)
    save_figure(fig, out_png)
    return drawn


def plot_settings(sweep: str, varying: list[str], table: Sequence[Mapping], out_png: str) -> None:
    """The final held-out loss (else final train loss) against each swept setting, one panel per setting."""
    from .plots import pyplot, save_figure

    plt = pyplot()
    key = "final_eval_loss" if any(r["final_eval_loss"] is not None for r in table) else "final_loss"
    n = max(1, len(varying))
    fig, axes = plt.subplots(1, n, figsize=(max(6.5, 4.5 * n), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], varying or [None]):
        pts = [(r[setting], r[key]) for r in table if setting and r[key] is not None]
        if pts and all(isinstance(x, (int, float)) for x, _ in pts):
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o")
            if setting.endswith("learning_rate") and min(x for x, _ in pts) > 0:
                ax.set_xscale("log")
        elif pts:
            ax.bar([str(x) for x, _ in pts], [y for _, y in pts])
        ax.set_xlabel(setting or "(nothing varies)")
        ax.set_ylabel(key.replace("_", " "))
    fig.suptitle(f"sweep {sweep}")
    save_figure(fig, out_png)


def build(plan: Plan, sweep: str, out: Mapping[str, str]) -> dict:
    """Every file of ``sweeps/<sweep>/`` (``out``: kind -> path, as :func:`outputs`); the done marker's content."""
    records = _records(plan, sweep)  # each cell's record and metrics, read once for the table and the curves
    varying, table = rows(plan, records)
    io.write_text(out["csv"], to_csv(table))
    io.write_text(out["md"], to_markdown(sweep, table))
    drawn = plot_curves(sweep, records, out["curves"])
    plot_settings(sweep, varying, table, out["settings"])
    best = next((r["cell"] for r in table if r["best"]), None)
    done = {"sweep": sweep, "cells": [r["cell"] for r in table], "varying": varying, "best": best,
            "curves_drawn": drawn, "files": {k: out[k] for k in ("csv", "md", "curves", "settings")}}
    io.write_json(out["done"], done)
    log.info("sweep %s: %d cell(s), best %s; %s", sweep, len(table), best, out["csv"])
    return done


def rule_sweep(snakemake) -> None:
    """Rule ``sweep``: the comparison of every cell of ``snakemake.wildcards.sweep`` (all trained: its inputs)."""
    from ..plan.config import REPO_DIR

    plan = Plan(dict(snakemake.config), base_dir=REPO_DIR)
    build(plan, snakemake.wildcards.sweep, dict(snakemake.output.items()))
