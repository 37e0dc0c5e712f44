"""trajsft.workflow.Rules, what the Snakefile knows of trajsft, without Snakemake: the .smk files name only it, its
read-time and start checks stop in one line, its functions answer per executor."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from trajsft.logs import WorkflowStop
from trajsft.plan import config as C
from trajsft.workflow import Rules

REPO = Path(__file__).resolve().parents[1]
SMK = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]


def smk_imports(text: str) -> list[str]:
    """The modules an .smk file imports (its Python lines: Snakemake's own keywords are not Python)."""
    return [a or b for a, b in re.findall(r"^\s*(?:from\s+(\S+)\s+import|import\s+(\S+))", text, re.M)]


def workflow_stub(**kw):
    """What Rules reads of Snakemake's Workflow."""
    registered = {}
    stub = NS(configfiles=[], basedir=str(C.REPO_DIR), global_resources={}, dag=NS(needrun_jobs=lambda: []),
              register_resource=lambda name, cap: registered.__setitem__(name, cap), registered=registered)
    for k, v in kw.items():
        setattr(stub, k, v)
    return stub


def test_the_smk_files_import_only_the_workflow_module_and_never_exit():
    seen = {}
    for f in SMK:
        text = f.read_text()
        mods = smk_imports(text)
        seen[f.name] = mods
        assert [m for m in mods if m.startswith("trajsft") and m != "trajsft.workflow"] == [], (f.name, mods)
        assert [m for m in mods if not (m.startswith(("trajsft", "snakemake")) or m == "os")] == [], (f.name, mods)
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        assert "sys.exit" not in code and "exit(" not in code, f.name
    assert seen["common.smk"] == ["snakemake.utils", "trajsft.workflow"]
    # the rules name the one Rules object, not helpers of lower layers
    for f in SMK:
        code = "\n".join(line.split("#", 1)[0] for line in f.read_text().splitlines())
        code = re.sub(r'"[^"\n]*"', '""', code)  # strings (a script: path names its module)
        assert not re.search(r"\b(report_build|eval_matrix\.|step_configs\.|sys\.)", code), f.name


def test_the_regex_above_finds_an_import_of_a_lower_layer():
    assert smk_imports("from trajsft.report import build as b\n  import trajsft.plan\n") == [
        "trajsft.report", "trajsft.plan"]


def test_the_workflow_module_sits_on_the_top_layer():
    import tomllib

    layers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    assert "workflow" in [x.strip() for x in layers[0].split("|")]
    tree = ast.parse((REPO / "src/trajsft/workflow.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "exit"]


def test_a_target_read_as_a_configfile_stops_in_one_line():
    wf = workflow_stub(configfiles=["config/config.yaml", "checkpoints/demo/done"])
    with pytest.raises(WorkflowStop, match=r"^trajsft: checkpoints/demo/done was read as a --configfile"):
        Rules.read(C.load(), wf)


def test_a_config_problem_stops_in_one_line():
    cfg = C.load()
    cfg["executor"] = "slurm"
    with pytest.raises(WorkflowStop) as e:
        Rules.read(cfg, workflow_stub())
    assert "executor" in str(e.value) and "slurm" in str(e.value) and "\n" not in str(e.value), e.value


def test_an_unwritable_storage_root_stops_the_start_in_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    rules = Rules.read(C.load(None, {"storage_root": str(tmp_path / "f" / "root")}), workflow_stub())
    with pytest.raises(WorkflowStop) as e:
        rules.check_storage()
    assert str(e.value) == f"trajsft: storage root {tmp_path}/f/root is not writable: {tmp_path}/f is not a directory"
    ok = Rules.read(C.load(None, {"storage_root": str(tmp_path / "root")}), workflow_stub())
    ok.check_storage()  # writable, nothing to train: no stop
    ok.preflight()  # the local executor has no preflight


def test_the_functions_answer_per_executor():
    local = Rules.read(C.load(), workflow_stub())
    assert local.train_local and not local.fit_check
    assert local.evals_of(["demo"]) == ["evals/demo/done"] and local.sweep_slots() == {}
    assert "results/evals/actions.html" in local.report_outputs()
    inputs = local.train_inputs(NS(target="demo"))
    assert inputs and all(p.endswith("manifest.json") for p in inputs)
    cfg = C.load()
    cfg["executor"] = "ray"
    cfg["sweeps"] = {"lr": {"base": "demo", "grid": {"training.learning_rate": [1e-3, 2e-3]}, "max_parallel": 1}}
    wf = workflow_stub()
    ray = Rules.read(cfg, wf)
    assert not ray.train_local and ray.fit_check
    assert ray.evals_of(["demo"]) == []  # a Ray job on a TPU host: built when named
    assert ray.train_inputs(NS(target="demo"))[-1] == "results/fit/demo/preflight.json"
    slots = ray.sweep_slots()
    assert wf.registered == {"sweep_lr": 1} and set(slots) == {"sweep_lr"}
    assert slots["sweep_lr"](NS(target="demo")) == 0
    assert ray.job_resources("checkpoints") != local.job_resources("checkpoints")


def test_a_typo_target_and_an_unknown_sweep_stop_in_one_line():
    rules = Rules.read(C.load(), workflow_stub())
    with pytest.raises(WorkflowStop, match=r"^trajsft: checkpoints/minimax/done: unknown target 'minimax'"):
        rules.typo_target(NS(marker="checkpoints", other="minimax"))
    with pytest.raises(WorkflowStop, match=r"^trajsft: sweeps/x/done: unknown sweep 'x' \(sweeps: none in the config\)"):
        rules.sweep_inputs(NS(sweep="x"))
    with pytest.raises(WorkflowStop, match="needs an eval: section"):
        rules.eval_matrix_inputs(NS())


def test_a_plan_problem_stops_in_one_line():
    cfg = C.load(None, {"teachers": {"minimax-lr2": {"dataset": "AlienKevin/SWE-smith-rs-minimax-m2.5-trajectories",
                                                     "revision": "dfd98db", "rows": 5000}}})
    with pytest.raises(WorkflowStop, match=r"^trajsft: config: teachers minimax-m2.5 and minimax-lr2 read the same "
                                           r"data \(raw/\S+\) but set rows 5251 and 5000: make them equal"):
        Rules.read(cfg, workflow_stub())
