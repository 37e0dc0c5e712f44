"""Unit tests of trajsft.gce against the stand-in metadata server (a real HTTP server on loopback, reached
as metadata.google.internal through http_proxy, as every emulated TPU VM reaches its own)."""

from __future__ import annotations

import pytest

from gce_fixtures import MetadataServer, tpu_attributes
from trajsft import gce


@pytest.fixture
def vm(monkeypatch):
    server = MetadataServer(tpu_attributes("s-a", "v5p-16", 1, ["10.0.0.1", "10.0.0.2"], "2x2x2"), zone="us-east5-a")
    for k, v in server.proxy_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(gce, "_state", {"unreachable": False})
    yield server
    server.stop()


def test_a_tpu_vm_knows_its_slice_worker_hosts_and_zone_from_the_metadata_server(vm):
    ident = gce.tpu_identity({})
    assert ident == gce.TpuIdentity(slice_name="s-a", worker_id=1, hostnames=("10.0.0.1", "10.0.0.2"),
                                    accelerator_type="v5p-16", source="metadata")
    assert (gce.zone(), gce.project(), gce.region_of(gce.zone())) == ("us-east5-a", "trajsft-test", "us-east5")
    assert gce.metadata("instance/preempted") == "FALSE"
    vm.preempted = True
    assert gce.metadata("instance/preempted") == "TRUE"
    assert gce.metadata("instance/attributes/no-such-key") is None  # 404
    assert all(p.startswith("/computeMetadata/v1/") for p in vm.requests)


def test_tpu_variables_override_the_metadata_server_and_it_is_asked_only_for_the_rest(vm):
    ident = gce.tpu_identity({"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "h0,h1"})
    assert (ident.worker_id, ident.hostnames, ident.slice_name, ident.source) == (0, ("h0", "h1"), "s-a", "env")
    assert not any(p.endswith(("agent-worker-number", "worker-network-endpoints")) for p in vm.requests)


def test_a_worker_id_that_is_not_a_number_is_one_line():
    """libtpu, loaded by a process with no TPU, writes its warning into TPU_WORKER_ID; the training launched
    from it is refused in one line naming the variable, not with a ValueError traceback."""
    from trajsft.errors import JobEnvironmentError
    from trajsft.train import run as train_run

    warning = ("WARNING: could not determine TPU worker number, please set env var `TPU_WORKER_ID` manually, "
               "otherwise libtpu.so may not properly initialize.")
    with pytest.raises(JobEnvironmentError) as e:
        train_run.refuse_single_process_on_pod({"TPU_WORKER_ID": warning}, lambda path: None)
    assert str(e.value).startswith("TPU_WORKER_ID is 'WARNING: could not determine") and "\n" not in str(e.value)
    with pytest.raises(JobEnvironmentError, match="the metadata server's agent-worker-number is 'x0'"):
        gce.tpu_identity({}, lambda path: "x0" if path.endswith("agent-worker-number") else None)


def test_a_request_without_the_flavor_header_is_refused_as_gce_does(vm):
    import requests

    r = requests.get(gce.METADATA_URL + "instance/zone", timeout=5)
    assert r.status_code == 403 and r.headers["Metadata-Flavor"] == "Google"


def test_no_metadata_server_is_asked_once_and_answers_none(monkeypatch):
    monkeypatch.setenv(gce.GCE_ENV, "1")
    monkeypatch.setattr(gce, "_state", {"unreachable": False})
    monkeypatch.setattr(gce, "METADATA_URL", "http://127.0.0.1:9/computeMetadata/v1/")
    assert gce.tpu_identity({}) == gce.TpuIdentity()
    assert gce._state["unreachable"] and gce.zone() is None


def test_only_a_machine_that_can_be_a_gce_vm_asks_the_metadata_server(vm, monkeypatch, tmp_path):
    """A laptop's or CI machine's run asks nothing (a local training asked 3 times per run); the firmware's product
    name, TPU devices, a TPU identity variable or TRAJSFT_GCE=1 (the emulated hosts') let it ask; TRAJSFT_GCE=0
    never asks."""
    import glob

    monkeypatch.setattr(gce, "PRODUCT_NAME", str(tmp_path / "product_name"))
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    assert not gce.may_be_gce({}) and gce.may_be_gce({gce.GCE_ENV: "1"})
    assert gce.may_be_gce({"TPU_WORKER_ID": "0"}) and not gce.may_be_gce({"TPU_WORKER_ID": "0", gce.GCE_ENV: "0"})
    assert not gce.may_be_gce({"TPU_LIBRARY_PATH": "/x/libtpu.so", "TPU_SKIP_MDS_QUERY": "1"})  # not an identity
    (tmp_path / "product_name").write_text("Google Compute Engine\n")
    assert gce.may_be_gce({})
    (tmp_path / "product_name").unlink()
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/accel0"] if pattern == "/dev/accel*" else [])
    assert gce.may_be_gce({})
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    # the metadata server is up and reachable (vm): without a reason to ask, nothing is asked
    asked = len(vm.requests)
    monkeypatch.delenv(gce.GCE_ENV)
    assert gce.metadata("instance/zone") is None and gce.tpu_identity({}) == gce.TpuIdentity()
    assert len(vm.requests) == asked and not gce._state["unreachable"]
    monkeypatch.setenv(gce.GCE_ENV, "1")
    assert gce.zone() == "us-east5-a" and len(vm.requests) == asked + 1


def test_region_of_a_zone_or_a_region():
    assert gce.region_of("us-east5-a") == "us-east5" and gce.region_of("us-central1") == "us-central1"


def test_a_slow_answer_is_asked_again_not_taken_for_no_server(vm, monkeypatch):
    """A loaded VM's metadata server may answer late: that is no reason to think this host is not a TPU VM."""
    import threading
    import time

    slow = {"left": 1}
    answer = vm.answer
    lock = threading.Lock()

    def late_once(path):
        with lock:
            first, slow["left"] = slow["left"] > 0, slow["left"] - 1
        if first:
            time.sleep(0.6)  # past the first try's timeout
        return answer(path)

    monkeypatch.setattr(vm, "answer", late_once)
    assert gce.metadata("instance/attributes/agent-worker-number", timeout_s=0.3) == "1"
    assert not gce._state["unreachable"]
