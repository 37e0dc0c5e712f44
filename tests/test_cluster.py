"""Unit tests of the cluster layer: outcome classification, slice summaries, host set-up, settings."""

from __future__ import annotations

import re
import time

import pytest

from trajsft import errors, storage
from trajsft.train import run as train_run
from trajsft.plan import config as C
from trajsft.cluster import preflight as cluster_preflight
from trajsft.cluster import submit
from trajsft.cluster import hooks, host, slices
from trajsft.plan.config import ConfigError
from trajsft.observe.status import slice_summary


def test_classify_our_host_outcomes():
    assert slices.classify(host.HostLost("train_lm on s-a host 1 was killed by SIGKILL")) == (
        "preempted", "train_lm on s-a host 1 was killed by SIGKILL")
    assert slices.classify(host.TrainingFailed("train_lm on s-a host 0 exited with code 1: boom"))[0] == "failed"
    # across processes only the remote traceback text survives (RayTaskError.__str__)
    remote = RuntimeError("ray::run_on_pod_ray() ...\nTraceback ...\n"
                          "trajsft.cluster.host.HostLost: train_lm on s-a host 1 exited with code 1 after 1 of 2 hosts "
                          "of slice s-a went away")
    kind, cause = slices.classify(remote)
    assert kind == "preempted" and cause.startswith("train_lm on s-a host 1 exited")
    wrapped = RuntimeError("TPU job was preempted too many times")
    wrapped.__cause__ = host.TrainingFailed("train_lm on s-a host 0 exited with code 1: NaN")
    assert slices.classify(wrapped) == ("failed", "train_lm on s-a host 0 exited with code 1: NaN")
    # a host whose collectives never reached its peers (seen on a loaded machine: the peer was up, but slow)
    gloo = ("jaxlib._jax.XlaRuntimeError: INTERNAL: Buffer Definition Event: Error dispatching computation: Gloo "
            "context initialization failed: [external/gloo/gloo/transport/tcp/pair.h:301] Connect timeout [none]")
    assert host.peers_unreachable(f"step 3\n{gloo}\n  File x\n").startswith("jaxlib._jax.XlaRuntimeError: INTERNAL")
    # ... and its peer, whose JAX distributed service then polled that error (the fresh-clone suite beside two other
    # test runs: host 0 timed out in Gloo, host 1 exited on the shutdown barrier with this)
    poll = ("F1129 13:26:15.029976    1829 client.h:75] Terminating process because the JAX distributed service "
            "detected fatal errors. This most likely indicates that another task died; see the other task logs")
    tail = "RPC: /tensorflow.CoordinationService/PollForError [type.googleapis.com/tensorflow.CoordinationServiceError='']"
    assert host.peers_unreachable(f"step 3\n{poll}\nBarrier timed out\n{tail}\n").startswith("F1129 13:26:15")
    assert host.peers_unreachable("ValueError: NaN loss\n") is None


def test_classify_ray_infrastructure_losses_are_preemptions():
    import ray.exceptions as rx

    assert slices.classify(rx.NodeDiedError("node 3f died"))[0] == "preempted"
    assert slices.classify(rx.WorkerCrashedError())[0] == "preempted"
    text = RuntimeError("ray.exceptions.OwnerDiedError: Failed to retrieve object 00ff. The owner has exited")
    kind, cause = slices.classify(text)
    assert kind == "preempted" and cause.startswith("OwnerDiedError")
    assert slices.classify(RuntimeError("TPU job was preempted too many times"))[0] == "preempted"
    assert slices.classify(ValueError("bad config"))[0] == "failed"


def test_slice_summary_counts_every_slice_attempt():
    attempts = [
        {"attempt": 1, "outcome": "failed", "slice_attempts": [
            {"outcome": "preempted", "slices": ["s-a"], "hosts": [{}, {}], "resumed_from_step": 0,
             "cause": "train_lm on s-a host 1 was killed by SIGKILL"}]},
        {"attempt": 2, "outcome": "running", "slice_attempts": [
            {"outcome": "preempted", "slices": ["s-a"], "hosts": [{}, {}], "resumed_from_step": 6},
            {"outcome": "running", "slices": ["s-b"], "hosts": [{}, {}], "resumed_from_step": 12}]},
    ]
    s = slice_summary(attempts)
    assert (s["preemptions"], s["failures"], s["slice_attempts"], s["slice"]) == (2, 0, 3, "s-b")
    assert s["detail"] == "preempted 2x, resumed at step 12 on slice s-b (2 hosts)"
    waiting = slice_summary([{"slice_attempts": [
        {"outcome": "preempted", "slices": ["s-a"], "hosts": [{}], "resumed_from_step": 0, "cause": "NodeDiedError: x"},
        {"outcome": "waiting for slice", "tpu_type": "v5p-32", "started": "T", "resumed_from_step": 9}]}])
    assert waiting["detail"] == "preempted 1x, waiting for a v5p-32 slice since T (resumes at step 9)"
    assert slice_summary([]) == {"preemptions": 0, "failures": 0, "slice_attempts": 0, "slice": None, "detail": None}


def _no_metadata(path):
    return None


def test_single_process_on_a_multi_host_slice_is_refused():
    env = {"TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2", "TPU_WORKER_ID": "0", "TPU_NAME": "s-a",
           "TPU_ACCELERATOR_TYPE": "v5p-16"}
    with pytest.raises(errors.SingleProcessOnPod, match="worker 0 of the 2-host TPU slice s-a .*run_on_pod"):
        train_run.refuse_single_process_on_pod(env, _no_metadata)
    train_run.refuse_single_process_on_pod({"TPU_WORKER_HOSTNAMES": "10.0.0.1"}, _no_metadata)  # one host: fine
    train_run.refuse_single_process_on_pod({}, _no_metadata)
    # a TPU VM sets no TPU_* variables: the metadata server says it is worker 1 of 2
    meta = {"instance/attributes/agent-worker-number": "1", "instance/attributes/instance-id": "s-b",
            "instance/attributes/accelerator-type": "v5p-16",
            "instance/attributes/worker-network-endpoints": "0:w0:10.0.0.1,1:w1:10.0.0.2"}
    with pytest.raises(errors.SingleProcessOnPod, match="worker 1 of the 2-host TPU slice s-b "):
        train_run.refuse_single_process_on_pod({}, meta.get)


GCE = {"instance/attributes/agent-worker-number": "1", "instance/attributes/instance-id": "s-a",
       "instance/attributes/accelerator-type": "v5p-16",
       "instance/attributes/worker-network-endpoints": "0:s-a-w-0:h0,1:s-a-w-1:h1"}


def test_host_info_and_distributed_args():
    env = {"TPU_NAME": "s-a", "TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_ACCELERATOR_TYPE": "v5p-16"}
    info = host.HostInfo.detect(env, _no_metadata)
    assert (info.slice_name, info.worker_id, info.num_hosts, info.primary) == ("s-a", 1, 2, False)
    # a TPU VM: no TPU_* variables, the same identity from its metadata server
    assert host.HostInfo.detect({}, GCE.get) == info
    job = host.HostJob(levanter={"trainer": {"id": "abc"}}, run_dir="/r", attempt_tag="a1-s1", coordinator_port=4321,
                       channel=None)
    assert host.distributed_args(info, job, env) == []  # real TPU: JAX finds its peers
    emu = {**env, "TRAJSFT_ALLOW_CPU_TRAINING": "1", "JAX_PLATFORMS": "cpu"}
    assert host.distributed_args(info, job, emu) == [
        "--trainer.distributed.coordinator_address=h0:4321", "--trainer.distributed.num_processes=2",
        "--trainer.distributed.process_id=1"]
    assert host.local_dir(job, info) == "/r/hosts/0-1"
    assert host.local_dir(job, host.HostInfo.detect({**env, "TPU_WORKER_ID": "0"}, _no_metadata)) == "/r"


def test_a_host_that_cannot_tell_who_it_is_is_a_configuration_error():
    """Guessing 'worker 0 of 1' on every host of a v5p-16 would train one single-process run per host."""
    with pytest.raises(errors.JobEnvironmentError, match="^TPU host s-a: no worker id .*agent-worker-number"):
        host.HostInfo.detect({"TPU_NAME": "s-a"}, _no_metadata)
    no_hosts = {k: v for k, v in GCE.items() if not k.endswith("worker-network-endpoints")}
    with pytest.raises(errors.JobEnvironmentError,
                       match="^TPU host s-a worker 1: 0 hosts known for a v5p-16 slice of 2 hosts"):
        host.HostInfo.detect({}, no_hosts.get)
    with pytest.raises(errors.JobEnvironmentError, match="1 hosts known for a v5p-32 slice of 4 hosts"):
        host.HostInfo.detect({"TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "v5p-32"}, {
            "instance/attributes/worker-network-endpoints": "0:w:h0"}.get)
    with pytest.raises(errors.JobEnvironmentError, match="worker id 2 is not one of its 2 hosts"):
        host.HostInfo.detect({"TPU_WORKER_ID": "2"}, GCE.get)
    # a single-host slice needs no host list: it is its own coordinator
    one = host.HostInfo.detect({}, {"instance/attributes/agent-worker-number": "0",
                                    "instance/attributes/instance-id": "s-8",
                                    "instance/attributes/accelerator-type": "v5p-8"}.get)
    assert (one.slice_name, one.worker_id, one.hostnames, one.primary) == ("s-8", 0, ("127.0.0.1",), True)


def test_gce_preemption_check_is_bounded_and_false_off_gce(monkeypatch):
    import levanter.infra.tpus as tpus

    from trajsft import gce

    monkeypatch.setenv(gce.GCE_ENV, "1")  # as if on a VM: the server is asked, and is not there
    monkeypatch.setattr(gce, "_state", {"unreachable": False})
    monkeypatch.setattr(gce, "METADATA_URL", "http://127.0.0.1:9/computeMetadata/v1/")
    t0 = time.monotonic()
    assert hooks.gce_preempted() is False and time.monotonic() - t0 < 5
    assert gce._state["unreachable"] is True
    original = tpus.get_current_tpu_is_preempted
    try:
        hooks.setup()
        assert tpus.get_current_tpu_is_preempted is hooks.gce_preempted
    finally:
        tpus.get_current_tpu_is_preempted = original


def test_the_hook_patches_levanter_when_it_is_imported_and_never_imports_it():
    """A worker of the job that never uses Levanter (the driver's channel, a host task) does not import it for the
    hook; one that does gets the bounded check, however it imports it."""
    probe = (
        "import sys\n"
        "from trajsft.cluster import hooks\n"
        "hooks.setup(); hooks.setup()\n"
        "assert [m for m in sys.modules if m.split('.')[0] == 'levanter'] == ['levanter'], 'imported by the hook'\n"
        "assert '__version__' not in vars(sys.modules['levanter']), 'its __init__ ran'\n"
        "assert sum(isinstance(f, hooks._AfterImport) for f in sys.meta_path) == 1\n"
        "from levanter.infra.tpus import get_current_tpu_is_preempted as g\n"
        "import levanter.infra.ray_tpu, levanter.infra.tpus as tpus\n"
        "assert g is tpus.get_current_tpu_is_preempted is hooks.gce_preempted\n"
        "assert tpus.__spec__.origin.endswith('levanter/infra/tpus.py') and callable(tpus.__loader__.get_source)\n"
        "print('ok')\n")
    _in_a_fresh_python(probe)


def test_the_hook_makes_levanter_lazy_for_the_processes_that_only_schedule():
    """run_on_pod's processes (the driver, its task, slice and host actors) import levanter.infra.ray_tpu without the
    package's __init__ (JAX, datasets, transformers); the first import of any other module of Levanter, or of an
    attribute the __init__ sets, runs it first, as an import without the hook would."""
    probe = (
        "import sys\n"
        "from trajsft.cluster import hooks\n"
        "hooks.setup(); hooks.setup()\n"
        "assert sum(isinstance(f, hooks._LazyPackage) for f in sys.meta_path) == 1\n"
        "import levanter.infra.ray_tpu\n"
        "from levanter.infra.ray_tpu import run_on_pod_ray\n"
        "from levanter.infra.tpus import get_current_tpu_is_preempted as g\n"
        "assert g is hooks.gce_preempted\n"
        "heavy = [m for m in ('jax', 'transformers', 'datasets', 'equinox', 'levanter.trainer') if m in sys.modules]\n"
        "assert heavy == [], heavy\n"
        "assert 'analysis' not in vars(sys.modules['levanter'])\n"
        "if sys.argv[1] == 'attribute':\n"
        "    import levanter\n"
        "    assert levanter.__version__ and levanter.initialize is levanter.trainer.initialize\n"
        "else:\n"
        "    import levanter.checkpoint\n"
        "    import levanter\n"
        "assert 'levanter.trainer' in sys.modules and '__getattr__' not in vars(levanter)\n"
        "assert levanter.analysis is sys.modules['levanter.analysis'] and levanter.infra.ray_tpu.run_on_pod_ray is run_on_pod_ray\n"
        "print('ok')\n")
    for how in ("attribute", "module"):
        _in_a_fresh_python(probe, how)
    # Snakemake's preflight and a rule's launcher read a slice's shape the same way, without the ML stack
    settings = (
        "import sys\n"
        "from trajsft.cluster import single_host, slices, submit\n"
        "assert submit.ray_settings({'ray': {'address': 'http://127.0.0.1:1', 'tpu_type': 'v5p-16'}})['tpu_type'] == 'v5p-16'\n"
        "assert slices.expected_hosts('v5p-32', 2) == 8 and single_host.resources_of('v4-8')['TPU'] == 4\n"
        "heavy = [m for m in ('jax', 'transformers', 'datasets', 'levanter.trainer') if m in sys.modules]\n"
        "assert heavy == [], heavy\n"
        "print('ok')\n")
    _in_a_fresh_python(settings)


def _in_a_fresh_python(code: str, *args: str) -> None:
    """``code`` run by this venv's Python in a process of its own (nothing imported yet); it prints ok."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert p.returncode == 0 and p.stdout.strip() == "ok", (args, p.stderr[-2000:])


def _cfg(**ray):
    return {"executor": "ray", "storage_root": "results", "wandb": {"mode": "offline"},
            "ray": {"address": "http://127.0.0.1:1", "tpu_type": "v5p-32", **ray}}


def test_ray_settings_refuse_the_old_shape_and_unknown_types():
    s = submit.ray_settings(_cfg())
    assert (s["num_slices"], s["max_preemptions"], s["max_failures"]) == (1, 100, 2)
    with pytest.raises(ConfigError, match="pins the training job to TPU-v5p-32-head.*run_on_pod"):
        submit.ray_settings(_cfg(entrypoint_resources={"TPU-v5p-32-head": 1}))
    with pytest.raises(ConfigError, match="unknown TPU type 'v9-1'"):
        submit.ray_settings(_cfg(tpu_type="v9-1"))
    assert submit.preflight(_cfg(entrypoint_resources={"TPU-v5p-32-head": 1}))[0].startswith("ray.entrypoint")


def test_the_evaluation_job_asks_for_one_whole_single_host_slice():
    from trajsft.cluster import single_host

    assert single_host.slice_of(_cfg()["ray"]) == ("v5p-8", {"TPU-v5p-8-head": 1.0, "TPU": 4.0})
    assert single_host.slice_of(_cfg(eval_tpu_type="v4-8")["ray"]) == ("v4-8", {"TPU-v4-8-head": 1.0, "TPU": 4.0})
    with pytest.raises(ConfigError, match="ray.eval_tpu_type v5p-16 has 2 hosts: the generation engine is single-host"):
        single_host.slice_of(_cfg(eval_tpu_type="v5p-16")["ray"])
    with pytest.raises(ConfigError, match="ray.eval_tpu_type: unknown TPU type 'v9-1'"):
        single_host.slice_of(_cfg(eval_tpu_type="v9-1")["ray"])
    for name in ("tpu-east5", "tpu-central1"):  # the profiles say which slice their evaluations take
        prof = C.load([C.DEFAULT_CONFIG, C.REPO_DIR / "profiles" / name / "cluster.yaml"])
        assert single_host.slice_of(prof["ray"])[0] == "v5p-8"


def test_runtime_env_of_the_driver():
    env = submit.runtime_env(_cfg(pip_requirements="envs/tpu-requirements.txt"))
    assert env["worker_process_setup_hook"] == "trajsft.cluster.hooks.setup"
    assert env["config"] == {"setup_timeout_seconds": 1800}
    # the lock's closure, installed by Ray's uv runtime env (pip on request)
    assert "jax==0.7.2" in env["uv"]["packages"] and "libtpu==0.0.23" in env["uv"]["packages"]
    assert not any(p.startswith(("ray==", "ray[", "#")) for p in env["uv"]["packages"])
    assert env["uv"]["uv_check"] is False and "pip" not in env
    assert env["uv"]["uv_pip_install_options"] == []  # not Ray's default `--no-cache`: the node's uv cache and UV_* settings count
    pip = submit.runtime_env(_cfg(pip_requirements="envs/tpu-requirements.txt", installer="pip"))
    assert pip["pip"]["packages"] == env["uv"]["packages"] and "uv" not in pip
    assert "uv" not in submit.runtime_env(_cfg(pip_requirements=None)) and "pip" not in submit.runtime_env(_cfg())


def test_the_profiles_plain_env_reaches_every_process_and_a_secret_there_is_refused():
    env = submit.runtime_env(_cfg(env={"WANDB_BASE_URL": "http://wandb.internal:8080", "WANDB_MODE": "online"}))
    assert env["env_vars"] == {"PYTHONPATH": "src", "PYTHONUNBUFFERED": "1", "RAY_COLOR_PREFIX": "0",
                               "WANDB_BASE_URL": "http://wandb.internal:8080", "WANDB_MODE": "online"}
    with pytest.raises(ConfigError, match=r"ray.env sets HF_TOKEN, WANDB_API_KEY: .*ray.forward_env"):
        submit.ray_settings(_cfg(env={"WANDB_API_KEY": "k", "HF_TOKEN": "t", "X": "1"}))


def test_a_hub_token_goes_only_to_a_job_that_reads_the_hub(monkeypatch):
    for k in ("WANDB_API_KEY", "HF_TOKEN", "TPU_CI"):
        monkeypatch.setenv(k, "x" * 40)
    cfg = _cfg(forward_env=["WANDB_API_KEY", "HF_TOKEN", "TPU_CI"], required_env=[])
    snap = {"data": {"tokenizer": "gs://b/trajsft/models/Qwen3-8B-b9c4233d78"},
            "model": {"reference_checkpoint": "gs://b/trajsft/models/Qwen3-8B-b9c4233d78"},
            "initialize_from_hf": "gs://b/trajsft/models/Qwen3-8B-b9c4233d78"}
    local = {"data": {"tokenizer": "demo/tokenizer"}, "model": {"reference_checkpoint": "/runs/x/hf_reference"}}
    hub = {"data": {"tokenizer": "Qwen/Qwen3-8B@b968826d9c46dd6066d109eabc6255188de91218"},
           "model": {"reference_checkpoint": "gs://b/r/hf_reference"}}
    assert submit.hub_refs(snap) == submit.hub_refs(local) == []
    assert submit.hub_refs(hub) == ["Qwen/Qwen3-8B@b968826d9c46dd6066d109eabc6255188de91218"]
    assert submit.forwarded_env(cfg, submit.hub_refs(snap)) == ["WANDB_API_KEY", "TPU_CI"]
    assert submit.forwarded_env(cfg, submit.hub_refs(hub)) == ["WANDB_API_KEY", "HF_TOKEN", "TPU_CI"]
    for name in ("tpu-east5", "tpu-central1", "tpu-local"):  # no profile requires HF_TOKEN
        prof = C.load([C.DEFAULT_CONFIG, C.REPO_DIR / "profiles" / name / "cluster.yaml"])
        assert "HF_TOKEN" not in submit.required_env(prof)


def test_preflight_refuses_in_seconds_without_network(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAJSFT_TEST_MISSING", raising=False)
    t0 = time.monotonic()
    probs = cluster_preflight.preflight("http://127.0.0.1:9", ["TRAJSFT_TEST_MISSING"], {"TPU-v5p-32-head": 1},
                              str(tmp_path / "store"), timeout_s=3)
    assert time.monotonic() - t0 < 10
    assert [p.split(" ", 1)[0] for p in probs] == ["env", "unreachable:"]
    if not storage.resolves("storage.googleapis.com", 3):  # no network here (CI): a bucket fails in seconds
        t0 = time.monotonic()
        probs = cluster_preflight.preflight("http://127.0.0.1:9", [], {}, "gs://marin-us-east5/trajsft", timeout_s=3)
        assert time.monotonic() - t0 < 10, probs
        assert any("cannot resolve storage.googleapis.com" in p for p in probs), probs


def test_status_render_shows_the_slice_story():
    from trajsft.observe.status import render

    row = {"target": "minimax-m2.5", "state": "training running", "hash": "abc", "cluster": "us-east5-a",
           "ray_job_id": "trajsft-abc-a0", "attempt": 1, "step": 1250, "steps_total": 2298, "loss": 0.5,
           "checkpoint_dir": "gs://b/c", "hf_export": None, "wandb_url": None, "cause": None, "next": None,
           "detail": "preempted 2x, resumed at step 1200 on slice s-b (4 hosts)"}
    out = render([row]).splitlines()
    assert "  minimax-m2.5: preempted 2x, resumed at step 1200 on slice s-b (4 hosts)" in out
    assert render([{**row, "detail": None}]).count("preempted") == 0


def test_host_tee_streams_only_what_this_launch_appends(tmp_path):
    """The primary host's train log is appended to by every slice attempt of a run; each attempt
    streams from the size it found, so no earlier line reaches the job log twice."""
    import io as _io
    import threading

    from trajsft.cluster.host import _tee

    log = tmp_path / "train.log"
    log.write_text("attempt 1 line\n")
    out, stop = _io.BytesIO(), threading.Event()
    t = threading.Thread(target=_tee, args=(str(log), stop, log.stat().st_size, out))
    t.start()
    with open(log, "a") as f:
        f.write("attempt 2 line\n")
    stop.set()
    t.join(timeout=10)
    assert out.getvalue() == b"attempt 2 line\n"


def _ray_node(node_id, memory_gib, cpus=10, head=False, alive=True):
    res = {"memory": memory_gib * 2**30, "CPU": cpus, **({"node:__internal_head__": 1.0} if head else {})}
    return {"NodeID": node_id, "Alive": alive, "NodeManagerHostname": f"h-{node_id}", "Resources": res}


def test_the_fallback_export_never_runs_on_the_head():
    from trajsft.cluster import export_node as X

    nodes = X.nodes_of([_ray_node("head", 256, head=True), _ray_node("w0", 400), _ray_node("w1", 448),
                        _ray_node("dead", 900, alive=False), _ray_node("busy", 500, cpus=0)])
    assert X.choose(nodes, 50 * 2**30).node_id == "w1"  # the largest that fits, not the head's 256 GiB
    assert X.choose(nodes, 50 * 2**30, driver_node="w1").node_id == "w0"
    with pytest.raises(errors.JobEnvironmentError, match=(
            r"^the final HF export needs about 450.0 GiB of memory and no node of the cluster but the head has that "
            r"much \(the largest other node declares 448.0 GiB \(h-w1\)\); it never runs on the head: .*nothing was loaded")):
        X.choose(nodes, 450 * 2**30)
    with pytest.raises(errors.JobEnvironmentError, match=r"\(no node with a CPU but the head is up\)"):
        X.choose(X.nodes_of([_ray_node("head", 1000, head=True)]), 2**30)


def test_the_fallback_exports_memory_comes_from_the_checkpoints_weights(tmp_path):
    from trajsft.cluster import export_node as X

    model = tmp_path / "step-9" / "model" / "transformer"
    model.mkdir(parents=True)
    (model / "c0").write_bytes(b"\0" * 3_000_000)
    (tmp_path / "step-9" / "opt_state").mkdir()
    (tmp_path / "step-9" / "opt_state" / "c0").write_bytes(b"\0" * 6_000_000)  # not loaded by the export
    assert X.memory_needed(str(tmp_path / "step-9")) == 4_500_000 + X.PROCESS_BYTES


def test_a_trainer_whose_log_stops_growing_is_killed_as_hung_and_one_that_writes_is_not(tmp_path):
    """ray.stall_seconds: a host's train_lm that writes nothing to its log for that long (a collective waiting
    forever for a lost peer) is SIGKILLed and said as hung (run_host makes it a HostLost: the slice attempt is
    retried as a preemption); a child that keeps writing past the limit runs to its end."""
    import subprocess
    import sys

    from trajsft.train import launch

    # a child set up as train_lm's (child_prelude) writes its threads' stacks when the watchdog asks, then is killed
    writes_then_hangs = ("import sys, time\nfrom trajsft.train.launch import child_prelude\nchild_prelude()\n"
                         "for _ in range(5):\n    print('step', flush=True); time.sleep(0.2)\n"
                         "def wait_for_peer():\n    time.sleep(120)\nwait_for_peer()")
    t0 = time.monotonic()
    with pytest.raises(launch.Stalled, match="wrote nothing to its log for 1 s, waiting in <string>:7 in wait_for_peer "
                                             r"\(every thread's stack is in its log\)") as stalled:
        launch.run_subprocess([sys.executable, "-c", writes_then_hangs], str(tmp_path / "hung.log"),
                              launch.levanter_env(), str(tmp_path), "header", stall_s=1.0, poll_s=0.1)
    assert 1.0 <= time.monotonic() - t0 < 30 and stalled.value.seconds == 1.0
    hung_log = (tmp_path / "hung.log").read_text()
    assert hung_log.count("step") == 5
    assert re.search(r'File "<string>", line 7 in wait_for_peer\n\s+File "<string>", line 8 in <module>', hung_log)
    # a child without the prelude (SIGUSR1 ends it) is killed all the same, said without a place
    with pytest.raises(launch.Stalled, match=r"wrote nothing to its log for 1 s$"):
        launch.run_subprocess([sys.executable, "-c", "import time\nprint('x', flush=True)\ntime.sleep(120)"],
                              str(tmp_path / "bare.log"), {}, str(tmp_path), "header", stall_s=1.0, poll_s=0.1)
    out = subprocess.run(["pgrep", "-f", "time.sleep(120)"], capture_output=True, text=True)
    assert not out.stdout.strip(), "the hung child is still alive"
    keeps_writing = "import time\nfor _ in range(15):\n    print('step', flush=True); time.sleep(0.2)"
    assert launch.run_subprocess([sys.executable, "-c", keeps_writing], str(tmp_path / "ok.log"), {}, str(tmp_path),
                                 "header", stall_s=1.0, poll_s=0.1) == 0
    assert slices.classify(errors.HostLost("train_lm on s host 1 wrote nothing: killed as hung"))[0] == "preempted"


def test_the_driver_is_told_the_stall_limit_of_the_profile():
    from trajsft.cluster.submit import RAY_DEFAULTS, driver_command

    cmd, _ = driver_command("gs://b/c.json", "gs://b/run", {**RAY_DEFAULTS, "tpu_type": "v5p-32"}, 0)
    assert "--stall-seconds 1800" in cmd
    cmd, _ = driver_command("gs://b/c.json", "gs://b/run", {**RAY_DEFAULTS, "tpu_type": "v5p-32", "stall_seconds": 0}, 0)
    assert "--stall-seconds 0" in cmd
