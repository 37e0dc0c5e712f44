"""Integration: training on every host of an emulated multi-host TPU slice (real Ray nodes on
127.0.0.1 that present themselves as TPU VM hosts; multi-process JAX on CPU with gloo).

The session's one emulated cluster (tests/slice_fixtures.py: a CPU head, a 2-host v5p-16 slice and two
v5p-8 slices, shared with tests/test_tpu_profile.py); this module's jobs ask for the v5p-16. Its nodes reach
a bucket on fake-gcs-server (started with the emulator's endpoint in their environment, as TPU VMs reach
GCS); a scenario that kills hosts leaves the cluster back in its shape for the next test:
1. Snakemake with the tpu-east5 profile (only address and storage root changed, plus test
   overrides) trains data-parallel on both hosts to `done`; the loss matches a single-process run.
2. With the profile's gs:// storage root on the bucket and a student initialised from a checkpoint on
   the (fake) Hub: the checkpoint is snapshotted once into the bucket and the Hub goes away; one host's
   trainer is killed before the first checkpoint (the next slice attempt initialises again, from the
   bucket), then a whole host, then the whole slice (a fresh slice appears later): each time the same
   Ray job resumes from the latest checkpoint in the bucket on a new slice attempt, no Snakemake retry
   is used, and status (reading the bucket) shows the preemptions. W&B is online (a stand-in server on
   loopback, tests/wandb_stub.py): only process 0 talks to it, and every slice attempt continues the same
   W&B run, its steps never restarting or repeating.
3. The old shape (one process pinned to the slice head) fails fast with a clear message.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

import tiny_hf_model
from fake_hub import FakeHub, Repo
from gcs_fixtures import Bucket, clear_fsspec_cache
from pipeline_utils import REPO, kill_group, wait_for
from wandb_stub import make_server as wandb_server
from tpu_utils import (HF, WK, data_rules, jobs, make_profile, plan_of, run_hash, short_seq, sm_cmd, sm_env, snakemake,
                       status, workdir)
from trajsft.plan import step_configs
from trajsft import io
from trajsft.train import checkpoints
from trajsft.train import metrics, tracking
from trajsft.train import run as train_run
from trajsft.plan import config as C
from trajsft.cluster import jobs as cluster_jobs
from trajsft.train.target import train_lm_config_for
from trajsft.cluster.entrypoint import absolute_local_refs

pytestmark = pytest.mark.integration

TPU = "v5p-16"  # 2 hosts x 4 chips
# the fit check (compile the step for the slice before submitting) is tested in test_fit/test_tpu_profile. The
# profile's runtime env (envs/tpu-requirements.txt, a venv per node made by Ray's uv) on both hosts of a v5p-16 is
# tests/test_foreign_image.py's, whose hosts hold nothing but Ray; here the hosts run this venv, as every test of the
# shared cluster does (on new hosts that env took the e2e job 98 s from submission to the trainer's start, not 30 s)
BASE = {"ray": {"tpu_type": TPU, "failure_grace_seconds": 45, "fit_check": False, "pip_requirements": None}}


PREEMPT_STEPS = 30  # the bucket scenario's training length (short_seq: no held-out chat, no evaluation)
# the bucket scenario's ray.stall_seconds: a slice attempt whose trainers hang after a loss (three CI runs of four in
# 2026-11: the attempt after the killed process's, its hosts silent until the limit) is ended as a preemption, as on
# a real cluster (there after 1800 s); a wait that spans a loss allows one such attempt and a fresh one's start
STALL_S = 300
RIDE_OUT_S = 600 + STALL_S + 300
HUB_REPO, HUB_SHA = "trajsft-test/tiny-qwen3", "89abcdef0123456789abcdef0123456789abcdef"


def hub_student() -> dict:
    """The demo's student initialised from a tiny checkpoint on the (fake) Hub instead of random weights."""
    return {"students": {"tiny-hf": {"init": "hf", "hf_checkpoint": HUB_REPO, "hf_revision": HUB_SHA,
                                     "tokenizer": "demo/tokenizer", "model": dict(tiny_hf_model.TINY)}},
            "teachers": {"demo": {"student": "tiny-hf"}}}


def overrides(**training) -> dict:
    """The demo on both hosts of the v5p-16 (a global batch of 8: one sequence per CPU device), on SHORT_SEQ_LEN
    windows (tests/tpu_utils.py: a step 10x cheaper than at 1024 on CPU)."""
    return short_seq({**BASE, "teachers": {"demo": {"training": {"batch_size": 8, **training}}},
                      "checkpointing": {"keep_every_steps": 3, "save_interval_minutes": 600}})


@pytest.fixture(scope="module")
def bucket(shared_cluster):
    """A fresh bucket on the fake-gcs-server the shared cluster's nodes were started pointing at; its endpoint
    in this process's environment (so Snakemake, the CLI and this test's reads) for this module's tests."""
    emu = shared_cluster.gcs
    with pytest.MonkeyPatch.context() as mp:
        for k, v in emu.env().items():
            mp.setenv(k, v)
        clear_fsspec_cache()  # gcsfs instances of earlier modules point at their (stopped) emulators
        yield Bucket(emu, emu.make_bucket())
    clear_fsspec_cache()


@pytest.fixture
def cluster(bucket, slices):
    """The session's emulated cluster (tests/slice_fixtures.py): this module's jobs ask for a v5p-16 and get
    its one 2-host slice; the cluster is back in its shape after each test."""
    return slices


@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_cluster):
    return data_rules(tmp_path_factory.mktemp("mh"), shared_cluster.cluster.head, BASE)


def attempts(run_dir: Path | str) -> list[dict]:
    p = io.join(str(run_dir), "attempts.json")  # a local run dir, or one in the bucket
    return io.read_json(p) if io.exists(p) else []


def slice_attempts(run_dir: Path) -> list[dict]:
    a = attempts(run_dir)
    return a[-1].get("slice_attempts", []) if a else []


def what_the_job_shows(wd: Path, run_dir: str, run_id: str) -> str:
    """What a wait that timed out saw: the slice attempts, the job log's last lines and each host's train_lm log's
    (on the emulated hosts, under this machine's temp dir), the long hparams lines left out."""
    out = ["slice attempts: " + "; ".join(f"{s['slice_attempt']} {s['outcome']} from {s.get('resumed_from_step')} on "
                                          f"{s.get('slices')}: {s.get('cause')}" for s in slice_attempts(run_dir))]
    hosts = sorted((Path(tempfile.gettempdir()) / "trajsft-runs" / run_id).glob("host-*/train*.log"))
    for path in [wd / "logs/train/demo.log", *hosts]:
        lines = [ln[:300] for ln in path.read_text(errors="replace").splitlines() if '"hparams"' not in ln][-30:] \
            if path.exists() else []
        out.append(f"--- {path} (its last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(out)


def job_log_steps(wd: Path) -> list[int]:
    """The steps in the job log Snakemake's train rule follows (the slice's primary host's output)."""
    return sorted(s for s, m in metrics.read_metrics(str(wd / "logs/train/demo.log"))["steps"].items()
                  if "train/loss" in m)


def test_trains_on_every_host_and_matches_a_single_process(data, cluster, tmp_path):
    wd = workdir(data, "e2e")
    prof = make_profile(wd.parent / "e2e-profile", cluster.address, data[1], overrides(max_steps=6))
    h = run_hash(wd, prof)
    # this run's own secret values: the cluster is the session's, and a job another test stopped before its
    # driver ran keeps its bundle in the KV store until Ray collects it (minutes later)
    hf, wk = f"{HF}-{os.urandom(4).hex()}", f"{WK}_{os.urandom(4).hex()}"  # W&B's SDK reads after a dash as the key
    run_dir = Path(plan_of(wd, prof)["checkpoint_dir"])
    t0 = time.time()
    p = subprocess.Popen(sm_cmd(wd, prof), stdout=open(wd / "snakemake.log", "w"), stderr=subprocess.STDOUT,
                         env=sm_env(cluster.head, HF_TOKEN=hf, WANDB_API_KEY=wk), start_new_session=True, cwd=REPO)
    try:
        # the same config in one process with the same 8 devices, trained while the job sets up and trains (its
        # Ray processes mostly wait): written at submission, it is the job's own
        wait_for(lambda: (run_dir / "levanter_config.json").exists(), 600, "the job's levanter_config.json", p)
        reference: dict = {}
        ref_thread = threading.Thread(target=single_process_run, args=(run_dir, tmp_path, reference), daemon=True)
        ref_thread.start()
        assert p.wait(timeout=1200) == 0, (wd / "snakemake.log").read_text()[-4000:]
        wall = time.time() - t0
        ref_thread.join(timeout=600)
    finally:
        if p.poll() is None:
            kill_group(p)
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert Path(done["checkpoint_dir"]) == run_dir
    assert done["steps"] == 6 and checkpoints.hf_export_complete(done["hf_export"])
    [job] = jobs(cluster.head, h)
    assert job["status"] == "SUCCEEDED" and job["entrypoint"].find("trajsft.cluster.entrypoint") >= 0
    # one training process per host of the slice, all in one slice attempt; the hosts have no TPU_* variable:
    # each knows its slice, worker id and the slice's hosts from its own GCE metadata server, as a TPU VM does
    [sa] = slice_attempts(run_dir)
    [slice_name] = cluster.complete_slices(TPU)  # the one v5p-16
    assert sa["outcome"] == "succeeded" and sa["slices"] == [slice_name]
    assert sorted((hst["slice"], hst["worker"]) for hst in sa["hosts"]) == [(slice_name, 0), (slice_name, 1)]
    assert not [k for hst in cluster.hosts.values() for k in psutil.Process(hst.pid).environ() if k.startswith("TPU_")]
    result = json.loads((run_dir / "training_result.json").read_text())
    assert sorted((x["slice"], x["worker"]) for x in result["hosts"]) == [(slice_name, 0), (slice_name, 1)]
    # one JAX process group of the slice's size: Levanter prefixes every line with jax.process_index(), so
    # host 1 logs as process 1 of the group (two single-process trainings would both log as process 0)
    host0_log, host1_log = run_dir / "train.log", run_dir / "hosts" / "0-1" / "train-0-1.log"
    for log_file, index in ((host0_log, 0), (host1_log, 1)):
        text = log_file.read_text()
        assert f"on {slice_name} host {index} (a1-s1" in text
        indices = set(re.findall(r"^\d{4}-\d\d-\d\dT[\d:]+ - (\d+) - levanter", text, re.M))
        assert indices == {str(index)}, (log_file, indices)
        assert '"num_processes": 2, "process_id": %d' % index in text
    # the job log carries the slice's primary host alone, each of its lines once: exactly host 0's own log,
    # from one host task (four worker-0 hosts would interleave four copies)
    job_log = (wd / "logs/train/demo.log").read_text()
    streamed = [m.groups() for m in re.finditer(r"^\(train_on_host pid=(\d+)[^)]*\) ?(.*)$", job_log, re.M)]
    assert len({pid for pid, _ in streamed}) == 1
    assert [line for _, line in streamed] == host0_log.read_text().splitlines()
    assert job_log.count(f"on {slice_name} host 0 (a1-s1") == 1 and f"on {slice_name} host 1" not in job_log
    # secrets: nowhere in files, logs, job metadata
    for root in (wd, data[1]):
        for f in root.rglob("*"):
            if f.is_file() and not f.is_symlink():
                blob = f.read_bytes()
                assert hf.encode() not in blob and wk.encode() not in blob, f
    listing = json.dumps(jobs(cluster.head))
    assert hf not in listing and wk not in listing
    # ... nor in the cluster: the secret bundle was deleted from the KV store, no session file holds them
    assert cluster.kv_keys_holding([hf, wk]) == []
    assert cluster.files_holding([hf, wk]) == []

    # the single process trained the same config: the same loss
    assert "result" in reference, reference.get("error", "the single-process reference did not finish")
    ref = reference["result"]
    multi = dict(result["loss_history"])
    single_ = dict(ref["loss_history"])
    assert sorted(multi) == sorted(single_) == list(range(6))
    # same init, same global batch: step 0 agrees to f32 rounding; later steps drift only by the order of
    # the gradient all-reduce in bf16 compute (mp p=f32,c=bfloat16)
    assert math.isclose(multi[0], single_[0], rel_tol=1e-6), (multi[0], single_[0])
    for step in multi:
        assert math.isclose(multi[step], single_[step], rel_tol=1e-3), (step, multi[step], single_[step])
    assert math.isclose(done["final_loss"], ref["final_loss"], rel_tol=1e-3), (done["final_loss"], ref["final_loss"])
    print(f"\n2-host run: {wall:.0f}s wall, final loss {done['final_loss']:.6f}; single process {ref['final_loss']:.6f}")


def single_process_run(run_dir: Path, tmp_path: Path, out: dict) -> None:
    """The job's own train_lm config (``levanter_config.json`` in its run dir) trained in one process with the
    slice's 8 devices on CPU: ``out["result"]`` is run_training's result (``out["error"]`` what went wrong)."""
    try:
        out["result"] = _single_process_run(run_dir, tmp_path)
    except BaseException as e:  # noqa: BLE001 - reported by the test's assertion, in its thread's stead
        out["error"] = f"the single-process reference failed: {type(e).__name__}: {e}"


def _single_process_run(run_dir: Path, tmp_path: Path) -> dict:
    cfg = json.loads((run_dir / "levanter_config.json").read_text())
    absolute_local_refs(cfg)  # the tokenizer ships with the job's working dir: here, the repo
    single = tmp_path / "single"
    cfg["trainer"]["checkpointer"]["base_path"] = str(single / "checkpoints")
    cfg["hf_save_path"] = str(single / "hf")
    cfg["trainer"]["require_accelerator"] = False
    for t in cfg["trainer"].get("tracker") or []:
        if t.get("type") == "wandb":
            t["mode"] = "disabled"
    return train_run.run_training(cfg, str(single), str(single / "train.log"),
                                  env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"})


def _wait_running(run_dir: Path, after: int, proc, timeout=600) -> dict:
    """The newest slice attempt once it is later than attempt ``after`` and runs on every host.

    Ray may need more than one new attempt after a loss (an attempt scheduled onto a node that is
    dying but not yet declared dead is itself preempted): those extra preemptions are correct
    behaviour, so the test waits for the newest attempt rather than for a fixed number."""
    return wait_for(lambda: (sa := slice_attempts(run_dir)) and sa[-1]["slice_attempt"] > after
                    and sa[-1]["outcome"] == "running" and sa[-1], timeout, f"a slice attempt after {after} running",
                    proc, poll=1.0)


def _running_now(run_dir: Path, proc) -> dict:
    """The slice attempt a kill made now hits: the newest, once it runs. An attempt the test waited for may have ended
    since on its own (once in CI: its hosts' gloo could not connect, a preemption the job rode out) and a later one
    runs; the kill's bookkeeping names the attempt it really ends."""
    return _wait_running(run_dir, -1, proc)


def _wait_step_after(wd: Path, step: int, proc, timeout=600) -> int:
    return wait_for(lambda: (s := job_log_steps(wd)) and s[-1] > step and s[-1], timeout,
                    f"a logged step after {step}", proc, poll=1.0)


def test_on_a_bucket_losses_resume_from_the_bucket_without_snakemake_retry(data, cluster, bucket, tmp_path):
    wd = workdir(data, "preempt")
    root = f"{bucket.url}/trajsft"
    # 30 steps: the three losses land by about step 15 (a host loss after the first checkpoint, the slice's two steps
    # after that attempt resumed), the job log trailing the trainer by a few steps; the last attempt trains the rest
    over = overrides(max_steps=PREEMPT_STEPS)
    over = C.deep_merge(over, hub_student())
    # W&B online, at a stand-in on loopback: the profile's ray.env wins over the nodes' WANDB_MODE=offline
    wb = wandb_server(0)
    threading.Thread(target=wb.serve_forever, daemon=True).start()
    wb_url = f"http://127.0.0.1:{wb.server_port}"
    over["ray"]["env"] = {"WANDB_MODE": "online", "WANDB_BASE_URL": wb_url, "WANDB_ERROR_REPORTING": "false",
                          "WANDB__FILE_STREAM_TRANSMIT_INTERVAL": "1"}
    over["ray"]["stall_seconds"] = STALL_S
    prof = make_profile(wd.parent / "preempt-profile", cluster.address, root, over)
    t = plan_of(wd, prof)
    h = run_hash(wd, prof)
    run_dir = f"{root}/checkpoints/demo-{h}"
    ckdir = f"{run_dir}/checkpoints"
    model = next(a for a in t["artifacts"] if a["kind"] == "models")
    assert t["init_weights"] == model["location"] == f"{root}/models/{model['name']}"

    # the student's checkpoint, snapshotted once from the Hub into the bucket; then the Hub goes away
    hub = FakeHub({HUB_REPO: Repo(HUB_SHA, tiny_hf_model.files())}).start()
    try:
        p = subprocess.run([*sm_cmd(wd, prof)[:-1], model["manifest"]], capture_output=True, text=True, cwd=REPO,
                           env=sm_env(cluster.head, **hub.env(), HF_HOME=str(tmp_path / "hf-home")), timeout=600)
        assert p.returncode == 0, p.stderr[-4000:]
        asked = list(hub.requests)
    finally:
        hub.stop()
    assert asked and all(path.startswith((f"/api/models/{HUB_REPO}/", f"/{HUB_REPO}/resolve/")) for _, path in asked)
    objs = bucket.objects()
    for rel, blob in tiny_hf_model.files().items():
        if rel != "README.md":
            assert objs[f"trajsft/models/{model['name']}/{rel}"] == blob, rel

    p = subprocess.Popen(sm_cmd(wd, prof), stdout=open(wd / "snakemake.log", "w"), stderr=subprocess.STDOUT,
                         env=sm_env(cluster.head), start_new_session=True, cwd=REPO)
    job_log = wd / "logs/train/demo.log"
    init_line = f"Initializing model from HF checkpoint '{model['location']}'"
    kills = []
    [first] = cluster.complete_slices(TPU)  # the cluster's one v5p-16 slice; a fresh one replaces it below
    second = cluster.new_slice_name()
    try:
        t0 = time.time()
        sa = _wait_running(run_dir, 0, p)
        # 1. one host's training process dies (SIGKILL, as the OOM killer would) before the first checkpoint:
        # the next slice attempt starts from the initial weights again, read from the bucket
        wait_for(lambda: job_log.exists() and init_line in job_log.read_text(), 600, "the weights loaded", p)
        sa = _running_now(run_dir, p)
        [pid] = cluster.trainer_pids(first, 1)
        assert checkpoints.latest_checkpoint(ckdir) is None
        os.kill(pid, 9)
        kills.append(("process", (job_log_steps(wd) or [-1])[-1], sa["slice_attempt"]))
        sa = _wait_running(run_dir, sa["slice_attempt"], p)
        # the trainer logs each checkpoint it saved: read the job log here, not the bucket's listing every second
        wait_for(lambda: f"Saved checkpoint to {ckdir}/step-" in job_log.read_text(), RIDE_OUT_S,
                 "the job log to show a checkpoint saved in the bucket", p, poll=1.0)
        at = _wait_step_after(wd, checkpoints.latest_checkpoint(ckdir)["completed_steps"], p, RIDE_OUT_S)
        # 2. a whole host goes away (raylet, workers, trainer), and comes back later
        at = job_log_steps(wd)[-1]
        sa = _running_now(run_dir, p)
        cluster.kill_host(first, 1)
        kills.append(("host", at, sa["slice_attempt"]))
        # the host comes back once the job has seen it go (its slice attempt ended), not after a fixed sleep
        lost = sa["slice_attempt"]
        wait_for(lambda: any(x["slice_attempt"] == lost and x["outcome"] != "running" for x in slice_attempts(run_dir)),
                 240, f"slice attempt {lost} to end after its host 1 was killed", p, poll=1.0)
        cluster.add_host(first, TPU, 1)
        sa = _wait_running(run_dir, sa["slice_attempt"], p)
        at = _wait_step_after(wd, sa["resumed_from_step"] + 2, p, RIDE_OUT_S)
        # 3. the whole slice is preempted; a fresh slice appears later
        at = job_log_steps(wd)[-1]
        sa = _running_now(run_dir, p)
        cluster.kill_slice(first)
        kills.append(("slice", at, sa["slice_attempt"]))
        # the job records a new slice attempt waiting for a slice (one object in the bucket: no CLI started per
        # poll); status then says so
        wait_for(lambda: (x := slice_attempts(run_dir)) and x[-1]["slice_attempt"] > sa["slice_attempt"]
                 and x[-1]["outcome"] == "waiting for slice", 240, "a slice attempt waiting for a slice", p, poll=1.0)
        row = status(wd, prof, cluster.head)
        assert "waiting" in (row.get("detail") or ""), row
        cluster.add_slice(second, TPU)
        assert p.wait(timeout=600 + RIDE_OUT_S) == 0, (wd / "snakemake.log").read_text()[-4000:]
        wall = time.time() - t0
    except AssertionError as e:  # a wait that timed out: what the job and its hosts were doing then
        raise AssertionError(f"{e}\n{what_the_job_shows(wd, run_dir, h)}") from None
    finally:
        if p.poll() is None:
            kill_group(p)
        wb.shutdown()
    # one Ray job, one Snakemake attempt: every loss was ridden out inside the job
    assert [(j["submission_id"], j["status"]) for j in jobs(cluster.head, h)] == [(f"trajsft-{h}-a0", "SUCCEEDED")]
    att = attempts(run_dir)
    assert [a["outcome"] for a in att] == ["succeeded"]
    sas = att[0]["slice_attempts"]
    shown = "\n".join(f"{s['slice_attempt']} {s['outcome']} from {s['resumed_from_step']} on {s['slices']}: "
                      f"{s.get('cause')}" for s in sas)
    # each kill ended the attempt it hit as a preemption; nothing was a failure; the last attempt succeeded
    assert [s["outcome"] for s in sas] == ["preempted"] * (len(sas) - 1) + ["succeeded"], shown
    hit = {n: kind for kind, _, n in kills}
    hit_by = {kind: n for kind, _, n in kills}
    assert len(hit) == 3 and all(sas[n - 1]["outcome"] == "preempted" for n in hit), (kills, shown)
    assert att[0]["preemptions"] == len(sas) - 1 >= 3 and att[0]["failures"] == 0, shown
    assert "killed by SIGKILL" in sas[hit_by["process"] - 1]["cause"], shown
    assert sas[-1]["slices"] == [second] and sas[0]["slices"] == [first], shown
    # the attempt after the first kill started again from the initial weights (nothing saved yet); the
    # attempts after the host and slice losses resumed from checkpoints in the bucket
    after = {kind: sas[n] for kind, _, n in kills}
    assert after["process"]["resumed_from_step"] == 0, shown
    assert 1 <= after["host"]["resumed_from_step"] <= after["slice"]["resumed_from_step"], shown
    for prev, s in zip(sas, sas[1:]):
        assert s["resumed_from_step"] >= prev["resumed_from_step"], shown
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["steps"] == PREEMPT_STEPS and done["checkpoint_dir"] == run_dir and checkpoints.hf_export_complete(done["hf_export"])
    assert done["hf_export"].startswith(f"{run_dir}/hf/step-")
    assert not (data[1] / "checkpoints" / f"demo-{h}").exists()  # nothing of the run under the local root
    lev = io.read_json(f"{run_dir}/levanter_config.json")
    assert lev["initialize_from_hf"] == lev["model"]["reference_checkpoint"] == model["location"]
    assert lev["data"]["cache_dir"].startswith(f"{root}/tokenized/")
    # the job log has every slice attempt's launch once (each attempt streams only what it appended); the
    # weights were read from the bucket's snapshot by each attempt that had no checkpoint, never from the Hub
    text = job_log.read_text()
    launches = [ln for ln in text.splitlines() if metrics.LAUNCH_MARK in ln]
    assert len(launches) >= 4 and len(set(launches)) == len(launches), launches
    assert text.count(init_line) == sum(1 for s in sas if s["resumed_from_step"] == 0) >= 2, shown
    assert "Starting from scratch" not in text
    # W&B: one run, the run hash, asked for by process 0 of each launch only (a second process online would ask
    # too, and write every step twice); each attempt continued it: steps in order, none twice, to the last
    assert list(wb.state["runs"]) == [h]
    wrun = wb.state["runs"][h]
    steps = [r["_step"] for r in wrun["history"]]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == PREEMPT_STEPS - 1 and wrun["exitcode"] == 0, steps
    asked = [r for r in wb.state["requests"] if r[3] == "RunResumeStatus"]
    # each launch asks once at most; the first kill lands once the weights loaded, which may be before its launch
    # reached W&B (seen once in a full suite run, 2026-11-29: 3 asked for 4 launches)
    assert len(launches) - 1 <= len(asked) <= len(launches), (asked, launches)
    rec = tracking.read_record(run_dir)  # written by the last attempt's process 0 into the bucket
    assert rec["id"] == h and rec["resumed"] is True and rec["starting_step"] > 0
    assert rec["url"] == f"{wb_url}/stub/{rec['project']}/runs/{h}" == done["wandb_url"]
    ident = wrun["config"]["trajsft"]["value"]
    assert (ident["target"], ident["run_hash"], ident["run"]) == ("demo", h, f"demo-{h}")
    assert sorted(i.split(":")[0] for i in ident["inputs"]) == ["models", "tokenized"], ident
    row = status(wd, prof, cluster.head)
    n = len(sas) - 1
    assert row["wandb_url"] == rec["url"], row
    assert row["state"] == "done" and row["preemptions"] == n
    assert f"preempted {n}x" in row["detail"] and second in row["detail"]
    report = [f"{kind}: killed at step {at}, resumed from {sas[n]['resumed_from_step']} "
              f"({at + 1 - sas[n]['resumed_from_step']} steps redone)" for kind, at, n in kills]
    print("\n" + "\n".join(report) + f"\nwall {wall:.0f}s\n" + shown)


def test_old_shape_pinned_to_the_slice_head_fails_fast(data, cluster, tmp_path, monkeypatch):
    # as a profile: refused by preflight in one line, nothing submitted
    wd = workdir(data, "old")
    prof = make_profile(wd.parent / "old-profile", cluster.address, data[1],
                        {**overrides(max_steps=4), "ray": {**BASE["ray"], "entrypoint_resources": {f"TPU-{TPU}-head": 1}}})
    before = len(jobs(cluster.head))
    t0 = time.time()
    p = snakemake(wd, prof, cluster.head, check=False)
    assert p.returncode != 0 and time.time() - t0 < 60
    [line] = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft preflight:")]
    assert "pins the training job to TPU-v5p-16-head" in line and "run_on_pod" in line
    assert len(jobs(cluster.head)) == before
    # as a raw Ray job (what the project used to submit): one training process on worker 0 fails at once
    good = make_profile(wd.parent / "good-profile", cluster.address, data[1], overrides(max_steps=4))
    monkeypatch.chdir(wd)  # the plan reads the tokenized manifests of this workdir
    plan = C.Plan(C.load([C.DEFAULT_CONFIG, str(good / "cluster.yaml"), str(good / "overrides.yaml")]),
                  base_dir=C.REPO_DIR)
    cfg = tmp_path / "levanter_config.json"
    cfg.write_text(json.dumps(train_lm_config_for(step_configs.train(plan, "demo"))))
    # the old entrypoint ran trajsft's local training (run_training) as the one process of the job
    entry = ("python -c 'import json, sys; from trajsft.train import run as train_run; "
             "train_run.run_training(json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3])' "
             f"{cfg} {tmp_path / 'old'} {tmp_path / 'old.log'}")
    t0 = time.time()
    sid, _ = cluster_jobs.submit_or_attach(cluster.address, entry, f"old-shape-{int(t0)}",
                                      runtime_env={"working_dir": str(REPO / "src"), "excludes": ["**/__pycache__/"]},
                                      entrypoint_resources={f"TPU-{TPU}-head": 1}, auth_token=cluster.head.token)
    st = wait_for(lambda: (s := cluster_jobs.Conn(cluster.address, cluster.head.token).status(sid)) in
                  cluster_jobs.TERMINAL_STATUSES and s, 120, "the old-shape job to end")
    assert st == "FAILED" and time.time() - t0 < 120
    # Ray's job message carries the tail of the driver's output (the log file of a job whose driver ran on
    # another node may not be collected yet)
    said = cluster_jobs.Conn(cluster.address, cluster.head.token).job_info(sid).message or ""
    said += cluster_jobs.job_logs(cluster.address, sid, auth_token=cluster.head.token)
    assert "SingleProcessOnPod: this is worker 0 of the 2-host TPU slice slice-" in said and "run_on_pod" in said, said
