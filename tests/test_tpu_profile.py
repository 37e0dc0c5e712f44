"""Integration: the TPU profile against a real Ray head on 127.0.0.1 (token auth).

The test profile is profiles/tpu-east5 with only the Ray address and the storage root
changed (asserted below); the head stands in for a v5p-32 slice head via the custom
resource ``TPU-v5p-32-head`` (see tests/ray_fixtures.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from pipeline_utils import REPO, SNAKEMAKE, kill_group, wait_for
from trajsft import levanter_run as LR
from trajsft import rayjobs

pytestmark = pytest.mark.integration

HF = "hf_test_" + secrets.token_hex(12)
WK = "wk_test_" + secrets.token_hex(12)


def make_profile(dest: Path, address: str, storage_root: Path, overrides: dict | None = None) -> Path:
    """profiles/tpu-east5 with only the address and storage root changed (+ test overrides)."""
    src = REPO / "profiles/tpu-east5"
    dest.mkdir(parents=True, exist_ok=True)
    cluster = (src / "cluster.yaml").read_text()
    cluster = re.sub(r"(?m)^storage_root: .*$", f"storage_root: {storage_root}", cluster)
    cluster = re.sub(r"(?m)^  address: .*$", f"  address: {address}", cluster)
    (dest / "cluster.yaml").write_text(cluster)
    files = [str(dest / "cluster.yaml")]
    if overrides:
        (dest / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        files.append(str(dest / "overrides.yaml"))
    prof = yaml.safe_load((src / "config.yaml").read_text())
    prof["configfiles"] = files
    (dest / "config.yaml").write_text(yaml.safe_dump(prof))
    return dest


def sm_env(head, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN")}
    env.update(head.client_env())
    env.update({"HF_TOKEN": HF, "WANDB_API_KEY": WK, "RAY_TMPDIR": "/tmp/rt-tests", "HF_HUB_OFFLINE": "1"})
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def sm_cmd(wd: Path, profile: Path, *args: str) -> list[str]:
    return [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(profile),
            "checkpoints/demo/done", *args]


def snakemake(wd, profile, head, *args, check=True, timeout=900, **env):
    p = subprocess.run(sm_cmd(wd, profile, *args), capture_output=True, text=True, env=sm_env(head, **env),
                       timeout=timeout, cwd=REPO)
    if check and p.returncode != 0:
        raise AssertionError(f"snakemake failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def jobs(head, run_hash: str | None = None) -> list[dict]:
    r = requests.get(f"{head.address}/api/jobs/", headers=head.headers(), timeout=10)
    r.raise_for_status()
    out = r.json()
    if run_hash:
        out = [j for j in out if (j.get("submission_id") or "").startswith(f"trajsft-{run_hash}-")]
    return out


def run_hash(wd: Path, profile: Path) -> str:
    cfg = yaml.safe_load((profile / "overrides.yaml").read_text()) if (profile / "overrides.yaml").exists() else {}
    cmd = [sys.executable, "-m", "trajsft.cli", "plan", "demo", "--json", "--configfile", str(profile / "cluster.yaml")]
    if cfg:
        cmd += ["--configfile", str(profile / "overrides.yaml")]
    t = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=wd).stdout)[0]
    return Path(t["checkpoint_dir"]).name.rsplit("-", 1)[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory, ray_head):
    """Data rules once (they run locally and write to the storage root); tests copy the state."""
    base = tmp_path_factory.mktemp("tpu")
    storage, wd = base / "storage", base / "seed"
    wd.mkdir()
    prof = make_profile(base / "seed-profile", ray_head.address, storage)
    tok = [a for a in json.loads(subprocess.run(
        [sys.executable, "-m", "trajsft.cli", "plan", "demo", "--json", "--configfile", str(prof / "cluster.yaml")],
        capture_output=True, text=True, check=True, cwd=wd).stdout)[0]["artifacts"] if a["kind"] == "tokenized"][0]
    p = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(prof),
                        tok["manifest"]], capture_output=True, text=True, env=sm_env(ray_head), cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return base, storage, wd


def workdir(data, name: str) -> Path:
    base, _, seed = data
    wd = base / name
    shutil.copytree(seed, wd, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    return wd


def test_test_profile_differs_from_tpu_east5_only_in_address_and_storage(tmp_path):
    prof = make_profile(tmp_path / "p", "http://127.0.0.1:1", tmp_path / "s")
    a = yaml.safe_load((REPO / "profiles/tpu-east5/cluster.yaml").read_text())
    b = yaml.safe_load((prof / "cluster.yaml").read_text())
    assert {k for k in a if a[k] != b[k]} == {"storage_root", "ray"}
    assert {k for k in a["ray"] if a["ray"][k] != b["ray"][k]} == {"address"}
    pa = yaml.safe_load((REPO / "profiles/tpu-east5/config.yaml").read_text())
    pb = yaml.safe_load((prof / "config.yaml").read_text())
    assert {k for k in pa if pa[k] != pb[k]} == {"configfiles"}


def test_bare_profile_names_resolve_from_repo_root():
    for name in ("tpu-east5", "tpu-central1", "tpu-local"):
        assert (REPO / name).resolve() == (REPO / "profiles" / name).resolve()
        assert (REPO / name / "config.yaml").is_file()
    p = subprocess.run([SNAKEMAKE, "--profile", "tpu-east5", "-n", "checkpoints/minimax-m2.5/done"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "gs://" not in p.stdout  # targets are local markers; payloads go to the bucket


def test_preflight_refuses_and_submits_nothing(data, ray_head):
    wd = workdir(data, "preflight")
    prof = make_profile(wd.parent / "preflight-profile", ray_head.address, data[1])
    before = len(jobs(ray_head))
    t0 = time.time()
    p = snakemake(wd, prof, ray_head, check=False, HF_TOKEN=None)
    assert p.returncode != 0 and time.time() - t0 < 60
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft preflight:")]
    assert lines == ["trajsft preflight: env var HF_TOKEN is not set (needed by the training job): export HF_TOKEN=..."]
    p = snakemake(wd, prof, ray_head, check=False, WANDB_API_KEY=None)
    assert p.returncode != 0 and "WANDB_API_KEY is not set" in p.stderr
    bad = make_profile(wd.parent / "bad-profile", "http://127.0.0.1:9", data[1])
    p = snakemake(wd, bad, ray_head, check=False)
    assert p.returncode != 0 and "trajsft preflight: unreachable" in p.stderr
    assert len(jobs(ray_head)) == before
    assert not (wd / "checkpoints/demo/done").exists()


def test_end_to_end_on_ray_and_no_secret_leaks(data, ray_head):
    wd = workdir(data, "e2e")
    prof = make_profile(wd.parent / "e2e-profile", ray_head.address, data[1],
                        {"teachers": {"demo": {"training": {"max_steps": 4}}}})
    h = run_hash(wd, prof)
    snakemake(wd, prof, ray_head)
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["executor"] == "ray" and done["cluster"] == "us-east5-a" and done["steps"] == 4
    assert done["ray_job_id"] == f"trajsft-{h}-a0"
    assert done["checkpoint_dir"] == str(data[1] / "checkpoints" / f"demo-{h}")
    assert LR.hf_export_complete(done["hf_export"])
    [job] = jobs(ray_head, h)
    assert job["status"] == "SUCCEEDED"
    log = (wd / "logs/train/demo.log").read_text()  # the Ray job's log, streamed into the rule log
    assert "levanter.json_logger" in log and f"Ray job trajsft-{h}-a0 finished: SUCCEEDED" in log
    # secrets: nowhere in files, logs or Ray's job metadata
    for root in (wd, data[1], data[2]):
        for f in root.rglob("*"):
            if f.is_file() and not f.is_symlink():
                blob = f.read_bytes()
                assert HF.encode() not in blob and WK.encode() not in blob, f
                assert ray_head.token.encode() not in blob, f
    row = status(wd, prof, ray_head)
    assert (row["state"], row["ray_job_id"], row["cluster"], row["step"]) == ("done", f"trajsft-{h}-a0", "us-east5-a", 4)
    assert row["hf_export"] == done["hf_export"] and row["checkpoint_dir"] == done["checkpoint_dir"]
    out = trajsft(wd, ray_head, "logs", "demo", "--profile", str(prof), "-n", "3")
    assert out.returncode == 0 and out.stdout.splitlines() == log.splitlines()[-3:]
    out = trajsft(wd, ray_head, "clusters", str(prof), "--json")
    [c] = json.loads(out.stdout)
    assert c["reachable"] and c["tpu"]["TPU-v5p-32-head"] == {"total": 2.0, "free": 2.0}
    listing = json.dumps(jobs(ray_head))
    assert HF not in listing and WK not in listing and ray_head.token not in listing
    assert set(job["metadata"]["trajsft_forwarded_env"].split(",")) >= {"HF_TOKEN", "WANDB_API_KEY"}


def trajsft(wd: Path, head, *args: str) -> subprocess.CompletedProcess:
    """The `trajsft` CLI run in a test workdir, talking to the test head."""
    env = sm_env(head)
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], capture_output=True, text=True, cwd=wd,
                          env=env, timeout=120)


def status(wd: Path, prof: Path, head) -> dict:
    p = trajsft(wd, head, "status", "demo", "--profile", str(prof), "--json")
    assert p.returncode == 0, p.stderr
    [row] = json.loads(p.stdout)
    return row


def _start(wd, prof, head, log: Path) -> subprocess.Popen:
    return subprocess.Popen(sm_cmd(wd, prof), stdout=open(log, "w"), stderr=subprocess.STDOUT, env=sm_env(head),
                            start_new_session=True, cwd=REPO)


def _running_job(head, h, proc):
    return wait_for(lambda: next((j for j in jobs(head, h) if j["status"] == "RUNNING"), None), 300,
                    "the Ray job to run", proc)


def test_stopped_job_is_retried_and_resumes_from_checkpoint(data, ray_head):
    wd = workdir(data, "retry")
    prof = make_profile(wd.parent / "retry-profile", ray_head.address, data[1],
                        {"teachers": {"demo": {"training": {"max_steps": 12}}},
                         "checkpointing": {"keep_every_steps": 3, "save_interval_minutes": 600}})
    h = run_hash(wd, prof)
    ckdir = str(data[1] / "checkpoints" / f"demo-{h}" / "checkpoints")
    p = _start(wd, prof, ray_head, wd / "snakemake.log")
    job = _running_job(ray_head, h, p)
    wait_for(lambda: LR.latest_checkpoint(ckdir), 600, "a checkpoint", p)
    row = status(wd, prof, ray_head)
    assert row["state"] == "training running" and row["ray_job_id"] == f"trajsft-{h}-a0" and row["steps_total"] == 12
    c = json.loads(trajsft(wd, ray_head, "clusters", str(prof), "--json").stdout)[0]
    assert c["jobs"]["ours_running"] == [f"trajsft-{h}-a0"]
    assert rayjobs.stop(ray_head.address, job["submission_id"], 60, auth_token=ray_head.token) == "STOPPED"  # like a preemption
    resumed_from = LR.latest_checkpoint(ckdir)["completed_steps"]
    row = wait_for(lambda: (r := status(wd, prof, ray_head))["state"] in ("failed", "retrying") and r, 120,
                   "status to show the stopped attempt", p)
    assert row["cause"] == "stopped" and row["next"] == f"resume from step {resumed_from}"
    assert p.wait(timeout=900) == 0, (wd / "snakemake.log").read_text()[-4000:]
    states = {j["submission_id"]: j["status"] for j in jobs(ray_head, h)}
    assert states == {f"trajsft-{h}-a0": "STOPPED", f"trajsft-{h}-a1": "SUCCEEDED"}
    result = json.loads((data[1] / "checkpoints" / f"demo-{h}" / "training_result.json").read_text())
    assert result["resumed_from_step"] == resumed_from >= 1
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["steps"] == 12 and done["ray_job_id"] == f"trajsft-{h}-a1"


def test_killed_snakemake_reattaches_instead_of_resubmitting(data, ray_head):
    wd = workdir(data, "reattach")
    prof = make_profile(wd.parent / "reattach-profile", ray_head.address, data[1],
                        {"teachers": {"demo": {"training": {"max_steps": 10}}}})
    h = run_hash(wd, prof)
    p = _start(wd, prof, ray_head, wd / "snakemake.log")
    _running_job(ray_head, h, p)
    kill_group(p)  # Snakemake and its job die; the Ray job keeps running
    assert [j["status"] for j in jobs(ray_head, h)] == ["RUNNING"]
    snakemake(wd, prof, ray_head, "--unlock")
    snakemake(wd, prof, ray_head)
    assert [(j["submission_id"], j["status"]) for j in jobs(ray_head, h)] == [(f"trajsft-{h}-a0", "SUCCEEDED")]
    assert json.loads((wd / "checkpoints/demo/done").read_text())["ray_job_id"] == f"trajsft-{h}-a0"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_snakemake_stops_the_ray_job(data, ray_head, sig):
    wd = workdir(data, f"sig{int(sig)}")
    prof = make_profile(wd.parent / "sigint-profile", ray_head.address, data[1],
                        {"teachers": {"demo": {"training": {"max_steps": 180 + int(sig)}}}})  # own run per signal
    h = run_hash(wd, prof)
    p = _start(wd, prof, ray_head, wd / "snakemake.log")
    job = _running_job(ray_head, h, p)
    os.kill(p.pid, sig)  # to Snakemake's own pid only, not its process group
    p.wait(timeout=300)
    wait_for(lambda: [j["status"] for j in jobs(ray_head, h)] == ["STOPPED"], 120, "the Ray job to be STOPPED")
    assert not (wd / "checkpoints/demo/done").exists()
    assert job["submission_id"] == f"trajsft-{h}-a0"
    row = status(wd, prof, ray_head)
    assert (row["state"], row["cause"], row["attempt"]) == ("failed", "stopped", 1)
    assert row["next"].startswith(("resume from step", "start from step 0"))


def test_two_targets_run_as_two_concurrent_ray_jobs(data, ray_head):
    """-j 2 with two targets: two Ray jobs at once (one per slice head), separate run dirs."""
    wd = workdir(data, "two")
    demo_training = {"epochs": 2, "batch_size": 4, "learning_rate": 3.0e-3, "max_grad_norm": 1.0, "seq_len": 1024,
                     "max_steps": 8}
    prof = make_profile(wd.parent / "two-profile", ray_head.address, data[1], {
        "teachers": {"demo": {"training": {"max_steps": 8}}},
        "mixtures": {"mix-demo": {"teachers": {"demo": 1.0}, "student": "tiny", "training": demo_training}}})
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(prof), "-j", "2",
           "checkpoints/demo/done", "checkpoints/mix-demo/done"]
    p = subprocess.Popen(cmd, stdout=open(wd / "snakemake.log", "w"), stderr=subprocess.STDOUT, env=sm_env(ray_head),
                         start_new_session=True, cwd=REPO)
    both = wait_for(lambda: (r := [j for j in jobs(ray_head) if j["status"] == "RUNNING"
                                    and j["submission_id"].startswith("trajsft-")]) and len(r) == 2 and r,
                    600, "two Ray jobs running at once", p)
    assert p.wait(timeout=900) == 0, (wd / "snakemake.log").read_text()[-4000:]
    done = [json.loads((wd / f"checkpoints/{t}/done").read_text()) for t in ("demo", "mix-demo")]
    assert {d["ray_job_id"] for d in done} == {j["submission_id"] for j in both}
    assert done[0]["checkpoint_dir"] != done[1]["checkpoint_dir"] and done[0]["hash"] != done[1]["hash"]
    assert all(d["steps"] == 8 for d in done)
