"""Tests for the Ray job client (trajsft.cluster: jobs, follow, secrets, run_job, preflight) against a real local Ray head (see ray_fixtures)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from ray_fixtures import ray_client_env, ray_head  # noqa: F401  (pytest fixtures)
from trajsft.cluster import follow
from trajsft.cluster import jobs as cluster_jobs
from trajsft.cluster import preflight as cluster_preflight
from trajsft.cluster import run_job
from trajsft.cluster import secrets as cluster_secrets

PY = "python"  # resolved on the head's PATH (ray_fixtures puts the venv first)


def _uid() -> str:
    return uuid.uuid4().hex[:12]


def _wait_status(address, job_id, want, timeout=60.0, token=None):
    conn = cluster_jobs.Conn(address, token)
    deadline = time.monotonic() + timeout
    st = None
    while time.monotonic() < deadline:
        st = conn.status(job_id)
        if st in want:
            return st
        time.sleep(0.2)
    raise AssertionError(f"{job_id} still {st}, wanted {want}")


def _py(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


# --------------------------------------------------------------------------- unit tests


def test_submission_id_is_deterministic():
    assert cluster_jobs.submission_id("abc123", 0) == "trajsft-abc123-a0"
    assert cluster_jobs.submission_id("abc123", 7) == cluster_jobs.submission_id("abc123", 7)
    assert cluster_jobs.submission_id("abc123", 1) != cluster_jobs.submission_id("abc123", 2)
    for bad_hash in ("", "a b", "../x", None):
        with pytest.raises(ValueError):
            cluster_jobs.submission_id(bad_hash, 0)
    for bad_attempt in (-1, 1.5, True):
        with pytest.raises(ValueError):
            cluster_jobs.submission_id("abc", bad_attempt)


def test_normalize_address():
    assert cluster_jobs.normalize_address("127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert cluster_jobs.normalize_address("http://h:1/") == "http://h:1"
    assert cluster_jobs.normalize_address("https://ray.example") == "https://ray.example:8265"
    with pytest.raises(ValueError):
        cluster_jobs.normalize_address("ray://h:10001")


def test_resolve_auth_token_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    assert cluster_jobs.resolve_auth_token() is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("fromdefault\n")
    assert cluster_jobs.resolve_auth_token() == "fromdefault"
    f = tmp_path / "tok"
    f.write_text("frompath\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(f))
    assert cluster_jobs.resolve_auth_token() == "frompath"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "fromenv")
    assert cluster_jobs.resolve_auth_token() == "fromenv"
    assert cluster_jobs.resolve_auth_token("explicit") == "explicit"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert cluster_jobs.resolve_auth_token() is None
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    with pytest.raises(cluster_jobs.ClusterUnauthorized):
        cluster_jobs.resolve_auth_token()


def test_log_writer_dedup_partial_lines_and_redaction(tmp_path):
    log = tmp_path / "job.log"
    w = follow.LogWriter(log, "job@1", {"HF_TOKEN": "s3cr3tvalue"})
    pos = w.feed(0, "a\nb")  # "b" is held back until its newline
    pos = w.feed(pos, "\nkey=s3cr3tvalue\n")
    w.close()
    assert log.read_text() == "a\nb\nkey=<redacted:HF_TOKEN>\n"
    # Re-attach: the stream is replayed from the start; only new text is appended.
    w = follow.LogWriter(log, "job@1", {"HF_TOKEN": "s3cr3tvalue"})
    assert w.committed == len("a\nb\nkey=s3cr3tvalue\n")
    pos = w.feed(0, "a\nb\nkey=s3cr3tvalue\nc\n")
    w.feed(0, "a\nb\nkey=s3cr3tvalue\nc\nd")  # polling style (full text again)
    w.finish()
    w.close()
    assert log.read_text() == "a\nb\nkey=<redacted:HF_TOKEN>\nc\nd"
    # Another job (or the same id on a restarted cluster) starts at 0.
    w = follow.LogWriter(log, "job@2", None)
    assert w.committed == 0
    w.close()


def test_log_writer_cuts_unrecorded_tail_after_crash(tmp_path):
    log = tmp_path / "job.log"
    w = follow.LogWriter(log, "job@1", None)
    w.marker("start")
    w.feed(0, "one\ntwo\n")
    w.close()
    good = log.read_bytes()
    with open(log, "a") as f:  # written, but killed before the sidecar update
        f.write("three\n")
    w = follow.LogWriter(log, "job@1", None)
    assert log.read_bytes() == good
    w.feed(0, "one\ntwo\nthree\nfour\n")
    w.close()
    assert log.read_text() == "[trajsft] start\none\ntwo\nthree\nfour\n"


def test_secret_names_are_moved_out_of_runtime_env(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hfvalue")
    renv = {"env_vars": {"WANDB_API_KEY": "wv", "PLAIN": "1"}, "pip": []}
    got = cluster_secrets.collect_secrets(["HF_TOKEN"], renv)
    assert got == {"HF_TOKEN": "hfvalue", "WANDB_API_KEY": "wv"}
    assert renv["env_vars"] == {"PLAIN": "1"}
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ValueError, match="export HF_TOKEN"):
        cluster_secrets.collect_secrets(["HF_TOKEN"], {})
    with pytest.raises(ValueError, match="HF_TOKEN") as ei:
        cluster_secrets.assert_not_leaked({"HF_TOKEN": "hfvalue"}, entrypoint="echo hfvalue")
    assert "hfvalue" not in str(ei.value)


def test_secret_bundles_get_distinct_package_uris():
    from ray._private.runtime_env.packaging import get_uri_for_directory

    uris, names = set(), set()
    for _ in range(2):
        with cluster_secrets.secret_bundle({"HF_TOKEN": "same"}) as (name, path):
            assert oct(Path(path, "secrets.json").stat().st_mode & 0o777) == "0o600"
            uris.add(get_uri_for_directory(path, include_gitignore=True))
            names.add(name)
        assert not Path(path).exists()  # deleted right away
    assert len(uris) == 2 and len(names) == 2


def test_preflight_unreachable_is_fast_and_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    probs = cluster_preflight.preflight(f"http://127.0.0.1:{port}", [], {"TPU": 1}, str(tmp_path))
    assert time.monotonic() - t0 < 6
    assert len(probs) == 1, probs
    assert "unreachable" in probs[0] and "refused" in probs[0] and "\n" not in probs[0]
    summary = cluster_preflight.cluster_summary(f"127.0.0.1:{port}")
    assert summary["reachable"] is False and "refused" in summary["error"]


def test_preflight_unwritable_storage_root(tmp_path, monkeypatch):
    f = tmp_path / "a-file"
    f.write_text("x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probs = cluster_preflight.preflight(f"http://127.0.0.1:{port}", [], {}, str(f / "sub"))
    storage = [p for p in probs if "storage root" in p]
    assert len(storage) == 1 and "not writable" in storage[0]


# --------------------------------------------------------------------------- cluster tests



@pytest.mark.integration
@pytest.mark.timeout(120)
def test_success_with_custom_resource_logs_and_attach(ray_head, tmp_path):  # noqa: F811
    tok = ray_head.token
    sid = cluster_jobs.submission_id(_uid(), 0)
    ep = _py("import time\nfor i in range(8):\n    print('line', i, flush=True)\n    time.sleep(0.7)\nprint('DONE')")
    job_id, attached = cluster_jobs.submit_or_attach(
        ray_head.address, ep, sid, None, {"TPU-v5p-32-head": 1}, {"purpose": "test"}, None, auth_token=tok
    )
    assert (job_id, attached) == (sid, False)
    # Same id again -> attach, no duplicate.
    job_id2, attached2 = cluster_jobs.submit_or_attach(
        ray_head.address, ep, sid, None, {"TPU-v5p-32-head": 1}, None, None, auth_token=tok
    )
    assert (job_id2, attached2) == (sid, True)
    conn = cluster_jobs.Conn(ray_head.address, tok)
    assert [j.submission_id for j in conn.client.list_jobs()].count(sid) == 1
    assert conn.job_info(sid).metadata["purpose"] == "test"

    log = tmp_path / "logs" / "train.log"

    # Follow until 'line 1' arrived, then drop out (as if the pipeline died)...
    def seen_line1() -> bool:
        return log.exists() and "line 1\n" in log.read_text()

    with pytest.raises(cluster_jobs.FollowInterrupted):
        follow.follow(ray_head.address, sid, log, 0.3, should_stop=seen_line1, auth_token=tok)
    # ... and re-attach: no line may be duplicated.
    assert follow.follow(ray_head.address, sid, log, 0.3, auth_token=tok) == "SUCCEEDED"
    text = log.read_text()
    assert text.count("[trajsft] following Ray job") == 2
    for i in range(8):
        assert text.count(f"line {i}\n") == 1, text
    assert "DONE\n" in text
    assert text.count("Running entrypoint for job") == 1
    # Following a finished job again writes nothing new but the markers.
    assert follow.follow(ray_head.address, sid, log, 0.3, auth_token=tok) == "SUCCEEDED"
    assert log.read_text().count("line 0\n") == 1
    # submit_or_attach reports a SUCCEEDED job as attached.
    assert cluster_jobs.submit_or_attach(ray_head.address, ep, sid, auth_token=tok) == (sid, True)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_stop_and_cluster_summary(ray_client_env, tmp_path):  # noqa: F811
    head = ray_client_env  # token comes from RAY_AUTH_TOKEN in the environment here
    sid = cluster_jobs.submission_id(_uid(), 0)
    cluster_jobs.submit_or_attach(head.address, _py("import time\nprint('started', flush=True)\ntime.sleep(600)"),
                        sid, entrypoint_resources={"TPU": 1})
    _wait_status(head.address, sid, {"RUNNING"})
    deadline = time.monotonic() + 20  # resource usage comes from a periodic report
    while True:
        s = cluster_preflight.cluster_summary(head.address)
        if s["tpu"].get("TPU", {}).get("free") == 3.0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert s["reachable"] and s["authenticated"] and s["error"] is None
    assert sid in s["jobs"]["ours_running"] and sid in s["jobs"]["running"]
    assert s["tpu"]["TPU"] == {"total": 4.0, "free": 3.0}
    assert s["tpu"]["TPU-v5p-32-head"]["total"] == 2.0
    t0 = time.monotonic()
    assert cluster_jobs.stop(head.address, sid, wait_s=60) == "STOPPED"
    stop_s = time.monotonic() - t0
    assert follow.follow(head.address, sid, tmp_path / "stopped.log", 0.3) == "STOPPED"
    assert "started" in (tmp_path / "stopped.log").read_text()
    s = cluster_preflight.cluster_summary(head.address)
    assert sid not in s["jobs"]["ours_running"]
    print(f"stop took {stop_s:.1f}s")
    # A job needing a resource the cluster lacks stays PENDING.
    sid2 = cluster_jobs.submission_id(_uid(), 0)
    cluster_jobs.submit_or_attach(head.address, "echo never", sid2, entrypoint_resources={"TPU-v4-8-head": 1})
    time.sleep(2)
    assert cluster_jobs.Conn(head.address).status(sid2) == "PENDING"
    assert sid2 in cluster_preflight.cluster_summary(head.address)["jobs"]["ours_pending"]
    # Documented Ray behaviour: the stop is queued until the job gets scheduled.
    assert cluster_jobs.stop(head.address, sid2, wait_s=2) == "PENDING"


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_failed_job_then_next_attempt(ray_head, tmp_path):  # noqa: F811
    tok = ray_head.token
    h = _uid()
    marker = tmp_path / "ran-once"
    ep = f"if [ -f {marker} ]; then echo second-run-ok; else touch {marker}; echo first-run-fails; exit 1; fi"
    sid0 = cluster_jobs.submission_id(h, 0)
    cluster_jobs.submit_or_attach(ray_head.address, ep, sid0, entrypoint_resources={"TPU": 1}, auth_token=tok)
    log = tmp_path / "run.log"
    assert follow.follow(ray_head.address, sid0, log, 0.3, auth_token=tok) == "FAILED"
    with pytest.raises(cluster_jobs.JobAlreadyTerminal) as ei:
        cluster_jobs.submit_or_attach(ray_head.address, ep, sid0, auth_token=tok)
    assert ei.value.status == "FAILED"
    # run_job skips the FAILED attempt and submits a1.
    res = run_job.run_job(ray_head.address, ep, h, log, entrypoint_resources={"TPU": 1}, poll_s=0.3,
                     auth_token=tok, handle_signals=False)
    assert (res.job_id, res.status, res.attempt, res.attached) == (cluster_jobs.submission_id(h, 1), "SUCCEEDED", 1, False)
    text = log.read_text()
    assert "first-run-fails" in text and "second-run-ok" in text
    # A job that exits non-zero -> JobFailed from run_job.
    with pytest.raises(cluster_jobs.JobFailed) as ei:
        run_job.run_job(ray_head.address, "echo about-to-fail; exit 3", _uid(), tmp_path / "fail.log",
                   entrypoint_resources={"TPU": 1}, poll_s=0.3, auth_token=tok, handle_signals=False)
    assert ei.value.status == "FAILED"
    assert "about-to-fail" in (tmp_path / "fail.log").read_text()


# the train rule's process as far as the Ray job goes: run_job, and 128 + the signal when interrupted
RUN_CHILD = """
import logging, sys
from trajsft.cluster.jobs import JobInterrupted
from trajsft.cluster.run_job import run_job
logging.basicConfig(level=logging.INFO)
address, content_hash, log, entrypoint = sys.argv[1:5]
try:
    run_job(address, entrypoint, content_hash, log, entrypoint_resources={"TPU": 1.0}, poll_s=0.3)
except JobInterrupted as e:
    sys.exit(128 + e.signum)
"""


def _start_run_child(head, h, log):
    env = {**os.environ, **head.client_env()}
    code = "import time\nfor i in range(10000):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"
    return subprocess.Popen(
        [sys.executable, "-c", RUN_CHILD, head.address, h, str(log), _py(code)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )


def _wait_log(child, log, needle, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (log.exists() and needle in log.read_text()):
        assert child.poll() is None, child.stdout.read().decode()
        assert time.monotonic() < deadline, f"{needle!r} never appeared in {log}"
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_job_child_reattach_then_signal_stops_ray_job(ray_head, tmp_path, sig):  # noqa: F811
    h = _uid()
    sid = cluster_jobs.submission_id(h, 0)
    log = tmp_path / "child.log"
    conn = cluster_jobs.Conn(ray_head.address, ray_head.token)
    children = []
    try:
        # 1) The pipeline process dies hard: the Ray job keeps running.
        a = _start_run_child(ray_head, h, log)
        children.append(a)
        _wait_log(a, log, "tick 1\n")
        a.kill()
        a.wait()
        assert conn.status(sid) == "RUNNING"
        # 2) Re-running the rule re-attaches (no second job) and resumes the log.
        b = _start_run_child(ray_head, h, log)
        children.append(b)
        n_before = log.read_text().count("tick ")
        _wait_log(b, log, "resuming at log char")
        deadline = time.monotonic() + 30
        while log.read_text().count("tick ") < n_before + 3:
            assert time.monotonic() < deadline and b.poll() is None
            time.sleep(0.2)
        # 3) Ctrl-C / SIGTERM: the Ray job is stopped before we exit non-zero.
        b.send_signal(sig)
        out, _ = b.communicate(timeout=90)
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    assert b.returncode == 128 + sig, out.decode()
    assert conn.status(sid) == "STOPPED"
    assert [j.submission_id for j in conn.list_jobs()].count(sid) == 1
    assert conn.job_info(cluster_jobs.submission_id(h, 1)) is None
    text = log.read_text()
    assert f"stopped on {signal.Signals(sig).name}: STOPPED" in text
    ticks = [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]
    assert ticks == list(range(len(ticks))), ticks  # nothing lost, nothing duplicated
    assert text.count("Running entrypoint for job") == 1


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_preflight_against_cluster(ray_head, tmp_path, monkeypatch):  # noqa: F811
    tok = ray_head.token
    addr = ray_head.address
    monkeypatch.setenv("TRAJSFT_TEST_PRESENT", "1")
    monkeypatch.delenv("TRAJSFT_TEST_MISSING", raising=False)
    store = str(tmp_path / "store")
    res = {"TPU-v5p-32-head": 1, "TPU": 4}
    assert cluster_preflight.preflight(addr, ["TRAJSFT_TEST_PRESENT"], res, store, auth_token=tok) == []
    assert list(tmp_path.iterdir()) == []  # probe object removed, in the dir the root would be made in (none made)
    # the real head says where its nodes run (this machine), as trajsft asks before refusing local paths
    assert cluster_preflight.nodes_on_this_machine(addr, auth_token=tok) is True

    probs = cluster_preflight.preflight(addr, ["TRAJSFT_TEST_PRESENT", "TRAJSFT_TEST_MISSING"], res, store, auth_token=tok)
    assert len(probs) == 1 and "TRAJSFT_TEST_MISSING" in probs[0] and "export TRAJSFT_TEST_MISSING=" in probs[0]

    # no live slice of that type (autoscaler at min_workers 0, or right after a preemption): a note, not a problem
    notes: list[str] = []
    assert cluster_preflight.preflight(addr, [], {"TPU-v4-8-head": 1}, store, auth_token=tok, notes=notes) == []
    assert len(notes) == 1 and "no live TPU-v4-8-head" in notes[0] and "waiting for a slice" in notes[0]
    notes = []
    assert cluster_preflight.preflight(addr, [], {"TPU": 8}, store, auth_token=tok, notes=notes) == []
    assert len(notes) == 1 and "waiting for a slice" in notes[0]

    (tmp_path / "file").write_text("")
    probs = cluster_preflight.preflight(addr, [], res, str(tmp_path / "file" / "sub"), auth_token=tok)
    assert len(probs) == 1 and "not writable" in probs[0]

    if ray_head.auth_mode == "token":
        probs = cluster_preflight.preflight(addr, [], res, store, auth_token="wrong-token")
        assert len(probs) == 1 and "rejected the auth token" in probs[0], probs
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # -> we send no token
        probs = cluster_preflight.preflight(addr, [], res, store)
        assert len(probs) == 1 and "requires token auth" in probs[0] and "RAY_AUTH_TOKEN" in probs[0], probs
        monkeypatch.delenv("RAY_AUTH_MODE")
        # Token from a file via RAY_AUTH_TOKEN_PATH.
        tf = tmp_path / "tokfile"
        tf.write_text(tok + "\n")
        monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tf))
        assert cluster_preflight.preflight(addr, [], res, store) == []


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_secrets_reach_job_but_are_not_leaked(ray_head, tmp_path, monkeypatch):  # noqa: F811
    tok = ray_head.token
    hf = "hf_" + secrets.token_hex(20)
    wb = secrets.token_hex(20)
    extra = "xt_" + secrets.token_hex(20)  # secret-looking name given via runtime_env
    monkeypatch.setenv("HF_TOKEN", hf)
    monkeypatch.setenv("WANDB_API_KEY", wb)

    def h(v):
        return hashlib.sha256(v.encode()).hexdigest()

    code = (
        "import os, hashlib\n"
        "h = lambda k: hashlib.sha256(os.environ.get(k, '').encode()).hexdigest()\n"
        f"print('HF', 'ok' if h('HF_TOKEN') == '{h(hf)}' else 'bad')\n"
        f"print('WANDB', 'ok' if h('WANDB_API_KEY') == '{h(wb)}' else 'bad')\n"
        f"print('EXTRA', 'ok' if h('EXTRA_TOKEN') == '{h(extra)}' else 'bad')\n"
        "print('PLAIN', os.environ.get('PLAIN_SETTING'))\n"
        "import json; cfg = json.loads(os.environ['RAY_JOB_CONFIG_JSON_ENV_VAR'])\n"
        "print('BUNDLE_IN_JOB_CONFIG', 'py_modules' in cfg.get('runtime_env', {}))\n"
    )
    log = tmp_path / "secret-job.log"
    h_ = _uid()
    res = run_job.run_job(
        ray_head.address, _py(code), h_, log,
        runtime_env={"env_vars": {"EXTRA_TOKEN": extra, "PLAIN_SETTING": "visible"}},
        entrypoint_resources={"TPU": 1}, env_vars=["HF_TOKEN", "WANDB_API_KEY"],
        poll_s=0.3, auth_token=tok, handle_signals=False,
    )
    assert res.status == "SUCCEEDED"
    text = log.read_text()
    for line in ("HF ok", "WANDB ok", "EXTRA ok", "PLAIN visible", "BUNDLE_IN_JOB_CONFIG False"):
        assert line in text, text

    conn = cluster_jobs.Conn(ray_head.address, tok)
    hdr = {"Authorization": f"Bearer {tok}"} if tok else {}
    exposed = [
        repr(conn.job_info(res.job_id)),
        repr(conn.client.list_jobs()),
        conn.client.get_job_logs(res.job_id),
    ]
    for path in ("/api/jobs/", f"/api/jobs/{res.job_id}", f"/api/jobs/{res.job_id}/logs",
                 "/api/v0/actors?detail=true", "/api/v0/tasks?detail=true",
                 "/api/v0/runtime_envs?detail=true", "/api/v0/jobs"):
        r = requests.get(ray_head.address + path, headers=hdr, timeout=10)
        assert r.status_code == 200, (path, r.status_code)
        exposed.append(r.text)
    info = conn.job_info(res.job_id)
    assert info.metadata["trajsft_forwarded_env"] == "EXTRA_TOKEN,HF_TOKEN,WANDB_API_KEY"
    assert info.runtime_env["env_vars"] == {"PLAIN_SETTING": "visible"}
    assert "PLAIN visible" in exposed[2]  # sanity: the log really is in `exposed`

    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    ray_files = [p for p in ray_head.temp_dir.rglob("*") if p.is_file()]
    assert files and ray_files
    # Ray rewrites or removes some of its files while it runs: one listed above may be gone when read (once in CI:
    # tmp_prom_metrics_service_discovery.json); such a file is passed over, a few at most
    blobs = {}
    for p in files + ray_files:
        with contextlib.suppress(FileNotFoundError):
            blobs[p] = p.read_bytes()
    assert len(blobs) >= len(files + ray_files) - 5, sorted(set(files + ray_files) - set(blobs))
    for value in (hf, wb, extra):
        for blob in exposed:
            assert value not in blob
        for p, blob in blobs.items():
            assert value.encode() not in blob, p
    # The secret bundle was consumed on the cluster side.
    assert not list(ray_head.temp_dir.rglob("secrets.json"))
    # Submitting with a secret inside the entrypoint is refused up front.
    with pytest.raises(ValueError, match="HF_TOKEN"):
        cluster_jobs.submit_or_attach(ray_head.address, f"echo {hf}", cluster_jobs.submission_id(_uid(), 0),
                            env_vars=["HF_TOKEN"], auth_token=tok)


def test_driver_identity_leaves_out_the_attempt():
    """A rerun that re-attaches has a new train-rule attempt: same identity, so no warning; another
    config is another identity."""
    from trajsft.cluster.submit import RAY_DEFAULTS, driver_command

    ray = {**RAY_DEFAULTS, "tpu_type": "v5p-32"}
    ep1, id1 = driver_command("gs://b/run/levanter_config.json", "gs://b/run", ray, 1)
    ep2, id2 = driver_command("gs://b/run/levanter_config.json", "gs://b/run", ray, 2)
    assert ep1 != ep2 and "--attempt 1" in ep1 and id1 == id2 and "--attempt" not in id1
    _, other = driver_command("gs://b/other/levanter_config.json", "gs://b/other", ray, 1)
    assert other != id1


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_reattach_warns_only_when_the_job_differs(ray_head, tmp_path, caplog):  # noqa: F811
    tok = ray_head.token
    h = _uid()
    same = _py("import sys; print('driver', sys.argv[1:], flush=True)")
    kw = dict(entrypoint_resources={"TPU": 1}, poll_s=0.3, auth_token=tok, handle_signals=False)
    first = run_job.run_job(ray_head.address, f"{same} --attempt 1", h, tmp_path / "a.log", identity=same, **kw)
    assert (first.status, first.attached) == ("SUCCEEDED", False)
    with caplog.at_level(logging.WARNING, logger="trajsft.rayjobs"):
        again = run_job.run_job(ray_head.address, f"{same} --attempt 2", h, tmp_path / "a.log", identity=same, **kw)
    assert (again.job_id, again.attached) == (first.job_id, True)
    assert "different entrypoint" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="trajsft.rayjobs"):
        other = run_job.run_job(ray_head.address, _py("print('another job')"), h, tmp_path / "a.log", **kw)
    assert (other.job_id, other.attached) == (first.job_id, True)
    assert f"attached job {first.job_id} was submitted with a different entrypoint" in caplog.text

    # what the SUCCEEDED job made is gone since (its final export deleted): that attempt is not attached to again,
    # the next attempt id is submitted and runs
    made = tmp_path / "made"
    again = run_job.run_job(ray_head.address, same, h, tmp_path / "b.log", identity=same,
                            success_still_holds=made.exists, **kw)
    assert (again.job_id, again.attached, again.attempt) == (f"trajsft-{h}-a1", False, 1)
    made.touch()
    kept = run_job.run_job(ray_head.address, same, h, tmp_path / "b.log", identity=same,
                           success_still_holds=made.exists, **kw)
    assert (kept.job_id, kept.attached) == (f"trajsft-{h}-a0", True)


FOREIGN_LOG_DRIVER = r"""
import json, sys, time
import ray
from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
from trajsft.cluster.entrypoint import only_our_workers_in_the_job_log

ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING")
only_our_workers_in_the_job_log()
arrived = []  # what Ray delivered to this driver, before our filter
dispatcher.add_handler("spy", lambda data: arrived.extend(data.get("lines") or []))

@ray.remote
def host_task():
    print("our worker line", flush=True)

ray.get(host_task.remote())
with open(sys.argv[1] + "/tpu_driver.vm.root.log.INFO.1", "a") as f:
    f.write("FOREIGN libtpu line\n")
deadline = time.time() + 30
while time.time() < deadline and not ("FOREIGN libtpu line" in arrived and "our worker line" in arrived):
    time.sleep(0.5)
time.sleep(1)
print("ARRIVED " + json.dumps(sorted(set(arrived) & {"FOREIGN libtpu line", "our worker line"})), flush=True)
ray.shutdown()
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_driver_output_has_worker_lines_not_foreign_tpu_logs(tmp_path):
    """Ray's log monitor publishes every file in the TPU log dir (/tmp/tpu_logs, or $TPU_LOG_DIR) to
    every driver; the training driver prints only its workers' lines, each once."""
    tpu_logs = tmp_path / "tpu_logs"
    tpu_logs.mkdir()
    env = {**os.environ, "TPU_LOG_DIR": str(tpu_logs), "RAY_COLOR_PREFIX": "0", "RAY_DEDUP_LOGS": "0"}
    p = subprocess.run([sys.executable, "-c", FOREIGN_LOG_DRIVER, str(tpu_logs)], capture_output=True, text=True,
                       env=env, timeout=110, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert 'ARRIVED ["FOREIGN libtpu line", "our worker line"]' in p.stdout, p.stdout + p.stderr[-2000:]
    printed = p.stdout + p.stderr
    assert "FOREIGN libtpu line" not in printed.replace('ARRIVED ["FOREIGN libtpu line"', "")
    assert sum("our worker line" in ln for ln in printed.splitlines() if not ln.startswith("ARRIVED")) == 1
