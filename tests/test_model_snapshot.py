"""The student's initial weights as an artifact (rule ``download_model``, ``trajsft.train.model_snapshot``):
a tiny Qwen3 checkpoint made here, served by a fake Hub over HTTP (the real huggingface_hub client), copied
to ``<root>/models/<repo>-<hash>/`` (a local root and a bucket on fake-gcs-server), verified and sealed;
reused without the Hub once sealed; a corrupt download, a wrong revision, a gated repo and a repo without
safetensors each refused in one line with nothing sealed."""

from __future__ import annotations

import copy
import json

import pytest

import tiny_hf_model
from fake_hub import FakeHub, Repo, point_this_process
from pipeline_utils import plan as plan_cli, run
from trajsft import storage
from trajsft.errors import DataError
from trajsft.plan import config as C
from trajsft.plan import step_configs
from trajsft.train import model_snapshot

REPO_ID = "trajsft-test/tiny-qwen3"
SHA = "0123456789abcdef0123456789abcdef01234567"


def student_config(root, revision: str = SHA) -> dict:
    """The demo trained from the tiny checkpoint on the (fake) Hub instead of from random weights."""
    return {"storage_root": str(root),
            "students": {"tiny-hf": {"init": "hf", "hf_checkpoint": REPO_ID, "hf_revision": revision,
                                     "tokenizer": "demo/tokenizer", "model": dict(tiny_hf_model.TINY)}},
            "teachers": {"demo": {"student": "tiny-hf"}}}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The fake Hub, and this process's huggingface_hub pointed at it (its endpoint and cache are read at import)."""
    from huggingface_hub.utils._http import reset_sessions

    h = FakeHub({REPO_ID: Repo(SHA, tiny_hf_model.files())}).start()
    point_this_process(h, monkeypatch, str(tmp_path / "hf-cache"))
    monkeypatch.chdir(tmp_path)  # the workdir's state (results/storage_roots.json): this test's own
    yield h
    h.stop()
    reset_sessions()


def build(cfg: dict):
    p = C.Plan(C.load(None, copy.deepcopy(cfg)), base_dir=C.REPO_DIR)
    art = step_configs.train(p, "demo").model
    return p, art, storage.build(p, art, lambda: model_snapshot.download_model(step_configs.download_model(p, art.name)))


def test_snapshot_from_the_hub_is_verified_sealed_and_reused(hub, tmp_path):
    cfg = student_config(tmp_path / "root")
    p, art, result = build(cfg)
    assert art.name.startswith("tiny-qwen3-") and art.location == str(tmp_path / "root" / "models" / art.name)
    assert art.inputs == {"format": 1, "init": "hf", "hf_checkpoint": {"hub": REPO_ID, "revision": SHA}}
    src = tiny_hf_model.files()
    # the weights, config and generation config, byte for byte; nothing else of the repo (README)
    there = {f.name: f.read_bytes() for f in (tmp_path / "root" / "models" / art.name).iterdir()
             if f.name not in storage.NOT_OBJECTS}
    assert there == {k: v for k, v in src.items() if k != "README.md"}
    assert result["payload_from"] == "built" and result["source"] == f"{REPO_ID}@{SHA}" and result["commit"] == SHA
    assert result["bytes"] == sum(len(v) for k, v in src.items() if k != "README.md")
    assert result["config"]["hidden_size"] == 64 and result["config"]["architectures"] == ["Qwen3ForCausalLM"]
    seal = storage.read_seal(art.location)
    assert set(seal["objects"]) == set(there) and storage.mismatch(art.location, seal) is None
    assert any(path == f"/api/models/{REPO_ID}/revision/{SHA}" for _, path in hub.requests)
    # sealed: verified and reused, the Hub not asked again
    before = len(hub.requests)
    _, _, again = build(cfg)
    assert again["payload_from"] == art.location and len(hub.requests) == before


def test_a_second_root_copies_the_sealed_snapshot_not_the_hub(hub, tmp_path):
    p, art, _ = build(student_config(tmp_path / "a"))
    before = len(hub.requests)
    cfg = {**student_config(tmp_path / "b"), "copy_from": [str(tmp_path / "a")]}
    _, art_b, result = build(cfg)
    assert art_b.name == art.name and result["payload_from"] == art.location and len(hub.requests) == before
    assert storage.mismatch(art_b.location, storage.read_seal(art_b.location)) is None


def test_a_corrupt_download_is_refused_in_one_line_and_never_sealed(hub, tmp_path):
    weights = tiny_hf_model.files()["model.safetensors"]
    hub.repos[REPO_ID].tamper["model.safetensors"] = weights[:-1] + bytes([weights[-1] ^ 1])  # same size
    p = C.Plan(C.load(None, student_config(tmp_path / "root")), base_dir=C.REPO_DIR)
    art = step_configs.train(p, "demo").model
    with pytest.raises(DataError) as e:
        storage.build(p, art, lambda: model_snapshot.download_model(step_configs.download_model(p, art.name)))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{REPO_ID}@{SHA}: model.safetensors downloaded as") and "the Hub says" in msg
    assert storage.read_seal(art.location) is None


@pytest.mark.parametrize("case,expect", [
    ("revision", "Hugging Face Hub answered HTTP 404"),
    ("gated", "Hugging Face Hub answered HTTP 401 (set HF_TOKEN for gated/private repos)"),
    ("wrong_token", "Hugging Face Hub answered HTTP 401 (HF_TOKEN was refused, or has no access to this repo)"),
    ("no_weights", "no safetensors weights"),
    ("offline", "cannot reach the Hugging Face Hub: 127.0.0.1:"),  # + "<port> refused the connection ..."
    ("offline_mode", "not downloaded: HF_HUB_OFFLINE is set (unset it to download)"),
])
def test_hub_problems_are_one_line(hub, tmp_path, case, expect, monkeypatch):
    revision = SHA
    if case == "revision":
        revision = "f" * 40
    elif case == "gated":
        hub.token = "hf_needed"
    elif case == "wrong_token":
        hub.token = "hf_needed"
        monkeypatch.setenv("HF_TOKEN", "hf_another")
    elif case == "no_weights":
        del hub.repos[REPO_ID].files["model.safetensors"]
    elif case == "offline":
        hub.stop()
    elif case == "offline_mode":
        import huggingface_hub.constants as hc

        monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    p = C.Plan(C.load(None, student_config(tmp_path / "root", revision)), base_dir=C.REPO_DIR)
    art = step_configs.train(p, "demo").model
    with pytest.raises(DataError) as e:
        model_snapshot.download_model(step_configs.download_model(p, art.name))
    assert expect in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith(f"{REPO_ID}@{revision}")


def test_a_disk_too_small_is_one_line_before_any_download(hub, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 << 30, 9 << 30, 1 << 30))  # 1 GiB free
    p = C.Plan(C.load(None, student_config(tmp_path / "root")), base_dir=C.REPO_DIR)
    art = step_configs.train(p, "demo").model
    with pytest.raises(DataError) as e:
        model_snapshot.download_model(step_configs.download_model(p, art.name))
    msg = str(e.value)
    size = sum(len(b) for rel, b in tiny_hf_model.files().items() if model_snapshot.wanted(rel))
    # the cache and the local root share this disk here: both copies counted, the figures in the line
    assert msg == (f"{REPO_ID}@{SHA}: needs {2 * size / 1e9:.1f} GB (+1 GB spare) on the disk of the Hugging Face "
                   f"cache {tmp_path / 'hf-cache'} and the storage root {art.location}, which has 1.1 GB free: free "
                   "space, or set HF_HOME to a bigger disk; nothing was downloaded"), msg
    assert not [path for _, path in hub.requests if "/resolve/" in path]  # only the repo's metadata was asked


def test_a_local_checkpoint_dir_is_snapshotted_by_content(tmp_path, monkeypatch):
    """A local HF checkpoint dir (no Hub): copied and verified against its own bytes."""
    monkeypatch.chdir(tmp_path)
    src = tiny_hf_model.write(tmp_path / "ckpt")
    cfg = student_config(tmp_path / "root")
    cfg["students"]["tiny-hf"].update(hf_checkpoint=str(src), hf_revision=None)
    p, art, result = build(cfg)
    assert art.name.startswith("ckpt-") and result["source"] == str(src) and result["commit"] == "local"
    assert (tmp_path / "root" / "models" / art.name / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    # its content is its identity: other bytes, another artifact
    (src / "generation_config.json").write_text("{}\n")
    assert step_configs.train(C.Plan(C.load(None, cfg), base_dir=C.REPO_DIR), "demo").model.name != art.name


@pytest.mark.integration
def test_the_rule_snapshots_once_and_training_starts_from_it(tmp_path):
    """Real Snakemake: rule download_model against the fake Hub (over HTTP, in the rule's own process), then
    the demo tokenized and trained from the snapshot with the Hub still reachable: the checkpoint holds the
    student's tokenizer (the demo's files), the tokenize rule and the Levanter config read it from the snapshot,
    and the Hub is asked nothing more."""
    tok_files = {f.name: f.read_bytes() for f in (C.REPO_DIR / "demo/tokenizer").iterdir()}
    h = FakeHub({REPO_ID: Repo(SHA, {**tiny_hf_model.files(), **tok_files})}).start()
    try:
        wd = tmp_path / "wd"
        wd.mkdir()
        cfg = student_config("results")
        cfg["students"]["tiny-hf"].update(tokenizer=REPO_ID, tokenizer_revision=SHA)  # the checkpoint's own
        cfg["teachers"]["demo"]["training"] = {"max_steps": 2}
        t = plan_cli(wd, "demo", cfg)
        model = next(a for a in t["artifacts"] if a["kind"] == "models")
        assert t["init_weights"] == model["location"] and not model["exists"]
        online = {**h.env(), "HF_HOME": str(tmp_path / "hf-home")}
        run(wd, model["manifest"], config=cfg, extra_env=online)
        m = json.loads((wd / model["manifest"]).read_text())
        assert m["payload_from"] == "built" and m["commit"] == SHA and m["location"] == model["location"]
        asked = len(h.requests)
        assert asked >= 4
        # the Hub stays up and reachable (online): tokenize reads the tokenizer from the snapshot, training
        # initialises from it (and the HF export's config comes from it); nothing asks the Hub again
        run(wd, "checkpoints/demo/done", config=cfg, extra_env=online)
        done = json.loads((wd / "checkpoints/demo/done").read_text())
        tok = next(a for a in t["artifacts"] if a["kind"] == "tokenized")
        assert json.loads((wd / tok["manifest"]).read_text())["tokenizer"] == model["location"]
        run_dir = wd / done["checkpoint_dir"]
        lev = json.loads((run_dir / "provenance" / "config.json").read_text())["levanter"]
        snap = str(wd / model["location"])
        assert lev["initialize_from_hf"] == lev["model"]["reference_checkpoint"] == lev["data"]["tokenizer"] == snap
        levanter_log = (run_dir / "logs" / f"{done['hash']}.log.log").read_text()
        assert f"Initializing model from HF checkpoint '{snap}'" in levanter_log
        assert json.loads((wd / done["hf_export"] / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
        assert h.requests[asked:] == []  # asked nothing while it answered
    finally:
        h.stop()
    # the plan shows the snapshot as done under this root
    model = next(a for a in plan_cli(wd, "demo", cfg)["artifacts"] if a["kind"] == "models")
    assert model["exists"] and model["present_at"] == [str(wd / "results")]
