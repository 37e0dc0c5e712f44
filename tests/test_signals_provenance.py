"""Unit tests on real processes and files: run identity and stop markers (signals), the attempt
record of a run (provenance)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psutil

from trajsft.runtime import provenance, signals


def test_run_id_names_one_live_process_and_survives_no_pid_reuse(tmp_path):
    me = signals.run_id(psutil.Process())
    assert signals.process_of(me).pid == os.getpid()
    pid, start = me.split("-")
    assert signals.process_of(f"{pid}-{int(start) + 500}") is None  # same pid, other start: reused pid
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    rid = signals.run_id(psutil.Process(child.pid))
    child.wait()
    assert signals.process_of(rid) is None and signals.process_of("garbage") is None


def test_stale_stop_markers_are_removed_live_ones_kept(tmp_path, monkeypatch):
    live = signals.stop_marker(signals.run_id(psutil.Process()), tmp_path)
    gone = signals.stop_marker("999999999-1", tmp_path)
    old = live.with_name(signals.STOP_PREFIX + "12345")  # an old pid-only marker
    for p in (live, gone, old):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
    assert sorted(signals.remove_stale_markers(tmp_path)) == sorted([gone, old])
    assert live.exists() and not gone.exists() and not old.exists()
    monkeypatch.setenv(signals.RUN_ENV, signals.run_env("1-2"))
    assert signals.current_run() == "1-2"
    monkeypatch.setenv(signals.RUN_ENV, "other-host/1-2")  # a pid on another host means nothing here
    assert signals.current_run() is None


def test_attempts_record_a_silent_death_as_interrupted(tmp_path):
    run = str(tmp_path / "run")
    a1 = provenance.record_attempt(run, note="first")
    assert a1["attempt"] == 1 and a1["outcome"] == "running" and a1["hostname"] == socket.gethostname()
    assert provenance.running_attempt(run)["attempt"] == 1  # this very process
    # the first attempt's process is gone (a dead pid): the next attempt marks it interrupted
    attempts = json.loads((tmp_path / "run" / "attempts.json").read_text())
    attempts[0]["pid"] = 999999999
    (tmp_path / "run" / "attempts.json").write_text(json.dumps(attempts))
    assert provenance.running_attempt(run) is None
    a2 = provenance.record_attempt(run)
    provenance.update_attempt(run, 2, slice="v5p-8-0")
    provenance.finish_attempt(run, 2, "succeeded")
    got = provenance.read_attempts(run)
    assert [a["outcome"] for a in got] == ["interrupted", "succeeded"] and a2["attempt"] == 2
    assert got[0]["error"] == "killed (no end recorded)" and got[1]["slice"] == "v5p-8-0"
    assert got[1]["ended"] >= got[1]["started"]
    assert provenance.read_attempts(str(tmp_path / "none")) == []
