"""The Snakefile itself: offline planning of every target, DAG rendering, lint, formatting."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_utils import REPO, SNAKEMAKE
from trajsft.plan import config as C

NO_NET = {"HF_HUB_OFFLINE": "1", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}


def sm(*args, cwd=REPO, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, **NO_NET)
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300, **kw)


def all_targets() -> list[str]:
    cfg = C.load()
    return [C.Plan.done_path(t) for t in [*cfg["teachers"], *cfg["mixtures"]]]


def test_dry_run_of_every_teacher_and_mixture_offline(tmp_path):
    t0 = time.time()
    p = sm("-n", *all_targets(), "-d", str(tmp_path), "-s", str(REPO / "Snakefile"))
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    for t in all_targets():
        assert t in out
    # one job per artifact: 4 teachers' data once each, Qwen3-8B's weights once, 6 training targets
    assert "download              4" in out and "download_model        1" in out and "train                 6" in out
    assert time.time() - t0 < 60
    assert not list(tmp_path.glob("results/**/*.parquet")), "a dry run must not download"


@pytest.mark.parametrize("kind", ["--dag", "--rulegraph"])
def test_dag_and_rulegraph_render(kind, tmp_path):
    p = sm("-q", "all", kind, "dot", "checkpoints/mix-minimax-gemini/done")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.lstrip().startswith("digraph") and "train" in p.stdout and "tokenize" in p.stdout
    if shutil.which("dot"):
        png = tmp_path / "dag.png"
        subprocess.run(["dot", "-Tpng", "-o", str(png)], input=p.stdout, text=True, check=True)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


NO_CONDA_LINT = "Specify a conda environment or container for each rule."


def test_lint_is_clean_but_for_the_software_definition():
    """The only lint is Snakemake's request for a conda env or container per rule: the rules run in
    the uv environment, since no conda env can be built and tested here (docs/development-and-layout.md, "Software of the rules")."""
    p = sm("--lint")
    out = p.stdout + p.stderr
    blocks = out.split("Lints for ")[1:]
    assert blocks, out[-3000:]  # (lint exits 1 when it has anything to say)
    assert not [b for b in blocks if not b.startswith("rule ")], out[-3000:]  # no snakefile lints
    for b in blocks:
        bullets = [ln for ln in b.splitlines() if ln.startswith("    * ")]
        assert bullets == [f"    * {NO_CONDA_LINT}:"], b


def test_every_rule_declares_threads_resources_and_heavy_ones_a_benchmark():
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, ResourceSettings, StorageSettings, WorkflowSettings

    with SnakemakeApi() as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=2), config_settings=ConfigSettings(),
                          storage_settings=StorageSettings(), workflow_settings=WorkflowSettings(),
                          snakefile=REPO / "Snakefile", workdir=REPO)
        rules = {r.name: r for r in wf._workflow.rules}
    runnable = {n: r for n, r in rules.items() if not r.norun}
    assert {"download", "shard", "tokenize", "train", "unknown_target", "report_card", "report_table",
            "report_curves", "export"} <= set(runnable)
    for name, r in runnable.items():
        assert r.resources["mem_mb"].value > 0 and r.conda_env is None, name
    # threads: is written out (its default, 1, is indistinguishable from the API)
    text = "".join("\n" + f.read_text() for f in sorted((REPO / "rules").glob("*.smk")) if f.name != "common.smk")
    blocks = {b.split(":", 1)[0]: b for b in text.split("\nrule ")[1:]}
    assert set(blocks) == set(runnable)
    assert [n for n, b in blocks.items() if "\n    threads:" not in b or "\n    resources:" not in b] == []
    for heavy in ("download", "shard", "tokenize", "train"):
        assert rules[heavy].benchmark is not None, heavy


def rule_resources(config: dict) -> dict[str, tuple[int, int]]:
    """Each rule's (threads, mem_mb) as Snakemake reads them from the workflow with ``config``."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, ResourceSettings, StorageSettings, WorkflowSettings

    with SnakemakeApi() as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=2), config_settings=ConfigSettings(config=config),
                          storage_settings=StorageSettings(), workflow_settings=WorkflowSettings(),
                          snakefile=REPO / "Snakefile", workdir=REPO)
        return {r.name: (r.resources["_cores"].value, r.resources["mem_mb"].value) for r in wf._workflow.rules
                if not r.norun}


def test_an_artifact_rule_asks_for_what_its_kind_record_says():
    """Threads and memory of a kind's rule come from its record (trajsft.plan.kinds); on a Ray profile the
    train job only submits and follows, so it takes the record's on_cluster share."""
    from trajsft.plan.kinds import REGISTRY

    local, ray = rule_resources({}), rule_resources({"executor": "ray"})
    for kind in REGISTRY:
        assert local[kind.rule] == (kind.resources.threads, kind.resources.mem_mb), kind.name
        share = kind.on_cluster or kind.resources
        assert ray[kind.rule] == (share.threads, share.mem_mb), kind.name
    assert local["train"] == (2, 16000) and ray["train"] == (1, 1000)


def test_snakefmt_formatted():
    snakefmt = Path(sys.executable).parent / "snakefmt"
    p = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_copy_of_the_demo_under_another_name_builds_its_data_once_and_trains_twice(tmp_path):
    """Data is named by what it holds: a teacher entry that reads the demo's dataset with the demo's data settings
    (another name, another learning rate) plans download, shard and tokenize once for both, and two trainings."""
    import yaml

    demo = C.load()["teachers"]["demo"]
    copy = {**demo, "training": {**demo["training"], "learning_rate": 1.0e-3}}
    (tmp_path / "copy.yaml").write_text(yaml.safe_dump({"teachers": {"demo-lr": copy}}))
    p = sm("-n", "--forceall", "checkpoints/demo/done", "checkpoints/demo-lr/done", "--configfile",
           str(REPO / "config/config.yaml"), str(tmp_path / "copy.yaml"), "-d", str(tmp_path), "-s",
           str(REPO / "Snakefile"))
    assert p.returncode == 0, p.stderr[-3000:]
    stats = p.stdout.split("Job stats:")[1].split("\n\n")[0]
    counts = {ln.split()[0]: int(ln.split()[1]) for ln in stats.splitlines()[3:] if ln.strip()}
    assert counts == {"download": 1, "shard": 1, "tokenize": 1, "train": 2, "total": 5}, stats


def test_stale_hash_target_is_refused_with_one_line(tmp_path):
    p = sm("-d", str(tmp_path), "-s", str(REPO / "Snakefile"), "--cores", "1",
           "results/shards/demo-0123456789/manifest.json")
    assert p.returncode != 0
    assert "shards/demo-0123456789 is not produced by the current config" in p.stdout + p.stderr


@pytest.mark.integration
def test_a_job_finished_before_the_rule_scripts_moved_is_not_rerun(tmp_path):
    """Snakemake records a script rule's `script:` line as its code: the workdirs of every user recorded
    "../scripts/rule.py" before each rule got its own module (src/trajsft/rules/). The workflow profile leaves "code"
    out of the rerun triggers, so those finished jobs stay finished (with it, all of them reran once)."""
    import base64
    import json

    from pipeline_utils import plan as plan_cli, run

    [raw] = [a for a in plan_cli(tmp_path, "demo")["artifacts"] if a["kind"] == "raw"]
    run(tmp_path, raw["manifest"])
    meta = tmp_path / ".snakemake" / "metadata" / base64.b64encode(raw["manifest"].encode()).decode()
    record = json.loads(meta.read_text())
    assert record["code"].strip() == '"../src/trajsft/rules/download.py"', record["code"]
    meta.write_text(json.dumps({**record, "code": '        "../scripts/rule.py"\n'}))  # as an older trajsft left it
    dry = run(tmp_path, "-n", raw["manifest"])
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]
    changes = run(tmp_path, "--list-changes", "code")  # what the trigger would have rerun
    assert raw["manifest"] in changes.stdout, changes.stdout[-2000:]
