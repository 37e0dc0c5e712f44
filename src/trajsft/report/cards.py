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
``write_card(card, path)``                          atomic JSON

The figures: :mod:`trajsft.report.plots` (``plot_card``, ``plot_mixture``); the comparison table:
:mod:`trajsft.report.tables`; the Snakemake helpers and ``script:`` entry points: :mod:`trajsft.report.build`."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from ..io import write_json



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
    return (f"seq_len {int(seq_len):,} loses {fmt_pct(now['tokens_share'])} of tokens to truncation; "
            f"{int(native):,} (the student's native length) would lose {fmt_pct(alt['tokens_share'])} "
            f"({fmt_pct(cut)} less): consider training.seq_len: {int(native)} (the reference default stays {int(seq_len):,})")


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
                 native_seq_len: int | None = None, teacher: str | None = None) -> dict:
    """The card of one teacher (``teacher``: its name in the config, default the one its shards manifest was built
    for: teacher entries that read the same dataset share one) from its shards manifest and (optionally) its
    tokenized manifest.

    Counts are copied from the manifests unchanged (``rows_in``, ``kept``, ``skipped`` by
    reason, ``events``, ``resolved_rate``); distributions are over the kept trajectories (all
    splits). ``checks`` records whether the manifests agree with each other (never raises)."""
    m = shards_manifest
    trajs = list(m.get("trajectories") or [])
    resolved = [t.get("resolved") for t in trajs]
    card: dict[str, Any] = {
        "card_version": CARD_VERSION,
        "kind": "teacher",
        "name": teacher or m["teacher"],
        "teacher": teacher or m["teacher"],
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
        # the tools the teacher was given, every chat trained with their block (what it adds per chat)
        "tools": {"names": list((tokenized_manifest or {}).get("tools", m.get("tools")) or []),
                  "block_tokens": (tokenized_manifest or {}).get("tools_block_tokens")},
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
            card["seq_len_advice"] = seq_len_advice(chat_lengths(tokenized_manifest), seq_len, native_seq_len)
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


def fmt_tools(card: Mapping) -> str:
    """The tools a card's chats trained with and the tokens their block adds per chat ("none": no block)."""
    def one(t: Mapping | None) -> str:
        if not t or not t.get("names"):
            return "none"
        n = t.get("block_tokens")
        return ", ".join(t["names"]) + ("" if n is None else f" (+{n:,} tokens per chat)")

    tools = card.get("tools") or {}
    if "per_teacher" in tools:  # a mixture: each teacher's
        return "; ".join(f"{t}: {one(x)}" for t, x in tools["per_teacher"].items())
    return one(tools)


def fmt_window(win: Mapping | None, key: str) -> str:
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
        "tools": {"names": list(dict.fromkeys(n for t in teachers for n in (cards[t].get("tools") or {}).get("names", []))),
                  "per_teacher": {t: cards[t].get("tools") for t in teachers}},
        "composition": composition,
        "teachers": {t: dict(cards[t]) for t in teachers},
        "checks": {f"{t}.{k}": v for t in teachers for k, v in (cards[t].get("checks") or {}).items()},
    }
    card["ok"] = all(card["checks"].values())
    return card


def write_card(card: Mapping, path: str | os.PathLike) -> None:
    write_json(path, card)


def fmt_int(n) -> str:
    return "–" if n is None else f"{int(n):,}"


def fmt_pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def fmt_num(x, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, int) or (float(x) == int(x) and abs(x) >= 100):
        return f"{int(x):,}"
    return f"{x:,.{nd}f}"


def chat_lengths(tok_manifest: Mapping | None, key: str = "lengths") -> list[int]:
    out: list[int] = []
    stats = (tok_manifest or {}).get("stats") or {}
    for split in SPLITS:
        s = _split_stats(stats, split)
        if s:
            out += [int(x) for x in s.get(key) or []]
    return out
