"""The data steps on small real data (the bundled demo dataset, a faked Hub)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trajsft.plan import step_configs
from trajsft.plan import config as C
from trajsft.data import download
from trajsft.data import shard
from trajsft.errors import DataError

DEMO = C.REPO_DIR / "demo" / "dataset"


def make_plan(tmp_path, **over) -> C.Plan:
    return C.Plan(C.load(None, {"storage_root": str(tmp_path / "store"), **over}), base_dir=C.REPO_DIR,
                  state_dir=str(tmp_path / "state"))


def name(plan, kind, teacher="demo"):
    return next(a.name for a in plan.chain(teacher) if a.kind == kind)


def build_shards(plan) -> tuple[dict, Path]:
    download.download(step_configs.download(plan, name(plan, "raw")))
    res = shard.shard(step_configs.shard(plan, name(plan, "shards")))
    return res, Path(plan.get("shards", name(plan, "shards")).location)


def test_shards_are_byte_identical_across_runs(tmp_path):
    res1, d1 = build_shards(make_plan(tmp_path / "a"))
    res2, d2 = build_shards(make_plan(tmp_path / "b"))
    files = sorted(p.name for p in d1.glob("*.jsonl.gz"))
    assert files == ["train-00000.jsonl.gz", "validation-00000.jsonl.gz"]
    for f in files:
        assert (d1 / f).read_bytes() == (d2 / f).read_bytes()
    assert res1["skipped"] == res2["skipped"] and res1["kept"] == res2["kept"]
    assert not [p for p in d1.iterdir() if p.name.startswith(".")], "temp files left behind"


def test_row_count_mismatch_is_one_line(tmp_path):
    plan = make_plan(tmp_path, teachers={"demo": {"rows": 61}})
    with pytest.raises(DataError) as e:
        download.download(step_configs.download(plan, name(plan, "raw")))
    assert str(e.value) == ("demo: demo/dataset@local has 60 rows, config says 61 (teachers.demo.rows): "
                            "wrong revision or changed dataset")


def test_strict_mode_fails_on_first_bad_row(tmp_path):
    plan = make_plan(tmp_path, transform={"strict": True})
    download.download(step_configs.download(plan, name(plan, "raw")))
    with pytest.raises(Exception) as e:
        shard.shard(step_configs.shard(plan, name(plan, "shards")))
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("data/train-00000-of-00002.parquet row 0 (traj_id=")
    assert "field messages" in str(e.value) and "not valid JSON" in str(e.value)


def test_missing_messages_column(tmp_path):
    ds = tmp_path / "ds" / "data"
    ds.mkdir(parents=True)
    pq.write_table(pa.table({"traj_id": ["a"], "text": ["x"]}), ds / "train-00000-of-00001.parquet")
    plan = make_plan(tmp_path, teachers={"demo": {"dataset": str(tmp_path / "ds"), "rows": 1}})
    download.download(step_configs.download(plan, name(plan, "raw")))
    with pytest.raises(DataError, match=r"data/train-00000-of-00001.parquet: missing column 'messages'"):
        shard.shard(step_configs.shard(plan, name(plan, "shards")))


def test_hub_download_pins_revision_and_keeps_token_secret(tmp_path, monkeypatch, caplog):
    """The real Hub code path with huggingface_hub's network calls faked."""
    import huggingface_hub

    calls = {}

    class FakeApi:
        def __init__(self, token=None):
            calls["api_token"] = token

        def dataset_info(self, repo_id, revision=None):
            calls["info"] = (repo_id, revision)
            return type("Info", (), {"sha": "de3bb10" + "0" * 33})()

    def fake_snapshot(repo_id, repo_type, revision, token, local_dir, allow_patterns):
        calls["snapshot"] = (repo_id, repo_type, revision, token)
        (Path(local_dir) / "data").mkdir(parents=True)
        for f in sorted(DEMO.glob("data/*.parquet")):
            shutil.copy(f, Path(local_dir) / "data" / f.name)
        return local_dir

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    secret = "hf_do_not_log_me_123456"
    monkeypatch.setenv("HF_TOKEN", secret)
    plan = make_plan(tmp_path, teachers={"gpt-5-mini": {"rows": 60}})
    with caplog.at_level(logging.DEBUG):
        res = download.download(step_configs.download(plan, name(plan, "raw", "gpt-5-mini")))
    assert calls["info"] == ("AlienKevin/SWE-smith-rs-gpt-5-mini-trajectories", "de3bb10")
    assert calls["snapshot"][:3] == ("AlienKevin/SWE-smith-rs-gpt-5-mini-trajectories", "dataset", "de3bb10" + "0" * 33)
    assert calls["snapshot"][3] == secret and calls["api_token"] == secret
    assert res["rows"] == 60 and res["resolved_revision"].startswith("de3bb10")
    assert secret not in caplog.text and secret not in json.dumps(res)
    assert secret not in json.dumps(plan.get("raw", name(plan, "raw", "gpt-5-mini")).inputs)


def test_hub_errors_are_one_line(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    import requests

    resp = requests.Response()
    resp.status_code = 401
    resp.request = requests.Request("GET", "https://huggingface.co/api/datasets/x").prepare()

    class FakeApi:
        def __init__(self, token=None):
            pass

        def dataset_info(self, repo_id, revision=None):
            raise HfHubHTTPError("401 Unauthorized", response=resp)

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    plan = make_plan(tmp_path)
    with pytest.raises(DataError) as e:
        download.download(step_configs.download(plan, name(plan, "raw", "minimax-m2.5")))
    assert str(e.value) == ("AlienKevin/SWE-smith-rs-minimax-m2.5-trajectories@dfd98db: Hugging Face Hub answered "
                            "HTTP 401 (set HF_TOKEN for gated/private repos)")


@pytest.mark.parametrize("revision", ["main", "v1.0", "DE3BB10", "abc12", "local "])
def test_revision_format_checked_with_the_config(revision):
    with pytest.raises(C.ConfigError) as e:
        C.load(None, {"teachers": {"gpt-5-mini": {"revision": revision}}})
    assert str(e.value) == (f"config: teachers.gpt-5-mini.revision {revision!r} is not a commit sha "
                            "(7-40 hex digits) or 'local'")


@pytest.mark.parametrize("dataset", ["no/such/dir", "./nope", "/definitely/not/here"])
def test_missing_local_dataset_names_the_path_and_never_asks_the_hub(tmp_path, monkeypatch, dataset):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # any Hub call would fail loudly
    plan = make_plan(tmp_path, teachers={"demo": {"dataset": dataset}})
    with pytest.raises(DataError) as e:
        download.download(step_configs.download(plan, name(plan, "raw")))
    assert str(e.value).startswith("demo: local dataset ")
    assert str(e.value).endswith(f"{dataset.lstrip('./') if not dataset.startswith('/') else dataset} does not exist (teachers.demo.dataset)")


def test_each_step_runs_alone_on_a_config_built_by_hand(tmp_path, monkeypatch):
    """No plan: every step takes its typed config (trajsft.plan.step_configs), with every input and output
    location in it, and nothing else: download -> shard -> tokenize, export, download_model, then train and
    check_fit on a training config over those (train's Ray attempt is a stand-in here: test_pipeline and the
    slice tests train for real)."""
    from trajsft.data import tokenize
    from trajsft.plan.step_configs import DownloadConfig, ShardConfig, TokenizeConfig

    store = tmp_path / "store"
    got = download.download(DownloadConfig(
        name="demo-raw", teacher="demo", dataset=str(DEMO), revision="local", rows=60,
        location=str(store / "raw/demo-raw"), local_dataset=DEMO, base_dir=C.REPO_DIR,
        staging=store / "raw/.staging"))
    assert got["rows"] == 60 and got["resolved_revision"] == "local"
    assert got["files"] and all((store / "raw/demo-raw" / rel).is_file() for rel in got["files"])
    plan = make_plan(tmp_path / "p")  # only for the demo teacher's transform settings, as the config gives them
    transform = plan.get("shards", name(plan, "shards")).spec["transform"]
    shards = shard.shard(ShardConfig(
        name="demo-shards", teacher="demo", transform=transform, raw_location=str(store / "raw/demo-raw"),
        location=str(store / "shards/demo-shards"), skipped_list=tmp_path / "state/skipped.jsonl"))
    assert shards["kept"]["train"] > 0 and (tmp_path / "state/skipped.jsonl").exists()
    tok = tokenize.tokenize(TokenizeConfig(
        name="demo-tok", teacher="demo", tokenizer=str(C.REPO_DIR / "demo/tokenizer"), seq_len=1024,
        long_chats="truncate", shards_location=str(store / "shards/demo-shards"), shard_files=shards["files"],
        location=str(store / "tokenized/demo-tok")))
    assert tok["stats"]["train"]["chats"] <= shards["kept"]["train"] and tok["cache_dir"].startswith(str(store))
    assert tok["window"]["seq_len"] == 1024
    _later_steps_on_configs_built_by_hand(tmp_path, store, plan, shards, tok, monkeypatch)


def _later_steps_on_configs_built_by_hand(tmp_path, store, plan, shards, tok, monkeypatch):
    import tiny_hf_model
    from trajsft.cluster.check_fit import check_fit
    from trajsft.data import export
    from trajsft.plan.config import Artifact
    from trajsft.plan.step_configs import ExportConfig, ModelConfig, TrainConfig
    from trajsft.train import model_snapshot, target

    monkeypatch.chdir(tmp_path)  # train's local records (results/checkpoints/<run>)
    ex = export.export(ExportConfig(
        target="demo", name="demo-export", location=str(store / "exports/demo-export"), weights={"demo": 1.0},
        shards={"demo": "demo-shards"}, shard_locations={"demo": str(store / "shards/demo-shards")}, seq_len=1024,
        model=None))
    assert ex["teachers"]["demo"]["shards"] == "demo-shards"
    assert sum(ex["teachers"]["demo"]["messages_rows"].values()) == sum(shards["kept"].values())
    assert ex["llamafactory"]["train_args"]["cutoff_len"] == 1024

    ckpt = tiny_hf_model.write(tmp_path / "tiny-ckpt")
    model = model_snapshot.download_model(ModelConfig(
        name="tiny-model", ref=str(ckpt), revision=None, local=str(ckpt), location=str(store / "models/tiny-model")))
    assert model["commit"] == "local" and (store / "models/tiny-model/config.json").is_file()
    assert {"config.json", "model.safetensors"} <= set(model["files"]) <= {p.name for p in ckpt.iterdir()}

    manifest = tmp_path / "state/tokenized/demo-tok/manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps(tok))
    tokenized = Artifact(kind="tokenized", name="demo-tok", hash="0" * 10, inputs={}, location=str(store / "tokenized/demo-tok"),
                         manifest=str(manifest))
    # the demo target's settings as the config gives them; the locations, the data and the executor are this test's
    demo = plan.get("checkpoints", next(a.name for a in plan.chain("demo") if a.kind == "checkpoints"))
    run = Artifact(kind="checkpoints", name="demo-run", hash="1" * 10, inputs={}, location=str(store / "checkpoints/demo-run"),
                   manifest="", spec={**demo.spec, "tokenized": {"demo": "demo-tok"}})
    workflow = {**plan.cfg, "executor": "ray", "ray": {"address": "http://127.0.0.1:1", "cluster": "here",
                                                       "tpu_type": "v5p-8", "fit_check": False}}
    cfg = TrainConfig(target="demo", spec=plan.specs.targets["demo"], run=run, tokenized={"demo": tokenized},
                      model=None, workflow=workflow, base_dir=C.REPO_DIR, results=str(tmp_path / "state"))
    submitted = []

    def on_ray(got, lev, attempt):  # the Ray job's stand-in: what it was handed, and its final HF export
        submitted.append((got, lev, attempt))
        hf = store / "checkpoints/demo-run/hf/step-2"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text("{}")
        return {"hf_export": str(hf), "steps": 2, "checkpoint_dir": str(store / "checkpoints/demo-run/checkpoints"),
                "wandb_mode": "disabled"}

    done = target.train(cfg, str(tmp_path / "done"), executor=SimpleNamespace(train_attempt=on_ray))
    [(got, lev, attempt)] = submitted
    assert got is cfg and attempt == 1
    assert lev["data"]["cache_dir"] == tok["cache_dir"]
    assert lev["trainer"]["id"] == run.hash and lev["trainer"]["checkpointer"]["base_path"].startswith(run.location)
    assert done["run"] == "demo-run" and done["checkpoint_dir"] == run.location and done["attempts"] == 1
    assert json.loads((tmp_path / "done").read_text())["hf_export"].endswith("hf/step-2")
    assert Path(cfg.state_dir, "manifest.json").is_file()
    assert check_fit(cfg) == {"skipped": "ray.fit_check: false"}
