"""Unit tests on real small files: the local-or-bucket file layer (storage) and status's
failure-cause patterns (status.classify)."""

from __future__ import annotations

import os

import fsspec
import pytest

from trajsft.observe import status
from trajsft import io


def test_local_write_is_atomic_and_round_trips(tmp_path):
    p = tmp_path / "deep" / "dir" / "f.bin"
    io.write_bytes(str(p), b"one")
    assert io.exists(str(p)) and io.read_bytes(str(p)) == b"one"
    io.write_bytes(str(p), b"two")  # replaced whole, no temp file left next to it
    assert p.read_bytes() == b"two" and os.listdir(p.parent) == ["f.bin"]
    assert not io.exists(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError):
        io.read_bytes(str(tmp_path / "nope"))


def test_put_tree_and_glob_on_a_bucket_keep_the_protocol(tmp_path):
    src = tmp_path / "export"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "model.safetensors").write_bytes(b"\0" * 10)
    dest = "memory://trajsft-test-bucket/run/hf/"
    try:
        io.put_tree(src, dest)
        found = io.glob("memory://trajsft-test-bucket/run/hf/**")
        files = [f for f in found if not fsspec.filesystem("memory").isdir(f.split("://", 1)[1])]
        files = [f.replace(":///", "://") for f in files]  # fsspec's memory fs roots its paths at "/"
        assert sorted(files) == ["memory://trajsft-test-bucket/run/hf/config.json",
                                 "memory://trajsft-test-bucket/run/hf/sub/model.safetensors"]
        assert io.read_bytes("memory://trajsft-test-bucket/run/hf/sub/model.safetensors") == b"\0" * 10
        assert io.exists("memory://trajsft-test-bucket/run/hf/config.json")
    finally:
        fsspec.filesystem("memory").rm("/trajsft-test-bucket", recursive=True)


def test_local_glob_is_sorted_plain_paths(tmp_path):
    for n in ("b.json", "a.json", "c.txt"):
        (tmp_path / n).write_text("x")
    assert io.glob(str(tmp_path / "*.json")) == [str(tmp_path / "a.json"), str(tmp_path / "b.json")]


@pytest.mark.parametrize("text,cause", [
    ("trajsft preflight: no TPU v5p-8 slice", "preflight"),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating", "out of memory"),
    ("Task was killed due to the node running low on memory (oom-kill)", "out of memory"),
    ("The node with node id abc and address 10.0.0.2 has been marked dead", "preempted / node lost"),
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly", "preempted / node lost"),
    ("TPU VM was preempted", "preempted / node lost"),
    ("trajsft tokenize demo: no usable rows in shard 0", "data error"),
    ("no finished Levanter cache at gs://b/cache", "data error"),
    ("Job STOPPED by user", "stopped"),
    ("trajsft train demo: stopped on SIGTERM", "stopped"),
    ("ValueError: something nobody anticipated", None),
    ("", None),
    (None, None),
])
def test_failure_causes(text, cause):
    assert status.classify(text) == cause


def test_failure_causes_in_priority_order():
    # an OOM that killed the node reads as OOM (the root cause), a stop after an OOM as OOM too
    assert status.classify("node 10.0.0.2 died\nRESOURCE_EXHAUSTED") == "out of memory"
    assert status.classify("Job STOPPED\nMemoryError") == "out of memory"
    assert status.classify("preflight failed; nothing was submitted (OOM last time)") == "preflight"
    assert [c for c, _ in status.CAUSES] == ["preflight", "out of memory", "preempted / node lost", "data error",
                                             "stopped"]


class _FakeConn:
    """The two dashboard calls cluster_jobs.stop makes, answering from a scripted status sequence."""

    def __init__(self, statuses):
        self.statuses, self.stops = list(statuses), 0

    def status(self, job_id):
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def stop_job(self, job_id):
        self.stops += 1
        return True


def test_stop_polls_until_terminal_and_gives_up_after_wait():
    from trajsft.cluster import jobs as cluster_jobs

    conn = _FakeConn(["RUNNING", "RUNNING", "RUNNING", "STOPPED"])
    assert cluster_jobs.stop("http://127.0.0.1:1", "j", wait_s=5, poll_s=0.01, _conn=conn) == "STOPPED"
    assert conn.stops == 1 and conn.statuses == ["STOPPED"]
    stuck = _FakeConn(["PENDING"])  # never scheduled: the last status seen after wait_s
    assert cluster_jobs.stop("http://127.0.0.1:1", "j", wait_s=0.2, poll_s=0.05, _conn=stuck) == "PENDING"
    done = _FakeConn(["SUCCEEDED"])  # already terminal: no stop request
    assert cluster_jobs.stop("http://127.0.0.1:1", "j", _conn=done) == "SUCCEEDED" and done.stops == 0
