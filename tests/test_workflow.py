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
from trajsft import config as C

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
    # one job per artifact: 4 teachers' data once each, 6 training targets
    assert "download        4" in out and "train           6" in out
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


def test_lint_is_clean():
    p = sm("--lint")
    assert p.returncode == 0 and "Congratulations, your workflow is in a good condition!" in p.stdout + p.stderr, \
        p.stdout[-3000:]


def test_snakefmt_formatted():
    snakefmt = Path(sys.executable).parent / "snakefmt"
    p = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_stale_hash_target_is_refused_with_one_line(tmp_path):
    p = sm("-d", str(tmp_path), "-s", str(REPO / "Snakefile"), "--cores", "1",
           "results/shards/demo-0123456789/manifest.json")
    assert p.returncode != 0
    assert "shards/demo-0123456789 is not produced by the current config" in p.stdout + p.stderr
