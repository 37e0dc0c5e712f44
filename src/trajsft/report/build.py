"""The report rules' side of the cards: Snakemake helpers (``rules/report.smk``) and the entry points
``trajsft.rule_job.run_rule`` calls (one card with its figure, the comparison table)."""

from __future__ import annotations

import logging
from typing import Iterable, Mapping

from ..io import read_json
from ..plan import step_configs
from .cards import QWEN3_NATIVE_SEQ_LEN, dataset_card, mixture_card, write_card
from .plots import plot_card, plot_mixture
from .tables import comparison_table, comparison_tsv

log = logging.getLogger("trajsft")


# ---- Snakemake helpers (rules/report.smk) ---------------------------------------------------
def report_targets(plan, cfg: Mapping) -> list[str]:
    """Targets compared in teachers.html: ``report_targets`` if set, else ``default_targets`` (an unknown name:
    one line naming the targets)."""
    return [step_configs.train(plan, t).target for t in (cfg.get("report_targets") or cfg["default_targets"])]


def card_paths(target: str, state_dir: str = "results") -> dict[str, str]:
    return {"json": f"{state_dir}/cards/{target}/card.json", "png": f"{state_dir}/cards/{target}/card.png"}


def report_outputs(plan, card_targets: Iterable[str], curve_targets: Iterable[str] = (),
                   state_dir: str = "results") -> list[str]:
    """The report files for ``rule all``: the comparison table, cards of ``card_targets`` and
    ``curve_targets``, curves of ``curve_targets`` (those need training)."""
    curve_targets = [step_configs.train(plan, t).target for t in curve_targets]
    out = [f"{state_dir}/cards/teachers.html"]
    for t in dict.fromkeys([step_configs.train(plan, t).target for t in card_targets] + curve_targets):
        out += list(card_paths(t, state_dir).values())
    out += [f"{state_dir}/curves/{t}.png" for t in curve_targets]
    return out


def card_inputs(plan, target: str) -> dict[str, list[str]]:
    """Input function of ``report_card``: the target's shards and tokenized manifests."""
    toks = step_configs.train(plan, target).tokenized.values()
    return {
        "shards": [plan.get("shards", a.spec["shards"]).manifest for a in toks],
        "tokenized": [a.manifest for a in toks],
    }


def card_params(plan, target: str) -> dict:
    """``seq_len`` of the target's training, normalized mixture ``weights``, ``mixture`` flag."""
    spec = step_configs.train(plan, target).run.spec
    hf = str(spec["student"].get("hf_checkpoint") or "")
    return {
        "seq_len": int(spec["training"]["seq_len"]),
        # the longer length the card's seq_len advice compares against (none for the tiny demo student)
        "native_seq_len": QWEN3_NATIVE_SEQ_LEN if hf.startswith("Qwen/Qwen3-8B") else None,
        "weights": dict(spec["weights"]),
        "mixture": target in (plan.cfg.get("mixtures") or {}),
    }


# ---- Snakemake entry points (trajsft/rules/report_*.py) --------------------------------------------
def _pair_manifests(shards_paths: list[str], tokenized_paths: list[str],
                    teachers: list[str] | None = None) -> dict[str, tuple[dict, dict | None]]:
    """Each teacher's (shards, tokenized) manifests: ``teachers`` names them in the order of the paths (the
    target's, as :func:`card_inputs` lists them; teacher entries that read the same dataset share manifests),
    else the teacher each shards manifest was built for."""
    shards = [read_json(p) for p in shards_paths]
    toks = [read_json(p) for p in tokenized_paths]
    if teachers is not None:
        return {t: (s, tok) for t, s, tok in zip(teachers, shards, toks, strict=True)}
    by_teacher_tok = {t["teacher"]: t for t in toks}
    return {s["teacher"]: (s, by_teacher_tok.get(s["teacher"])) for s in shards}


def build_target_card(target: str, shards_paths: list[str], tokenized_paths: list[str], seq_len: int | None,
                      weights: Mapping[str, float] | None, mixture: bool, out_json: str, out_png: str,
                      native_seq_len: int | None = None) -> dict:
    """Card JSON + PNG of one target (a teacher, or a mixture of teachers)."""
    manifests = _pair_manifests(list(shards_paths), list(tokenized_paths), list(weights) if weights else None)
    cards = {t: dataset_card(s, tok, seq_len, native_seq_len, teacher=t) for t, (s, tok) in manifests.items()}
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
