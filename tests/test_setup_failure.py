"""A training job that fails before training starts is a configuration error: recognised, recorded with a
fingerprint, answered in one line, shown by status (unit tier; the cluster scenario is in test_host_image)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajsft import errors
from trajsft.cluster import entrypoint, requirements, setup_failure as SF, slices
from trajsft.cluster.jobs import JobView
from trajsft.observe.status_row import Facts, row

REPO = Path(__file__).resolve().parents[1]


def test_installed_versions_against_the_lock():
    text = ("# comment\ntenacity==9.2.1\nnot-a-package-xyz==1.0\npsutil==0.0.1  # wrong on purpose\n"
            "colorama==0.4.6 ; sys_platform == 'win32'\nuvloop==0.0.1 ; sys_platform == 'win32'\n")
    assert SF.installed_mismatches(text) == ["not-a-package-xyz missing (the lock pins 1.0)",
                                             "psutil 7.2.2 (the lock pins 0.0.1)"]
    # this venv is the lock: the emulated hosts pass the check the driver and every host make
    assert SF.installed_mismatches((REPO / requirements.OUT).read_text()) == []


def test_check_installed_names_the_host_and_counts_the_rest(tmp_path):
    req = tmp_path / "tpu-requirements.txt"
    req.write_text("tenacity==0.1\npsutil==0.2\n")
    with pytest.raises(errors.JobEnvironmentError) as e:
        SF.check_installed("slice-a host 1", req)
    assert str(e.value).startswith("slice-a host 1: tenacity 9.2.1 (the lock pins 0.1) and 1 more: its Python is not")
    assert isinstance(e.value, errors.ConfigError)  # the rule prints it as one line
    SF.check_installed("slice-a host 1", tmp_path / "absent.txt")  # no file shipped: nothing to check


DRIVER_IMPORT = """[trajsft.remote_train] JAX version 0.7.2 available.
Traceback (most recent call last):
  File "/tmp/ray/session/runtime_resources/working_dir_files/_ray_pkg_1/src/trajsft/cluster/jobs.py", line 12
    import tenacity
ModuleNotFoundError: No module named 'tenacity'
"""


def test_a_failed_job_that_never_trained_is_recognised():
    info = JobView({"status": "FAILED", "driver_node_id": "0123456789abcdef", "message": "exit code 1",
                    "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR"})
    # the driver said so (a host could not start train_lm, a version is wrong)
    said = f"(SliceActor pid=9) ...\n{SF.MARK} train_lm on slice-a host 1 cannot start: ImportError: haliax\n"
    assert SF.from_failed_job(info, said) == "train_lm on slice-a host 1 cannot start: ImportError: haliax"
    # the driver died on an import before any slice attempt
    assert SF.from_failed_job(info, DRIVER_IMPORT) == (
        "the driver (node 0123456789ab): ModuleNotFoundError: No module named 'tenacity'")
    # Ray could not set up the driver's runtime env
    env = JobView({"status": "FAILED", "error_type": "RUNTIME_ENV_SETUP_FAILURE",
                   "message": "Job set up failed: RuntimeEnvSetupError: Failed to set up runtime environment.\n"
                              "pip install failed: No matching distribution found for levanter==9"})
    assert SF.from_failed_job(env, "").startswith("the driver: the runtime env could not be set up: RuntimeEnvSetupError")
    # training had started (a slice attempt ran): a failure, Snakemake's retries resume it
    trained = "[trajsft.remote_train] slice attempt 1 running on s-a\n" + DRIVER_IMPORT
    assert SF.from_failed_job(info, trained) is None
    assert SF.from_failed_job(info, "[trajsft.remote_train] slice attempt 3 failed: NaN loss") is None
    assert entrypoint.MARK == SF.MARK


def test_fingerprint_follows_the_runtime_env_ray_and_the_code(tmp_path):
    code = tmp_path / "src"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "a.py").write_text("x = 1\n")
    renv = {"working_dir": "/repo", "pip": {"packages": ["jax==0.7.2"]}}
    fp = SF.fingerprint(renv, "2.60.0", code)
    assert fp == SF.fingerprint(dict(renv), "2.60.0", code)
    assert fp != SF.fingerprint({**renv, "pip": {"packages": ["jax==0.7.1"]}}, "2.60.0", code)
    assert fp != SF.fingerprint(renv, "2.61.0", code)
    (code / "pkg" / "__pycache__").mkdir()
    (code / "pkg" / "__pycache__" / "a.py").write_text("cache")
    assert fp == SF.fingerprint(renv, "2.60.0", code)
    (code / "pkg" / "a.py").write_text("x = 2\n")
    assert fp != SF.fingerprint(renv, "2.60.0", code)


def test_record_round_trip_and_its_lines(tmp_path):
    run_dir = str(tmp_path / "run")
    assert SF.read(run_dir) is None and SF.clear(run_dir) is None
    rec = SF.write(run_dir, cause="train_lm on s-a host 0 cannot start: ImportError: x", fingerprint="f1",
                   job_id="trajsft-h-a0")
    assert SF.read(run_dir) == rec
    first, again = SF.line(rec), SF.line(rec, repeated=True)
    assert first.startswith("configuration error: train_lm on s-a host 0 cannot start: ImportError: x (Ray job trajsft-h-a0")
    assert "not resubmitted" in again and "trajsft retry" in again and "\n" not in again
    assert SF.clear(run_dir) == rec and SF.read(run_dir) is None


def test_the_slice_loop_calls_a_setup_failure_a_configuration_error():
    e = errors.JobEnvironmentError("train_lm on s-a host 1 cannot start: ModuleNotFoundError: No module named 'x'")
    assert slices.classify(e) == ("config", str(e))
    remote = RuntimeError("ray::run_on_pod_ray() ...\nTraceback ...\ntrajsft.errors.JobEnvironmentError: "
                          "s-a host 1: jax 0.7.1 (the lock pins 0.7.2): its Python is not tpu-requirements.txt")
    assert slices.classify(remote) == ("config", "s-a host 1: jax 0.7.1 (the lock pins 0.7.2): its Python is not "
                                                 "tpu-requirements.txt")
    renv = RuntimeError("ray.exceptions.RuntimeEnvSetupError: Failed to set up runtime environment. pip failed")
    assert slices.classify(renv)[0] == "config"
    actor = RuntimeError("ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation "
                         "task\nModuleNotFoundError: No module named 'haliax'")
    assert slices.classify(actor) == ("config", "ModuleNotFoundError: No module named 'haliax'")
    # a lost host stays a preemption
    assert slices.classify(RuntimeError("ray.exceptions.ActorDiedError: node died"))[0] == "preempted"


def test_the_driver_ends_a_configuration_error_with_one_marked_line(monkeypatch, capsys):
    def boom(argv):
        raise errors.JobEnvironmentError("the driver on head: ModuleNotFoundError: No module named 'tenacity'")

    monkeypatch.setattr(entrypoint, "_main", boom)
    assert entrypoint.main([]) == 3
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"{SF.MARK} the driver on head: ModuleNotFoundError: No module named 'tenacity'"]


def test_status_shows_the_configuration_error():
    rec = {"cause": "train_lm on s-a host 0 cannot start: ImportError: x", "ray_job_id": "trajsft-h-a0",
           "fingerprint": "f", "at": "2026-11-26T00:00:00+00:00"}
    f = Facts(target="demo", hash="h", run="demo-h", cluster="east5", checkpoint_dir="gs://b/run", log="/l",
              data_ready=True, config_failure=rec)
    r = row(f)
    assert (r["state"], r["cause"], r["ray_job_id"]) == ("configuration error", rec["cause"], "trajsft-h-a0")
    assert "trajsft retry demo" in r["next"]
    assert row(Facts(target="demo", hash="h", run="demo-h", cluster="east5", checkpoint_dir="/c", log="/l",
                     data_ready=True))["state"] == "data ready"
