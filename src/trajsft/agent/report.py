"""Rule ``report_agent`` (``results/agent/resolve_rate.{html,png,json}``, on request): every evaluated target's
resolve rate over its run's training steps: a point per HF export ``trajsft eval --agent --watch`` evaluated while it
trained, then the final evaluation's (``agent/<target>/done``), as a plot and a table."""

from __future__ import annotations

import html as _html
import logging
from typing import Mapping, Sequence

from .. import io
from .evaluate import RESULTS, evaluated_steps, rate_shown

log = logging.getLogger("trajsft")


def rows_of(final: Mapping) -> list[dict]:
    """A target's rows: its evaluated exports by step, then its final evaluation (the step of the model it ran)."""
    steps = evaluated_steps(final["location"]) if final.get("location") else {}
    rows = [{**r, "step": step, "final": False} for step, r in steps.items()]
    last = io.read_json(io.join(final["location"], RESULTS)) if final.get("location") else dict(final)
    rows.append({**last, "step": (last.get("source") or {}).get("step"), "final": True})
    return [{k: r.get(k) for k in ("target", "model", "step", "final", "tasks", "resolved", "resolve_rate",
                                    "exit_statuses", "task_set")}
            | {"episodes": r.get("episodes", r.get("tasks")), "repeats": r.get("repeats", 1),
               "resolve_rate_std": r.get("resolve_rate_std")} for r in rows]


def plot(rows: Sequence[Mapping], out_png: str) -> str:
    """The resolve rate over training steps, a line per target (the final evaluation a filled marker; with repeats,
    a bar of the repeats' std)."""
    from ..report.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target and r["step"] is not None]
        line, = ax.plot([r["step"] for r in mine], [r["resolve_rate"] for r in mine], marker="o", mfc="white",
                        label=target)
        ends = [r for r in mine if r["final"]]
        ax.plot([r["step"] for r in ends], [r["resolve_rate"] for r in ends], "o", color=line.get_color())
        spread = [r for r in mine if r.get("resolve_rate_std") is not None]
        if spread:
            ax.errorbar([r["step"] for r in spread], [r["resolve_rate"] for r in spread],
                        yerr=[r["resolve_rate_std"] for r in spread], fmt="none", ecolor=line.get_color(), capsize=3)
    ax.set(xlabel="training step", ylabel="resolve rate", ylim=(-0.02, 1.02),
           title="Tasks resolved through mini-swe-agent (filled: the final evaluation)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, out_png)


def _rate(r: Mapping) -> str:
    """The rate, with repeats its std and their count: ``31.1% ± 3.8% (3 repeats)``."""
    return rate_shown(r) + (f" ({r['repeats']} repeats)" if r["repeats"] > 1 else "")


def render_html(rows: Sequence[Mapping], png_name: str) -> str:
    """The plot and a row per (target, evaluated model)."""
    esc = _html.escape
    body = [f"<tr><th>{esc(r['target'])}</th><td>{'final' if r['final'] else 'export'}</td>"
            f"<td>{'-' if r['step'] is None else r['step']}</td><td>{r['resolved']}/{r['episodes']}</td>"
            f"<td>{_rate(r)}</td><td>{esc(', '.join(f'{k} {v}' for k, v in (r['exit_statuses'] or {}).items()))}"
            f"</td><td>{esc(str(r['task_set']).rstrip('/').rsplit('/', 1)[-1])}</td></tr>" for r in rows]
    css = ("body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse}"
           "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}caption{font-weight:bold;margin-bottom:4px}")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>trajsft resolve rate</title>"
            f"<style>{css}</style></head><body>\n<img src=\"{esc(png_name)}\" alt=\"resolve rate over training steps\">\n"
            "<table id=\"agent\"><caption>Resolve rate: each target's student working its task set through "
            "mini-swe-agent, per evaluated export and finally</caption>\n<thead><tr><th>target</th><th>model</th>"
            "<th>step</th><th>resolved</th><th>rate</th><th>exit statuses</th><th>task set</th></tr></thead>\n<tbody>\n"
            + "\n".join(body) + "\n</tbody></table>\n</body></html>\n")


def rule_agent(snakemake) -> None:
    """Rule report_agent: the plot, the table and their rows (json) of every named target's agent evaluations."""
    import os

    rows = [r for p in snakemake.input for r in rows_of(io.read_json(p))]
    plot(rows, snakemake.output.png)
    io.write_text(snakemake.output.html, render_html(rows, os.path.basename(snakemake.output.png)))
    io.write_json(snakemake.output.json, rows)
    log.info("resolve rates of %d target(s), %d row(s), written to %s", len(snakemake.input), len(rows),
             snakemake.output.html)
