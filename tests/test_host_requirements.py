"""What the TPU hosts install: envs/tpu-requirements.txt is the `hosts` group's closure in uv.lock (Ray aside),
written by one command, and covers everything the training job imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trajsft.cluster import requirements as R

REPO = Path(__file__).resolve().parents[1]
FILE = REPO / R.OUT


def toy_lock() -> dict:
    """trajsft[hosts] -> lev, x[fast]; lev -> ray[default], a; ray -> b, a; ray[default] -> c; a -> d;
    x[fast] -> y (an extra's dependency)."""
    p = lambda name, deps=(), opt=None, dev=None: {"name": name, "version": "1.0",  # noqa: E731
                                                  "dependencies": [dict(d) for d in deps],
                                                  **({"optional-dependencies": opt} if opt else {}),
                                                  **({"dev-dependencies": dev} if dev else {})}
    return {"package": [
        p("trajsft", dev={"hosts": [{"name": "lev"}, {"name": "x", "extra": ["fast"]}]}),
        p("lev", [{"name": "ray", "extra": ["default"]}, {"name": "a"}]),
        p("ray", [{"name": "b"}, {"name": "a"}], opt={"default": [{"name": "c"}]}),
        p("a", [{"name": "d"}]), p("b"), p("c"), p("d"),
        p("x", opt={"fast": [{"name": "y"}]}), p("y"), p("unrelated"),
    ]}


def test_closure_follows_extras_and_ray_only_packages_are_ray_and_what_only_it_needs():
    lock = toy_lock()
    roots = R.group_roots(lock)
    assert R.closure(lock, roots) == {"lev", "ray", "a", "b", "c", "d", "x", "y"}
    assert R.closure(lock, roots, skip=["ray"]) == {"lev", "a", "d", "x", "y"}
    # a and d are needed without Ray too: only ray, b and c (ray's extra) are the cluster's
    assert R.cluster_only(lock) == ["b", "c", "ray"]
    assert R.export_args(lock)[-6:] == ["--no-emit-package", "b", "--no-emit-package", "c", "--no-emit-package", "ray"]
    with pytest.raises(KeyError, match="no dependency group 'gpu'"):
        R.group_roots(lock, "gpu")


def test_the_file_is_what_the_lock_gives():
    """Stale when pyproject's `hosts` group or uv.lock changed without rerunning the command."""
    assert FILE.read_text() == R.render(), ("envs/tpu-requirements.txt is stale: "
                                            "run `uv run python -m trajsft.cluster.requirements`")


def test_the_file_is_closed_under_the_lock_without_ray():
    lock = R.load_lock()
    pkgs = {R.norm(p["name"]): p for p in lock["package"]}
    pins = R.pins(FILE.read_text())
    ray_own = set(R.cluster_only(lock))
    assert "ray" in ray_own and {"opencensus", "py-spy", "aiohttp-cors"} <= ray_own
    assert not ray_own & set(pins), "Ray and what only Ray pulls in are the cluster image's own"
    # what uv exported is exactly the group's closure (extras included) less Ray's own, at the lock's versions
    assert set(pins) == R.closure(lock, R.group_roots(lock)) - ray_own
    for name, version in pins.items():
        assert pkgs[name]["version"] == version, (name, version, pkgs[name]["version"])
    # every dependency of a pinned package is pinned, or Ray's own
    for name in pins:
        for d in pkgs[name].get("dependencies") or []:
            assert R.norm(d["name"]) in pins or R.norm(d["name"]) in ray_own, (name, d["name"])
    # what Levanter leaves unpinned and an image would otherwise decide
    for name in ("haliax", "equinox", "optax", "tensorstore", "draccus", "protobuf", "tenacity", "libtpu", "jax"):
        assert name in pins, name
    assert pins["libtpu"] == "0.0.23" and pins["jax"] == "0.7.2"


def test_check_fails_in_one_line_when_stale(tmp_path, capsys):
    good = tmp_path / "ok.txt"
    good.write_text(FILE.read_text())
    assert R.main(["--check", "--output", str(good)]) == 0
    stale = tmp_path / "stale.txt"
    stale.write_text(FILE.read_text().replace("tenacity==", "tenacity>="))
    assert R.main(["--check", "--output", str(stale)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stale" in err and "python -m trajsft.cluster.requirements" in err
    written = tmp_path / "new.txt"
    assert R.main(["--output", str(written)]) == 0 and written.read_text() == FILE.read_text()


PROBE = """
import importlib, importlib.metadata as md, json, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
dists = md.packages_distributions()
print(json.dumps(sorted({d for t in {n.split('.')[0] for n in sys.modules} for d in dists.get(t, [])})))
"""


def test_every_distribution_the_job_imports_is_installed_on_the_hosts():
    """The driver, the slice loop, the host task, the hooks and train_lm (and the final export): each package
    they import is in the file or is Ray's own (a module missing there was a ModuleNotFoundError on a real image)."""
    mods = ["trajsft.cluster.entrypoint", "trajsft.cluster.host", "trajsft.cluster.slices", "trajsft.cluster.hooks",
            "trajsft.train.train_lm_main", "trajsft.train.hf_export", "levanter.main.train_lm",
            "levanter.infra.ray_tpu", "gcsfs", "wandb",
            # the agent evaluation's job on a slice's host (issue 70): its driver, its task and the harness
            "trajsft.agent.job", "trajsft.agent.evaluate", "minisweagent.agents.default",
            "minisweagent.models.litellm_model"]
    p = subprocess.run([sys.executable, "-c", PROBE, *mods], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO / "src")})
    assert p.returncode == 0, p.stderr[-2000:]
    # optional imports of packages that go without them (`try: import ...`), installed here by another lock group:
    # tabulate's wcwidth (the agent group's textual brings it; tabulate measures widths without it on the hosts)
    optional = {"wcwidth"}
    # its last line: mini-swe-agent greets on stdout when imported
    imported = {R.norm(d) for d in json.loads(p.stdout.splitlines()[-1])} - {"trajsft"} - optional
    lock = R.load_lock()
    have = set(R.pins(FILE.read_text())) | set(R.cluster_only(lock))
    assert {"levanter", "jax", "gcsfs", "wandb", "mini-swe-agent", "litellm"} <= imported
    assert imported <= have, sorted(imported - have)


CHILD = """
import os, subprocess, sys, trajsft
from trajsft.train import launch
env = launch.levanter_env()
out = subprocess.run([sys.executable, "-c", "import trajsft; print(trajsft.__file__)"], env=env, cwd=sys.argv[1],
                     capture_output=True, text=True, check=True).stdout.strip()
print(trajsft.__file__); print(out)
"""


def test_a_child_in_another_dir_imports_the_trajsft_the_job_shipped(tmp_path):
    """As on a Ray host: the job's working dir holds the project (``PYTHONPATH=src``, relative), and the host
    starts train_lm in the run's directory. The child imports the shipped package, not whatever a venv holds."""
    import shutil

    job = tmp_path / "job"
    shutil.copytree(REPO / "src" / "trajsft", job / "src" / "trajsft", ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    p = subprocess.run([sys.executable, "-c", CHILD, str(elsewhere)], cwd=job, capture_output=True, text=True,
                       timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "src", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    parent, child = p.stdout.split()
    assert parent == child == str(job / "src" / "trajsft" / "__init__.py")
