"""Dataset cards, comparison table and training curves (trajsft.report.cards / trajsft.report.curves)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trajsft.plan import step_configs
from trajsft.report import cards
from trajsft.report import plots
from trajsft.report import tables
from trajsft.report import curves
from trajsft.plan.config import REPO_DIR

sys.path.insert(0, str(Path(__file__).parent))
import chromium  # noqa: E402
import required  # noqa: E402


# ---- hand-made manifests with known numbers ---------------------------------------------------
def traj(i, turns, tool_calls, resolved=True, split="train"):
    return {"traj_id": f"t{i}", "resolved": resolved, "turns": turns, "messages": 2 * turns + 1,
            "tool_calls": tool_calls, "chars": 100 * turns, "split": split}


TURNS = [1, 2, 3, 4, 5, 10]
TOOLS = [0, 1, 2, 3, 4, 20]
TRAIN_LEN = [100, 200, 300, 400, 2000]
VAL_LEN = [50]
TRAIN_ASST = [50, 100, 100, 100, 500]
VAL_ASST = [10]


def shards_manifest(teacher="alpha"):
    trajs = [traj(i, t, c, resolved=i % 2 == 0, split="train" if i < 5 else "validation")
             for i, (t, c) in enumerate(zip(TURNS, TOOLS))]
    return {
        "kind": "shards", "name": f"{teacher}-0123456789", "hash": "0123456789", "location": "x",
        "hash_inputs": {}, "seconds": 0.1, "teacher": teacher,
        "rows_in": 10, "kept": {"train": 5, "validation": 1}, "kept_total": 6,
        "skipped": {"invalid_json": 2, "duplicate_traj_id": 1, "no_assistant_turn": 1}, "skipped_total": 4,
        "skipped_examples": [], "events": {"dropped_role:exit": 3, "trimmed_trailing_turns": 1},
        "resolved_rate": 0.5, "trajectories": trajs,
    }


def split_stats(lengths, asst):
    return {"chats": len(lengths), "tokens": sum(lengths), "assistant_tokens": sum(asst),
            "assistant_fraction": sum(asst) / sum(lengths), "lengths": lengths, "assistant_lengths": asst,
            "max_length": max(lengths), "mean_length": sum(lengths) / len(lengths)}


def tokenized_manifest(teacher="alpha", scale=1):
    return {
        "kind": "tokenized", "name": f"{teacher}-abcdef0123", "hash": "abcdef0123", "teacher": teacher,
        "stats": {"cache_dir": "c",
                  "train": split_stats([n * scale for n in TRAIN_LEN], [n * scale for n in TRAIN_ASST]),
                  "validation": split_stats([n * scale for n in VAL_LEN], [n * scale for n in VAL_ASST])},
    }


def png_size(path) -> tuple[int, int]:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\0")[-8:-4] == b"IEND", "truncated PNG"
    return w, h


def assert_png(path, min_bytes=10_000, min_w=600, min_h=400):
    assert Path(path).is_file()
    assert Path(path).stat().st_size >= min_bytes
    w, h = png_size(path)
    assert min_w <= w <= 4000 and min_h <= h <= 4000, (w, h)
    assert not [p for p in Path(path).parent.iterdir() if p.name.endswith(".tmp")], "temp file left behind"
    return w, h


# ---- numbers ---------------------------------------------------------------------------------
def test_distribution_matches_numpy():
    vals = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    d = cards.distribution(vals)
    assert d["n"] == 11 and d["sum"] == 44 and d["min"] == 1 and d["max"] == 9
    assert d["mean"] == pytest.approx(np.mean(vals))
    assert d["median"] == pytest.approx(np.median(vals))
    assert d["p90"] == pytest.approx(np.percentile(vals, 90))
    assert cards.distribution([])["n"] == 0 and cards.distribution([])["mean"] is None
    assert cards.distribution([7]) == {"n": 1, "mean": 7.0, "median": 7.0, "p90": 7.0, "min": 7, "max": 7, "sum": 7}


def test_beyond_seq_len_by_hand():
    b = cards.beyond([100, 200, 300, 400, 2000, 50], 250)
    assert b["chats"] == 3 and b["chats_share"] == pytest.approx(0.5)
    assert b["tokens"] == 50 + 150 + 1750
    assert b["tokens_share"] == pytest.approx(1950 / 3050)
    assert b["tokens_in_long_chats"] == 2700
    assert b["tokens_in_window"] == 3050 - 1950
    # exactly seq_len fits (Levanter truncates only longer chats)
    assert cards.beyond([250, 250], 250)["chats"] == 0
    assert cards.beyond([], 250)["chats_share"] == 0.0


# ---- cards -----------------------------------------------------------------------------------
def test_card_counts_match_manifest_exactly():
    m, tok = shards_manifest(), tokenized_manifest()
    c = cards.dataset_card(m, tok, 250)
    assert c["rows_in"] == m["rows_in"] == 10
    assert c["kept"] == m["kept"] and c["kept_total"] == 6
    assert c["skipped"] == m["skipped"] and c["skipped_total"] == 4
    assert c["events"] == m["events"]
    assert c["resolved_rate"] == 0.5 and c["resolved"] == {"true": 3, "false": 3, "unknown": 0}
    assert c["trajectories"]["turns"]["median"] == pytest.approx(np.median(TURNS))
    assert c["trajectories"]["turns"]["p90"] == pytest.approx(np.percentile(TURNS, 90))
    assert c["trajectories"]["tool_calls"]["max"] == 20
    t = c["tokens"]
    assert t["chats"] == 6 and t["total"] == 3050
    assert t["assistant_tokens"] == 860 and t["assistant_share"] == pytest.approx(860 / 3050)
    assert t["per_trajectory"]["max"] == 2000
    assert t["beyond_seq_len"]["chats_share"] == pytest.approx(0.5)
    assert t["beyond_seq_len"]["tokens_share"] == pytest.approx(1950 / 3050)
    assert t["per_split"]["train"]["beyond_seq_len"]["chats"] == 3
    assert t["per_split"]["validation"]["beyond_seq_len"]["chats"] == 0
    assert c["ok"] and all(c["checks"].values())
    json.dumps(c)  # JSON-able


def test_card_flags_inconsistent_manifests():
    m = shards_manifest()
    m["rows_in"] = 11  # one row unaccounted for
    tok = tokenized_manifest()
    tok["stats"]["validation"] = None  # validation split missing from the cache
    c = cards.dataset_card(m, tok, 250)
    assert not c["ok"]
    assert c["checks"]["rows_balance"] is False and c["checks"]["tokenized_chats"] is False
    assert c["rows_in"] == 11  # still copied as is


def test_card_without_tokens_and_without_seq_len():
    c = cards.dataset_card(shards_manifest(), None, None)
    assert c["tokens"] is None and c["seq_len"] is None and c["ok"]
    c = cards.dataset_card(shards_manifest(), tokenized_manifest(), None)
    assert "beyond_seq_len" not in c["tokens"]


def test_real_demo_manifest(tmp_path):
    """A shard manifest of the bundled demo dataset, built by the real data steps."""
    from trajsft.plan import config as C
    from trajsft.data import download
    from trajsft.data import shard

    plan = C.Plan(C.load(None, {"storage_root": str(tmp_path / "store")}), base_dir=C.REPO_DIR,
                  state_dir=str(tmp_path / "state"))
    names = {a.kind: a.name for a in plan.chain("demo")}
    download.download(step_configs.download(plan, names["raw"]))
    m = shard.shard(step_configs.shard(plan, names["shards"]))
    c = cards.dataset_card(m, None, 1024)
    assert (c["rows_in"], c["kept"], c["kept_total"]) == (m["rows_in"], m["kept"], m["kept_total"])
    assert c["skipped"] == m["skipped"] and c["skipped_total"] == m["skipped_total"]
    assert c["trajectories"]["turns"]["n"] == len(m["trajectories"]) == m["kept_total"]
    assert c["trajectories"]["turns"]["mean"] == pytest.approx(np.mean([t["turns"] for t in m["trajectories"]]))
    assert c["ok"]
    assert m["tools"] == ["bash"] and c["tools"] == {"names": ["bash"], "block_tokens": None}  # counted when tokenized


def test_the_card_says_which_tools_each_teacher_trained_with_and_what_their_block_adds():
    a = cards.dataset_card(shards_manifest("alpha"), {**tokenized_manifest("alpha"), "tools": ["bash"],
                                                      "tools_block_tokens": 225}, 250)
    b = cards.dataset_card(shards_manifest("beta"), {**tokenized_manifest("beta"), "tools": [], "tools_block_tokens": 0},
                           250)
    assert a["tools"] == {"names": ["bash"], "block_tokens": 225}
    mc = cards.mixture_card({"alpha": a, "beta": b}, {"alpha": 1, "beta": 1}, name="mix")
    assert mc["tools"]["names"] == ["bash"] and set(mc["tools"]["per_teacher"]) == {"alpha", "beta"}
    row = dict(tables.table_rows({"alpha": a, "beta": b, "mix": mc})[1])["tools (their block per chat)"]
    assert row == ["bash (+225 tokens per chat)", "none", "alpha: bash (+225 tokens per chat); beta: none"]


def test_mixture_card():
    a = cards.dataset_card(shards_manifest("alpha"), tokenized_manifest("alpha"), 250)
    b = cards.dataset_card(shards_manifest("beta"), tokenized_manifest("beta", scale=2), 250)
    mc = cards.mixture_card({"alpha": a, "beta": b}, {"alpha": 1.0, "beta": 3.0}, name="mix")
    assert mc["kind"] == "mixture" and mc["name"] == "mix"
    assert mc["weights"] == {"alpha": 0.25, "beta": 0.75}
    assert mc["rows_in"] == 20 and mc["kept_total"] == 12 and mc["skipped"]["invalid_json"] == 4
    comp = mc["composition"]
    # train split, truncated to seq_len 250: alpha [100, 200, 250, 250, 250], beta [200, 250 x 4]
    wa, wb = 1050, 1200
    assert comp["alpha"]["train_window_tokens"] == wa and comp["beta"]["train_window_tokens"] == wb
    assert comp["alpha"]["natural_token_share"] == pytest.approx(wa / (wa + wb))
    assert comp["beta"]["upsampling"] == pytest.approx(0.75 / (wb / (wa + wb)))
    # chat shares: c_t ~ w_t * train_chats_t / window_tokens_t
    ca, cb = 0.25 * 5 / wa, 0.75 * 5 / wb
    assert comp["alpha"]["chat_share"] == pytest.approx(ca / (ca + cb))
    assert mc["tokens"]["assistant_share"] == pytest.approx(
        0.25 * a["tokens"]["assistant_share"] + 0.75 * b["tokens"]["assistant_share"])
    assert mc["trajectories"]["turns"]["mean"] == pytest.approx(np.mean(TURNS))
    assert mc["trajectories"]["turns"]["median"] is None and mc["trajectories"]["tool_calls"]["max"] == 20
    assert set(mc["teachers"]) == {"alpha", "beta"} and mc["ok"]
    with pytest.raises(ValueError):
        cards.mixture_card({"alpha": a}, {"alpha": 1, "gamma": 1})


def test_a_target_that_shares_another_teachers_data_gets_cards_under_its_own_names(tmp_path):
    """A teacher entry that reads another's dataset shares its shards and tokenized manifests (built for the other):
    its card, and a mixture's component, carry the target's own teacher names."""
    from trajsft.report import build

    for name, m in (("s.json", shards_manifest("alpha")), ("t.json", tokenized_manifest("alpha"))):
        (tmp_path / name).write_text(json.dumps(m))
    s, t = str(tmp_path / "s.json"), str(tmp_path / "t.json")
    one = build.build_target_card("alpha-lr", [s], [t], 250, {"alpha-lr": 1.0}, False, str(tmp_path / "one.json"),
                                  str(tmp_path / "one.png"))
    assert (one["name"], one["teacher"], one["shards"]) == ("alpha-lr", "alpha-lr", "alpha-0123456789") and one["ok"]
    mix = build.build_target_card("mix", [s, s], [t, t], 250, {"alpha": 0.5, "alpha-lr": 0.5}, True,
                                  str(tmp_path / "mix.json"), str(tmp_path / "mix.png"))
    assert set(mix["teachers"]) == {"alpha", "alpha-lr"} and mix["weights"] == {"alpha": 0.5, "alpha-lr": 0.5}


# ---- plots -----------------------------------------------------------------------------------
def test_plot_card(tmp_path):
    m, tok = shards_manifest(), tokenized_manifest()
    c = cards.dataset_card(m, tok, 250)
    out = tmp_path / "cards" / "alpha" / "card.png"
    assert plots.plot_card(c, m, tok, out) == str(out)
    w, h = assert_png(out)
    assert (w, h) == (1700, 900)
    # wide length range -> log x axis path; no tokens -> placeholder panels
    tok_wide = tokenized_manifest(scale=1)
    tok_wide["stats"]["train"] = split_stats([10, 100, 1000, 10000, 100000], [1, 10, 100, 1000, 10000])
    tok_wide["stats"]["validation"] = split_stats([5], [1])
    plots.plot_card(cards.dataset_card(m, tok_wide, 32768), m, tok_wide, tmp_path / "wide.png")
    assert_png(tmp_path / "wide.png")
    plots.plot_card(cards.dataset_card(m, None, None), m, None, tmp_path / "notok.png")
    assert_png(tmp_path / "notok.png")


def test_plot_mixture(tmp_path):
    mans = {t: (shards_manifest(t), tokenized_manifest(t, scale=s)) for t, s in (("alpha", 1), ("beta", 3))}
    cs = {t: cards.dataset_card(s, tok, 250) for t, (s, tok) in mans.items()}
    mc = cards.mixture_card(cs, {"alpha": 1, "beta": 1}, name="mix")
    plots.plot_mixture(mc, mans, tmp_path / "mix.png")
    assert_png(tmp_path / "mix.png")
    plots.plot_mixture(mc, None, tmp_path / "mix_nomanifests.png")
    assert_png(tmp_path / "mix_nomanifests.png")


def test_plot_writes_atomically(tmp_path, monkeypatch):
    out = tmp_path / "card.png"
    out.write_bytes(b"old")
    m = shards_manifest()
    c = cards.dataset_card(m, None, None)
    import matplotlib.figure

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", boom)
    with pytest.raises(RuntimeError):
        plots.plot_card(c, m, None, out)
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["card.png"]


# ---- comparison table ------------------------------------------------------------------------
def test_comparison_table():
    a = cards.dataset_card(shards_manifest("alpha"), tokenized_manifest("alpha"), 250)
    b = cards.dataset_card(shards_manifest("b<eta>"), None, 250)
    b["skipped"] = {"unknown_role": 4}
    mc = cards.mixture_card({"alpha": a, "alpha2": a}, {"alpha": 1, "alpha2": 1}, name="mix")
    html, md = tables.comparison_table({"alpha": a, "b<eta>": b, "mix": mc})
    assert '<table id="teachers">' in html and "<th>alpha</th>" in html and "b&lt;eta&gt;" in html
    assert "<th>mix</th>" in html and "mixture: alpha 0.50, alpha2 0.50" in html
    lines = md.strip().splitlines()
    assert lines[0] == "| metric | alpha | b<eta> | mix |"
    assert all(line.count("|") - line.count("\\|") == 5 for line in lines)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["rows in"] == "| rows in | 10 | 10 | 20 |"
    assert rows["data (tokenized)"] == "| data (tokenized) | alpha-abcdef0123 | – | – |"
    # two teacher entries of one dataset share their data: the table says so in each column
    shared = dict(tables.table_rows({"alpha": a, "alpha-lr": {**a, "name": "alpha-lr"}})[1])["data (tokenized)"]
    assert shared == ["alpha-abcdef0123 (shared with alpha-lr)", "alpha-abcdef0123 (shared with alpha)"]
    assert rows["skipped: invalid_json"] == "| skipped: invalid_json | 2 | 0 | 4 |"
    assert rows["skipped: unknown_role"] == "| skipped: unknown_role | 0 | 4 | 0 |"
    assert rows["chats beyond seq_len"] == "| chats beyond seq_len | 50.0% | – | 50.0% |"
    assert "tokens beyond seq_len" in rows and "63.9%" in rows["tokens beyond seq_len"]
    tsv = tables.comparison_tsv({"alpha": a, "mix": mc})
    assert tsv.splitlines()[0] == "metric\talpha\tmix"
    assert len({len(r.split("\t")) for r in tsv.splitlines()}) == 1


# ---- curves ----------------------------------------------------------------------------------
def fake_metrics(n=120, eval_every=20, with_eval=True, with_lr=True):
    steps = {}
    for s in range(n):
        m = {"train/loss": 5.0 * np.exp(-s / 40) + 1.0 + 0.05 * np.sin(s), "global_step": s}
        if with_lr:
            m["optim/learning_rate"] = 1e-3 * min(1.0, (s + 1) / 10) * (1 - s / n)
        if with_eval and (s % eval_every == 0 or s == n - 1):
            m.update({"eval/loss": 5.0 * np.exp(-s / 40) + 1.2, "eval/alpha/loss": 5.0 * np.exp(-s / 40) + 1.1,
                      "eval/loading_time": 0.1, "eval/macro_loss": 2.0})
        steps[s] = m
    return {"steps": steps, "summary": {}, "launches": []}


def test_curves_series_and_summary():
    s = curves.series(fake_metrics())
    assert len(s["train"]) == 120 and s["lr_key"] == "optim/learning_rate"
    assert list(s["eval"]) == ["eval/alpha/loss", "eval/loss"][::-1]  # overall first
    assert [st for st, _ in s["eval"]["eval/loss"]] == [0, 20, 40, 60, 80, 100, 119]
    summ = curves.summary(fake_metrics())
    assert summ["last_step"] == 119 and summ["eval"]["eval/loss"]["points"] == 7
    assert summ["max_learning_rate"] == pytest.approx(max(m["optim/learning_rate"] for m in fake_metrics()["steps"].values()))
    # JSON round trip (string step keys) works too
    rt = json.loads(json.dumps(fake_metrics()))
    assert curves.series(rt)["train"][0][0] == 0


@pytest.mark.parametrize("kw", [{}, {"with_eval": False}, {"with_lr": False, "with_eval": False}, {"n": 3}])
def test_plot_curves(tmp_path, kw):
    out = tmp_path / "curves" / "demo.png"
    summ = curves.plot_curves(fake_metrics(**kw), out, "training curves: demo")
    w, h = assert_png(out)
    assert (w, h) == (1100, 750)
    if kw.get("with_eval") is False:
        assert summ["eval"] == {}
    else:  # every eval series with its point count and final value
        n = kw.get("n", 120)
        assert set(summ["eval"]) == {"eval/loss", "eval/alpha/loss"}
        assert summ["eval"]["eval/loss"]["points"] == {120: 7, 3: 2}[n]  # every 20 steps and the last
        assert summ["eval"]["eval/loss"]["final_step"] == n - 1
        assert summ["eval"]["eval/loss"]["final"] == pytest.approx(5.0 * np.exp(-(n - 1) / 40) + 1.2)


def test_plot_curves_without_any_metrics(tmp_path):
    summ = curves.plot_curves({"steps": {}}, tmp_path / "empty.png", "nothing")
    assert summ["steps_logged"] == 0 and summ["final_train_loss"] is None
    assert_png(tmp_path / "empty.png", min_bytes=5_000)


def levanter_log_line(event: str, step=None, metrics=None) -> str:
    rec = {"tracker": "json_logger", "event": event, "step": step, "metrics": metrics or {}}
    return f"2026-01-01 00:00:00,000 - 123 - levanter.json_logger - json_logger.py:90 - INFO :: {json.dumps(rec)}\n"


def test_curves_from_levanter_log(tmp_path):
    from trajsft.train.metrics import read_metrics

    log = tmp_path / "train.log"
    lines = ["[trajsft.levanter_run] launch train_lm id=x at now (latest checkpoint: None)\n", "noise\n"]
    for s in range(10):
        lines.append(levanter_log_line("log", s, {"optim/learning_rate": 1e-3, "optim/weight_decay": 0.0}))
        lines.append(levanter_log_line("log", s, {"train/loss": 3.0 - 0.1 * s, "global_step": s}))
    lines.append(levanter_log_line("log", 9, {"eval/loss": 2.5, "eval/total_time": 1.0}))
    log.write_text("".join(lines))
    metrics = read_metrics(str(log))
    summ = curves.plot_curves(metrics, tmp_path / "c.png", "t")
    assert summ["steps_logged"] == 10 and summ["final_train_loss"] == pytest.approx(2.1)
    assert summ["eval"]["eval/loss"]["final"] == 2.5 and summ["max_learning_rate"] == 1e-3
    assert_png(tmp_path / "c.png")


# ---- Snakemake rules + report + headless Chromium --------------------------------------------
needs_chromium = required.skip_unless(chromium.available(), "TRAJSFT_REQUIRE_CHROMIUM", chromium.INSTALL_HINT)


@needs_chromium
def test_chromium_render_catches_errors(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p id=x>hi</p><script>console.error('boom'); nope();</script></body></html>")
    errs = chromium.render(bad, tmp_path / "bad.png")
    assert any("boom" in e for e in errs) and any("nope" in e for e in errs)
    assert_png(tmp_path / "bad.png", min_bytes=1_000)
    good = tmp_path / "good.html"
    good.write_text("<html><body><p id=x>hi</p><script>document.getElementById('x').textContent='rendered'</script>"
                    "</body></html>")
    dom, errs = chromium.dom(good)
    assert errs == [] and ">rendered<" in dom


MIX = "mix-minimax-gemini"


def _report_workflow(tmp_path: Path) -> Path:
    """A throwaway workflow that includes the real common.smk + report.smk, with hand-made
    manifests / done markers / training logs as source files (no data or training rules).
    Report targets: the demo teacher and a mixture of two (fake) teachers."""
    import yaml

    from trajsft.plan import config as C

    wd = tmp_path / "wf"
    (wd / "config").mkdir(parents=True)
    cfg_raw = yaml.safe_load((REPO_DIR / "config" / "config.yaml").read_text())
    cfg_raw["report_targets"] = ["demo", MIX]
    cfg_raw["default_targets"] = ["demo", MIX]
    (wd / "config" / "config.yaml").write_text(yaml.safe_dump(cfg_raw))
    (wd / "Snakefile").write_text(
        'configfile: "config/config.yaml"\n\n\n'
        f'include: "{REPO_DIR}/rules/common.smk"\n'
        f'include: "{REPO_DIR}/rules/report.smk"\n\n\n'
        "rule all:\n    input:\n        REPORT_OUTPUTS,\n    default_target: True\n"
    )
    plan = C.Plan(C.load([wd / "config" / "config.yaml"]), base_dir=wd)
    for target, scale in (("demo", 3), (MIX, 20)):
        for tok_art in plan.target(target)["tokenized"]:
            teacher = tok_art.spec["teacher"]
            shards_art = plan.get("shards", tok_art.spec["shards"])
            m = dict(shards_manifest(teacher), name=shards_art.name)
            tm = dict(tokenized_manifest(teacher, scale=scale * (2 if teacher == "gemini-3-flash" else 1)),
                      name=tok_art.name)
            for art, man in ((shards_art, m), (tok_art, tm)):
                p = wd / art.manifest
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(json.dumps(man))
        (wd / "checkpoints" / target).mkdir(parents=True)
        (wd / "checkpoints" / target / "done").write_text(json.dumps({"target": target, "steps": 10}))
        (wd / "logs" / "train").mkdir(parents=True, exist_ok=True)
        with open(wd / "logs" / "train" / f"{target}.log", "w") as f:
            for s in range(10):
                f.write(levanter_log_line("log", s, {"train/loss": 3.0 - 0.1 * s, "optim/learning_rate": 1e-3}))
            ev = {"eval/loss": 2.5}
            if target == MIX:
                ev.update({"eval/minimax-m2.5/loss": 2.4, "eval/gemini-3-flash/loss": 2.6})
            f.write(levanter_log_line("log", 9, ev))
    # the demo's next-action scores (rule eval_actions' done marker: the mixture's teachers hold out nothing)
    (wd / "evals" / "demo").mkdir(parents=True)
    split = {"turns": 8, "valid": 0.25, "tool_or_text": 0.75, "tool_name": 0.5, "arguments_exact": 0.0,
             "command_program": 0.5, "command_similarity": 0.41, "ends_episode": 0.875, "tokens": 21.5, "unparsed": 1,
             "applies_to": {"tool_name": 6, "arguments_exact": 6, "command_program": 6, "command_similarity": 6}}
    (wd / "evals" / "demo" / "done").write_text(json.dumps(
        {"target": "demo", "model": "demo-0123456789", "max_turns": 8, "max_tokens": 64, "splits": {"demo": split}}))
    return wd


@pytest.mark.integration
@needs_chromium
def test_report_rules_and_html_report(tmp_path):
    wd = _report_workflow(tmp_path)
    sm = [str(REPO_DIR / ".venv" / "bin" / "snakemake"), "--directory", str(wd), "-s", str(wd / "Snakefile")]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(sm + ["-c1", "--nocolor"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    card = json.loads((wd / "results/cards/demo/card.json").read_text())
    assert card["rows_in"] == 10 and card["skipped"] == shards_manifest()["skipped"] and card["seq_len"] == 1024
    mix = json.loads((wd / f"results/cards/{MIX}/card.json").read_text())
    assert mix["kind"] == "mixture" and mix["weights"] == {"gemini-3-flash": 0.5, "minimax-m2.5": 0.5}
    assert mix["rows_in"] == 20 and mix["seq_len"] == 32768
    for t in ("demo", MIX):
        assert_png(wd / f"results/cards/{t}/card.png")
        assert_png(wd / f"results/curves/{t}.png")
        assert json.loads((wd / f"results/curves/{t}.json").read_text())["steps_logged"] == 10
    assert len(json.loads((wd / f"results/curves/{MIX}.json").read_text())["eval"]) == 3
    table = (wd / "results/cards/teachers.html").read_text()
    assert "<table id=\"teachers\">" in table and f"<th>{MIX}</th>" in table

    lint = subprocess.run(sm + ["--lint", "--nocolor"], capture_output=True, text=True, env=env, timeout=600)
    blocks = (lint.stdout + lint.stderr).split("Lints for ")
    assert not [b for b in blocks if b.startswith("snakefile") and "report.smk" in b.splitlines()[0]], lint.stdout
    report_lints = [b for b in blocks if b.startswith("rule report_")]
    for block in report_lints:  # only the project-wide "conda environment" lint is accepted
        assert block.count("    * ") == 1 and "conda environment" in block, block

    r = subprocess.run(sm + ["--report", str(wd / "report.html")], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = chromium.check_snakemake_report(wd / "report.html", tmp_path / "shots")
    assert info["errors"] == []
    assert set(info["categories"]) == {"Dataset cards", "Teacher comparison", "Training curves", "Next actions"}
    assert all(info["navbar"].values()), info["navbar"]
    res = info["results"]
    assert set(info["categories"]["Dataset cards"]) == {"demo", MIX}
    for t in ("demo", MIX):
        for name in (f"results/cards/{t}/card.png", f"results/curves/{t}.png"):
            assert res[name]["ok"] and res[name]["w"] > 600, res[name]
    table = res["results/cards/teachers.html"]
    assert table["ok"] and table["tables"] == 1 and "rows in" in table["text"]
    acts = res["results/evals/actions.html"]
    assert acts["ok"] and acts["tables"] == 1 and "demo-0123456789" in acts["text"] and "0.875" in acts["text"]
    assert_png(tmp_path / "shots" / "landing.png", min_bytes=5_000)


def test_seq_len_advice_is_one_line_against_the_native_length():
    from trajsft.report.cards import seq_len_advice

    lengths = [10_000, 30_000, 40_000, 50_000]  # 130k tokens; beyond 32768: 7232 + 17232; beyond 40960: 9040
    line = seq_len_advice(lengths, 32768, 40960)
    assert line.startswith("seq_len 32,768 loses 18.8% of tokens to truncation; 40,960 (the student's native length) "
                           "would lose 7.0% (63.0% less): consider training.seq_len: 40960")
    assert line.endswith("(the reference default stays 32,768)") and "\n" not in line
    assert seq_len_advice([100, 200], 32768, 40960) is None  # nothing lost
    assert seq_len_advice(lengths, 32768, None) is None  # no native length known (tiny demo student)
    assert seq_len_advice(lengths, 40960, 40960) is None
