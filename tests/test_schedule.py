"""Training length (issue 10 section 4): epochs of rows (the reference) or of packed sequences, the
reference checkpoint cadence, `trajsft plan --explain`, and what the train rule reads and sets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trajsft.plan import step_configs
from trajsft import cli
from trajsft.plan import schedule
from trajsft.train import target as train_target
from trajsft.plan import config as C


def plan(**over):
    return C.Plan(C.load(None, over), base_dir=C.REPO_DIR)


REFERENCE = {"gpt-5-mini": 1730, "minimax-m2.5": 2298, "gemini-3-flash": 634}


@pytest.mark.parametrize("teacher", sorted(REFERENCE))
def test_reference_teachers_train_the_reference_step_count(teacher):
    spec = plan().target(teacher)["run"].spec
    assert spec["training"]["epochs_of"] == "rows"
    # ceil(7 * configured rows / 16), known offline
    assert schedule.train_steps(spec["training"], spec["rows"], None) == REFERENCE[teacher]


def test_plan_explain_shows_2298_steps_for_minimax(capsys):
    assert cli.main(["plan", "--explain", "minimax-m2.5"]) == 0
    out = capsys.readouterr().out
    assert "training: 2298 steps (7 epochs of rows, batch 16; seq_len 32768)" in out
    assert "minimax-m2.5: weight 1.00, 5251 rows" in out
    assert cli.main(["plan", "--explain", "--json", "minimax-m2.5"]) == 0
    [t] = json.loads(capsys.readouterr().out)
    assert t["training"]["steps"] == 2298 and t["training"]["epochs_of"] == "rows"


def test_mixture_epoch_is_the_concatenation_of_its_teachers():
    p = plan()
    spec = p.target("mix-minimax-gemini")["run"].spec
    assert spec["rows"] == {"gemini-3-flash": 1449, "minimax-m2.5": 5251}
    assert schedule.train_steps(spec["training"], spec["rows"]) == -(-7 * (1449 + 5251) // 16) == 2932
    # per-teacher passes follow the weights (packed counts as a tokenized manifest would give them)
    e = schedule.explain(spec["training"], spec["weights"], spec["rows"],
                         {"minimax-m2.5": {"packed_sequences": 4000, "tokens_in_window": 80_000_000},
                          "gemini-3-flash": {"packed_sequences": 1000, "tokens_in_window": 20_000_000}})
    assert e["sequences"] == 2932 * 16
    mm, gf = e["teachers"]["minimax-m2.5"], e["teachers"]["gemini-3-flash"]
    assert mm["sequences"] == gf["sequences"] == 2932 * 8
    assert mm["passes"] == pytest.approx(2932 * 8 / 4000) and gf["passes"] == pytest.approx(2932 * 8 / 1000)
    assert e["tokens_seen"] == pytest.approx(mm["passes"] * 80e6 + gf["passes"] * 20e6)


def test_packed_sequences_definition_needs_the_tokenized_count():
    tr = {"epochs": 2, "batch_size": 4, "epochs_of": "packed_sequences", "seq_len": 1024}
    assert schedule.train_steps(tr, {"demo": 60}) is None
    assert schedule.train_steps(tr, {"demo": 60}, {"demo": 54}) == 27  # ceil(2 * 54 / 4)
    assert schedule.train_steps({**tr, "epochs_of": "rows"}, {"demo": 60}) == 30
    assert schedule.train_steps({**tr, "max_steps": 5}, {"demo": 60}) == 5
    lines = schedule.render("demo", schedule.explain(tr, {"demo": 1.0}, {"demo": 60}))
    assert lines[0] == "  training: ? steps (known once tokenized) (2 epochs of packed_sequences, batch 4; seq_len 1024)"


def test_epochs_of_and_rows_are_hashed_cadence_is_not():
    base = plan().target("minimax-m2.5")["run"]
    assert base.inputs["rows"] == {"minimax-m2.5": 5251}
    packed = plan(training={"epochs_of": "packed_sequences"}).target("minimax-m2.5")["run"]
    assert packed.hash != base.hash and "rows" not in packed.inputs
    # the data artifacts do not depend on how epochs are counted
    assert ({a.name for a in plan().chain("minimax-m2.5") if a.kind != "checkpoints"}
            == {a.name for a in plan(training={"epochs_of": "packed_sequences"}).chain("minimax-m2.5") if a.kind != "checkpoints"})
    rows = plan(teachers={"minimax-m2.5": {"rows": 5000}}).target("minimax-m2.5")["run"]
    assert rows.hash != base.hash


def test_quarter_epoch_checkpoint_cadence():
    assert schedule.quarter_epoch_steps({"minimax-m2.5": 5251}, 16) == (5251 // 16) // 4 == 82
    assert schedule.resolve_every("quarter_epoch", {"a": 3953, "b": 1449}, 16) == (5402 // 16) // 4
    assert schedule.resolve_every(1000, {"a": 1}, 16) == 1000
    assert schedule.quarter_epoch_steps({"demo": 3}, 4) == 1


def test_bad_cadence_is_one_line():
    with pytest.raises(C.ConfigError) as e:
        C.load(None, {"checkpointing": {"keep_every_steps": "sometimes"}})
    assert str(e.value).startswith("config: checkpointing.keep_every_steps: 'sometimes' is not allowed (allowed: steps, or quarter_epoch")
    assert "\n" not in str(e.value)


def _fake_tokenized(p: C.Plan, target: str, packed: int, tokens: int = 5000, truncated: int = 200) -> None:
    for teacher, name in p.target(target)["run"].spec["tokenized"].items():
        art = p.get("tokenized", name)
        Path(art.manifest).parent.mkdir(parents=True, exist_ok=True)
        Path(art.manifest).write_text(json.dumps({
            "teacher": teacher, "cache_dir": f"/caches/{name}/cache",
            "stats": {"train": {"chats": 50, "tokens": tokens, "tokens_truncated": truncated, "packed_sequences": packed}},
        }))


def test_train_config_reads_the_packed_count_from_the_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # manifests under ./results
    p = plan(training={"epochs_of": "rows"})
    _fake_tokenized(p, "minimax-m2.5", packed=1500)
    lev = train_target.train_lm_config_for(step_configs.train(p, "minimax-m2.5"))
    t = lev["trainer"]
    assert t["num_train_steps"] == 2298
    assert lev["data"]["cache_dir"].startswith("/caches/SWE-smith-rs-minimax-m2.5-trajectories-")  # named by its dataset
    assert lev["epoch"] == (2298 - 1) * 16 // 1500 + 1  # Levanter cycles the packed data to cover the steps
    assert lev["hf_save_dtype"] == "bfloat16"
    assert t["watch"] == {"interval": 0}  # grad-norm watch off: one compiled train step
    assert t["jax_compilation_cache_dir"] == str(tmp_path / "results" / "jax-compilation-cache")
    # the reference checkpoint cadence, when asked for
    p = plan(checkpointing={"keep_every_steps": "quarter_epoch", "hf_export_every_steps": "quarter_epoch"})
    lev = train_target.train_lm_config_for(step_configs.train(p, "minimax-m2.5"))
    assert lev["trainer"]["checkpointer"]["keep"][0] == {"every": 82, "until": 2296}
    assert lev["hf_save_steps"] == 82
    # explain uses the same numbers
    e = train_target.explain(step_configs.train(p, "minimax-m2.5"))
    assert e["steps"] == 2298 and e["teachers"]["minimax-m2.5"]["passes"] == pytest.approx(2298 * 16 / 1500)
    assert e["tokens_seen"] == pytest.approx(2298 * 16 / 1500 * 4800)


def test_packed_sequences_steps_and_a_gs_compilation_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = plan(training={"epochs_of": "packed_sequences"}, storage_root="gs://marin-us-east5/trajsft",
             wandb={"watch_interval": 5})
    _fake_tokenized(p, "gemini-3-flash", packed=321)
    lev = train_target.train_lm_config_for(step_configs.train(p, "gemini-3-flash"))
    assert lev["trainer"]["num_train_steps"] == -(-7 * 321 // 16)
    assert lev["trainer"]["jax_compilation_cache_dir"] == "gs://marin-us-east5/trajsft/jax-compilation-cache"
    assert lev["trainer"]["watch"] == {"interval": 5}


def test_missing_packed_count_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = plan()
    name = p.target("demo")["run"].spec["tokenized"]["demo"]
    art = p.get("tokenized", name)
    Path(art.manifest).parent.mkdir(parents=True)
    Path(art.manifest).write_text(json.dumps({"cache_dir": "/c", "stats": {"train": {"chats": 1}}}))
    with pytest.raises(Exception, match="has no stats.train.packed_sequences: rebuild it"):
        train_target.train_lm_config_for(step_configs.train(p, "demo"))


def test_train_config_imports_neither_jax_nor_levanter(tmp_path):
    """The train rule's own work before train_lm: no jax/levanter import in the rule process."""
    code = f"""
import json, os, sys
os.chdir({str(tmp_path)!r})
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_schedule import plan, _fake_tokenized
from trajsft.plan import step_configs
from trajsft.train import target as train_target
p = plan()
_fake_tokenized(p, "demo", packed=27)
lev = train_target.train_lm_config_for(step_configs.train(p, "demo"))
print(json.dumps({{"steps": lev["trainer"]["num_train_steps"],
                  "heavy": sorted(m for m in ("jax", "levanter", "haliax", "equinox") if m in sys.modules)}}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert out == {"steps": 14, "heavy": []}  # demo: ceil(2 * 27 / 4)


def test_forced_hooks_run_once_per_step():
    from trajsft.train.train_lm_main import final_hooks_once

    class FakeTrainer:
        def __init__(self):
            self.calls = []

        def run_hooks(self, info, force=False):
            self.calls.append((info.step, force))

    class Info:
        def __init__(self, step):
            self.step = step

    t = final_hooks_once(FakeTrainer)()
    t.run_hooks(Info(5))
    t.run_hooks(Info(5))  # scheduled hooks are never skipped
    t.run_hooks(Info(9), force=True)  # Trainer.train's end-of-training hooks
    t.run_hooks(Info(9), force=True)  # train_lm.main's second run when epoch > 0: skipped
    t.run_hooks(Info(10), force=True)
    assert t.calls == [(5, False), (5, False), (9, True), (10, True)]
    assert isinstance(t, FakeTrainer) and type(t).__name__ == "FinalHooksOnceFakeTrainer"


def test_final_hooks_skip_periodic_hooks_that_ran_at_the_last_step():
    """The last step on the eval period: eval ran as scheduled, the forced end-of-training run must not
    run it again; a hook run every step (the checkpointer) still gets its forced call. Levanter's own
    TrainerHooks and callbacks."""
    from levanter.callbacks import Callback
    from levanter.trainer import TrainerHooks

    from trajsft.train.train_lm_main import final_hooks_once

    calls = []

    class Record(Callback):
        def __init__(self, name):
            self.name = name

        def on_step(self, info, force=False):
            calls.append((self.name, info.step, force))

    class Base:  # Levanter's Trainer.run_hooks, without the rest of the Trainer
        def __init__(self):
            self.hooks = TrainerHooks()

        def run_hooks(self, info, force=False):
            self.hooks.run_hooks(info, force=force)

    class Info:
        def __init__(self, step):
            self.step = step

    t = final_hooks_once(Base)()
    for name, every in (("eval", 5), ("hf_export", 10), ("checkpointer", 1)):
        t.hooks.add_hook(Record(name), every=every)
    for step in range(21, 26):
        t.run_hooks(Info(step))
    t.run_hooks(Info(25), force=True)  # Trainer.train's end
    t.run_hooks(Info(25), force=True)  # train_lm.main's second run (epoch > 0)
    assert [c for c in calls if c[0] == "eval"] == [("eval", 25, False)]
    assert [c for c in calls if c[0] == "hf_export"] == [("hf_export", 25, True)]
    assert [c for c in calls if c[0] == "checkpointer"][-2:] == [("checkpointer", 25, False), ("checkpointer", 25, True)]
    calls.clear()
    t.run_hooks(Info(27))  # not on eval's period: the forced run runs every hook once
    t.run_hooks(Info(27), force=True)
    assert sorted(c for c in calls if c[2]) == [("checkpointer", 27, True), ("eval", 27, True), ("hf_export", 27, True)]


def test_none_leaf_warning_of_a_resume_is_filtered_and_other_leaves_still_warn(caplog):
    """Levanter warns "Unknown leaf type <class 'NoneType'>" for every None leaf of the state it
    restores (~50 per resume); the children drop exactly that line. Levanter's own function."""
    import logging

    from levanter.tensorstore_serialization import _sharding_from_leaf

    from trajsft.train.launch import NONE_LEAF_WARNING, quiet_none_leaves

    with caplog.at_level(logging.WARNING, logger="levanter.tensorstore_serialization"):
        assert _sharding_from_leaf(None, None, None) is None
    assert NONE_LEAF_WARNING in caplog.text  # Levanter's behaviour, unfiltered
    caplog.clear()
    quiet_none_leaves()
    quiet_none_leaves()  # idempotent
    with caplog.at_level(logging.WARNING, logger="levanter.tensorstore_serialization"):
        assert _sharding_from_leaf(None, None, None) is None
        _sharding_from_leaf(object(), None, None)
    assert NONE_LEAF_WARNING not in caplog.text and "Unknown leaf type <class 'object'>" in caplog.text
    assert len(logging.getLogger("levanter.tensorstore_serialization").filters) == 1
