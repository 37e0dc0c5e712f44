"""The opt-in `eval:` section and the cross-teacher matrix (trajsft.report.matrix / train_eval):
what the plan evaluates, which model of a run, the matrix document, heatmap and HTML. The Levanter
evaluation itself runs on the real demo in tests/test_pipeline.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_cards import assert_png
from trajsft.plan import step_configs
from trajsft.plan import config as C
from trajsft.report import matrix

REAL = ["gpt-5-mini", "minimax-m2.5", "gemini-3-flash"]


def plan(overrides=None) -> C.Plan:
    return C.Plan(C.load(None, overrides))


def runs(p: C.Plan) -> dict:
    return {t: p.target(t)["run"].name for t in p.targets}


def test_without_eval_section_nothing_changes():
    ref = plan()
    assert ref.eval_cells == {} and "eval" not in ref.cfg
    # rows/columns alone hash nothing: every run (the reference runs included) keeps its name
    p = plan({"eval": {"targets": ["demo"], "max_eval_batches": 3, "model": "checkpoint"}})
    assert runs(p) == runs(ref)
    assert list(p.eval_cells) == [("demo", "demo")]


def test_heldout_fraction_of_eval_applies_to_teachers_without_their_own():
    ref = plan()
    p = plan({"eval": {"heldout_fraction": 0.05, "targets": [*REAL, "mix-all"]}})
    for t in REAL:  # their shards (and so training) change: the cost of the matrix
        assert p.teacher_transform(t)["heldout_fraction"] == 0.05
        assert runs(p)[t] != runs(ref)[t]
    assert p.teacher_transform("demo")["heldout_fraction"] == 0.1  # its own setting wins
    assert runs(p)["demo"] == runs(ref)["demo"]
    assert p.eval_columns() == REAL


def test_every_row_reads_the_same_heldout_rows_of_a_teacher():
    p = plan({"eval": {"heldout_fraction": 0.05, "targets": [*REAL, "mix-minimax-gemini", "mix-all"]}})
    for col in REAL:
        arts = {p.eval_cells[(row, col)].name for row in p.eval_rows()}
        assert len(arts) == 1, arts  # same student and seq_len: one tokenized artifact per column
        # ... and it is the artifact the teacher (and every mixture using it) trains and evaluates on
        [own] = [a for a in p.target(col)["tokenized"]]
        assert arts == {own.name}
        for mix in ("mix-minimax-gemini", "mix-all"):
            if col in p.target(mix)["run"].spec["weights"]:
                assert own.name in {a.name for a in p.target(mix)["tokenized"]}


def test_a_row_with_another_student_gets_the_column_tokenized_its_way():
    p = plan({"eval": {"heldout_fraction": 0.05, "targets": ["demo", "gemini-3-flash"],
                       "teachers": ["demo", "gemini-3-flash"]}})
    demo_on_gem, gem_on_gem = p.eval_cells[("demo", "gemini-3-flash")], p.eval_cells[("gemini-3-flash", "gemini-3-flash")]
    assert demo_on_gem.spec["shards"] == gem_on_gem.spec["shards"]  # the same held-out rows ...
    assert demo_on_gem.name != gem_on_gem.name and demo_on_gem.spec["seq_len"] == 1024  # ... tokenized its way
    spec = matrix.matrix_spec(step_configs.eval_matrix(p))
    doc = matrix.assemble(spec, {r: {"kind": "hf_export", "path": "x", "step": 1} for r in spec["rows"]},
                     {r: {c: {"loss": 1.0, "tokens": 5, "sequences": 1} for c in spec["columns"]} for r in spec["rows"]},
                     {})
    assert doc["same_chats"] == {"demo": False, "gemini-3-flash": False}


@pytest.mark.parametrize("ev, msg", [
    ({"targets": ["minimax-m2.5"]}, "eval: teacher 'minimax-m2.5' has no held-out split"),
    ({"targets": ["nope"]}, "eval.targets: unknown target 'nope'"),
    ({"targets": ["demo"], "teachers": ["mix-all"]}, "eval.teachers: unknown teacher 'mix-all'"),
    ({"targets": ["demo"], "model": "best"}, "config: eval.model: 'best' is not allowed (allowed: latest, hf_export, checkpoint)"),
    ({"heldout_fraction": 0}, "config: eval.heldout_fraction: 0 is not allowed (allowed: > 0)"),
])
def test_eval_config_errors_are_one_line(ev, msg):
    with pytest.raises(C.ConfigError) as e:
        plan({"eval": ev})
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_spec_and_inputs():
    p = plan({"eval": {"heldout_fraction": 0.05, "targets": ["gemini-3-flash", "mix-minimax-gemini"]}})
    spec = matrix.matrix_spec(step_configs.eval_matrix(p))
    assert spec["rows"] == {t: p.target(t)["run"].name for t in ("gemini-3-flash", "mix-minimax-gemini")}
    assert spec["columns"] == ["minimax-m2.5", "gemini-3-flash"] and spec["model"] == "latest"
    inp = matrix.eval_inputs(p)
    assert inp["done"] == ["checkpoints/gemini-3-flash/done", "checkpoints/mix-minimax-gemini/done"]
    assert len(inp["tokenized"]) == 2 and all(x.startswith("results/tokenized/") for x in inp["tokenized"])


# ---- which model of a run ----------------------------------------------------------------------
def _hf_export(path, complete=True):
    from safetensors.numpy import save_file

    os.makedirs(path)
    save_file({"w": np.zeros(2, dtype=np.float32)}, os.path.join(path, "model.safetensors"))
    if complete:
        (open(os.path.join(path, "config.json"), "w")).write("{}")


def _checkpoint(path, step, ts):
    os.makedirs(path)
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump({"step": step, "timestamp": ts, "is_temporary": False}, f)


def test_model_source(tmp_path):
    cfg = {"hf_save_path": str(tmp_path / "hf"), "trainer": {"checkpointer": {"base_path": str(tmp_path / "ck")}}}
    assert matrix.model_source(cfg) is None
    _hf_export(tmp_path / "hf" / "step-3")
    _hf_export(tmp_path / "hf" / "step-9", complete=False)  # interrupted export: ignored
    assert matrix.model_source(cfg) == {"kind": "hf_export", "path": str(tmp_path / "hf" / "step-3"), "step": 3}
    _checkpoint(tmp_path / "ck" / "step-5", 5, "2026-01-01T00:00:00")
    assert matrix.model_source(cfg)["kind"] == "checkpoint" and matrix.model_source(cfg)["step"] == 5  # newer
    assert matrix.model_source(cfg, "hf_export")["step"] == 3
    _hf_export(tmp_path / "hf" / "step-5")
    assert matrix.model_source(cfg) == {"kind": "hf_export", "path": str(tmp_path / "hf" / "step-5"), "step": 5}  # tie
    assert matrix.model_source(cfg, "checkpoint")["path"] == str(tmp_path / "ck" / "step-5")


# ---- the document and its renderings -----------------------------------------------------------
def _doc():
    spec = {"rows": {"a": "a-0123456789", "mix": "mix-0123456789"}, "columns": ["a", "b"],
            "cells": {"a": {"a": "a-t1", "b": "b-t1"}, "mix": {"a": "a-t1", "b": "b-t1"}}, "max_eval_batches": None}
    scores = {"a": {"a": {"loss": 1.25, "tokens": 12000, "sequences": 3}, "b": {"loss": 2.5, "tokens": 900, "sequences": 1}},
              "mix": {"a": {"loss": 1.5, "tokens": 12000, "sequences": 3}, "b": {"loss": None, "tokens": 0, "sequences": 0}}}
    models = {"a": {"kind": "hf_export", "path": "/r/a/hf/step-9", "step": 9},
              "mix": {"kind": "checkpoint", "path": "/r/m/checkpoints/step-4", "step": 4}}
    return matrix.assemble(spec, models, scores, {"a-t1": 4, "b-t1": 2})


def test_assemble():
    doc = _doc()
    assert doc["rows"] == ["a", "mix"] and doc["columns"] == ["a", "b"]
    assert doc["cells"]["a"]["b"] == {"loss": 2.5, "tokens": 900, "sequences": 1, "chats": 2, "tokenized": "b-t1"}
    assert doc["same_chats"] == {"a": True, "b": True} and doc["runs"]["mix"] == "mix-0123456789"
    json.dumps(doc, allow_nan=False)  # plain JSON


def test_render_html_and_text():
    from chromium import available, dom

    doc = _doc()
    page = matrix.render_html(doc)
    assert page.count("<tr>") == 3 and "1.2500" in page and "12,000 tokens, 4 chats" in page and "n/a" in page
    assert "checkpoint step 4" in page
    text = matrix.render_text(doc)
    assert "1.2500 (12.0k)" in text and "2.5000 (900)" in text and "/r/m/checkpoints/step-4" in text
    if available():
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.html")
            open(path, "w").write(page)
            html, errs = dom(path)
        assert errs == [] and 'id="matrix"' in html


def test_plot_heatmap(tmp_path):
    matrix.plot_heatmap(_doc(), str(tmp_path / "m.png"))
    assert_png(tmp_path / "m.png")


# ---- the Levanter config of an evaluation ------------------------------------------------------
def test_eval_config_parses_into_levanter(tmp_path):
    import draccus
    import levanter.config  # noqa: F401
    from levanter.data.text import LMMixtureDatasetConfig
    from levanter.main.train_lm import TrainLmConfig

    from spec_utils import run_inputs, target_spec
    from trajsft.train import eval as train_eval
    from trajsft.train import levanter_config

    tmpl = "{{ messages }}"
    train = levanter_config.train_lm_config(target_spec(weights={"a": 1.0}, seq_len=128, batch_size=2),
                                            run_inputs(str(tmp_path), {"a": ("/c/a", 10)}, 5, chat_template=tmpl))
    cfg = train_eval.eval_config(train, {"a": "/c/a", "b": "/c/b"}, "demo/tokenizer", max_eval_batches=2)
    assert train["data"]["cache_dir"] == "/c/a"  # the training config is not modified
    path = levanter_config.write_config(cfg, str(tmp_path / "e.yaml"))
    parsed = draccus.parse(config_class=TrainLmConfig, config_path=path, args=[])
    assert isinstance(parsed.data, LMMixtureDatasetConfig) and set(parsed.data.configs) == {"a", "b"}
    assert parsed.data.configs["b"].cache_dir == "/c/b" and parsed.data.configs["b"].tags == ["b"]
    fmt = parsed.data.configs["b"].format
    assert fmt.chat_template == tmpl and fmt.pack and fmt.mask_user_turns  # trained format: assistant-only loss
    assert parsed.trainer.max_eval_batches == 2 and tuple(parsed.trainer.tracker) == ()
    assert parsed.model.seq_len == 128 and parsed.data.tokenizer == "demo/tokenizer"


def test_cli_eval_errors_are_one_line(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "trajsft.cli", "eval", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)

    p = cli()
    assert p.returncode == 2 and "no eval: section" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = cli("demo")
    assert p.returncode == 2 and "demo on demo: results/tokenized/" in p.stderr and "is missing" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = cli("minimax-m2.5")
    assert p.returncode == 2 and "has no held-out split" in p.stderr


# ---- the rule ----------------------------------------------------------------------------------
def _dry_run(tmp_path, *args):
    from pipeline_utils import REPO, SNAKEMAKE

    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n", "--cores", "1", *args],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_rule_plans_the_matrix_only_with_an_eval_section(tmp_path):
    from pipeline_utils import REPO

    p = _dry_run(tmp_path, "results/eval/matrix.json")
    assert p.returncode == 1 and "needs an eval: section" in p.stderr
    # config/eval.yaml: the five reference-data targets (new hashes: they hold out 5%) plus demo's rule all
    p = _dry_run(tmp_path, "--configfile", str(REPO / "config" / "eval.yaml"))
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout + p.stderr
    assert "rule eval_matrix:" in out and "results/eval/matrix.png" in out
    for t in [*REAL, "mix-minimax-gemini", "mix-all"]:  # every row is trained first
        assert f"output: checkpoints/{t}/done" in out


def test_the_matrix_step_runs_on_a_config_built_by_hand(tmp_path):
    """rule eval_matrix's step takes its typed config alone (no plan): a row not trained yet is one line naming
    the file it needs and the command that makes it; a column with no held-out chat left is one line too."""
    from trajsft.plan.config import Artifact
    from trajsft.plan.step_configs import EvalMatrixConfig, EvalRow

    manifest = tmp_path / "tok.json"
    manifest.write_text(json.dumps({"stats": {"validation": {"chats": 3}}}))
    tok = Artifact(kind="tokenized", name="demo-tok", hash="0" * 10, inputs={}, location=str(tmp_path / "tok"),
                   manifest=str(manifest))
    run = Artifact(kind="checkpoints", name="demo-run", hash="1" * 10, inputs={}, location=str(tmp_path / "run"),
                   manifest="")
    cfg = EvalMatrixConfig(rows={"demo": EvalRow(run=run, tokenizer=str(C.REPO_DIR / "demo/tokenizer"),
                                                 cells={"demo": tok})},
                           columns=("demo",), max_eval_batches=None, model="latest")
    assert matrix.matrix_spec(cfg)["cells"] == {"demo": {"demo": "demo-tok"}}
    out = {"json": str(tmp_path / "m.json")}
    with pytest.raises(C.ConfigError) as e:
        matrix.eval_matrix(cfg, out)
    assert str(e.value) == (f"demo: {tmp_path}/run/provenance/config.json is missing: train it first "
                            "(snakemake checkpoints/demo/done)")
    manifest.write_text(json.dumps({"stats": {"validation": {}}}))
    with pytest.raises(C.ConfigError, match=r"^tokenized/demo-tok: no held-out chat is left .*raise heldout_fraction$"):
        matrix.eval_matrix(cfg, out)
    assert not (tmp_path / "m.json").exists()
