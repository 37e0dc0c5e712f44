"""Sweeps (issue 43): the grid, its cells as targets, the one-line errors, the dry run and the comparison's files."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess

import pytest
import yaml

from pipeline_utils import REPO, SNAKEMAKE
from trajsft.plan import config as C
from trajsft.plan import step_configs, sweeps
from trajsft.report import sweeps as sweep_report

LR_DEMO = {"sweeps": {"lr-demo": {"base": "demo", "grid": {"training.learning_rate": [1.0e-3, 3.0e-3]},
                                  "max_parallel": 2}}}


def load(over: dict) -> dict:
    return C.load(None, over)


def test_cells_are_the_grid_and_a_cell_that_changes_nothing_is_its_base():
    cfg = load(LR_DEMO)
    [a, b] = sweeps.cells(cfg)["lr-demo"]
    assert (a.target, a.values) == ("lr-demo-learning_rate-0.001", (("training.learning_rate", 0.001),))
    assert (b.target, b.values) == ("demo", (("training.learning_rate", 0.003),))  # demo's own learning rate
    cell = cfg["mixtures"]["lr-demo-learning_rate-0.001"]
    assert cell["teachers"] == {"demo": 1.0} and cell["student"] == "tiny" and cell["training"]["learning_rate"] == 0.001
    assert cell["training"]["seq_len"] == 1024 and cell["actions"] == {"max_turns": 8, "max_tokens": 64}
    plan = C.Plan(cfg, base_dir=C.REPO_DIR)
    # its data is the demo's (named by what it holds), its run its own; every other run keeps its name
    chain = {x.kind: x.name for x in plan.chain("lr-demo-learning_rate-0.001")}
    demo = {x.kind: x.name for x in plan.chain("demo")}
    assert chain["tokenized"] == demo["tokenized"] and chain["checkpoints"].startswith("lr-demo-learning_rate-0.001-")
    assert demo["checkpoints"] == "demo-6793026b50"
    assert C.validate(cfg) is cfg and sweeps.cells(cfg) == sweeps.cells(load(LR_DEMO))  # validating again: the same


def test_two_axes_exclude_include_and_targets_as_an_axis():
    cfg = load({"sweeps": {"g": {"targets": ["demo", "mix-all"],
                                 "grid": {"training.learning_rate": ["1e-3", 2.0e-3], "training.epochs": [1, 2]},
                                 "exclude": [{"target": "mix-all", "training.epochs": 1}],
                                 "include": [{"target": "demo", "training.learning_rate": 5e-4, "training.epochs": 3}]}}})
    names = [c.target for c in sweeps.cells(cfg)["g"]]
    assert names == ["g-demo-learning_rate-0.001-epochs-1", "g-demo-learning_rate-0.001-epochs-2",
                     "g-demo-learning_rate-0.002-epochs-1", "g-demo-learning_rate-0.002-epochs-2",
                     "g-mix-all-learning_rate-0.001-epochs-2", "g-mix-all-learning_rate-0.002-epochs-2",
                     "g-demo-learning_rate-0.0005-epochs-3"]
    assert len(set(names)) == len(names) and all(n in cfg["mixtures"] for n in names)
    assert cfg["mixtures"]["g-mix-all-learning_rate-0.001-epochs-2"]["teachers"] == cfg["mixtures"]["mix-all"]["teachers"]


@pytest.mark.parametrize("sweep, line", [
    ({"base": "nope", "grid": {"training.learning_rate": [1]}}, r"sweeps.s: unknown target 'nope' \(teachers and mix"),
    ({"grid": {"training.learning_rate": [1]}}, r"sweeps.s: give either base .* or targets"),
    ({"base": "demo", "grid": {"training.lr": [1]}}, r"sweeps.s.grid.training.lr: training has no field 'lr'"),
    ({"base": "demo", "grid": {"seed": [1]}}, r"sweeps.s.grid: axis 'seed' is not training.<field>"),
    ({"base": "demo", "grid": {"training.batch_size": [0]}}, r"sweeps.s.grid.training.batch_size: training.batch_size "
                                                             r"0 is not allowed"),
    ({"base": "demo", "grid": {"training.seed": [1]}, "include": [{"training.epochs": 2}]},
     r"sweeps.s.include: training.epochs is not an axis of the sweep \(training.seed\)"),
    ({"base": "demo"}, r"sweeps.s: an empty grid"),
])
def test_a_sweep_that_cannot_be_expanded_is_one_line(sweep, line):
    with pytest.raises(C.ConfigError, match=r"^config: " + line) as e:
        load({"sweeps": {"s": sweep}})
    assert "\n" not in str(e.value)


def test_the_dry_run_plans_the_data_once_and_two_trainings(tmp_path):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(LR_DEMO))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.run([SNAKEMAKE, "-n", "--forceall", "sweeps/lr-demo/done", "--configfile",
                        str(REPO / "config/config.yaml"), str(tmp_path / "sweep.yaml"), "-d", str(tmp_path), "-s",
                        str(REPO / "Snakefile")], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    stats = p.stdout.split("Job stats:")[1].split("\n\n")[0]
    counts = {ln.split()[0]: int(ln.split()[1]) for ln in stats.splitlines()[3:] if ln.strip()}
    assert counts == {"download": 1, "shard": 1, "tokenize": 1, "train": 2, "sweep": 1, "total": 6}, stats
    q = subprocess.run([SNAKEMAKE, "-n", "sweeps/nope/done", "-d", str(tmp_path), "-s", str(REPO / "Snakefile")],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert q.returncode != 0 and "sweeps/nope/done: unknown sweep 'nope' (sweeps: none in the config)" in q.stderr


def test_max_parallel_is_a_snakemake_resource_each_cells_training_takes_on_a_ray_profile(tmp_path):
    """On a Ray profile each sweep with max_parallel is a Snakemake global resource of that many slots, and the
    training of each of its cells takes one (other targets none): the cells beyond the cap wait in Snakemake.
    tests/test_tpu_profile.py runs two cells with max_parallel 1 on the emulated cluster, one after the other."""
    cfg = load({"sweeps": {"lr-m": {"base": "minimax-m2.5", "grid": {"training.learning_rate": [1.0e-5, 3.0e-5]},
                                    "max_parallel": 1},
                           "lr_m": {"targets": ["demo", "gpt-5-mini"], "max_parallel": 3},
                           "free": {"base": "demo", "grid": {"training.epochs": [1, 2]}}}})
    got = [(s.sweep, s.resource, s.cap, sorted(s.targets)) for s in sweeps.slots(cfg)]
    assert got == [("lr-m", "sweep_lr_m", 1, ["lr-m-learning_rate-1e_05", "lr-m-learning_rate-3e_05"]),
                   ("lr_m", "sweep_lr_m_2", 3, ["demo", "gpt-5-mini"])]  # no cap, no resource; names never shared
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"sweeps": {"lr-m": cfg["sweeps"]["lr-m"]}}))
    p = subprocess.run([SNAKEMAKE, "--profile", "tpu-east5", "-n", "sweeps/lr-m/done", "checkpoints/gpt-5-mini/done",
                        "--configfile", str(REPO / "profiles/tpu-east5/cluster.yaml"), str(tmp_path / "sweep.yaml"),
                        "-d", str(tmp_path / "wd"), "-s", str(REPO / "Snakefile")], cwd=REPO, capture_output=True,
                       text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    took = {}
    for job in p.stdout.split("\nrule ")[1:]:
        if job.startswith("train:"):
            target = job.split("wildcards: target=")[1].split()[0]
            took[target] = job.split("resources: ")[1].split("\n")[0].split(", ")
    assert {t: [r for r in res if r.startswith("sweep_")] for t, res in took.items()} == {
        "lr-m-learning_rate-1e_05": ["sweep_lr_m=1"], "lr-m-learning_rate-3e_05": ["sweep_lr_m=1"],
        "gpt-5-mini": ["sweep_lr_m=0"]}, p.stdout[-3000:]


def test_the_comparison_marks_the_best_cell_and_keeps_only_what_varies(tmp_path, monkeypatch):
    """Two cells' done markers and train logs, as training leaves them: the table, the csv and the pictures."""
    monkeypatch.chdir(tmp_path)
    cfg = load({"sweeps": {"lr-demo": {"base": "demo", "grid": {"training.learning_rate": [1.0e-3, 3.0e-3],
                                                                "training.seed": [42]}}}})
    plan = C.Plan(cfg, base_dir=C.REPO_DIR)
    for target, final in (("lr-demo-learning_rate-0.001", 5.2), ("demo", 3.6)):
        tc = plan.target(target)["run"]
        os.makedirs(f"checkpoints/{target}", exist_ok=True)
        (tmp_path / f"checkpoints/{target}/done").write_text(json.dumps(
            {"hash": tc.hash, "final_loss": final - 0.5, "eval_loss": {"eval/loss": [20, final]}, "wandb_url": None}))
        log = tmp_path / step_configs.train(plan, target).log
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join("2026-11-27 INFO levanter.json_logger :: " + json.dumps(
            {"event": "log", "step": s, "metrics": {"train/loss": 8 - s * 0.1, "eval/loss": final + 2 - s * 0.1}}) + "\n"
            for s in range(0, 21, 10)))
    os.unlink(tmp_path / step_configs.train(plan, "demo").log)  # demo's weights copied from another root: no log here
    out = {k: str(tmp_path / v) for k, v in sweep_report.outputs("lr-demo").items()}
    os.makedirs(tmp_path / "sweeps/lr-demo", exist_ok=True)
    done = sweep_report.build(plan, "lr-demo", out)
    assert done["best"] == "demo" and done["varying"] == ["learning_rate"]
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweeps/lr-demo/results.csv").read_text())))
    assert [r["cell"] for r in rows] == ["lr-demo-learning_rate-0.001", "demo"]
    assert "seed" not in rows[0] and [r["learning_rate"] for r in rows] == ["0.001", "0.003"]
    assert [r["state"] for r in rows] == ["done", "done"] and rows[1]["best"] == "best (final_eval_loss)"
    assert rows[0]["checkpoint_dir"].startswith("results/checkpoints/lr-demo-learning_rate-0.001-")
    md = (tmp_path / "sweeps/lr-demo/results.md").read_text()
    assert "| demo | 0.003 | done |" in md and md.count("\n| ") == 3
    assert float(rows[1]["final_eval_loss"]) == 3.6 and rows[1]["best_eval_loss"] == "" and done["curves_drawn"] == 1
    for png in ("loss.png", "settings.png"):
        assert (tmp_path / "sweeps/lr-demo" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_values_written_as_yaml_1_1_strings_are_numbers_and_name_the_same_cells():
    """``3e-3`` is a string to YAML 1.1: the sweep reads it as the schema does, and the config keeps the number (the
    rule and the report expand the validated config again)."""
    cfg = C.load([C.DEFAULT_CONFIG], {"sweeps": {"s": {"base": "demo", "grid": {"training.learning_rate": ["1e-3"]},
                                                       "include": [{"training.learning_rate": "2e-3"}]}}})
    assert [c.target for c in sweeps.cells(cfg)["s"]] == ["s-learning_rate-0.001", "s-learning_rate-0.002"]
    assert cfg["sweeps"]["s"]["grid"]["training.learning_rate"] == [0.001]
    assert all(c.target in cfg["mixtures"] for c in sweeps.cells(cfg)["s"])


def test_a_cells_wandb_run_is_grouped_by_its_sweep_and_tagged_with_its_values():
    from trajsft.train import target as train_target

    plan = C.Plan(load(LR_DEMO), base_dir=C.REPO_DIR)
    tracker = lambda t: train_target.train_lm_config_for(step_configs.train(plan, t), untokenized_ok=True)[  # noqa: E731
        "trainer"]["tracker"][0]
    cell, demo = tracker("lr-demo-learning_rate-0.001"), tracker("demo")
    assert cell["group"] == demo["group"] == "lr-demo"  # demo is the sweep's 3.0e-3 cell
    assert "sweep:lr-demo" in cell["tags"] and "learning_rate=0.001" in cell["tags"]
    assert "learning_rate=0.003" in demo["tags"]
    plain = C.Plan(C.load(), base_dir=C.REPO_DIR)  # no sweep: no group, the tags as before
    t = train_target.train_lm_config_for(step_configs.train(plain, "demo"), untokenized_ok=True)["trainer"]["tracker"][0]
    assert "group" not in t and not any(x.startswith("sweep:") for x in t["tags"])


def test_status_groups_the_cells_under_their_sweep(tmp_path):
    import sys

    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(LR_DEMO))
    cmd = [sys.executable, "-m", "trajsft.cli", "status", "--offline", "--configfile", str(tmp_path / "sweep.yaml")]
    rows = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout)
    by = {r["target"]: r["sweeps"] for r in rows}
    assert by["demo"] == by["lr-demo-learning_rate-0.001"] == ["lr-demo"] and by["mix-all"] == []
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert ("  sweep lr-demo: 0/2 cell(s) done: demo, lr-demo-learning_rate-0.001 (sweeps/lr-demo/done compares them)"
            in text.splitlines()), text
