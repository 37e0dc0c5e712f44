"""Integration: the TPU profile against a real Ray cluster on 127.0.0.1 (token auth).

The test profile is profiles/tpu-east5 with only the Ray address and the storage root
changed (asserted below), plus test overrides: the slice type is v5p-8 (one host), and the
cluster is the session's emulated one (tests/slice_fixtures.py, shared with tests/test_multihost.py),
whose two single-host v5p-8 slices let two targets train at once. Multi-host slices and preemptions:
tests/test_multihost.py.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from fit_fixtures import ALIGNED, OVERSIZED
from pipeline_utils import REPO, SNAKEMAKE, alive, attempts, kill9_snakemake_only, kill_group, rule_jobs, wait_for
from slice_fixtures import host_image_without
from wandb_stub import make_server as wandb_server
from tpu_utils import (HF, SHORT_SEQ_LEN, WK, data_rules, jobs, make_profile, plan_of, run_hash, short_seq, sm_cmd,
                       sm_env, snakemake, status, trajsft, workdir)
from trajsft.train import checkpoints
from trajsft.cluster import jobs as cluster_jobs

pytestmark = pytest.mark.integration

# the fit check compiles each distinct run's step; it is on in test_preflight_refuses_a_step_that_does_not_fit
# the hosts run the job without the profile's pip requirements (envs/tpu-requirements.txt): that runtime env
# (a venv per node) is exercised on both hosts of tests/test_foreign_image.py's cluster, whose image holds only Ray
SLICE = {"ray": {"tpu_type": "v5p-8", "fit_check": False, "pip_requirements": None}}


@pytest.fixture
def ray_head(slices):
    """The head of the session's emulated cluster (tests/slice_fixtures.py; overrides the single-node head of
    tests/ray_fixtures.py): this module's jobs ask for a v5p-8 and get one of its two single-host slices."""
    return slices.head


def profile(dest: Path, address: str, storage_root: Path, overrides: dict | None = None) -> Path:
    return make_profile(dest, address, storage_root, {**SLICE, **(overrides or {})})

@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_cluster):
    # and the end-to-end test's data, without tools (E2E_DEMO): mix-demo's, the demo's 256-token windows with its
    # held-out chats (demo, trained beside it, is evaluated), and demo's own 1024-token windows
    return data_rules(tmp_path_factory.mktemp("tpu"), shared_cluster.cluster.head, SLICE,
                      {**SLICE, "teachers": {"demo": {"training": {"seq_len": SHORT_SEQ_LEN}, "tools": []}}},
                      {**SLICE, "teachers": {"demo": {"tools": []}}})


# the end-to-end test's demo and its later runs of the same run (the sweep, the export refusal, the evaluation): no
# tools, as mix-demo trains the demo's chats on 256-token windows that the tools block (about 225 tokens) would fill,
# and a mixture renders its teachers' chats with their tools
E2E_DEMO = {"training": {"max_steps": 4}, "tools": []}


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
    prof = profile(wd.parent / "preflight-profile", ray_head.address, data[1])
    before = len(jobs(ray_head))
    t0 = time.time()
    p = snakemake(wd, prof, ray_head, check=False, WANDB_API_KEY=None)  # HF_TOKEN is set, but required nowhere
    assert p.returncode != 0 and time.time() - t0 < 60
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft preflight:")]
    assert lines == ["trajsft preflight: env var WANDB_API_KEY is not set (needed by the training job): "
                     "export WANDB_API_KEY=..."], p.stderr[-2000:]
    # W&B (online in the profile, here a stand-in on loopback named by ray.env) refuses the key: one line
    wb = wandb_server(0, refused={WK})
    threading.Thread(target=wb.serve_forever, daemon=True).start()
    wb_url = f"http://127.0.0.1:{wb.server_port}"
    try:
        refused = profile(wd.parent / "wandb-profile", ray_head.address, data[1],
                          {"ray": {**SLICE["ray"], "env": {"WANDB_BASE_URL": wb_url}}})
        p = snakemake(wd, refused, ray_head, check=False)
    finally:
        wb.shutdown()
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft preflight:")]
    assert p.returncode != 0 and lines == [f"trajsft preflight: W&B at {wb_url} refused WANDB_API_KEY (HTTP 401): "
                                           "fix the key, or set wandb.mode: offline"], p.stderr[-2000:]
    assert [r[2:] for r in wb.state["requests"]] == [["/graphql", "Viewer", 401]]
    bad = profile(wd.parent / "bad-profile", "http://127.0.0.1:9", data[1])
    p = snakemake(wd, bad, ray_head, check=False)
    assert p.returncode != 0 and "trajsft preflight: unreachable" in p.stderr
    # the head is a VM in us-east5-a (its GCE metadata server says so, read by the probe job on the head): a
    # profile for us-central1-a reached it through the same address, as a tunnel to the wrong cluster would
    elsewhere = profile(wd.parent / "central1-profile", ray_head.address, data[1],
                        {"ray": {**SLICE["ray"], "zone": "us-central1-a"}})
    p = snakemake(wd, elsewhere, ray_head, check=False)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft preflight:")]
    assert p.returncode != 0 and lines == [
        f"trajsft preflight: the Ray head at {ray_head.address} is in us-east5-a (its GCE metadata server), but this "
        "profile's cluster is in us-central1-a (ray.zone): is the tunnel open to another region's cluster? nothing "
        "was submitted"], p.stderr[-2000:]
    assert len(jobs(ray_head)) == before
    assert not (wd / "checkpoints/demo/done").exists()


def test_preflight_refuses_a_step_that_does_not_fit_before_any_job(data, ray_head, demo_fit, oversized_fit):
    """ray.fit_check (the default): rule check_fit compiles the step for the profile's slice before the train
    rule runs and refuses, in one line naming HBM and the knobs, a student that does not fit; the train rule
    never runs and no Ray job is created."""
    wd = workdir(data, "fit")
    fit_on = {"ray": {**SLICE["ray"], "fit_check": True}}
    prof = profile(wd.parent / "fit-profile", ray_head.address, data[1],
                   {**yaml.safe_load(OVERSIZED.read_text()), **fit_on})
    before = len(jobs(ray_head))
    p = snakemake(wd, prof, ray_head, check=False)
    assert p.returncode != 0
    # one line (the profile's `retries` repeat it; the rule and its retries read the session's cached compile)
    [line] = {ln for ln in p.stderr.splitlines() if ln.startswith("trajsft check_fit demo: preflight")}
    assert "does not fit" in line and "GiB of HBM per chip" in line and "nothing submitted" in line
    assert "training.batch_size 4" in line and "ray.tpu_type v5p-8" in line
    assert "rule check_fit:" in p.stdout + p.stderr and "rule train:" not in p.stdout + p.stderr
    assert len(jobs(ray_head)) == before
    assert not (wd / "checkpoints/demo/done").exists()
    # a student that fits (the session's demo_fit compiled it: cached); with the data tokenized, the estimate covers
    # the whole run. Remat full, as demo_fit compiled it: the profile's training.remat auto (two more compiles) is
    # test_fit's (test_second_call_reads_the_cache, through `trajsft fit --profile`)
    good = profile(wd.parent / "fit-good-profile", ray_head.address, data[1],
                   {**yaml.safe_load(ALIGNED.read_text()), "training": {"remat": "full"}, **fit_on})
    out = trajsft(wd, ray_head, "fit", "demo", "--profile", str(good), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    [s] = json.loads(out.stdout)
    assert s["fits"] and s["devices"] == 4 and s["steps"] and s["slice_wall_hours"] is not None
    assert s["remat"] == "full" and s["cached"] and s["key"] == demo_fit[1]["key"], s
    assert s["chip_hours"] == pytest.approx(s["slice_wall_hours"] * 4, rel=0.05, abs=0.1)
    assert 0 < s["non_pad_tokens_per_step"] <= s["tokens_per_step"] == 4 * 1024
    assert "fit on v5p-8: " in status(wd, good, ray_head)["fit"]


def test_end_to_end_two_targets_at_once_and_no_secret_leaks(data, ray_head):
    """The whole TPU-profile path, for two targets at once (one training fewer than a test each):
    -j 2 with demo and mix-demo runs two Ray jobs at the same time (one per slice head) in separate run
    dirs; demo's done marker, job, log, status, `logs` and `clusters` are then checked, and no secret
    is in any file, log or Ray's job metadata."""
    wd = workdir(data, "e2e")
    # demo trains on its 1024-token windows (the next-action evaluation below needs the context); mix-demo, which
    # nothing evaluates, on SHORT_SEQ_LEN ones: the two jobs share the machine's two cores
    mix_training = {"epochs": 2, "batch_size": 4, "learning_rate": 3.0e-3, "max_grad_norm": 1.0,
                    "seq_len": SHORT_SEQ_LEN, "max_steps": 4}
    prof = profile(wd.parent / "e2e-profile", ray_head.address, data[1], {
        "teachers": {"demo": E2E_DEMO},
        "mixtures": {"mix-demo": {"teachers": {"demo": 1.0}, "student": "tiny", "training": mix_training}}})
    h = run_hash(wd, prof)
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(prof), "-j", "2",
           "checkpoints/demo/done", "checkpoints/mix-demo/done"]
    p = subprocess.Popen(cmd, stdout=open(wd / "snakemake.log", "w"), stderr=subprocess.STDOUT, env=sm_env(ray_head),
                         start_new_session=True, cwd=REPO)
    try:
        both = wait_for(lambda: (r := [j for j in jobs(ray_head) if j["status"] == "RUNNING"
                                        and j["submission_id"].startswith("trajsft-")]) and len(r) == 2 and r,
                        600, "two Ray jobs running at once", p)
        assert p.wait(timeout=900) == 0, (wd / "snakemake.log").read_text()[-4000:]
    finally:
        if p.poll() is None:
            kill_group(p)
    two = [json.loads((wd / f"checkpoints/{t}/done").read_text()) for t in ("demo", "mix-demo")]
    assert {d["ray_job_id"] for d in two} == {j["submission_id"] for j in both}
    assert two[0]["checkpoint_dir"] != two[1]["checkpoint_dir"] and two[0]["hash"] != two[1]["hash"]
    assert all(d["steps"] == 4 for d in two)

    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["executor"] == "ray" and done["cluster"] == "us-east5-a" and done["steps"] == 4
    assert done["ray_job_id"] == f"trajsft-{h}-a0"
    assert done["checkpoint_dir"] == str(data[1] / "checkpoints" / f"demo-{h}")
    assert checkpoints.hf_export_complete(done["hf_export"])
    [job] = jobs(ray_head, h)
    assert job["status"] == "SUCCEEDED"
    log = (wd / "logs/train/demo.log").read_text()  # the Ray job's log, streamed into the rule log
    assert "levanter.json_logger" in log and f"Ray job trajsft-{h}-a0 finished: SUCCEEDED" in log
    next_actions_on_a_slice_host_killed_then_resumed(wd, ray_head, data)
    agent_episodes_on_a_slice_host_killed_then_resumed(wd, ray_head, data)
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
    # `clusters` counts both v5p-8 slices and, once the evaluation's last task has handed its lease back (Ray does it
    # after the job's end, not before: seen taking seconds here), both free
    c = wait_for(lambda: (c := json.loads(trajsft(wd, ray_head, "clusters", str(prof), "--json").stdout)[0])["tpu"]
                 .get("TPU-v5p-8-head") == {"total": 2.0, "free": 2.0} and c, 60,
                 "`trajsft clusters` to show both v5p-8 slices free after the jobs ended")
    assert c["reachable"] and c["tpu"]["TPU-v5p-8-head"] == {"total": 2.0, "free": 2.0}
    listing = json.dumps(jobs(ray_head))
    assert HF not in listing and WK not in listing and ray_head.token not in listing
    # the W&B key goes to the job; HF_TOKEN (set here) does not: the demo's training reads nothing from the Hub
    forwarded = set(job["metadata"]["trajsft_forwarded_env"].split(","))
    assert "WANDB_API_KEY" in forwarded and "HF_TOKEN" not in forwarded, forwarded

    # the final HF export lost (as a kill mid-export leaves it): the next job finds the run complete and exports
    # on a node whose declared memory fits it, never on the head (the driver's node). Both targets rebuilt as the
    # cells of a sweep (targets as its axis) with max_parallel 1: one Ray job at a time, the other waiting in
    # Snakemake (-j 2 would start both), then the sweep's comparison of the two (a run complete with its export
    # needs no job: both exports are lost)
    for t, d in (("demo", done), ("mix-demo", two[1])):
        shutil.rmtree(d["hf_export"])
        (wd / f"checkpoints/{t}/done").unlink()
    swept = profile(wd.parent / "e2e-sweep-profile", ray_head.address, data[1], {
        **yaml.safe_load((prof / "overrides.yaml").read_text()),
        "sweeps": {"pair": {"targets": ["demo", "mix-demo"], "max_parallel": 1}}})
    before = {j["submission_id"] for j in jobs(ray_head)}
    snakemake(wd, swept, ray_head, "sweeps/pair/done", "-j", "2", timeout=900)
    again = sorted((j for j in jobs(ray_head) if j["submission_id"] not in before and
                    j["submission_id"].startswith(tuple(f"trajsft-{d['hash']}-" for d in two))),
                   key=lambda j: j["start_time"])
    assert [j["status"] for j in again] == ["SUCCEEDED"] * 2, again
    assert again[0]["end_time"] <= again[1]["start_time"], again  # never two at once
    rows = list(csv.DictReader(open(wd / "sweeps/pair/results.csv")))
    assert sorted(r["cell"] for r in rows) == ["demo", "mix-demo"] and all(r["state"] == "done" for r in rows), rows
    assert checkpoints.hf_export_complete(done["hf_export"])
    log = (wd / "logs/train/demo.log").read_text()
    [line] = [ln for ln in log.splitlines() if "exporting on" in ln]
    node = re.search(r"\(node ([0-9a-f]+)", line).group(1)
    head_node = next(n["node_id"] for n in ray_head_nodes(ray_head) if n.get("is_head_node"))
    assert node != head_node[:len(node)] and "never on the head" in line and "not relaunched" in log, line
    # a cluster with no node but the head that fits the export: refused in one line, nothing loaded anywhere
    shutil.rmtree(done["hf_export"])
    (wd / "checkpoints/demo/done").unlink()
    exports = sorted(data[1].rglob("export_hf.log"))
    before = {f: f.read_text().count("export ") for f in exports}
    big = profile(wd.parent / "big-export-profile", ray_head.address, data[1], {
        "teachers": {"demo": E2E_DEMO}, "ray": {**SLICE["ray"], "export_memory_gib": 1000}})
    p = snakemake(wd, big, ray_head, check=False, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "the final HF export needs about 1000.0 GiB of memory and no node of the cluster " \
        "but the head has that much (the largest other node declares 19.6 GiB" in out, out[-3000:]
    assert {f: f.read_text().count("export ") for f in sorted(data[1].rglob("export_hf.log"))} == before
    assert not checkpoints.hf_export_complete(done["hf_export"])


def next_actions_on_a_slice_host_killed_then_resumed(wd: Path, ray_head, data) -> None:
    """The trained demo's next-action evaluation (evals/demo/done) on the cluster: one Ray job whose driver runs its
    work as one task on the host of a v5p-8 slice, each scored chat streamed to the storage root. The task's worker
    killed (SIGKILL, as a lost host) once it stored its first chat, Ray retries it on a v5p-8 host within the same
    job and the retry scores only the missing chats, ending with the figures an uninterrupted evaluation computes
    here. One turn at a time (actions.max_seqs 1: cosmetic, the same artifacts), so the chats end one by one."""
    prof = profile(wd.parent / "e2e-eval-profile", ray_head.address, data[1], {
        "teachers": {"demo": {**E2E_DEMO, "actions": {"max_seqs": 1}}}})
    ev = next(a for a in plan_of(wd, prof)["artifacts"] if a["kind"] == "evals")
    chats = Path(ev["location"]) / "chats"
    reference = subprocess.Popen(  # uninterrupted, on this machine's CPU, meanwhile (--teachers: computed, not read)
        [sys.executable, "-m", "trajsft.cli", "eval", "demo", "--actions", "--teachers", "demo", "--json",
         "--profile", str(prof)], cwd=wd, env=sm_env(ray_head), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(prof), "evals/demo/done"]
    p = subprocess.Popen(cmd, stdout=open(wd / "eval-snakemake.log", "w"), stderr=subprocess.STDOUT,
                         env=sm_env(ray_head), start_new_session=True, cwd=REPO)
    a0 = f"trajsft-{ev['hash']}-a0"
    stored, ref_out = kill_its_task_once_stored(p, reference, "score_next_actions",
                                                lambda: list(chats.glob("*.json")) if chats.is_dir() else [],
                                                "scored chat", wd / "eval-snakemake.log", waits=(300, 600, 300))
    done = json.loads((wd / "evals/demo/done").read_text())
    assert {j["submission_id"]: j["status"] for j in jobs(ray_head, ev["hash"])} == {a0: "SUCCEEDED"}
    assert done["ray_job_id"] == a0 and done["location"] == ev["location"]
    assert 1 <= stored < done["chats"] and (done["chats_reused"], done["chats_scored"]) == (stored, done["chats"] - stored)
    [computed] = json.loads(ref_out)
    assert computed["from"] == "computed" and done["splits"] == computed["splits"], (done["splits"], computed["splits"])
    assert done["splits"]["demo"]["turns"] == 8 and (Path(ev["location"]) / "side_by_side.md").exists()
    # the driver on the head; both attempts of its task on a v5p-8 slice's host (the TPU-v5p-8-head it asked for)
    job = killed_once_on_slice_hosts(ray_head, ev["hash"], "score_next_actions")
    assert "trajsft_forwarded_env" not in job["metadata"]  # the demo reads nothing from the Hub: no secret goes
    log = (wd / "logs/eval_actions/demo.log").read_text()  # the job's log, the task's lines in it
    assert log.count("scoring demo") == 2 and f"{stored} reused from an earlier attempt" in log, log[-3000:]


# the reference: the same evaluation's episodes on this machine's CPU, into a location of its own
REFERENCE = """
import json, sys
from trajsft.agent import evaluate
from trajsft.plan import config as C, step_configs
plan = C.Plan(C.load([C.DEFAULT_CONFIG, *sys.argv[2:]]), base_dir=C.REPO_DIR)
print(json.dumps(evaluate.episodes(step_configs.eval_agent(plan, "demo"), location=sys.argv[1])["rows"]))
"""


def agent_episodes_on_a_slice_host_killed_then_resumed(wd: Path, ray_head, data) -> None:
    """Issue 70: the trained demo's agent evaluation (agent/demo/done) on the cluster: the task set built here (one
    crate's tasks), then one Ray job whose driver runs the episodes as one task on the host of a v5p-8 slice (the
    student served there, each command in the task's sandbox, each graded row stored on the storage root). The
    task's worker killed (SIGKILL, as a lost host) once it graded its first episode, Ray retries it on a v5p-8 host
    within the same job, no Snakemake retry, and the retry runs only the tasks without a row: the rows equal a
    run of the same evaluation on this machine (their timings aside)."""
    from test_tasks import needs_sandbox

    needs_sandbox()
    crates = wd.parent / "agent-crates"
    shutil.copytree(REPO / "tasks/demo/crates/mini_math", crates / "mini_math")
    prof = profile(wd.parent / "e2e-agent-profile", ray_head.address, data[1], {
        "teachers": {"demo": E2E_DEMO}, "tasks": {"mini": {"crates": str(crates)}}, "agent": {"tasks": "mini"}})
    snakemake(wd, prof, ray_head, "agent/demo/done", "--until", "make_tasks", timeout=600)  # the task set, built here
    ag = next(a for a in plan_of(wd, prof)["artifacts"] if a["kind"] == "agent")
    episodes = Path(ag["location"]) / "episodes"
    graded = lambda: [f for f in episodes.glob("*.json") if not f.name.endswith(".traj.json")] \
        if episodes.is_dir() else []  # noqa: E731
    ref_dir = wd.parent / "agent-reference"
    reference = subprocess.Popen(  # uninterrupted, on this machine's CPU, meanwhile
        [sys.executable, "-c", REFERENCE, str(ref_dir), *(str(prof / f) for f in ("cluster.yaml", "overrides.yaml"))],
        cwd=wd, env=sm_env(ray_head), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(prof), "agent/demo/done"]
    # this machine's W&B is off, as the hosts' (their training's W&B runs offline): the tracking is test_agent's
    p = subprocess.Popen(cmd, stdout=open(wd / "agent-snakemake.log", "w"), stderr=subprocess.STDOUT,
                         env=sm_env(ray_head, WANDB_MODE="offline"), start_new_session=True, cwd=REPO)
    a0 = f"trajsft-{ag['hash']}-a0"
    stored, ref_out = kill_its_task_once_stored(p, reference, "agent_episodes", graded, "graded episode",
                                                wd / "agent-snakemake.log", waits=(600, 900, 600))
    done = json.loads((wd / "agent/demo/done").read_text())
    assert {j["submission_id"]: j["status"] for j in jobs(ray_head, ag["hash"])} == {a0: "SUCCEEDED"}
    assert done["ray_job_id"] == a0 and done["location"] == ag["location"] and done["model"] == "student"
    assert 1 <= stored < done["tasks"] and (done["episodes_reused"], done["episodes_run"]) == (stored, done["tasks"] - stored)
    untimed = lambda row: {k: ({**v, "seconds": None} if k == "graded" else v)  # noqa: E731
                           for k, v in row.items() if k != "seconds"}
    rows = json.loads((Path(ag["location"]) / "results.json").read_text())["rows"]
    assert [untimed(r) for r in rows] == [untimed(r) for r in json.loads(ref_out)], (rows, ref_out)
    killed_once_on_slice_hosts(ray_head, ag["hash"], "agent_episodes")  # the driver on the head, the task on hosts
    log = (wd / "logs/eval_agent/demo.log").read_text()  # the job's log, the task's lines in it
    assert log.count("episodes of demo") == 2 and f"{stored} of {done['tasks']} tasks already graded" in log, log[-3000:]
    out = trajsft(wd, ray_head, "eval", "demo", "--agent", "--json", "--profile", str(prof))
    assert out.returncode == 0 and json.loads(out.stdout)["rows"] == rows, out.stderr[-2000:]


def kill_its_task_once_stored(p: subprocess.Popen, reference: subprocess.Popen, task: str, stored, what: str,
                              log: Path, waits: tuple[float, float, float]) -> tuple[int, str]:
    """A single-host job's rule (Snakemake ``p``) with an uninterrupted ``reference`` run beside it: the worker of its
    Ray task ``task`` SIGKILLed (as a lost host) once ``stored()`` lists a first ``what``, then both waited for (the
    first store, the rule, the reference: ``waits`` seconds). What was stored at the kill, and the reference's
    stdout."""
    import psutil

    first, rule, ref = waits
    try:
        worker = wait_for(lambda: next((q for q in psutil.process_iter(["cmdline"])
                                        if f"ray::{task}" in " ".join(q.info["cmdline"] or [])), None),
                          300, f"the task {task} to run on a host", p, poll=0.1)
        wait_for(stored, first, f"the first {what}", p, poll=0.005)
        worker.kill()
        n = len(stored())
        assert p.wait(timeout=rule) == 0, log.read_text()[-4000:]
        ref_out, ref_err = reference.communicate(timeout=ref)
    finally:
        if p.poll() is None:
            kill_group(p)
        if reference.poll() is None:
            reference.kill()
    assert reference.returncode == 0, ref_err[-3000:]
    return n, ref_out


def killed_once_on_slice_hosts(head, h: str, task: str) -> dict:
    """The one Ray job of ``h``: its driver ran on the head, its task ``task`` twice (the killed attempt, then Ray's
    retry), each on a v5p-8 slice's host (the TPU-v5p-8-head it asked for)."""
    nodes = {n["node_id"]: n for n in ray_head_nodes(head)}
    [job] = jobs(head, h)
    assert nodes[job["driver_node_id"]].get("is_head_node"), job
    r = requests.get(f"{head.address}/api/v0/tasks?detail=true&limit=1000&filter_keys=name&filter_predicates=%3D"
                     f"&filter_values={task}", headers=head.headers(), timeout=10)
    r.raise_for_status()
    tries = sorted(r.json()["data"]["result"]["result"], key=lambda t: t["attempt_number"])
    assert [(t["attempt_number"], t["state"]) for t in tries] == [(0, "FAILED"), (1, "FINISHED")], tries
    assert all("TPU-v5p-8-head" in nodes[t["node_id"]]["resources_total"] for t in tries), tries
    return job


def ray_head_nodes(head) -> list[dict]:
    r = requests.get(f"{head.address}/api/v0/nodes?detail=true&limit=1000", headers=head.headers(), timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]["result"]


def _start(wd, prof, head, log: Path) -> subprocess.Popen:
    return subprocess.Popen(sm_cmd(wd, prof), stdout=open(log, "w"), stderr=subprocess.STDOUT, env=sm_env(head),
                            start_new_session=True, cwd=REPO)


def _running_job(head, h, proc):
    return wait_for(lambda: next((j for j in jobs(head, h) if j["status"] == "RUNNING"), None), 300,
                    "the Ray job to run", proc)


# the stop lands after the first checkpoint (step 3), a status and a clusters call: on SHORT_SEQ_LEN windows a step
# and its checkpoint take well under a second, so the run is long enough to still be training then (short_seq: no
# held-out chat, no evaluation)
RETRY_STEPS = 60


def test_a_broken_host_image_a_stopped_job_and_a_kill9ed_snakemake_each_recover(data, slices, tmp_path):
    """Three interruptions of one run, each recovered (one run's Ray start-ups, not two tests'):
    1. the only slice of the profile's type (a v4-8 added beside the shape's slices, which stay up) runs an image
       whose Python lacks one package the lock pins (wandb): the job fails before training, every Snakemake attempt
       answers the same line naming the host and the package, and one Ray job was submitted; status says so. The
       image fixed, `trajsft retry`, and the next run trains;
    2. its Ray job is stopped (as a lost driver would be): the profile's Snakemake retry submits a new Ray job
       that resumes from the checkpoint;
    3. Snakemake is then kill -9ed: its launcher dies with it but leaves that Ray job running (recorded as
       "detached"), and the same command re-attaches to it instead of resubmitting."""
    wd = workdir(data, "image")
    prof = profile(wd.parent / "image-profile", slices.address, data[1],
                   short_seq({"teachers": {"demo": {"training": {"max_steps": RETRY_STEPS}}},
                              "checkpointing": {"keep_every_steps": 3, "save_interval_minutes": 600},
                              "ray": {**SLICE["ray"], "tpu_type": "v4-8"}}))
    h = run_hash(wd, prof)
    a0, a1, a2 = (f"trajsft-{h}-a{n}" for n in range(3))
    run_dir = Path(plan_of(wd, prof)["checkpoint_dir"])
    ckdir = str(run_dir / "checkpoints")
    image = host_image_without(tmp_path / "image", "wandb")
    assert slices.complete_slices("v4-8") == []
    broken = slices.new_slice_name()
    slices.add_slice(broken, "v4-8", python=image)
    p = snakemake(wd, prof, slices.head, check=False)
    assert p.returncode != 0
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft train demo: configuration error:")]
    cause = f"{broken} host 0: wandb missing (the lock pins 0.31.0)"
    assert said and said[0].startswith(f"trajsft train demo: configuration error: {cause}: its Python is not "
                                       f"tpu-requirements.txt"), p.stderr[-3000:]
    assert f"(Ray job {a0}; not retried" in said[0]
    # Snakemake's retries (the profile's 3) each answered at once, without resubmitting
    again = [ln for ln in said[1:] if "not resubmitted" in ln]
    assert len(again) == 3 and all(cause in ln for ln in again), said
    [job] = jobs(slices.head, h)
    assert (job["submission_id"], job["status"]) == (a0, "FAILED")
    # four Snakemake attempts, one slice attempt: the first one's
    att = attempts(run_dir)
    assert [a["outcome"] for a in att] == ["failed"] * 4
    assert [(s["outcome"], s["cause"].split(":")[0]) for s in att[0]["slice_attempts"]] == [
        ("configuration error", f"{broken} host 0")]
    assert not any(a.get("slice_attempts") for a in att[1:])
    row = status(wd, prof, slices.head)
    assert (row["state"], row["ray_job_id"]) == ("configuration error", a0)
    assert row["cause"].startswith(cause) and "trajsft retry demo" in row["next"]

    # the image is fixed (a slice of our own image); nothing the fingerprint sees changed: `trajsft retry`, and the
    # next run trains as a1
    slices.kill_slice(broken)
    slices.add_slice(slices.new_slice_name(), "v4-8")
    r = trajsft(wd, slices.head, "retry", "demo", "--profile", str(prof))
    assert r.returncode == 0 and f"cleared the configuration error of Ray job {a0}" in r.stdout, r.stderr
    p = _start(wd, prof, slices.head, wd / "snakemake.log")
    job = _running_job(slices.head, h, p)
    assert job["submission_id"] == a1
    wait_for(lambda: checkpoints.latest_checkpoint(ckdir), 600, "a checkpoint", p)
    row = status(wd, prof, slices.head)  # running after a failed job: retrying, and a1 the job
    assert row["state"] == "retrying" and row["ray_job_id"] == a1 and row["steps_total"] == RETRY_STEPS, row
    c = json.loads(trajsft(wd, slices.head, "clusters", str(prof), "--json").stdout)[0]
    assert c["jobs"]["ours_running"] == [a1]
    assert cluster_jobs.stop(slices.address, a1, 60, auth_token=slices.head.token) == "STOPPED"  # like a preemption
    resumed_from = checkpoints.latest_checkpoint(ckdir)["completed_steps"]
    row = wait_for(lambda: (r := status(wd, prof, slices.head))["state"] in ("stopped", "retrying") and r, 120,
                   "status to show the stopped attempt", p)
    assert row["cause"] == "stopped" and row["next"] == f"resume from step {resumed_from}"

    # the retry runs as a new Ray job; kill -9 Snakemake alone (its job dies with it: PDEATHSIG)
    wait_for(lambda: {j["submission_id"]: j["status"] for j in jobs(slices.head, h)}.get(a2) == "RUNNING", 300,
             "the retry's Ray job to run", p)
    assert rule_jobs(p, "launcher.log"), "no train launcher"
    tree = kill9_snakemake_only(p)
    wait_for(lambda: not alive(tree), 60, "the launcher to die with Snakemake")
    assert {j["submission_id"]: j["status"] for j in jobs(slices.head, h)} == {a0: "FAILED", a1: "STOPPED",
                                                                                a2: "RUNNING"}
    last = attempts(run_dir)[-1]
    assert last["outcome"] == "detached" and "a rerun re-attaches" in last["error"], last
    snakemake(wd, prof, slices.head, "--unlock")
    snakemake(wd, prof, slices.head)
    assert {j["submission_id"]: j["status"] for j in jobs(slices.head, h)} == {a0: "FAILED", a1: "STOPPED",
                                                                                a2: "SUCCEEDED"}
    result = json.loads((run_dir / "training_result.json").read_text())
    assert result["resumed_from_step"] == resumed_from >= 1
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["steps"] == RETRY_STEPS and done["ray_job_id"] == a2
    assert [a["outcome"] for a in attempts(run_dir)] == ["failed"] * 5 + ["detached", "succeeded"], attempts(run_dir)
    assert status(wd, prof, slices.head)["state"] == "done"


def test_sigint_and_sigterm_to_snakemake_stop_their_ray_jobs(data, ray_head):
    """SIGINT to one Snakemake and SIGTERM to another stop each one's Ray job. The two run at once, one per
    v5p-8 slice of the cluster (one job start-up for both signals), each with its own run and workdir."""
    runs = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            wd = workdir(data, f"sig{int(sig)}")
            prof = profile(wd.parent / f"sig{int(sig)}-profile", ray_head.address, data[1],
                           {"teachers": {"demo": {"training": {"max_steps": 180 + int(sig)}}}})  # own run per signal
            h = run_hash(wd, prof)
            runs[sig] = (wd, prof, h, _start(wd, prof, ray_head, wd / "snakemake.log"))
        started = {sig: _running_job(ray_head, h, p) for sig, (_, _, h, p) in runs.items()}
        wd, prof, h, _ = runs[signal.SIGINT]  # a first Ray job running: status says so
        row = status(wd, prof, ray_head)
        assert (row["state"], row["ray_job_id"], row["attempt"]) == ("training running", f"trajsft-{h}-a0", 1), row
        for sig, (_, _, _, p) in runs.items():
            os.kill(p.pid, sig)  # to Snakemake's own pid only, not its process group
        for _, _, _, p in runs.values():
            p.wait(timeout=300)
    finally:
        for _, _, _, p in runs.values():
            if p.poll() is None:
                kill_group(p)
    for sig, (wd, prof, h, p) in runs.items():
        # the train rule's launcher got the signal from Snakemake (trajsft.runtime.signals forwards it) and said so
        said = (wd / "snakemake.log").read_text()
        assert f"got {sig.name}; stopping the Ray job" in said, (sig.name, said[-3000:])
        wait_for(lambda: [j["status"] for j in jobs(ray_head, h)] == ["STOPPED"], 120,
                 f"the Ray job of the {sig.name} run to be STOPPED")
        assert not (wd / "checkpoints/demo/done").exists(), sig.name
        assert started[sig]["submission_id"] == f"trajsft-{h}-a0"
        row = status(wd, prof, ray_head)
        assert (row["state"], row["cause"], row["attempt"]) == ("stopped", "stopped", 1), (sig.name, row)
        assert row["next"].startswith(("resume from step", "start from step 0")), (sig.name, row)
