"""Training curves: train / eval loss vs step and the learning rate, from Levanter's metrics.

Input is what :func:`trajsft.train.metrics.read_metrics` returns: ``{"steps": {step: {metric:
value}}, ...}``. Metric names are Levanter's: ``train/loss`` (every step), ``optim/learning_rate``
(every step, from the optimizer's injected hyperparameters), and eval losses ``eval/loss``
(micro average over all validation sets) plus ``eval/<tag>/loss`` per tagged set (a mixture
evaluates every teacher's validation split) every ``steps_per_eval`` steps and at the end. Any of
them may be missing (no validation split -> no eval; a log from an old run -> no lr).

Public API
----------
``series(metrics) -> {"train": [(step, loss)], "eval": {key: [(step, loss)]}, "lr": [(step, lr)]}``
``summary(metrics) -> dict``                 steps, final / min losses, max lr
``plot_curves(metrics, out_png, title) -> dict``   writes the PNG atomically, returns ``summary``
``rule_curves(snakemake)``                   Snakemake ``script:`` entry point
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Mapping

from ..io import write_json

log = logging.getLogger("trajsft")

TRAIN_LOSS = "train/loss"
LR_KEYS = ("optim/learning_rate", "learning_rate", "optim/lr", "lr")


def _steps(metrics: Mapping) -> dict[int, Mapping]:
    steps = metrics.get("steps") if isinstance(metrics, Mapping) and "steps" in metrics else metrics
    out = {}
    for k, v in (steps or {}).items():
        try:
            out[int(k)] = v or {}
        except (TypeError, ValueError):
            continue
    return dict(sorted(out.items()))


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def is_eval_loss(key: str) -> bool:
    """``eval/loss``, ``eval/<tag>/loss``, ``eval/ema/loss``; not times, bpb or macro losses."""
    return key.startswith("eval/") and key.endswith("/loss")


def _lr_key(steps: Mapping[int, Mapping]) -> str | None:
    keys = {k for m in steps.values() for k in m}
    for k in LR_KEYS:
        if k in keys:
            return k
    cands = sorted(k for k in keys if k.endswith("learning_rate"))
    return cands[0] if cands else None


def series(metrics: Mapping) -> dict:
    steps = _steps(metrics)
    train = [(s, v) for s, m in steps.items() if (v := _num(m.get(TRAIN_LOSS))) is not None]
    evals: dict[str, list] = {}
    for s, m in steps.items():
        for k, v in m.items():
            if is_eval_loss(k) and (f := _num(v)) is not None:
                evals.setdefault(k, []).append((s, f))
    lr_key = _lr_key(steps)
    lr = [(s, v) for s, m in steps.items() if lr_key and (v := _num(m.get(lr_key))) is not None]
    # the overall eval loss first, then tags alphabetically
    evals = dict(sorted(evals.items(), key=lambda kv: (kv[0] != "eval/loss", kv[0])))
    return {"train": train, "eval": evals, "lr": lr, "lr_key": lr_key}


def summary(metrics: Mapping) -> dict:
    s = series(metrics)
    tr = s["train"]
    return {
        "steps_logged": len(tr),
        "last_step": tr[-1][0] if tr else None,
        "final_train_loss": tr[-1][1] if tr else None,
        "min_train_loss": min(v for _, v in tr) if tr else None,
        "eval": {k: {"final": v[-1][1], "final_step": v[-1][0], "min": min(x for _, x in v), "points": len(v)}
                 for k, v in s["eval"].items()},
        "max_learning_rate": max(v for _, v in s["lr"]) if s["lr"] else None,
        "lr_key": s["lr_key"],
    }


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(sa == sb and math.isclose(va, vb, rel_tol=1e-9) for (sa, va), (sb, vb) in zip(a, b))


def _ema(values: list[float], alpha: float) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def plot_curves(metrics: Mapping, out_png: str | os.PathLike, title: str) -> dict:
    """Loss panel (train loss, smoothed when long, and every eval loss) over a learning-rate panel.

    Works with train loss only, eval only, or no metrics at all (a placeholder figure saying so).
    Writes atomically; returns :func:`summary`."""
    from .plots import pyplot, save_figure

    plt = pyplot()
    s = series(metrics)
    fig, (ax, ax_lr) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    fig.suptitle(title, fontsize=13)
    if s["train"]:
        xs, ys = zip(*s["train"])
        if len(xs) >= 50:
            ax.plot(xs, ys, color="tab:blue", alpha=0.3, lw=0.8, label="train loss")
            ax.plot(xs, _ema(list(ys), 2 / (1 + max(5, len(xs) // 50))), color="tab:blue", lw=1.6,
                    label="train loss (EMA)")
        else:
            ax.plot(xs, ys, color="tab:blue", lw=1.4, marker="." if len(xs) < 30 else None, label="train loss")
    colors = ["tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
    main_eval = s["eval"].get("eval/loss")
    shown = {k: pts for k, pts in s["eval"].items()
             # one validation set: eval/<teacher>/loss repeats eval/loss; draw it once
             if k == "eval/loss" or not main_eval or not _same(pts, main_eval)}
    for i, (k, pts) in enumerate(shown.items()):
        xs, ys = zip(*pts)
        main = k == "eval/loss"
        ax.plot(xs, ys, color=colors[i % len(colors)], lw=2.0 if main else 1.2, ls="-" if main else "--",
                marker="o", ms=4 if main else 3, label=k.replace("/loss", " loss"))
    all_losses = [v for _, v in s["train"]] + [v for pts in s["eval"].values() for _, v in pts]
    if all_losses:
        lo, hi = min(all_losses), max(all_losses)
        if lo > 0 and hi / lo > 30:
            ax.set_yscale("log")
        ax.legend(fontsize=9, frameon=False)
        note = []
        if s["train"]:
            note.append(f"final train loss {s['train'][-1][1]:.4g} @ step {s['train'][-1][0]}")
        if "eval/loss" in s["eval"]:
            note.append(f"final eval loss {s['eval']['eval/loss'][-1][1]:.4g}")
        elif not s["eval"]:
            note.append("no eval metrics")
        ax.set_title("; ".join(note), fontsize=10)
    else:
        ax.text(0.5, 0.5, "no loss metrics in the log", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if s["lr"]:
        xs, ys = zip(*s["lr"])
        ax_lr.plot(xs, ys, color="tab:gray", lw=1.4)
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax_lr.set_ylabel(s["lr_key"] or "learning rate", fontsize=9)
    else:
        ax_lr.text(0.5, 0.5, "no learning-rate metric", ha="center", va="center", transform=ax_lr.transAxes,
                   color="0.4")
        ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step (0-based, Levanter)")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    save_figure(fig, out_png)
    return summary(metrics)


def rule_curves(snakemake) -> None:
    """``results/curves/{target}.png`` (+ ``.json`` summary) from the training log."""
    from ..train.metrics import read_metrics

    target = snakemake.wildcards.target
    log_path = snakemake.input.log
    metrics = read_metrics(log_path)
    if not metrics["steps"]:
        # the done marker names the durable run log (the rule log is a symlink to it)
        try:
            with open(snakemake.input.done) as f:
                alt = json.load(f).get("log")
        except (OSError, ValueError):
            alt = None
        if alt and os.path.exists(alt):
            metrics = read_metrics(alt)
    if not metrics["steps"]:
        log.warning("%s: no metrics found in %s; writing a placeholder plot", target, log_path)
    summ = plot_curves(metrics, snakemake.output.png, f"training curves: {target}")
    if snakemake.output.get("json"):
        write_json(snakemake.output.json, {"target": target, "log": str(log_path), **summ})
    log.info("%s: curves written to %s (%d steps logged)", target, snakemake.output.png, summ["steps_logged"])
