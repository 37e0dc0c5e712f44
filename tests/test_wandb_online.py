"""W&B online against a stand-in server on loopback (tests/wandb_stub.py), with the real wandb SDK and Levanter's
tracker, on the local executor: the demo logs to the server from one process, a trainer killed mid-run is resumed
into the same W&B run with its steps continuing, a refused key is one line, an outage costs seconds; preflight
checks the key with one request. Each asserts what the server recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gcs_fixtures import free_port
from pipeline_utils import attempts, plan, procs, run, start, wait_for
from trajsft.train import checkpoints, tracking
from wandb_stub import make_server

GOOD, BAD = "g" * 40, "b" * 40
OVER = {"wandb": {"mode": "online", "project": "sft"},
        "teachers": {"demo": {"training": {"max_steps": 40}}},  # the kill must land before the end
        "checkpointing": {"keep_every_steps": 3, "save_interval_minutes": 600}}
TRACEBACK = "Traceback (most recent call last)"


@pytest.fixture(scope="module")
def server():
    srv = make_server(0, refused={BAD})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def wandb_env(srv, tmp: Path, key: str) -> dict:
    """Online W&B at the stand-in (the tests' environment says offline); the SDK's own files under ``tmp``."""
    d = tmp / "wandb-home"
    d.mkdir(exist_ok=True)
    return {"WANDB_MODE": "online", "WANDB_API_KEY": key, "WANDB_BASE_URL": f"http://127.0.0.1:{srv.server_port}",
            "WANDB_ERROR_REPORTING": "false", "WANDB_CONFIG_DIR": str(d), "WANDB_CACHE_DIR": str(d),
            "WANDB_DATA_DIR": str(d), "WANDB__FILE_STREAM_TRANSMIT_INTERVAL": "1",  # rows reach the server each second
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def cli(wd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args, "--configfile", str(wd / "test-overrides.yaml")],
                          capture_output=True, text=True, cwd=wd, timeout=120, env={**os.environ, **env})


def requests_of(srv, since: int) -> list:
    return srv.state["requests"][since:]


@pytest.mark.integration
def test_demo_online_a_refused_key_then_a_killed_run_resumed_into_the_same_wandb_run(server, tmp_path):
    wd = tmp_path
    t = plan(wd, "demo", OVER)
    [ck] = [a for a in t["artifacts"] if a["kind"] == "checkpoints"]
    [tok] = [a for a in t["artifacts"] if a["kind"] == "tokenized"]
    run_hash, run_dir = ck["hash"], wd / t["checkpoint_dir"]
    ckpts = str(run_dir / "checkpoints")

    # 1. a refused key: the train rule ends in one line naming W&B, in seconds, not retried, nothing logged
    n0 = len(server.state["requests"])
    p = run(wd, "checkpoints/demo/done", config=OVER, check=False, extra_env=wandb_env(server, tmp_path, BAD))
    assert p.returncode != 0
    out = p.stdout + p.stderr
    line = f"trajsft train demo: W&B: http://127.0.0.1:{server.server_port} refused the API key (HTTP 401)"
    assert line in out, out[-3000:]
    assert TRACEBACK not in out and "CommError" not in out.replace(line, "").split(line)[0]
    [a] = attempts(run_dir)  # one attempt: not retried
    assert a["outcome"] == "failed" and "refused the API key (HTTP 401)" in a["error"]
    took = (time.mktime(time.strptime(a["ended"][:19], "%Y-%m-%dT%H:%M:%S"))
            - time.mktime(time.strptime(a["started"][:19], "%Y-%m-%dT%H:%M:%S")))
    assert took < 30, a
    seen = requests_of(server, n0)
    assert seen and all(code == 401 for *_, code in seen if _[1].startswith(("/graphql", "/files"))), seen
    assert run_hash not in server.state["runs"]
    [row] = json.loads(cli(wd, wandb_env(server, tmp_path, BAD), "status", "demo", "--json").stdout)
    assert row["state"] == "failed" and "refused the API key" in row["cause"], row

    # 2. the right key; the trainer is killed after a checkpoint, as a preemption would
    env = wandb_env(server, tmp_path, GOOD)
    p = start(wd, "checkpoints/demo/done", config=OVER, log=wd / "run2.log", extra_env=env)
    [trainer] = wait_for(lambda: procs(p, "trajsft.train.train_lm_main"), 300, "train_lm to start", p)
    wb = wait_for(lambda: server.state["runs"].get(run_hash), 300, "the W&B run", p)
    wait_for(lambda: checkpoints.latest_checkpoint(ckpts) and wb["history"], 300, "a checkpoint and W&B rows", p)
    trainer.kill()
    assert p.wait(timeout=120) != 0
    killed_at = checkpoints.latest_checkpoint(ckpts)["completed_steps"]
    first = tracking.read_record(str(run_dir))
    logged_before = [h["_step"] for h in wb["history"]]
    assert first["id"] == run_hash and first["resumed"] is False and first["starting_step"] == 0
    assert logged_before == list(range(len(logged_before))), logged_before
    assert 0 < killed_at < 40

    # 3. the same command again: training resumes from the checkpoint and W&B continues the same run
    run(wd, "checkpoints/demo/done", config=OVER, extra_env=env)
    rec = tracking.read_record(str(run_dir))
    assert rec["id"] == run_hash and rec["resumed"] is True and rec["starting_step"] == logged_before[-1] + 1
    steps = [h["_step"] for h in wb["history"]]
    # the resumed run logs from where W&B and the checkpoint both are: nothing restarted at 0, nothing twice
    # (rows a SIGKILL caught before they were sent are lost, as on a preempted host)
    assert steps == logged_before + list(range(max(rec["starting_step"], killed_at), 40)), (steps, killed_at)
    assert len(logged_before) >= killed_at or steps != list(range(40))
    result = json.loads((run_dir / "training_result.json").read_text())
    assert result["resumed_from_step"] == killed_at
    by_step = {h["_step"]: h for h in wb["history"]}
    for s, loss in result["loss_history"]:  # the server holds the losses training logged
        if s in by_step:
            assert by_step[s]["train/loss"] == pytest.approx(loss, rel=1e-5), s
    assert wb["exitcode"] == 0 and list(server.state["runs"]) == [run_hash]
    assert wb["config"]["trajsft"]["value"] == {
        "target": "demo", "run": run_dir.name, "run_hash": run_hash,
        "inputs": [f"tokenized:{tok['name']}"]}
    assert rec["url"] == f"http://127.0.0.1:{server.server_port}/stub/sft/runs/{run_hash}"
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["wandb_url"] == rec["url"]
    [row] = json.loads(cli(wd, env, "status", "demo", "--json").stdout)
    assert row["state"] == "done" and row["wandb_url"] == rec["url"], row


# ---- the pieces, against the same server ------------------------------------------------------------------


def test_check_key_is_one_request_refused_unknown_or_unanswered(server):
    url = f"http://127.0.0.1:{server.server_port}"
    n0 = len(server.state["requests"])
    assert tracking.check_key(GOOD, url) == (None, None)
    problem, note = tracking.check_key(BAD, url)
    assert problem == (f"W&B at {url} refused WANDB_API_KEY (HTTP 401): fix the key, or set wandb.mode: offline")
    assert note is None
    assert [r[2:] for r in requests_of(server, n0)] == [["/graphql", "Viewer", 200], ["/graphql", "Viewer", 401]]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    problem, note = tracking.check_key(GOOD, dead, timeout_s=2)
    assert problem is None and note.startswith(f"W&B at {dead} did not answer (ConnectionError)")
    # a key the SDK itself refuses (a training host would stop on it) is refused without a request
    n1 = len(server.state["requests"])
    assert tracking.check_key("k" * 32, url) == (
        f"WANDB_API_KEY: API key must have 40+ characters, has 32. (the W&B SDK refuses it before asking {url})", None)
    assert len(server.state["requests"]) == n1


def test_causes_are_one_line_and_name_the_server():
    from wandb.errors import CommError

    env = {"WANDB_BASE_URL": "http://w:1/", "WANDB_INIT_TIMEOUT": "20"}
    refused = tracking.cause(CommError("Failed to get resume status for run x: returned error 401: {\n\"errors\": 1}"), env)
    assert refused.startswith("http://w:1 refused the API key (HTTP 401): check WANDB_API_KEY") and "\n" not in refused
    down = tracking.cause(CommError("Timed out while retrying: HTTP 503: unavailable"), env)
    assert down.startswith("http://w:1 did not answer wandb.init within WANDB_INIT_TIMEOUT=20s")
    from wandb.errors import AuthenticationError

    local = tracking.cause(AuthenticationError("WANDB_API_KEY invalid: API key must have 40+ characters, has 32."), env)
    assert local == ("the W&B SDK refused WANDB_API_KEY before asking http://w:1: WANDB_API_KEY invalid: API key "
                     "must have 40+ characters, has 32.")
    other = tracking.cause(ValueError("run id is in use\nby a deleted run"), env)
    assert other == "wandb.init failed at http://w:1: ValueError: run id is in use by a deleted run"
    log = "x\ntrajsft: W&B: first\nnoise\ntrajsft: W&B: second one\n"
    assert tracking.line_of(log) == "second one" and tracking.line_of("nothing") is None


def test_train_lm_children_get_bounded_waits_unless_the_user_set_them(monkeypatch):
    from trajsft.train.launch import levanter_env

    monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
    monkeypatch.setenv("WANDB_FINISH_TIMEOUT", "7")
    monkeypatch.setenv("WANDB_SERVICE", "3-1-unix-/tmp/wandb-1-2-3/socket")  # another process's wandb-core
    env = levanter_env("/tmp/x")
    assert env["WANDB_INIT_TIMEOUT"] == tracking.ENV_DEFAULTS["WANDB_INIT_TIMEOUT"] and env["WANDB_FINISH_TIMEOUT"] == "7"
    assert "WANDB_SERVICE" not in env  # its own service: never "run ID ... is in use" in a shared one


def test_the_run_identity_is_the_target_the_run_and_its_inputs():
    cfg = {"trainer": {"id": "abc123", "checkpointer": {"base_path": "gs://b/trajsft/checkpoints/demo-abc123/checkpoints"},
                       "tracker": [{"type": "wandb", "tags": ["demo", "tokenized:demo-f350", "models:qwen-1a2b"]},
                                   {"type": "json_logger"}]}}
    assert tracking.run_identity(cfg) == {"target": "demo", "run": "demo-abc123", "run_hash": "abc123",
                                          "inputs": ["models:qwen-1a2b", "tokenized:demo-f350"]}
    assert json.loads(tracking.child_env(cfg)[tracking.CONFIG_ENV])["run_hash"] == "abc123"


# ---- outages, with the real SDK and Levanter's tracker in a child ------------------------------------------

CHILD = """
import os, sys, time
import wandb
from levanter.tracker.wandb import WandbConfig
from trajsft.train import tracking
tracking.guard_init()
print("init at", time.time(), flush=True)
t = WandbConfig(project="sft", id="outage-" + sys.argv[1], mode="online", save_code=False).init(None)
print("started", flush=True)
if sys.argv[1] == "after":
    open(os.environ["GO_DOWN"], "w").close()
    time.sleep(1.5)
    for i in range(5):
        t.log({"loss": 1.0 / (i + 1)}, step=i)
    print("logged", flush=True)
    t.finish()
print("finished", flush=True)
"""


def _child(server, tmp_path, which: str, extra: dict) -> tuple[subprocess.CompletedProcess, float]:
    """The child's run, and the seconds from its wandb.init to its exit (its imports, slow on a loaded machine,
    are not what the bounds are about)."""
    from trajsft.train.launch import levanter_env

    env = levanter_env(str(tmp_path), {**wandb_env(server, tmp_path, GOOD), "JAX_PLATFORMS": "cpu", **extra})
    p = subprocess.run([sys.executable, "-c", CHILD, which], env=env, capture_output=True, text=True, timeout=240,
                       cwd=tmp_path)
    ended = time.time()
    [at] = [float(ln.split()[-1]) for ln in p.stdout.splitlines() if ln.startswith("init at ")]
    return p, ended - at


@pytest.mark.integration
def test_an_outage_at_start_is_one_line_in_seconds_and_after_start_never_stops_training(server, tmp_path):
    # W&B down when training starts: the child's one line and the configuration-error exit, bounded by the
    # default init timeout (the measured 100 s without it)
    server.fail = 503
    try:
        p, took = _child(server, tmp_path, "start", {})
    finally:
        server.fail = None
    assert p.returncode == tracking.EXIT_CODE, p.stderr[-2000:]
    [line] = [ln for ln in p.stderr.splitlines() if ln.startswith(tracking.MARK)]
    assert f"did not answer wandb.init within WANDB_INIT_TIMEOUT={tracking.ENV_DEFAULTS['WANDB_INIT_TIMEOUT']}s" in line
    assert TRACEBACK not in p.stderr and "started" not in p.stdout
    assert took < int(tracking.ENV_DEFAULTS["WANDB_INIT_TIMEOUT"]) + 25, took

    # W&B goes down after the run started: logging goes on, and the finish gives up after WANDB_FINISH_TIMEOUT
    go_down = tmp_path / "down"
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if go_down.exists():
                server.fail = 503
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    try:
        p, took = _child(server, tmp_path, "after", {"GO_DOWN": str(go_down), "WANDB_FINISH_TIMEOUT": "5"})
    finally:
        stop.set()
        server.fail = None
    said = [ln for ln in p.stdout.splitlines() if not ln.startswith("init at ")]
    assert p.returncode == 0 and said == ["started", "logged", "finished"], (p.stdout, p.stderr[-2000:])
    assert took < 60, took
    assert "outage-after" in server.state["runs"]


def test_preflight_asks_wandb_once_and_a_refused_key_is_one_line(server, tmp_path):
    url = f"http://127.0.0.1:{server.server_port}"
    (tmp_path / "test-overrides.yaml").write_text(json.dumps({"wandb": {"mode": "online"}}))
    n0 = len(server.state["requests"])
    p = cli(tmp_path, wandb_env(server, tmp_path, BAD), "preflight")
    assert p.returncode == 1 and p.stderr.splitlines() == [
        f"trajsft preflight: W&B at {url} refused WANDB_API_KEY (HTTP 401): fix the key, or set wandb.mode: offline"]
    p = cli(tmp_path, wandb_env(server, tmp_path, GOOD), "preflight")
    assert p.returncode == 0 and p.stdout.splitlines()[0] == "local executor: storage root writable, W&B online", p.stderr
    assert [r[2:] for r in requests_of(server, n0)] == [["/graphql", "Viewer", 401], ["/graphql", "Viewer", 200]]


def test_a_cluster_submission_is_refused_before_anything_when_wandb_refuses_the_key(server, tmp_path, monkeypatch):
    from trajsft.cluster import submit
    from trajsft.plan import config as C

    for k, v in wandb_env(server, tmp_path, BAD).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_TOKEN", "x")
    dead = f"http://127.0.0.1:{free_port()}"  # a head that does not answer
    cfg = C.load(overrides={"executor": "ray", "wandb": {"mode": "online"}, "storage_root": str(tmp_path / "r"),
                            "ray": {"address": dead, "tpu_type": "v5p-8"}})
    problems = submit.preflight(cfg, [])
    assert f"W&B at http://127.0.0.1:{server.server_port} refused WANDB_API_KEY (HTTP 401): fix the key, or set " \
           "wandb.mode: offline" in problems, problems
    monkeypatch.setenv("WANDB_API_KEY", GOOD)
    assert not [p for p in submit.preflight(cfg, []) if "W&B" in p]
