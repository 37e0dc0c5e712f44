"""trajsft.storage: payloads sealed, found again, copied between a local root and a bucket (fake-gcs-server)
and verified object by object; anything cut off or altered is never taken as finished."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from trajsft.plan.kinds import KINDS
from trajsft import io, storage
from trajsft.plan.config import Artifact

NAME = "demo-0123456789"


def plan_at(root: str, state: Path, **cfg) -> SimpleNamespace:
    return SimpleNamespace(root=root, state_dir=str(state), cfg=cfg)


def art(plan, kind="raw", rows=3) -> Artifact:
    return Artifact(kind=kind, name=NAME, hash="0123456789", inputs={}, location=io.join(plan.root, kind, NAME),
                    manifest=f"{plan.state_dir}/{kind}/{NAME}/manifest.json", spec={"rows": rows})


def maker(calls: list, payload: dict[str, bytes]):
    """A step that writes ``payload`` under the artifact's location (and records that it ran)."""

    def make(a):
        def inner():
            calls.append(a.location)
            for rel, data in payload.items():
                io.write_bytes(io.join(a.location, rel), data)
            return {"rows": 3, "cache_dir": io.join(storage.absolute(a.location), "cache")}
        return inner
    return make


PAYLOAD = {"data/train-00000.parquet": os.urandom(70_000), "README.md": b"readme", "cache/x/0.0": b"\x00" * 9}


@pytest.fixture
def built_locally(tmp_path, monkeypatch):
    """A payload built under the local root ``results`` (cwd: tmp_path): (calls, make, plan, artifact, result)."""
    monkeypatch.chdir(tmp_path)
    calls: list = []
    make = maker(calls, PAYLOAD)
    local = plan_at("results", Path("results"))
    a = art(local)
    return calls, make, local, a, storage.build(local, a, make(a))


def test_local_build_then_bucket_copy_then_back(tmp_path, gcs, built_locally):
    calls, make, local, a, r = built_locally
    assert calls == ["results/raw/" + NAME] and r["payload_from"] == "built"
    assert r["cache_dir"] == str(tmp_path / "results/raw" / NAME / "cache")
    seal = json.loads((tmp_path / "results/raw" / NAME / "payload.json").read_text())
    assert set(seal["objects"]) == set(PAYLOAD) and seal["checked"] == {"rows": 3}
    assert seal["result"]["cache_dir"] == "@LOCATION@/cache"

    bucket = plan_at(f"{gcs.url}/trajsft", Path("results"))
    b = art(bucket)
    r = storage.build(bucket, b, make(b))
    assert len(calls) == 1, "copied, not rebuilt"
    assert r["payload_from"] == str(tmp_path / "results/raw" / NAME)
    assert r["cache_dir"] == f"{gcs.url}/trajsft/raw/{NAME}/cache"
    objs = gcs.objects()
    for rel, data in PAYLOAD.items():
        assert objs[f"trajsft/raw/{NAME}/{rel}"] == data
    assert json.loads(objs[f"trajsft/raw/{NAME}/payload.json"])["copied_from"] == r["payload_from"]
    assert storage.where(bucket, b) == [f"{gcs.url}/trajsft", str(tmp_path / "results")]

    # the local payload is gone: back on the local root it comes from the bucket
    import shutil
    shutil.rmtree(tmp_path / "results/raw")
    r = storage.build(local, a, make(a))
    assert len(calls) == 1 and r["payload_from"] == f"{gcs.url}/trajsft/raw/{NAME}"
    assert {p: (tmp_path / "results/raw" / NAME / p).read_bytes() for p in PAYLOAD} == PAYLOAD
    # and at its own location a verified payload is reused as it is
    r = storage.build(local, a, make(a))
    assert len(calls) == 1 and r["payload_from"] == str(tmp_path / "results/raw" / NAME)


def test_a_payload_under_its_earlier_name_is_reused_here_and_on_a_bucket(tmp_path, gcs, built_locally):
    """raw, shards and tokenized were named <teacher>-<hash> before they were named by their dataset: a sealed payload
    of the same kind and hash under another name is found (``plan`` says so), verified and copied to the new name,
    here and from a bucket; a payload of another hash under another name is not."""
    calls, make, local, a, _ = built_locally  # sealed under results/raw/demo-0123456789
    renamed = Artifact(kind="raw", name="demo-dataset-0123456789", hash=a.hash, inputs={},
                       location=io.join(local.root, "raw", "demo-dataset-0123456789"),
                       manifest="results/raw/demo-dataset-0123456789/manifest.json", spec={"rows": 3})
    assert storage.where(local, renamed) == [storage.absolute("results")]
    got = storage.build(local, renamed, make(renamed))
    assert got["payload_from"] == storage.absolute(a.location) and len(calls) == 1
    assert got["cache_dir"] == io.join(storage.absolute(renamed.location), "cache")  # the result names its new place
    assert (tmp_path / "results/raw/demo-dataset-0123456789/data/train-00000.parquet").read_bytes() == \
        PAYLOAD["data/train-00000.parquet"]
    other = Artifact(kind="raw", name="demo-dataset-9999999999", hash="9999999999", inputs={},
                     location=io.join(local.root, "raw", "demo-dataset-9999999999"),
                     manifest="results/raw/demo-dataset-9999999999/manifest.json", spec={"rows": 3})
    assert storage.where(local, other) == []
    assert storage.build(local, other, make(other))["payload_from"] == "built" and len(calls) == 2
    # on a bucket: the payload sealed there under the earlier name (copied from here) is copied within the bucket
    bucket = plan_at(f"{gcs.url}/trajsft", Path("results"))
    old = art(bucket)
    assert storage.build(bucket, old, make(old))["payload_from"] == storage.absolute(a.location)
    new = Artifact(kind="raw", name="demo-dataset-0123456789", hash=a.hash, inputs={},
                   location=io.join(bucket.root, "raw", "demo-dataset-0123456789"),
                   manifest="results/raw/demo-dataset-0123456789/manifest.json", spec={"rows": 3})
    assert storage.build(bucket, new, make(new))["payload_from"] == old.location and len(calls) == 2
    assert storage.read_seal(new.location)["hash"] == a.hash


def test_altered_cut_off_or_differently_checked_payloads_are_rebuilt(tmp_path, gcs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls: list = []
    make = maker(calls, PAYLOAD)
    bucket = plan_at(f"{gcs.url}/trajsft", Path("results"))
    b = art(bucket)
    storage.build(bucket, b, make(b))
    loc = b.location

    # one object altered in place (same size): the md5 the server computed differs from the seal
    io.write_bytes(f"{loc}/README.md", b"READme")
    assert storage.mismatch(loc, storage.read_seal(loc)).startswith("README.md has md5 ")
    assert storage.build(bucket, b, make(b))["payload_from"] == "built" and len(calls) == 2

    # a rebuild cut off before its seal: never taken as finished
    storage.unseal(loc)
    assert storage.read_seal(loc) is None and storage.where(bucket, b) == []
    assert storage.build(bucket, b, make(b))["payload_from"] == "built" and len(calls) == 3

    # a missing object, in the source of a copy: the copy is refused, the payload rebuilt
    fs, p = io.fs_and_path(f"{loc}/cache/x/0.0")
    fs.rm_file(p)
    local = plan_at("results", Path("results"), copy_from=[f"{gcs.url}/trajsft"])
    a = art(local)
    assert storage.build(local, a, make(a))["payload_from"] == "built" and len(calls) == 4

    # `rows` is checked, not hashed: a payload sealed with other rows is not reused
    a5 = art(local, rows=5)
    assert storage.build(local, a5, make(a5))["payload_from"] == "built" and len(calls) == 5


def test_a_copy_cut_off_mid_object_is_not_sealed(tmp_path, gcs, built_locally, monkeypatch):
    bucket = plan_at(f"{gcs.url}/trajsft", Path("results"))
    b = art(bucket)
    real = storage._stream

    def dies_mid_way(fi, fo, src, want):
        if src.endswith(".parquet"):
            fo.write(fi.read(1000))
            raise OSError("connection reset by peer")
        real(fi, fo, src, want)

    monkeypatch.setattr(storage, "_stream", dies_mid_way)
    assert storage.find(bucket, b, KINDS[b.kind].checked_settings(b.spec)) is None
    assert storage.read_seal(b.location) is None and storage.where(bucket, b) == [str(tmp_path / "results")]
    assert not [k for k in gcs.objects() if k.endswith(".parquet")], "a cut-off upload was finalised"
    # and a copy whose bytes differ from the seal (a source altered after sealing) is discarded as well
    monkeypatch.setattr(storage, "_stream", real)
    (tmp_path / "results/raw" / NAME / "README.md").write_bytes(b"READme")
    assert storage.find(bucket, b, KINDS[b.kind].checked_settings(b.spec)) is None
    assert gcs.objects()[f"trajsft/raw/{NAME}/README.md"] == b"readme"  # the earlier good copy, not replaced
    assert storage.read_seal(b.location) is None


def _ray_cfg(root: str, address: str) -> dict:
    return {"executor": "ray", "storage_root": root, "wandb": {"mode": "offline"},
            "ray": {"address": address, "tpu_type": "v5p-32"}}


def test_a_ray_job_is_never_handed_a_path_its_hosts_cannot_read(tmp_path, monkeypatch):
    from trajsft.cluster import preflight as cluster_preflight, run_job, submit
    from trajsft.errors import ConfigError

    def never(*a, **k):
        raise AssertionError("submitted")

    monkeypatch.setattr(run_job, "run_job", never)
    monkeypatch.setattr(submit, "check_or_raise", lambda cfg: None)
    monkeypatch.setattr(submit, "fit_or_raise", lambda train, lev: None)  # tests/test_fit.py
    monkeypatch.setattr(submit, "with_remat_policy", lambda train, lev, fitted: (lev, "full"))  # tests/test_fit.py
    # the settings without Levanter's TPU table (tested in test_cluster.py): this test needs no Levanter import
    monkeypatch.setattr(submit, "ray_settings", lambda cfg: {**submit.RAY_DEFAULTS, **cfg["ray"]})
    monkeypatch.chdir(tmp_path)
    local_cache = str(tmp_path / "results/tokenized/demo-abc/cache-packed")

    def submit_with(root, address, cache_dir):
        run = SimpleNamespace(location=io.join(root, "checkpoints", "demo-1234567890"), name="demo-1234567890",
                              hash="1234567890")
        train = SimpleNamespace(target="demo", run=run, workflow=_ray_cfg(root, address), log=str(tmp_path / "log"))
        lev = {"data": {"configs": {"demo": {"cache_dir": cache_dir}}}}
        with pytest.raises(ConfigError) as e:
            submit.train_on_ray(train, lev, 0)
        return str(e.value)

    # the case: data built under the local root, training on a bucket root
    assert submit_with("gs://b/trajsft", "http://10.0.0.5:8265", local_cache) == (
        f"refusing to submit: data.configs.demo.cache_dir {local_cache} is not under storage_root gs://b/trajsft "
        "(an artifact of another root: rerun its rule, it copies or rebuilds the payload there)")
    assert submit_with("gs://b/trajsft", "http://127.0.0.1:8265", "gs://other/trajsft/tokenized/x").startswith(
        "refusing to submit: data.configs.demo.cache_dir gs://other/trajsft/tokenized/x is not under")
    # a local root is fine only for a Ray head on this machine (tpu-local, the tests)
    assert submit_with("results", "http://10.0.0.5:8265", local_cache) == (
        f"refusing to submit: run_dir {tmp_path}/results/checkpoints/demo-1234567890 is a local path the hosts of "
        "http://10.0.0.5:8265 cannot read")
    with pytest.raises(AssertionError, match="submitted"):
        submit.train_on_ray(SimpleNamespace(target="demo", workflow=_ray_cfg("results", "http://127.0.0.1:8265"),
                                            run=SimpleNamespace(location="results/checkpoints/demo-1234567890",
                                                                name="demo-1234567890", hash="1234567890"),
                                            log=str(tmp_path / "log")),
                            {"data": {"configs": {"demo": {"cache_dir": local_cache}}}}, 0)
    # and preflight says so at the start of the run, before any rule ran
    monkeypatch.setattr(cluster_preflight, "preflight", lambda *a, **k: [])
    assert submit.preflight(_ray_cfg("results", "http://10.0.0.5:8265")) == [
        "storage_root results is a local dir: the hosts of http://10.0.0.5:8265 cannot read it (use a bucket, "
        "e.g. storage_root: gs://<bucket>/trajsft)"]
    assert submit.preflight(_ray_cfg("results", "http://127.0.0.1:8265")) == []


def test_plan_says_where_payloads_are_and_when_a_root_does_not_answer(tmp_path, gcs, monkeypatch):
    import subprocess
    import sys
    import time

    from gcs_fixtures import free_port

    def plan_lines(root: str) -> list[str]:
        p = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "demo", "--storage-root", root],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert p.returncode == 0, p.stderr
        return [ln.split("[", 1)[1] for ln in p.stdout.splitlines() if ln.startswith("  raw ")]

    assert plan_lines(f"{gcs.url}/trajsft") == ["missing; no payload]"]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    t0 = time.monotonic()
    assert plan_lines("gs://b/trajsft") == ["missing; gs://b/trajsft did not answer]"]
    assert time.monotonic() - t0 < 30


def test_a_training_run_seals_its_weights_only_and_they_are_copied_before_it_runs(tmp_path, gcs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = plan_at("results", Path("results"))
    a = art(local, kind="checkpoints")
    run_dir = tmp_path / a.location
    weights = {"checkpoints/step-1/metadata.json": b'{"step": 1}', "hf/step-1/model.safetensors": os.urandom(5000)}
    seen: list[dict] = []

    def train(where: Path | None):
        def inner():
            seen.append(gcs.objects())  # what the bucket holds when training starts
            if where is not None:
                for rel, data in weights.items():
                    (where / rel).parent.mkdir(parents=True, exist_ok=True)
                    (where / rel).write_bytes(data)
                (where / "attempts.json").write_text("[]")
                (where / "wandb").mkdir()
                (where / "wandb" / "latest-run").symlink_to("offline-run-gone")  # W&B's links may dangle
            return {"steps": 2}
        return inner

    assert storage.train(local, a, train(run_dir)) == {"steps": 2}
    assert set(storage.read_seal(a.location)["objects"]) == set(weights)
    bucket = plan_at(f"{gcs.url}/trajsft", Path("results"))
    b = art(bucket, kind="checkpoints")
    storage.train(bucket, b, train(None))
    prefix = f"trajsft/checkpoints/{NAME}/"
    copied = {k[len(prefix):]: v for k, v in seen[-1].items() if k.startswith(prefix)}
    assert json.loads(copied.pop("payload.json"))["copied_from"] == str(run_dir)
    assert copied == weights  # copied (no records, no links) and sealed before training started
