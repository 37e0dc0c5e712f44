"""Dataset cards: what each teacher's data looks like after sharding and tokenization.

A *card* is a small JSON-able dict summarising one teacher's shards manifest (rows in / kept /
skipped by reason, resolved rate, turns and tool calls per trajectory) and its tokenized manifest
(tokens per trajectory, share of chats and tokens beyond ``seq_len``, assistant-token share).
A *mixture card* combines teacher cards with the mixture weights. Cards are plotted to one PNG
each and compared side by side in an HTML / Markdown / TSV table.

Public API
----------
``distribution(values) -> dict``            n / mean / median / p90 / min / max / sum
``dataset_card(shards_manifest, tokenized_manifest=None, seq_len=None) -> dict``
``mixture_card(cards, weights, name=None, seq_len=None) -> dict``
``plot_card(card, shards_manifest, tokenized_manifest, out_png) -> str``
``plot_mixture(card, manifests, out_png) -> str``   manifests: {teacher: (shards, tokenized | None)}
``comparison_table(cards) -> (html, markdown)``     cards: {target name: card}
``comparison_tsv(cards) -> str``
``write_card(card, path)``                          atomic JSON
``rule_card(snakemake)`` / ``rule_table(snakemake)``  Snakemake ``script:`` entry points
``report_targets / report_outputs / card_inputs / card_params``  helpers for rules/report.smk
"""

from __future__ import annotations

import html as _html
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ..io import atomic_path, read_json, write_json

log = logging.getLogger("trajsft")

SPLITS = ("train", "validation")
CARD_VERSION = 2


# ---- numbers -------------------------------------------------------------------------------
def distribution(values: Iterable[float]) -> dict:
    """``{"n", "mean", "median", "p90", "min", "max", "sum"}`` (None for an empty list)."""
    vals = sorted(float(v) for v in values if v is not None)
    if not vals:
        return {"n": 0, "mean": None, "median": None, "p90": None, "min": None, "max": None, "sum": 0}
    total = sum(vals)
    as_int = all(v == int(v) for v in vals)
    conv = int if as_int else float
    return {
        "n": len(vals),
        "mean": total / len(vals),
        "median": float(np.percentile(vals, 50)),
        "p90": float(np.percentile(vals, 90)),
        "min": conv(vals[0]),
        "max": conv(vals[-1]),
        "sum": conv(total),
    }


def beyond(lengths: list[int], seq_len: int) -> dict:
    """How much of a list of chat lengths does not fit into ``seq_len`` tokens.

    ``chats``: chats longer than ``seq_len`` (Levanter truncates them to their first ``seq_len``
    tokens); ``tokens``: tokens past ``seq_len`` (lost); ``tokens_in_long_chats``: all tokens of
    those chats; shares are over all chats / all tokens of the list."""
    s = int(seq_len)
    total = sum(lengths)
    over = [n for n in lengths if n > s]
    lost = sum(n - s for n in over)
    return {
        "seq_len": s,
        "chats": len(over),
        "chats_share": len(over) / len(lengths) if lengths else 0.0,
        "tokens": lost,
        "tokens_share": lost / total if total else 0.0,
        "tokens_in_long_chats": sum(over),
        "tokens_in_long_chats_share": sum(over) / total if total else 0.0,
        "tokens_in_window": total - lost,
    }


QWEN3_NATIVE_SEQ_LEN = 40960  # Qwen3-8B's max_position_embeddings


def seq_len_advice(lengths: list[int], seq_len: int, native: int | None) -> str | None:
    """One line for the card: the tokens lost at ``seq_len`` against the student's native length,
    when that is longer and would keep tokens that ``seq_len`` loses (None otherwise)."""
    if not native or not lengths or int(native) <= int(seq_len):
        return None
    now, alt = beyond(lengths, seq_len), beyond(lengths, native)
    if now["tokens"] == 0:
        return None
    cut = 1 - alt["tokens"] / now["tokens"]
    return (f"seq_len {int(seq_len):,} loses {_fmt_pct(now['tokens_share'])} of tokens to truncation; "
            f"{int(native):,} (the student's native length) would lose {_fmt_pct(alt['tokens_share'])} "
            f"({_fmt_pct(cut)} less): consider training.seq_len: {int(native)} (the reference default stays {int(seq_len):,})")


# ---- cards ---------------------------------------------------------------------------------
def _split_stats(stats: Mapping | None, split: str) -> dict | None:
    if not stats:
        return None
    s = stats.get(split)
    return s if isinstance(s, Mapping) and s.get("chats") is not None else None


def _token_section(tok_manifest: Mapping, seq_len: int | None) -> dict:
    stats = tok_manifest.get("stats") or {}
    per_split = {}
    lengths: list[int] = []
    asst_lengths: list[int] = []
    for split in SPLITS:
        s = _split_stats(stats, split)
        if s is None:
            continue
        ls = [int(x) for x in s.get("lengths") or []]
        als = [int(x) for x in s.get("assistant_lengths") or []]
        tokens = int(s.get("tokens", sum(ls)))
        asst = int(s.get("assistant_tokens", sum(als)))
        entry = {
            "chats": int(s["chats"]),
            "tokens": tokens,
            "assistant_tokens": asst,
            "assistant_share": asst / tokens if tokens else 0.0,
            "per_trajectory": distribution(ls),
        }
        if seq_len:
            entry["beyond_seq_len"] = beyond(ls, seq_len)
            # only trust the cache's own in-window count if it was computed for this seq_len
            if s.get("seq_len") == seq_len and s.get("assistant_tokens_in_window") is not None:
                entry["assistant_tokens_in_window"] = int(s["assistant_tokens_in_window"])
            if s.get("seq_len") == seq_len and s.get("packed_sequences") is not None:
                entry["packed_sequences"] = int(s["packed_sequences"])
        per_split[split] = entry
        lengths += ls
        asst_lengths += als
    total = sum(e["tokens"] for e in per_split.values())
    asst = sum(e["assistant_tokens"] for e in per_split.values())
    out = {
        "chats": sum(e["chats"] for e in per_split.values()),
        "total": total,
        "assistant_tokens": asst,
        "assistant_share": asst / total if total else 0.0,
        "per_trajectory": distribution(lengths),
        "assistant_per_trajectory": distribution(asst_lengths),
        "per_split": per_split,
    }
    if seq_len:
        out["beyond_seq_len"] = beyond(lengths, seq_len)
    return out


def dataset_card(shards_manifest: Mapping, tokenized_manifest: Mapping | None = None, seq_len: int | None = None,
                 native_seq_len: int | None = None) -> dict:
    """The card of one teacher from its shards manifest and (optionally) its tokenized manifest.

    Counts are copied from the manifests unchanged (``rows_in``, ``kept``, ``skipped`` by
    reason, ``events``, ``resolved_rate``); distributions are over the kept trajectories (all
    splits). ``checks`` records whether the manifests agree with each other (never raises)."""
    m = shards_manifest
    trajs = list(m.get("trajectories") or [])
    resolved = [t.get("resolved") for t in trajs]
    card: dict[str, Any] = {
        "card_version": CARD_VERSION,
        "kind": "teacher",
        "name": m["teacher"],
        "teacher": m["teacher"],
        "shards": m.get("name"),
        "tokenized": tokenized_manifest.get("name") if tokenized_manifest else None,
        "seq_len": int(seq_len) if seq_len else None,
        "rows_in": int(m["rows_in"]),
        "kept": {s: int((m.get("kept") or {}).get(s, 0)) for s in SPLITS},
        "kept_total": int(m["kept_total"]),
        "skipped": {str(k): int(v) for k, v in sorted((m.get("skipped") or {}).items())},
        "skipped_total": int(m["skipped_total"]),
        "events": {str(k): int(v) for k, v in sorted((m.get("events") or {}).items())},
        "resolved_rate": m.get("resolved_rate"),
        "resolved": {
            "true": sum(1 for r in resolved if r is True),
            "false": sum(1 for r in resolved if r is False),
            "unknown": sum(1 for r in resolved if not isinstance(r, bool)),
        },
        "trajectories": {
            key: distribution(t.get(key) for t in trajs) for key in ("turns", "tool_calls", "messages", "chars")
        },
        "tokens": None,
        "seq_len_advice": None,
    }
    checks = {
        "rows_balance": card["rows_in"] == card["kept_total"] + card["skipped_total"],
        "kept_sum": sum(card["kept"].values()) == card["kept_total"],
        "skipped_sum": sum(card["skipped"].values()) == card["skipped_total"],
        "trajectories_listed": len(trajs) == card["kept_total"],
    }
    card["window"] = None
    if tokenized_manifest is not None:
        card["tokens"] = _token_section(tokenized_manifest, seq_len)
        if seq_len:
            card["seq_len_advice"] = seq_len_advice(_lengths(tokenized_manifest), seq_len, native_seq_len)
        checks["tokenized_teacher"] = tokenized_manifest.get("teacher", m["teacher"]) == m["teacher"]
        per_split = card["tokens"]["per_split"]
        win = tokenized_manifest.get("window") or {}
        card["window"] = window_summary(win)
        checks["tokenized_chats"] = all(
            per_split.get(s, {}).get("chats", 0) + _dropped_chats(win.get(s)) == card["kept"][s] for s in SPLITS
        )
    card["checks"] = checks
    card["ok"] = all(checks.values())
    return card


WINDOW_KEYS = ("dropped_empty_window", "dropped_longer_than_seq_len", "truncated")


def _dropped_chats(split_window: Mapping | None) -> int:
    w = split_window or {}
    return sum(int((w.get(k) or {}).get("chats", 0)) for k in WINDOW_KEYS if k.startswith("dropped_"))


def window_summary(window: Mapping) -> dict | None:
    """What the tokenize step did with seq_len windows, summed over splits (chats and tokens):
    ``dropped_empty_window`` (no loss token in the window), ``dropped_longer_than_seq_len``
    (``long_chats: drop``), ``truncated`` (``long_chats: truncate``; ``tokens`` = tokens cut)."""
    if not window:
        return None
    out: dict[str, Any] = {"seq_len": window.get("seq_len"), "long_chats": window.get("long_chats")}
    for k in WINDOW_KEYS:
        parts = [window[s].get(k) or {} for s in SPLITS if isinstance(window.get(s), Mapping)]
        out[k] = {"chats": sum(int(p.get("chats", 0)) for p in parts),
                  "tokens": sum(int(p.get("tokens", p.get("tokens_cut", 0))) for p in parts)}
    return out


def _fmt_window(win: Mapping | None, key: str) -> str:
    if not win:
        return "–"
    return f"{win[key]['chats']:,} ({win[key]['tokens']:,} tok)"


def _normalize(weights: Mapping[str, float]) -> dict[str, float]:
    total = float(sum(weights.values()))
    if total <= 0:
        raise ValueError("mixture weights must sum to > 0")
    return {t: float(w) / total for t, w in weights.items()}


def mixture_card(cards: Mapping[str, Mapping], weights: Mapping[str, float], name: str | None = None,
                 seq_len: int | None = None) -> dict:
    """Combine teacher cards with mixture weights.

    Sampling model (Levanter's mixture dataset): weights are probabilities of drawing a packed
    ``seq_len`` training sequence from each teacher, so the share of *tokens* the student sees from
    teacher t is ~``w_t`` and the share of *chats* is ``c_t ~ w_t * chats_t / window_tokens_t``
    (train split; ``window_tokens`` = tokens after truncation to ``seq_len``; falls back to ``w_t``
    without token stats). Token-level metrics are averaged with ``w``, per-trajectory metrics with ``c``.
    ``upsampling`` = ``w_t`` / the teacher's share of window tokens in a plain concatenation
    (> 1: the teacher is repeated more often than the others). Counts (rows, kept, skipped) are
    plain sums. Quantiles cannot be mixed from summaries: mixed distributions give mean and max.
    """
    missing = set(weights) - set(cards)
    if missing:
        raise ValueError(f"mixture_card: no card for {', '.join(sorted(missing))}")
    w = _normalize({t: weights[t] for t in weights})
    teachers = sorted(w)
    seq_len = seq_len or next((cards[t].get("seq_len") for t in teachers if cards[t].get("seq_len")), None)

    def train_tokens(c: Mapping) -> tuple[int, float] | None:
        """(chats, window tokens) of the train split (training samples only from it)."""
        tok = c.get("tokens")
        if not tok or not tok.get("total"):
            return None
        tr = (tok.get("per_split") or {}).get("train") or tok
        b = tr.get("beyond_seq_len")
        return int(tr["chats"]), float(b["tokens_in_window"] if b else tr.get("tokens", tr.get("total")))

    tt = {t: train_tokens(cards[t]) for t in teachers}
    have_tokens = all(v and v[1] for v in tt.values())
    wt = {t: (tt[t][1] if tt[t] else None) for t in teachers}
    if have_tokens:
        raw = {t: w[t] * tt[t][0] / wt[t] for t in teachers}
        c = _normalize(raw) if sum(raw.values()) > 0 else dict(w)
        total_wt = sum(wt.values())
        natural = {t: wt[t] / total_wt for t in teachers}
    else:
        c = dict(w)
        natural = {t: None for t in teachers}

    def wmean(weights_: Mapping[str, float], get) -> float | None:
        vals = [(weights_[t], get(cards[t])) for t in teachers]
        vals = [(a, v) for a, v in vals if v is not None]
        if not vals:
            return None
        tw = sum(a for a, _ in vals)
        return sum(a * v for a, v in vals) / tw if tw else None

    def mixed_dist(get) -> dict:
        ds = {t: get(cards[t]) for t in teachers}
        ds = {t: d for t, d in ds.items() if d and d.get("n")}
        cw = sum(c[t] for t in ds)
        return {
            "n": sum(d["n"] for d in ds.values()),
            "mean": sum(c[t] * d["mean"] for t, d in ds.items()) / cw if ds and cw else None,
            "median": None,
            "p90": None,
            "max": max((d["max"] for d in ds.values()), default=None),
        }

    kept = {s: sum(cards[t]["kept"].get(s, 0) for t in teachers) for s in SPLITS}
    skipped: dict[str, int] = {}
    events: dict[str, int] = {}
    for t in teachers:
        for k, v in cards[t]["skipped"].items():
            skipped[k] = skipped.get(k, 0) + v
        for k, v in (cards[t].get("events") or {}).items():
            events[k] = events.get(k, 0) + v
    composition = {}
    for t in teachers:
        tc = cards[t]
        tok = tc.get("tokens") or {}
        composition[t] = {
            "weight": w[t],
            "chat_share": c[t],
            "train_chats": tt[t][0] if tt[t] else tc["kept"]["train"],
            "tokens": tok.get("total"),
            "train_window_tokens": wt[t],
            "natural_token_share": natural[t],
            "upsampling": (w[t] / natural[t]) if natural[t] else None,
        }
    tokens = None
    if have_tokens:
        tokens = {
            "chats": sum(cards[t]["tokens"]["chats"] for t in teachers),
            "total": sum(cards[t]["tokens"]["total"] for t in teachers),
            "assistant_share": wmean(w, lambda cc: cc["tokens"]["assistant_share"]),
            "per_trajectory": mixed_dist(lambda cc: (cc.get("tokens") or {}).get("per_trajectory")),
        }
        if all((cards[t]["tokens"] or {}).get("beyond_seq_len") for t in teachers):
            tokens["beyond_seq_len"] = {
                "seq_len": seq_len,
                "chats_share": wmean(c, lambda cc: cc["tokens"]["beyond_seq_len"]["chats_share"]),
                "tokens_share": wmean(w, lambda cc: cc["tokens"]["beyond_seq_len"]["tokens_share"]),
            }
    windows = [cards[t].get("window") for t in teachers]
    window = None
    if windows and all(windows):
        window = {"seq_len": seq_len, "long_chats": "/".join(sorted({str(x["long_chats"]) for x in windows}))}
        for k in WINDOW_KEYS:
            window[k] = {f: sum(x[k][f] for x in windows) for f in ("chats", "tokens")}
    card = {
        "card_version": CARD_VERSION,
        "kind": "mixture",
        "window": window,
        "name": name or "+".join(teachers),
        "weights": w,
        "seq_len": seq_len,
        "rows_in": sum(cards[t]["rows_in"] for t in teachers),
        "kept": kept,
        "kept_total": sum(kept.values()),
        "skipped": dict(sorted(skipped.items())),
        "skipped_total": sum(skipped.values()),
        "events": dict(sorted(events.items())),
        "resolved_rate": wmean(c, lambda cc: cc.get("resolved_rate")),
        "trajectories": {
            key: mixed_dist(lambda cc, _k=key: cc["trajectories"].get(_k)) for key in ("turns", "tool_calls", "messages", "chars")
        },
        "tokens": tokens,
        "composition": composition,
        "teachers": {t: dict(cards[t]) for t in teachers},
        "checks": {f"{t}.{k}": v for t in teachers for k, v in (cards[t].get("checks") or {}).items()},
    }
    card["ok"] = all(card["checks"].values())
    return card


def write_card(card: Mapping, path: str | os.PathLike) -> None:
    write_json(path, card)


# ---- plots ---------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_png: str | os.PathLike, dpi: int = 100) -> str:
    """Write a figure to ``out_png`` atomically (temp file in the same dir + ``os.replace``)."""
    plt = _plt()
    try:
        with atomic_path(out_png) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    finally:
        plt.close(fig)
    return str(out_png)


def _fmt_int(n) -> str:
    return "–" if n is None else f"{int(n):,}"


def _fmt_pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _fmt_num(x, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, int) or (float(x) == int(x) and abs(x) >= 100):
        return f"{int(x):,}"
    return f"{x:,.{nd}f}"


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


def _lengths(tok_manifest: Mapping | None, key: str = "lengths") -> list[int]:
    out: list[int] = []
    stats = (tok_manifest or {}).get("stats") or {}
    for split in SPLITS:
        s = _split_stats(stats, split)
        if s:
            out += [int(x) for x in s.get(key) or []]
    return out


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
                   label=f"seq_len {seq_len:,}: {_fmt_pct(b['chats_share'])} of chats, "
                         f"{_fmt_pct(b['tokens_share'])} of tokens beyond")
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
    plt = _plt()
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

    lengths = _lengths(tokenized_manifest)
    _token_hist(axes[1, 0], lengths, card.get("seq_len"))

    # assistant-token share per trajectory
    ax = axes[1, 1]
    asst = _lengths(tokenized_manifest, "assistant_lengths")
    if lengths and len(asst) == len(lengths):
        shares = [a / n for a, n in zip(asst, lengths) if n]
        ax.hist(shares, bins=[i / 40 for i in range(41)], color="tab:cyan", edgecolor="white", linewidth=0.5)
        overall = card["tokens"]["assistant_share"]
        ax.axvline(overall, color="k", lw=1.5, label=f"all tokens: {_fmt_pct(overall)}")
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
        ("rows in", _fmt_int(card["rows_in"])),
        ("kept train / validation", f"{card['kept']['train']:,} / {card['kept']['validation']:,}"),
        ("skipped", f"{card['skipped_total']:,} ({_fmt_pct(card['skipped_total'] / card['rows_in'] if card['rows_in'] else None)})"),
        ("resolved rate", _fmt_pct(card.get("resolved_rate"))),
        ("turns mean / median / p90", f"{_fmt_num(tr['turns']['mean'])} / {_fmt_num(tr['turns']['median'])} / {_fmt_num(tr['turns']['p90'])}"),
        ("tool calls mean / p90", f"{_fmt_num(tr['tool_calls']['mean'])} / {_fmt_num(tr['tool_calls']['p90'])}"),
        ("tokens (all splits)", _fmt_int(tok.get("total"))),
        ("tokens / traj. mean", _fmt_num((tok.get("per_trajectory") or {}).get("mean"), 0)),
        ("seq_len", _fmt_int(card.get("seq_len"))),
        ("chats beyond seq_len", _fmt_pct(bsl.get("chats_share"))),
        ("tokens beyond seq_len", _fmt_pct(bsl.get("tokens_share"))),
        ("assistant-token share", _fmt_pct(tok.get("assistant_share"))),
        (f"long chats ({(card.get('window') or {}).get('long_chats', '–')}): truncated", _fmt_window(card.get("window"), "truncated")),
        ("dropped: longer than seq_len", _fmt_window(card.get("window"), "dropped_longer_than_seq_len")),
        ("dropped: no loss token in window", _fmt_window(card.get("window"), "dropped_empty_window")),
    ]
    lines += [(f"event: {k}", _fmt_int(v)) for k, v in card.get("events", {}).items()]
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

    plt = _plt()
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
    all_lengths = {t: _lengths(manifests.get(t, ({}, None))[1]) for t in teachers}
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


# ---- comparison table ----------------------------------------------------------------------
def _dist_cell(d: Mapping | None, nd: int = 1) -> str:
    if not d or not d.get("n"):
        return "–"
    return " / ".join(_fmt_num(d.get(k), nd) for k in ("mean", "median", "p90", "max"))


def table_rows(cards: Mapping[str, Mapping]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(column names, [(metric, [cell per card])]) of the side-by-side comparison."""
    names = list(cards)
    reasons = sorted({r for c in cards.values() for r in c.get("skipped", {})})
    event_keys = sorted({e for c in cards.values() for e in c.get("events", {})})

    def col(f):
        out = []
        for n in names:
            try:
                out.append(f(cards[n]))
            except (KeyError, TypeError, ZeroDivisionError):
                out.append("–")
        return out

    def tok(c):
        return c.get("tokens") or {}

    rows: list[tuple[str, list[str]]] = [
        ("kind", col(lambda c: c["kind"] if c["kind"] == "teacher" else
                     "mixture: " + ", ".join(f"{t} {w:.2f}" for t, w in sorted(c["weights"].items())))),
        ("rows in", col(lambda c: _fmt_int(c["rows_in"]))),
        ("kept (train / validation)", col(lambda c: f"{c['kept']['train']:,} / {c['kept']['validation']:,}")),
        ("skipped", col(lambda c: f"{c['skipped_total']:,} ({_fmt_pct(c['skipped_total'] / c['rows_in'])})")),
    ]
    rows += [(f"skipped: {r}", col(lambda c, r=r: _fmt_int(c["skipped"].get(r, 0)))) for r in reasons]
    rows += [(f"event: {e}", col(lambda c, e=e: _fmt_int(c["events"].get(e, 0)))) for e in event_keys]
    rows += [
        ("resolved rate", col(lambda c: _fmt_pct(c.get("resolved_rate")))),
        ("turns / traj. (mean / median / p90 / max)", col(lambda c: _dist_cell(c["trajectories"]["turns"]))),
        ("tool calls / traj. (mean / median / p90 / max)", col(lambda c: _dist_cell(c["trajectories"]["tool_calls"]))),
        ("tokens / traj. (mean / median / p90 / max)", col(lambda c: _dist_cell(tok(c).get("per_trajectory"), 0))),
        ("tokens (all splits)", col(lambda c: _fmt_int(tok(c).get("total")))),
        ("seq_len", col(lambda c: _fmt_int(c.get("seq_len")))),
        ("chats beyond seq_len", col(lambda c: _fmt_pct(tok(c)["beyond_seq_len"]["chats_share"]))),
        ("tokens beyond seq_len", col(lambda c: _fmt_pct(tok(c)["beyond_seq_len"]["tokens_share"]))),
        ("assistant-token share", col(lambda c: _fmt_pct(tok(c).get("assistant_share")))),
        ("long chats", col(lambda c: c["window"]["long_chats"])),
        ("truncated to seq_len (chats, tokens cut)", col(lambda c: _fmt_window(c["window"], "truncated"))),
        ("dropped: longer than seq_len", col(lambda c: _fmt_window(c["window"], "dropped_longer_than_seq_len"))),
        ("dropped: no loss token in window", col(lambda c: _fmt_window(c["window"], "dropped_empty_window"))),
        ("consistency checks", col(lambda c: "ok" if c.get("ok", True) else
                                   "FAILED: " + ", ".join(k for k, v in c["checks"].items() if not v))),
    ]
    return names, rows


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1em; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; }
th { background: #f3f4f6; text-align: left; }
td { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.metric { text-align: left; font-weight: 600; white-space: normal; }
tr.sub td.metric { font-weight: normal; padding-left: 1.5em; }
td.bad { color: #b91c1c; font-weight: 600; }
caption { caption-side: top; text-align: left; font-weight: 600; margin-bottom: .5em; }
"""


def comparison_table(cards: Mapping[str, Mapping]) -> tuple[str, str]:
    """Side-by-side table of cards (columns = targets): ``(html document, markdown)``."""
    names, rows = table_rows(cards)
    esc = _html.escape
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    body = []
    for metric, cells in rows:
        cls = ' class="sub"' if metric.startswith(("skipped: ", "event: ")) else ""
        tds = "".join(
            f'<td class="bad">{esc(c)}</td>' if c.startswith("FAILED") else f"<td>{esc(c)}</td>" for c in cells
        )
        body.append(f'<tr{cls}><td class="metric">{esc(metric)}</td>{tds}</tr>')
    html_doc = (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>trajsft teachers</title>"
        f"<style>{_CSS}</style></head><body>\n"
        f"<table id=\"teachers\"><caption>Teacher datasets side by side</caption>\n"
        f"<thead><tr><th>metric</th>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody></table>\n"
        "<p style=\"font-size:12px;color:#555\">Distributions are over kept trajectories (train + validation). "
        "Mixtures: chat-weighted means and max only; token shares weighted by mixture weight.</p>\n"
        "</body></html>\n"
    )

    def md_cell(s: str) -> str:
        return s.replace("|", "\\|")

    md = ["| metric | " + " | ".join(md_cell(n) for n in names) + " |",
          "|---|" + "---:|" * len(names)]
    md += [f"| {md_cell(m)} | " + " | ".join(md_cell(c) for c in cells) + " |" for m, cells in rows]
    return html_doc, "\n".join(md) + "\n"


def comparison_tsv(cards: Mapping[str, Mapping]) -> str:
    names, rows = table_rows(cards)
    clean = lambda s: s.replace("\t", " ").replace("\n", " ")  # noqa: E731
    lines = ["metric\t" + "\t".join(clean(n) for n in names)]
    lines += [clean(m) + "\t" + "\t".join(clean(c) for c in cells) for m, cells in rows]
    return "\n".join(lines) + "\n"


# ---- Snakemake helpers (rules/report.smk) ---------------------------------------------------
def report_targets(plan, cfg: Mapping) -> list[str]:
    """Targets compared in teachers.html: ``report_targets`` if set, else ``default_targets``."""
    return [plan.target(t)["name"] for t in (cfg.get("report_targets") or cfg["default_targets"])]


def card_paths(target: str, state_dir: str = "results") -> dict[str, str]:
    return {"json": f"{state_dir}/cards/{target}/card.json", "png": f"{state_dir}/cards/{target}/card.png"}


def report_outputs(plan, card_targets: Iterable[str], curve_targets: Iterable[str] = (),
                   state_dir: str = "results") -> list[str]:
    """The report files for ``rule all``: the comparison table, cards of ``card_targets`` and
    ``curve_targets``, curves of ``curve_targets`` (those need training)."""
    curve_targets = [plan.target(t)["name"] for t in curve_targets]
    out = [f"{state_dir}/cards/teachers.html"]
    for t in dict.fromkeys([plan.target(t)["name"] for t in card_targets] + curve_targets):
        out += list(card_paths(t, state_dir).values())
    out += [f"{state_dir}/curves/{t}.png" for t in curve_targets]
    return out


def card_inputs(plan, target: str) -> dict[str, list[str]]:
    """Input function of ``report_card``: the target's shards and tokenized manifests."""
    toks = plan.target(target)["tokenized"]
    return {
        "shards": [plan.get("shards", a.spec["shards"]).manifest for a in toks],
        "tokenized": [a.manifest for a in toks],
    }


def card_params(plan, target: str) -> dict:
    """``seq_len`` of the target's training, normalized mixture ``weights``, ``mixture`` flag."""
    spec = plan.target(target)["run"].spec
    hf = str(spec["student"].get("hf_checkpoint") or "")
    return {
        "seq_len": int(spec["training"]["seq_len"]),
        # the longer length the card's seq_len advice compares against (none for the tiny demo student)
        "native_seq_len": QWEN3_NATIVE_SEQ_LEN if hf.startswith("Qwen/Qwen3-8B") else None,
        "weights": dict(spec["weights"]),
        "mixture": target in (plan.cfg.get("mixtures") or {}),
    }


# ---- Snakemake entry points (scripts/report_rule.py) ---------------------------------------
def _pair_manifests(shards_paths: list[str], tokenized_paths: list[str]) -> dict[str, tuple[dict, dict | None]]:
    shards = [read_json(p) for p in shards_paths]
    toks = [read_json(p) for p in tokenized_paths]
    by_teacher_tok = {t["teacher"]: t for t in toks}
    return {s["teacher"]: (s, by_teacher_tok.get(s["teacher"])) for s in shards}


def build_target_card(target: str, shards_paths: list[str], tokenized_paths: list[str], seq_len: int | None,
                      weights: Mapping[str, float] | None, mixture: bool, out_json: str, out_png: str,
                      native_seq_len: int | None = None) -> dict:
    """Card JSON + PNG of one target (a teacher, or a mixture of teachers)."""
    manifests = _pair_manifests(list(shards_paths), list(tokenized_paths))
    cards = {t: dataset_card(s, tok, seq_len, native_seq_len) for t, (s, tok) in manifests.items()}
    for t, c in cards.items():
        bad = [k for k, v in c["checks"].items() if not v]
        if bad:
            log.warning("%s: manifest consistency checks failed: %s", t, ", ".join(bad))
    if mixture:
        card = mixture_card(cards, weights or {t: 1.0 for t in cards}, name=target, seq_len=seq_len)
        write_card(card, out_json)
        plot_mixture(card, manifests, out_png)
    else:
        if len(cards) != 1:
            raise ValueError(f"{target}: expected one teacher's manifests, got {sorted(cards)}")
        (t, card), = cards.items()
        s, tok = manifests[t]
        write_card(card, out_json)
        plot_card(card, s, tok, out_png)
    log.info("%s: card written to %s and %s", target, out_json, out_png)
    return card


def build_table(card_paths: list[str], out_html: str, out_md: str | None = None, out_tsv: str | None = None) -> None:
    from ..io import write_text

    cards = {}
    for p in card_paths:
        c = read_json(p)
        cards[c["name"]] = c
    html_doc, md = comparison_table(cards)
    write_text(out_html, html_doc)
    if out_md:
        write_text(out_md, md)
    if out_tsv:
        write_text(out_tsv, comparison_tsv(cards))
    log.info("comparison of %d target(s) written to %s", len(cards), out_html)


def rule_card(snakemake) -> None:
    p = snakemake.params
    build_target_card(
        snakemake.wildcards.target, list(snakemake.input.shards), list(snakemake.input.tokenized),
        p.seq_len, dict(p.weights), bool(p.mixture), snakemake.output.json, snakemake.output.png,
        native_seq_len=p.get("native_seq_len"),
    )


def rule_table(snakemake) -> None:
    out = snakemake.output
    build_table(list(snakemake.input.cards), out.html, out.get("md"), out.get("tsv"))
