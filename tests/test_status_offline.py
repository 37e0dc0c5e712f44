"""`trajsft status --profile tpu-east5` when the bucket does not answer or refuses us, and the head is down:
the table at once, each row saying which, no traceback and no retry storm. The bucket is a real HTTP endpoint
on loopback (nothing listening, or a server answering 403 to everything: fake-gcs-server checks no
credentials), reached through gcsfs' STORAGE_EMULATOR_HOST as a TPU VM reaches GCS.

Every command runs in a working directory of its own (``wd``): what a user's runs left in the checkout
(the demo's ``checkpoints/demo/done``, ``results/``) is not what these tests read."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trajsft.observe.status_row import Facts, row

REPO = Path(__file__).resolve().parents[1]
TARGETS = 6  # the default config's teachers and mixtures


@pytest.fixture
def wd(tmp_path) -> Path:
    """The commands' working directory: empty, as a fresh clone's (the config is the repository's)."""
    d = tmp_path / "wd"
    d.mkdir()
    return d


def _status(endpoint: str, wd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORAGE_EMULATOR", "RAY_ADDRESS"))}
    env["STORAGE_EMULATOR_HOST"] = endpoint
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "status", "--profile", "tpu-east5"], env=env,
                       capture_output=True, text=True, cwd=wd, timeout=300)
    return p, time.monotonic() - t0


def _rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["TARGET", "STATE"], out
    return [ln.split() for ln in lines[1:1 + TARGETS]]


def test_a_bucket_that_does_not_answer_is_said_per_row_at_once(wd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    p, took = _status(dead, wd)
    assert p.returncode == 0 and "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    assert all(r[1] == "unknown" for r in _rows(p.stdout)), p.stdout
    causes = [ln for ln in p.stdout.splitlines() if ": cause: " in ln]
    assert len(causes) == TARGETS and all(
        "storage root gs://marin-us-east5/trajsft did not answer" in c and "cluster not reachable" in c for c in causes)
    assert took < 60, took  # measured: about 1 s; gcsfs alone retries a dead endpoint for about a minute


class Refusing:
    def __init__(self):
        self.requests = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def _deny(self):
                outer.requests += 1
                body = b'{"error": {"code": 403, "message": "caller does not have storage.objects.list access"}}'
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _deny

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def refusing():
    r = Refusing()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_a_bucket_that_refuses_the_credentials_is_said_per_row_without_retries(refusing, wd):
    p, took = _status(refusing.endpoint, wd)
    assert p.returncode == 0 and "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    assert all(r[1] == "unknown" for r in _rows(p.stdout)), p.stdout
    causes = [ln for ln in p.stdout.splitlines() if ": cause: " in ln]
    assert len(causes) == TARGETS and all("refused the request: Forbidden" in c for c in causes), causes
    assert refusing.requests <= 2 * TARGETS, refusing.requests  # one look per target: nothing retried
    assert took < 60, took


def test_the_row_of_an_unreadable_run_dir_is_unknown_and_says_why():
    f = Facts(target="demo", hash="h", run="demo-h", cluster="east5", checkpoint_dir="gs://b/run", log="/l",
              storage_error="storage root gs://b did not answer", cluster_error="refused")
    r = row(f)
    assert (r["state"], r["cause"]) == ("unknown", "storage root gs://b did not answer; cluster not reachable: refused")
    done = row(Facts(target="demo", hash="h", run="demo-h", cluster="east5", checkpoint_dir="gs://b/run", log="/l",
                     storage_error="x", done={"hash": "h", "steps": 3}))
    assert (done["state"], done["step"]) == ("done", 3)  # the local done marker decides; the bucket is not needed


def test_plan_and_logs_say_which_in_one_go(refusing, wd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORAGE_EMULATOR")}
    env["STORAGE_EMULATOR_HOST"] = refusing.endpoint
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "demo", "--profile", "tpu-east5"], env=env,
                       capture_output=True, text=True, cwd=wd, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    marks = [ln for ln in p.stdout.splitlines() if "gs://marin-us-east5/trajsft/" in ln and "[" in ln]
    assert marks and all("gs://marin-us-east5/trajsft refused: Forbidden" in ln for ln in marks), p.stdout
    assert refusing.requests <= 2  # refused once for the whole plan, not once per artifact
    # the profile's head is down (nothing on 127.0.0.1:8265 here): logs names the command that opens the tunnel
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "logs", "demo", "--profile", "tpu-east5"], env=env,
                       capture_output=True, text=True, cwd=wd, timeout=300)
    [line] = p.stderr.strip().splitlines()
    assert p.returncode == 1 and line.startswith("trajsft logs: cannot use Ray at http://127.0.0.1:8265")
    assert line.endswith("open the tunnel to the head first: ray dashboard infra/marin-us-east5-a.yaml")


def test_preflight_says_the_bucket_refused_and_the_head_is_down_in_two_lines(refusing, wd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORAGE_EMULATOR")}
    env.update(STORAGE_EMULATOR_HOST=refusing.endpoint, HF_TOKEN="x", WANDB_API_KEY="y" * 40)
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "preflight", "--profile", "tpu-east5"], env=env,
                       capture_output=True, text=True, cwd=wd, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 2 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("trajsft preflight: unreachable: Ray dashboard http://127.0.0.1:8265 unreachable")
    assert lines[1].startswith("trajsft preflight: storage root gs://marin-us-east5/trajsft is not writable: ")
    assert "Forbidden" in lines[1] and refusing.requests == 1


def test_a_head_that_refuses_the_token_is_said_per_row(refusing, tmp_path, wd):
    """The head answers, but 403 to everything (a wrong RAY_AUTH_TOKEN): the table, the cause, no traceback."""
    import yaml

    over = tmp_path / "head.yaml"
    over.write_text(yaml.safe_dump({"ray": {"address": refusing.endpoint}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORAGE_EMULATOR")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{s.getsockname()[1]}"
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "status", "--profile", "tpu-east5", "--configfile",
                        str(over)], env=env, capture_output=True, text=True, cwd=wd, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    causes = [ln for ln in p.stdout.splitlines() if ": cause: " in ln]
    assert len(causes) == TARGETS and all("cluster not reachable" in c and "403" in c for c in causes), causes
    assert refusing.requests <= TARGETS  # asked once per row, never retried


def _dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_eval_says_a_dead_or_refusing_bucket_in_one_line(refusing, wd):
    """The matrix reads the targets' checkpoints in the bucket: it is asked once, and said in one line."""
    for endpoint, said in ((_dead_endpoint(), "did not answer (no network"), (refusing.endpoint, "refused: Forbidden")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STORAGE_EMULATOR")}
        env["STORAGE_EMULATOR_HOST"] = endpoint
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "trajsft.cli", "eval", "demo", "--profile", "tpu-east5"], env=env,
                           capture_output=True, text=True, cwd=wd, timeout=300)
        [line] = p.stderr.strip().splitlines()
        assert p.returncode == 2 and line.startswith(f"trajsft: storage root gs://marin-us-east5/trajsft {said}"), p.stderr
        assert time.monotonic() - t0 < 60
    assert refusing.requests <= 2  # one look (gcsfs asks for the object, then for its listing): nothing retried


def test_fit_says_the_snapshot_bucket_refused_in_its_facts_line(refusing, monkeypatch):
    """`trajsft fit` compiles without the bucket; the student's snapshot there (its config.json) is read for the
    architecture check: a refusal is said in that line, not raised as gcsfs' traceback."""
    from gcs_fixtures import clear_fsspec_cache
    from trajsft import storage
    from trajsft.fit import facts
    from trajsft.plan import config as C
    from trajsft.plan import step_configs

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", refusing.endpoint)
    monkeypatch.setattr(storage, "_REACHABLE", {})
    monkeypatch.setattr(storage, "_REFUSED", {})
    clear_fsspec_cache()
    try:
        plan = C.Plan(C.load([C.DEFAULT_CONFIG, str(REPO / "profiles/tpu-east5/cluster.yaml")]), base_dir=C.REPO_DIR)
        snapshot = step_configs.train(plan, "minimax-m2.5").model.location
        assert snapshot.startswith("gs://marin-us-east5/trajsft/models/")
        line = facts.check(plan.specs.targets["minimax-m2.5"].student, fetch=lambda ref, rev: None, snapshot=snapshot)
    finally:
        clear_fsspec_cache()
    assert line.startswith("not checked: ") and "its snapshot's bucket refused: Forbidden" in line, line
    assert refusing.requests <= 2


def _local_demo_run(wd: Path) -> str:
    """The done marker and kept run manifest a local demo run writes (fields as train writes them), in ``wd``;
    its run hash (the same under every profile: the storage root is cosmetic)."""
    import json

    from trajsft.plan import config as C
    from trajsft.plan import step_configs

    run = step_configs.train(C.Plan(C.load([C.DEFAULT_CONFIG]), base_dir=C.REPO_DIR), "demo").run
    assert not run.location.startswith("gs://")
    rec = {"attempts": 1, "checkpoint_dir": run.location, "cluster": "local", "executor": "local", "final_loss": 3.12,
           "finished": "2026-11-29T06:01:57+00:00", "hash": run.hash, "hf_export": str(wd / run.location / "hf/step-24"),
           "run": run.name, "steps": 25, "target": "demo", "wandb_mode": "offline", "wandb_url": None}
    for path in (wd / "checkpoints/demo/done", wd / "results/checkpoints" / run.name / "manifest.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec))
    (wd / "results/checkpoints" / run.name / "train.log").write_text(
        '{"step": 24, "train/loss": 3.12}\n')  # the local run's log: not this profile's run's progress
    return run.hash


def test_a_local_runs_marker_is_not_done_under_a_ray_profile_and_says_where_it_finished(wd):
    """The run's hash is the same under every profile, its payload is not: under tpu-east5 the demo that finished
    locally is not done (Snakemake trains it again into the profile's bucket), and the row says where it did finish;
    without a profile it is done."""
    h = _local_demo_run(wd)
    p, _ = _status(_dead_endpoint(), wd)
    assert p.returncode == 0 and "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    [demo] = [r for r in _rows(p.stdout) if r[0] == "demo"]
    assert demo[1] == "unknown" and demo[2] == h and "25/25" not in p.stdout, p.stdout
    [where] = [ln for ln in p.stdout.splitlines() if "this config finished as" in ln]
    assert where.startswith(f"  demo: this config finished as demo-{h} in results/checkpoints/demo-{h} (cluster local")
    assert where.endswith(f"not in this row's gs://marin-us-east5/trajsft/checkpoints/demo-{h}"), where
    local = subprocess.run([sys.executable, "-m", "trajsft.cli", "status"], capture_output=True, text=True, cwd=wd,
                           timeout=300)
    [demo] = [r for r in _rows(local.stdout) if r[0] == "demo"]
    assert demo[:3] == ["demo", "done", h] and "this config finished as" not in local.stdout, local.stdout
    plan = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "demo", "--profile", "tpu-east5", "--offline"],
                          capture_output=True, text=True, cwd=wd, timeout=300).stdout
    assert plan.splitlines()[0] == ("demo:  checkpoints/demo/done  [not done here: checkpoints/demo/done is of this "
                                    f"config's run in results/checkpoints/demo-{h}]"), plan
