"""Integration: the TPU job on a cluster image that holds nothing of ours (issue 31).

The cluster (its own: the driver runs on the head, so the head runs the image too) is a CPU head and a
2-host v5p-16 slice whose Python is a venv with only the lock's ``image`` group: ``ray[default]`` (and uv,
which Ray's uv runtime env runs), installed offline from uv's cache. The profile's runtime env installs
``envs/tpu-requirements.txt`` on every node with Ray's ``uv`` runtime env, reading uv's cache (the wheels
the lock pins are there: the suite's own venv came from them). The demo trains on both hosts, and each
host's record of its Python (``python-env.txt``, written before ``train_lm`` starts) is the lock: every
distribution at the lock's version, every pin of the requirements file present, and ``trajsft`` imported
from the job's shipped working dir, as no package of the image holds it.

A host image missing one pinned package fails in one line, submitted once:
tests/test_tpu_profile.py::test_a_broken_host_image_a_stopped_job_and_a_kill9ed_snakemake_each_recover.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_utils import REPO
from slice_fixtures import start_emulated_cluster
from tpu_utils import data_rules, jobs, make_profile, run_hash, short_seq, snakemake, workdir
from trajsft.cluster import requirements, setup_failure

pytestmark = pytest.mark.integration

TPU = "v5p-16"
OVERRIDES = short_seq({"ray": {"tpu_type": TPU, "fit_check": False, "failure_grace_seconds": 45},
                       # a run of its own: the data are the session's (tests/tpu_utils.py), and another test trains demo
                       # for 2 steps of 8 on the shared cluster, whose finished run this job would find and not relaunch;
                       # on 256-token windows (short_seq): this test is about the hosts' Python, not the student
                       "teachers": {"demo": {"training": {"batch_size": 8, "max_steps": 3}}}})


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """The image's interpreter: a venv of the lock's ``image`` group alone, made offline from uv's cache."""
    dest = tmp_path_factory.mktemp("image") / "venv"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    subprocess.run([sys.executable, "-m", "uv", "sync", "--frozen", "--offline", "--only-group", "image",
                    "--no-install-project", "--python", sys._base_executable, "-q"],
                   env={**env, "UV_PROJECT_ENVIRONMENT": str(dest)}, cwd=REPO, check=True, timeout=600)
    python = dest / "bin" / "python"
    # nothing of the project's: not trajsft, not one package only the job needs
    p = subprocess.run([str(python), "-c", "import ray, uv; import trajsft"], capture_output=True, text=True)
    assert "No module named 'trajsft'" in p.stderr, p.stderr
    assert subprocess.run([str(python), "-c", "import jax"], capture_output=True).returncode != 0
    return python


@pytest.fixture(scope="module")
def cluster(image):
    c = start_emulated_cluster({"foreign-a": TPU}, node_env={"VIRTUAL_ENV": str(image.parent.parent)},
                               python=image)
    try:
        yield c
    finally:
        c.stop()


def test_the_demo_trains_on_hosts_whose_python_is_the_lock(cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("foreign")
    data = data_rules(base, cluster.head, OVERRIDES)
    wd = workdir(data, "e2e")
    prof = make_profile(wd.parent / "e2e-profile", cluster.address, data[1], OVERRIDES)
    assert "pip_requirements: envs/tpu-requirements.txt" in (prof / "cluster.yaml").read_text()
    h = run_hash(wd, prof)
    snakemake(wd, prof, cluster.head, timeout=1500)
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["steps"] == 3
    [job] = jobs(cluster.head, h)
    assert job["status"] == "SUCCEEDED"
    # trained here, by this job: one launch on each host of the foreign slice
    log = (wd / "logs/train/demo.log").read_text()
    assert log.count("on foreign-a host 0 (a1-s1") == 1, log[-3000:]
    result = json.loads((Path(done["checkpoint_dir"]) / "training_result.json").read_text())
    assert sorted((x["slice"], x["worker"]) for x in result["hosts"]) == [("foreign-a", 0), ("foreign-a", 1)]

    lock = {requirements.norm(p["name"]): p["version"] for p in requirements.load_lock()["package"] if "version" in p}
    # the pins whose markers hold on this platform (the hosts' here)
    pins = {name for ln in (REPO / requirements.OUT).read_text().splitlines() for name in requirements.pins(ln)
            if ";" not in ln or _marker_holds(ln.split(";", 1)[1])}
    run_dir = Path(done["checkpoint_dir"])
    records = [run_dir / setup_failure.ENV_RECORD, run_dir / "hosts" / "0-1" / setup_failure.ENV_RECORD]
    for rec in records:
        text = rec.read_text()
        freeze = requirements.pins(text)
        # every distribution the host's Python holds is the lock's, at the lock's version
        assert {k: v for k, v in freeze.items() if lock.get(k) != v} == {}, rec
        assert pins <= set(freeze), (rec, sorted(pins - set(freeze)))
        # the image's Ray, and no installed trajsft: the project came with the job
        assert freeze["ray"] == "2.60.0" and "trajsft" not in freeze, rec
        [where] = re.findall(r"^# trajsft imported from (.+)$", text, re.M)
        assert "runtime_resources" in where and where.endswith("/src/trajsft") and str(REPO) not in where, where
        [py] = re.findall(r"^# python \S+ (.+)$", text, re.M)
        assert "runtime_resources/uv" in py, py  # the runtime env's virtualenv on the host, over the image


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker.strip()).evaluate()
