"""The cross-target comparison table of the dataset cards: rows, HTML, Markdown and TSV."""

from __future__ import annotations

import html as _html
from typing import Mapping

from .cards import fmt_int, fmt_num, fmt_pct, fmt_tools, fmt_window


# ---- comparison table ----------------------------------------------------------------------
def _dist_cell(d: Mapping | None, nd: int = 1) -> str:
    if not d or not d.get("n"):
        return "–"
    return " / ".join(fmt_num(d.get(k), nd) for k in ("mean", "median", "p90", "max"))


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

    users: dict[str, list[str]] = {}  # a teacher card's tokenized data -> the columns that train on it
    for n in names:
        if cards[n].get("tokenized"):
            users.setdefault(cards[n]["tokenized"], []).append(n)

    def data(n: str) -> str:  # the data once named, and who shares it (teacher entries of one dataset)
        t = cards[n].get("tokenized")
        others = [m for m in users.get(t, []) if m != n]
        return "–" if not t else t + (f" (shared with {', '.join(others)})" if others else "")

    rows: list[tuple[str, list[str]]] = [
        ("kind", col(lambda c: c["kind"] if c["kind"] == "teacher" else
                     "mixture: " + ", ".join(f"{t} {w:.2f}" for t, w in sorted(c["weights"].items())))),
        ("data (tokenized)", [data(n) for n in names]),
        ("rows in", col(lambda c: fmt_int(c["rows_in"]))),
        ("kept (train / validation)", col(lambda c: f"{c['kept']['train']:,} / {c['kept']['validation']:,}")),
        ("skipped", col(lambda c: f"{c['skipped_total']:,} ({fmt_pct(c['skipped_total'] / c['rows_in'])})")),
    ]
    rows += [(f"skipped: {r}", col(lambda c, r=r: fmt_int(c["skipped"].get(r, 0)))) for r in reasons]
    rows += [(f"event: {e}", col(lambda c, e=e: fmt_int(c["events"].get(e, 0)))) for e in event_keys]
    rows += [
        ("resolved rate", col(lambda c: fmt_pct(c.get("resolved_rate")))),
        ("turns / traj. (mean / median / p90 / max)", col(lambda c: _dist_cell(c["trajectories"]["turns"]))),
        ("tool calls / traj. (mean / median / p90 / max)", col(lambda c: _dist_cell(c["trajectories"]["tool_calls"]))),
        ("tokens / traj. (mean / median / p90 / max)", col(lambda c: _dist_cell(tok(c).get("per_trajectory"), 0))),
        ("tokens (all splits)", col(lambda c: fmt_int(tok(c).get("total")))),
        ("seq_len", col(lambda c: fmt_int(c.get("seq_len")))),
        ("chats beyond seq_len", col(lambda c: fmt_pct(tok(c)["beyond_seq_len"]["chats_share"]))),
        ("tokens beyond seq_len", col(lambda c: fmt_pct(tok(c)["beyond_seq_len"]["tokens_share"]))),
        ("assistant-token share", col(lambda c: fmt_pct(tok(c).get("assistant_share")))),
        ("tools (their block per chat)", col(fmt_tools)),
        ("long chats", col(lambda c: c["window"]["long_chats"])),
        ("truncated to seq_len (chats, tokens cut)", col(lambda c: fmt_window(c["window"], "truncated"))),
        ("dropped: longer than seq_len", col(lambda c: fmt_window(c["window"], "dropped_longer_than_seq_len"))),
        ("dropped: no loss token in window", col(lambda c: fmt_window(c["window"], "dropped_empty_window"))),
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
