"""A storage root that cannot be written (issue 45), in units: what counts as a write fault, its one line, the
attempts record that survives it, and logging that does not trace. The real thing (a tmpfs, read-only, then full,
then grown): tests/test_pipeline.py::test_a_full_or_read_only_storage_root_is_one_line_and_the_rerun_finishes."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest

from trajsft import io, logs
from trajsft.errors import TrainingFailed
from trajsft.runtime import provenance


def test_write_faults_are_found_through_the_exception_chain():
    full = OSError(errno.ENOSPC, "No space left on device", "/r/ckpt/x")
    try:
        try:
            raise full
        except OSError as e:
            raise TrainingFailed("train_lm exited with code 1") from e
    except TrainingFailed as e:
        assert io.write_fault(e) == ("No space left on device", "/r/ckpt/x")
    assert io.write_fault(OSError(errno.EROFS, "x")) == ("Read-only file system", None)
    assert io.write_fault(PermissionError(errno.EACCES, "x", "/r")) == ("Permission denied", "/r")
    assert io.write_fault(OSError(errno.ENOENT, "x")) is None and io.write_fault(ValueError("x")) is None
    # a library's own wording (safetensors), not an OSError
    assert io.write_fault(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")) \
        == ("No space left on device", None)

    class HttpError(Exception):
        code = 403
    assert io.write_fault(HttpError("Forbidden"))[0] == "the bucket refused the write (403: Forbidden)"


def test_the_line_names_the_root_the_cause_and_what_is_free(tmp_path):
    line = io.fault_line(str(tmp_path), "No space left on device", str(tmp_path / "checkpoints/x"))
    assert line.startswith(f"the storage root {tmp_path} is full: No space left on device; ")
    assert "MiB free" in line and f"(writing {tmp_path}/checkpoints/x)" in line
    assert io.fault_line("gs://b/t", "Read-only file system").startswith("the storage root gs://b/t is read-only")
    assert io.fault_line(str(tmp_path / "root"), "Disk quota exceeded", "/elsewhere/logs/x.log").startswith(
        "the path /elsewhere/logs/x.log is over its quota")
    # a sibling whose name starts with the root's is not under it
    assert io.fault_line(str(tmp_path / "root"), "Read-only file system", str(tmp_path / "root2/x")).startswith(
        f"the path {tmp_path}/root2/x is read-only")
    assert io.fault_in_text("...\nOSError: [Errno 28] No space left on device\n") == "No space left on device"
    assert io.fault_in_text("Traceback ... ValueError") is None


def test_the_attempts_record_falls_back_to_the_workdir_and_is_folded_in_later(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = str(tmp_path / "root/checkpoints/demo-1")
    real = io.write_bytes
    full = {"on": True}

    def write_bytes(path, data):
        if full["on"] and str(path).startswith(run_dir):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(io, "write_bytes", write_bytes)
    a = provenance.record_attempt(run_dir, executor="local")
    provenance.finish_attempt(run_dir, a["attempt"], "failed", error="the storage root is full")
    kept = tmp_path / provenance.fallback_path(run_dir)
    assert json.loads(kept.read_text())[0]["error"] == "the storage root is full"
    assert not os.path.exists(f"{run_dir}/attempts.json")
    assert provenance.read_attempts(run_dir)[0]["outcome"] == "failed"  # status reads it
    full["on"] = False  # space freed: the next attempt writes both to the run dir, the fallback goes
    provenance.record_attempt(run_dir, executor="local")
    assert [x["outcome"] for x in json.loads(open(f"{run_dir}/attempts.json").read())] == ["failed", "running"]
    assert not kept.exists()
    with pytest.raises(OSError):  # anything else is not a write fault: raised as before
        monkeypatch.setattr(io, "write_bytes", lambda p, d: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
        provenance.record_attempt(run_dir)


def test_a_log_handler_that_cannot_write_prints_no_logging_error_block(tmp_path, capfd):
    log = logs.setup(str(tmp_path / "rule.log"))
    try:
        handler = next(h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler))
        handler.stream.close()  # as a full disk makes every write fail
        handler.stream = open(os.devnull, "w")
        handler.stream.close()
        log.error("after the disk filled up")
        assert "Logging error" not in capfd.readouterr().err
        logging.raiseExceptions = True  # Python's default: the block and its trace, for every record
        log.error("after the disk filled up")
        assert "--- Logging error ---" in capfd.readouterr().err
    finally:
        logging.raiseExceptions = True


def test_a_rules_one_line_reaches_the_terminal_once_and_its_log_file(tmp_path, capfd):
    """The rule's line goes bare to stderr once, not also through the log's stream handler; the rule's log file
    keeps it with its time."""
    from trajsft import rule_job

    logs.setup(str(tmp_path / "rule.log"))
    line = "trajsft train demo: the training could not write: the storage root /r is full: No space left on device"
    try:
        with pytest.raises(SystemExit) as e:
            rule_job._exit_in_one_line(line)
        assert e.value.code == 1
        assert capfd.readouterr().err.splitlines() == [line]
        [kept] = (tmp_path / "rule.log").read_text().splitlines()
        assert kept.endswith(f" ERROR trajsft: {line}")
    finally:
        for h in list(logging.getLogger().handlers):
            logging.getLogger().removeHandler(h)
            h.close()
