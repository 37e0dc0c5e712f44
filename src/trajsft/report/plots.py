"""The dataset cards' figures (matplotlib, headless): per-target histograms and the mixture panel."""

from __future__ import annotations

import math
import os
from typing import Mapping

import numpy as np

from ..io import atomic_path
from .cards import SPLITS, fmt_int, fmt_num, fmt_pct, fmt_window, chat_lengths, beyond, distribution


# ---- plots ---------------------------------------------------------------------------------
def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_png: str | os.PathLike, dpi: int = 100) -> str:
    """Write a figure to ``out_png`` atomically (temp file in the same dir + ``os.replace``)."""
    plt = pyplot()
    try:
        with atomic_path(out_png) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    finally:
        plt.close(fig)
    return str(out_png)


def _empty_panel(ax, title: str, text: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _int_hist(ax, values: list[int], title: str, xlabel: str, color: str) -> None:
    if not values:
        _empty_panel(ax, title, "no trajectories")
        return
    lo, hi = min(values), max(values)
    span = hi - lo
    bins = (range(lo, hi + 2) if span <= 40 else 30)
    ax.hist(values, bins=bins, color=color, edgecolor="white", linewidth=0.5, align="left" if span <= 40 else "mid")
    d = distribution(values)
    ax.axvline(d["median"], color="k", lw=1, ls="--", label=f"median {d['median']:g}")
    ax.axvline(d["p90"], color="k", lw=1, ls=":", label=f"p90 {d['p90']:g}")
    ax.set_title(f"{title} (mean {d['mean']:.1f}, max {d['max']})", fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("trajectories")
    _integer_y(ax)
    ax.legend(fontsize=8, frameon=False)


def _integer_y(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _token_hist(ax, lengths: list[int], seq_len: int | None, title: str = "tokens per trajectory") -> None:

    if not lengths:
        _empty_panel(ax, title, "not tokenized yet")
        return
    lo, hi = max(1, min(lengths)), max(lengths)
    if seq_len:
        hi_plot = max(hi, seq_len)
    else:
        hi_plot = hi
    log_x = hi_plot / lo > 50
    if log_x:
        bins = np.logspace(math.log10(lo), math.log10(hi_plot * 1.05), 40)
        ax.set_xscale("log")
    else:
        bins = np.linspace(0, hi_plot * 1.05, 40)
    ax.hist(lengths, bins=bins, color="tab:purple", edgecolor="white", linewidth=0.5)
    if seq_len:
        b = beyond(lengths, seq_len)
        ax.axvline(seq_len, color="tab:red", lw=1.5,
                   label=f"seq_len {seq_len:,}: {fmt_pct(b['chats_share'])} of chats, "
                         f"{fmt_pct(b['tokens_share'])} of tokens beyond")
        ax.legend(fontsize=8, frameon=False, loc="upper left")
    d = distribution(lengths)
    ax.set_title(f"{title} (median {d['median']:,.0f}, p90 {d['p90']:,.0f}, max {d['max']:,})", fontsize=10)
    ax.set_xlabel("tokens" + (" (log scale)" if log_x else ""))
    ax.set_ylabel("trajectories")
    _integer_y(ax)


def plot_card(card: Mapping, shards_manifest: Mapping, tokenized_manifest: Mapping | None,
              out_png: str | os.PathLike) -> str:
    """One PNG for a teacher card: rows kept/skipped by reason, turns, tool calls, tokens per
    trajectory (log-x when wide, red line at ``seq_len``), assistant-token share, key numbers."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    fig.suptitle(f"dataset card: {card['name']}  ({card.get('shards')}"
                 + (f", {card['tokenized']}" if card.get("tokenized") else "") + ")", fontsize=13)

    # rows
    ax = axes[0, 0]
    labels = [f"kept: {s}" for s in SPLITS] + [f"skipped: {r}" for r in card["skipped"]]
    vals = [card["kept"][s] for s in SPLITS] + list(card["skipped"].values())
    colors = ["tab:green", "tab:olive"] + ["tab:red"] * len(card["skipped"])
    y = list(range(len(labels)))[::-1]
    bars = ax.barh(y, vals, color=colors)
    ax.set_yticks(y, labels, fontsize=8)
    for b_, v in zip(bars, vals):
        ax.text(b_.get_width(), b_.get_y() + b_.get_height() / 2, f" {v:,}", va="center", fontsize=8)
    ax.set_xlim(0, max(vals + [1]) * 1.2)
    ax.set_title(f"rows: {card['rows_in']:,} in, {card['kept_total']:,} kept, {card['skipped_total']:,} skipped",
                 fontsize=10)
    ax.set_xlabel("rows")

    trajs = list(shards_manifest.get("trajectories") or [])
    _int_hist(axes[0, 1], [int(t["turns"]) for t in trajs if t.get("turns") is not None],
              "assistant turns per trajectory", "turns", "tab:blue")
    _int_hist(axes[0, 2], [int(t["tool_calls"]) for t in trajs if t.get("tool_calls") is not None],
              "tool calls per trajectory", "tool calls", "tab:orange")

    lengths = chat_lengths(tokenized_manifest)
    _token_hist(axes[1, 0], lengths, card.get("seq_len"))

    # assistant-token share per trajectory
    ax = axes[1, 1]
    asst = chat_lengths(tokenized_manifest, "assistant_lengths")
    if lengths and len(asst) == len(lengths):
        shares = [a / n for a, n in zip(asst, lengths) if n]
        ax.hist(shares, bins=[i / 40 for i in range(41)], color="tab:cyan", edgecolor="white", linewidth=0.5)
        overall = card["tokens"]["assistant_share"]
        ax.axvline(overall, color="k", lw=1.5, label=f"all tokens: {fmt_pct(overall)}")
        ax.legend(fontsize=8, frameon=False)
        ax.set_xlim(0, 1)
        ax.set_title("assistant-token share (loss tokens / tokens) per trajectory", fontsize=10)
        ax.set_xlabel("share")
        ax.set_ylabel("trajectories")
        _integer_y(ax)
    else:
        _empty_panel(ax, "assistant-token share", "not tokenized yet")

    # key numbers
    ax = axes[1, 2]
    ax.axis("off")
    tok = card.get("tokens") or {}
    bsl = tok.get("beyond_seq_len") or {}
    tr = card["trajectories"]
    lines = [
        ("rows in", fmt_int(card["rows_in"])),
        ("kept train / validation", f"{card['kept']['train']:,} / {card['kept']['validation']:,}"),
        ("skipped", f"{card['skipped_total']:,} ({fmt_pct(card['skipped_total'] / card['rows_in'] if card['rows_in'] else None)})"),
        ("resolved rate", fmt_pct(card.get("resolved_rate"))),
        ("turns mean / median / p90", f"{fmt_num(tr['turns']['mean'])} / {fmt_num(tr['turns']['median'])} / {fmt_num(tr['turns']['p90'])}"),
        ("tool calls mean / p90", f"{fmt_num(tr['tool_calls']['mean'])} / {fmt_num(tr['tool_calls']['p90'])}"),
        ("tokens (all splits)", fmt_int(tok.get("total"))),
        ("tokens / traj. mean", fmt_num((tok.get("per_trajectory") or {}).get("mean"), 0)),
        ("seq_len", fmt_int(card.get("seq_len"))),
        ("chats beyond seq_len", fmt_pct(bsl.get("chats_share"))),
        ("tokens beyond seq_len", fmt_pct(bsl.get("tokens_share"))),
        ("assistant-token share", fmt_pct(tok.get("assistant_share"))),
        (f"long chats ({(card.get('window') or {}).get('long_chats', '–')}): truncated", fmt_window(card.get("window"), "truncated")),
        ("dropped: longer than seq_len", fmt_window(card.get("window"), "dropped_longer_than_seq_len")),
        ("dropped: no loss token in window", fmt_window(card.get("window"), "dropped_empty_window")),
    ]
    lines += [(f"event: {k}", fmt_int(v)) for k, v in card.get("events", {}).items()]
    bad = [k for k, v in (card.get("checks") or {}).items() if not v]
    lines.append(("consistency checks", "all ok" if not bad else "FAILED: " + ", ".join(bad)))
    for i, (k, v) in enumerate(lines):
        yy = 1 - i * (1 / max(len(lines), 14))
        ax.text(0.0, yy, k, fontsize=9, transform=ax.transAxes, va="top")
        ax.text(1.0, yy, v, fontsize=9, transform=ax.transAxes, va="top", ha="right", family="monospace",
                color="tab:red" if k == "consistency checks" and bad else "black")
    ax.set_title("summary", fontsize=10)
    advice = card.get("seq_len_advice")
    if advice:
        fig.text(0.5, 0.01, advice, ha="center", va="bottom", fontsize=10, color="tab:red")
    fig.tight_layout(rect=(0, 0.03 if advice else 0, 1, 0.96))
    return save_figure(fig, out_png)


def plot_mixture(card: Mapping, manifests: Mapping[str, tuple[Mapping, Mapping | None]] | None,
                 out_png: str | os.PathLike) -> str:
    """One PNG for a mixture card: weights vs natural token shares, rows per teacher, and overlaid
    histograms (share of each teacher's trajectories) of tokens and turns per trajectory."""

    plt = pyplot()
    manifests = manifests or {}
    teachers = sorted(card["weights"])
    comp = card["composition"]
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    fig.suptitle(f"mixture card: {card['name']}  ("
                 + ", ".join(f"{t} {card['weights'][t]:.2f}" for t in teachers) + ")", fontsize=13)

    ax = axes[0, 0]
    x = np.arange(len(teachers))
    wv = [comp[t]["weight"] for t in teachers]
    nat = [comp[t]["natural_token_share"] or 0 for t in teachers]
    cs = [comp[t]["chat_share"] for t in teachers]
    ax.bar(x - 0.27, wv, 0.27, label="weight (token share sampled)", color="tab:blue")
    ax.bar(x, nat, 0.27, label="share of tokens in the data", color="tab:gray")
    ax.bar(x + 0.27, cs, 0.27, label="chat share sampled", color="tab:green")
    for i, t in enumerate(teachers):
        up = comp[t]["upsampling"]
        if up:
            ax.text(i, max(wv[i], nat[i], cs[i]) + 0.02, f"x{up:.2f}", ha="center", fontsize=9)
    ax.set_xticks(x, teachers)
    ax.set_ylim(0, 1.1)
    ax.set_title("composition (x = upsampling vs. plain concatenation)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)

    ax = axes[0, 1]
    kept = [card["teachers"][t]["kept_total"] for t in teachers]
    skipped = [card["teachers"][t]["skipped_total"] for t in teachers]
    ax.bar(x, kept, color="tab:green", label="kept")
    ax.bar(x, skipped, bottom=kept, color="tab:red", label="skipped")
    for i in range(len(teachers)):
        ax.text(i, kept[i] + skipped[i], f"{kept[i]:,} + {skipped[i]:,}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, teachers)
    ax.set_ylim(0, max([k + s_ for k, s_ in zip(kept, skipped)] + [1]) * 1.2)
    ax.set_ylabel("rows")
    ax.set_title(f"rows: {card['rows_in']:,} in, {card['kept_total']:,} kept", fontsize=10)
    ax.legend(fontsize=8, frameon=False)

    # tokens per trajectory, per teacher
    ax = axes[1, 0]
    all_lengths = {t: chat_lengths(manifests.get(t, ({}, None))[1]) for t in teachers}
    if any(all_lengths.values()):
        flat = [n for v in all_lengths.values() for n in v]
        lo, hi = max(1, min(flat)), max(max(flat), card.get("seq_len") or 0)
        log_x = hi / lo > 50
        bins = np.logspace(math.log10(lo), math.log10(hi * 1.05), 40) if log_x else np.linspace(0, hi * 1.05, 40)
        for t in teachers:
            if all_lengths[t]:
                n = len(all_lengths[t])
                ax.hist(all_lengths[t], bins=bins, histtype="step", weights=[1 / n] * n, lw=1.5, label=t)
        if log_x:
            ax.set_xscale("log")
        if card.get("seq_len"):
            ax.axvline(card["seq_len"], color="tab:red", lw=1.5, label=f"seq_len {card['seq_len']:,}")
        ax.legend(fontsize=8, frameon=False)
        ax.set_title("tokens per trajectory (share of each teacher's trajectories)", fontsize=10)
        ax.set_xlabel("tokens" + (" (log scale)" if log_x else ""))
    else:
        _empty_panel(ax, "tokens per trajectory", "not tokenized yet")

    ax = axes[1, 1]
    turns = {t: [int(r["turns"]) for r in (manifests.get(t, ({}, None))[0].get("trajectories") or [])] for t in teachers}
    if any(turns.values()):
        hi = max(max(v) for v in turns.values() if v)
        bins = np.arange(0, hi + 2) - 0.5 if hi <= 60 else 40
        for t in teachers:
            if turns[t]:
                n = len(turns[t])
                ax.hist(turns[t], bins=bins, histtype="step", weights=[1 / n] * n, lw=1.5, label=t)
        ax.legend(fontsize=8, frameon=False)
        ax.set_title("assistant turns per trajectory (share of each teacher's trajectories)", fontsize=10)
        ax.set_xlabel("turns")
    else:
        means = [card["teachers"][t]["trajectories"]["turns"]["mean"] or 0 for t in teachers]
        ax.bar(x, means)
        ax.set_xticks(x, teachers)
        ax.set_title("mean assistant turns per trajectory", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save_figure(fig, out_png)
