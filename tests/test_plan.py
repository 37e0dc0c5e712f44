import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trajsft.plan import step_configs
from trajsft.plan.kinds import KINDS
from trajsft.plan import config as C
from trajsft.plan import hashing


def plan(**over):
    return C.Plan(C.load(None, over), base_dir=C.REPO_DIR)


def names(p, target):
    return {a.kind: a.name for a in p.chain(target)}


def test_learning_rate_changes_checkpoint_dir_but_not_data():
    base = names(plan(), "minimax-m2.5")
    lr = names(plan(training={"learning_rate": 1e-5}), "minimax-m2.5")
    assert lr["checkpoints"] != base["checkpoints"]
    for kind in ("raw", "shards", "tokenized"):
        assert lr[kind] == base[kind]


NEW_VALUES = {"batch_size": 32, "epochs": 3, "warmup": 0.05, "decay": 0.5, "weight_decay": 0.1, "max_grad_norm": 1.0,
              "beta1": 0.95, "beta2": 0.95, "epsilon": 1e-6, "seq_len": 16384, "seed": 0, "min_lr_ratio": 0.1,
              "lr_schedule": "linear", "max_steps": 10, "epochs_of": "packed_sequences"}


def test_new_values_cover_the_schema():
    import yaml
    schema = yaml.safe_load(C.SCHEMA_PATH.read_text())
    # remat: not hashed (test_cosmetic_settings_not_hashed)
    assert set(NEW_VALUES) | {"learning_rate", "remat"} == set(schema["definitions"]["training"]["properties"])


@pytest.mark.parametrize("field", sorted(NEW_VALUES))
def test_every_training_field_is_hashed(field):
    new = NEW_VALUES[field]
    assert C.load()["training"].get(field) != new
    assert names(plan(training={field: new}), "gemini-3-flash")["checkpoints"] != names(plan(), "gemini-3-flash")["checkpoints"]


@pytest.mark.parametrize("over", [
    {"wandb": {"project": "other", "entity": "someone", "mode": "online"}},
    {"storage_root": "gs://marin-us-east5/trajsft"},
    {"executor": "ray"},
    {"log_level": "DEBUG"},
    {"checkpointing": {"save_interval_minutes": 3}},
    {"checkpointing": {"keep_every_steps": "quarter_epoch", "hf_export_every_steps": 50, "hf_save_dtype": "float32"}},
    {"wandb": {"watch_interval": 10}},
    {"transform": {"strict": True}},
    {"training": {"remat": "save_attention"}},
    {"training": {"remat": "auto"}},
])
def test_cosmetic_settings_not_hashed(over):
    assert names(plan(**over), "minimax-m2.5") == names(plan(), "minimax-m2.5")


def test_transform_changes_data_hashes_downstream_only():
    base, new = names(plan(), "demo"), names(plan(transform={"resolved_only": True}), "demo")
    assert new["raw"] == base["raw"]
    assert new["shards"] != base["shards"] and new["tokenized"] != base["tokenized"]
    assert new["checkpoints"] != base["checkpoints"]


def test_revision_and_student_are_hashed():
    base = names(plan(), "gpt-5-mini")
    p = plan(teachers={"gpt-5-mini": {"revision": "abc1234"}})
    assert names(p, "gpt-5-mini")["raw"] != base["raw"]
    p = plan(students={"qwen3-8b": {"rope_theta": 5e5}})
    n = names(p, "gpt-5-mini")
    assert n["checkpoints"] != base["checkpoints"] and n["tokenized"] == base["tokenized"]
    p = plan(students={"qwen3-8b": {"tokenizer": "Qwen/Qwen3-4B"}})
    assert names(p, "gpt-5-mini")["tokenized"] != base["tokenized"]


def test_float_spelling_does_not_matter():
    assert hashing.digest({"lr": 4e-5}) == hashing.digest({"lr": 0.00004})
    assert hashing.digest({"b": 16.0, "a": 1}) == hashing.digest({"a": 1, "b": 16})
    assert hashing.digest({"lr": 4e-5}) != hashing.digest({"lr": 4.1e-5})


def test_mixture_reuses_teacher_data_and_hashes_weights():
    p = plan()
    mix = names(p, "mix-minimax-gemini")
    mm = {a.name for a in p.chain("mix-minimax-gemini") if a.kind == "tokenized"}
    assert names(p, "minimax-m2.5")["tokenized"] in mm and names(p, "gemini-3-flash")["tokenized"] in mm
    p2 = plan(mixtures={"mix-minimax-gemini": {"teachers": {"minimax-m2.5": 0.7, "gemini-3-flash": 0.3}}})
    assert names(p2, "mix-minimax-gemini")["checkpoints"] != mix["checkpoints"]


def test_local_dataset_hashed_by_content(tmp_path):
    d = tmp_path / "ds" / "data"
    d.mkdir(parents=True)
    (d / "train-00000-of-00001.parquet").write_bytes(b"one")
    over = {"teachers": {"demo": {"dataset": str(tmp_path / "ds")}}}
    first = names(plan(**over), "demo")["raw"]
    (d / "train-00000-of-00001.parquet").write_bytes(b"two")
    assert names(plan(**over), "demo")["raw"] != first


def test_bad_config_is_one_line():
    with pytest.raises(C.ConfigError) as e:
        C.load(None, {"training": {"learning_rate": -1}})
    assert "\n" not in str(e.value) and "learning_rate" in str(e.value)
    with pytest.raises(C.ConfigError, match="unknown teacher 'nope'"):
        C.load(None, {"mixtures": {"m": {"teachers": {"nope": 1}}}})
    with pytest.raises(C.ConfigError, match="unknown target 'nope'"):
        plan().target("nope")


def test_plan_cli_prints_locations_without_running(tmp_path):
    out = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "minimax-m2.5", "--json",
                          "--storage-root", "gs://marin-us-east5/trajsft"], capture_output=True, text=True, check=True)
    [t] = json.loads(out.stdout)
    assert t["checkpoint_dir"].startswith("gs://marin-us-east5/trajsft/checkpoints/minimax-m2.5-")
    assert t["checkpoint_dir"] == C.join("gs://marin-us-east5/trajsft", "checkpoints", names(plan(), "minimax-m2.5")["checkpoints"])
    # upstream first: the student's snapshot holds the tokenizer the tokenized data is made with
    assert [a["kind"] for a in t["artifacts"]] == ["raw", "shards", "models", "tokenized", "checkpoints", "exports",
                                                   "evals", "tasks", "agent"]
    model = step_configs.train(plan(), "minimax-m2.5").model  # the initial weights: once, in the bucket
    assert t["init_weights"] == t["artifacts"][2]["location"] == f"gs://marin-us-east5/trajsft/models/{model.name}"
    assert model.name.startswith("Qwen3-8B-")
    export, evals, tasks, agent = t["artifacts"][-4:]
    # the agent evaluation and its task set, on request too
    assert agent["on_request"] == "snakemake agent/minimax-m2.5/done" and agent["manifest"] == "agent/minimax-m2.5/done"
    assert agent["location"] == C.join("gs://marin-us-east5/trajsft", "agent", plan().target("minimax-m2.5")["agent"].name)
    assert tasks["on_request"] == f"snakemake {tasks['manifest']}" and tasks["location"].startswith(
        "gs://marin-us-east5/trajsft/tasks/demo-")
    assert evals["on_request"] == "snakemake evals/minimax-m2.5/done" and evals["manifest"] == "evals/minimax-m2.5/done"
    assert evals["location"] == C.join("gs://marin-us-east5/trajsft", "evals", plan().target("minimax-m2.5")["evals"].name)
    assert export["location"] == C.join("gs://marin-us-east5/trajsft", "exports", plan().target("minimax-m2.5")["export"].name)
    assert export["on_request"] == "snakemake results/exports/minimax-m2.5/manifest.json"
    text = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "minimax-m2.5"], capture_output=True, text=True,
                          check=True).stdout
    assert f"  exports     results/exports/{plan().target('minimax-m2.5')['export'].name}" in text and "[on request" in text
    assert f"  initial weights:       results/models/{model.name}\n" in text
    bad = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown target" in bad.stderr


def test_targets_with_identical_content_get_distinct_runs():
    demo = C.load()["teachers"]["demo"]
    p = plan(mixtures={"mix-demo": {"teachers": {"demo": 1.0}, "student": "tiny", "training": demo["training"]}})
    a, b = p.target("demo")["run"], p.target("mix-demo")["run"]
    assert a.inputs["training"] == b.inputs["training"] and a.inputs["data"] == b.inputs["data"]
    assert a.hash != b.hash  # the hash is also the W&B run id and the Ray submission id
    assert names(p, "demo")["tokenized"] == names(p, "mix-demo")["tokenized"]


QWEN3_8B_REV = "b968826d9c46dd6066d109eabc6255188de91218"


def test_student_revision_is_pinned_hashed_and_passed_on():
    p = plan()
    assert p.cfg["students"]["qwen3-8b"]["hf_revision"] == QWEN3_8B_REV
    tok = next(a for a in p.chain("minimax-m2.5") if a.kind == "tokenized")
    # the tokenize rule loads the student's tokenizer from its checkpoint's models/ snapshot (the same repo and
    # revision): one copy for tokenize and training, no Hub; the rule waits on download_model for it
    model = step_configs.train(p, "minimax-m2.5").model
    assert tok.spec["tokenizer"] == model.location and (model.kind, model.name) in tok.deps
    assert p.tokenizer_snapshot(p.specs.students["qwen3-8b"]) is model
    from trajsft.train.levanter_config import RunInputs, initialize_from_hf

    run = RunInputs(run_id="r", run_dir="d", tokenizer="t", chat_template="", sources={}, num_train_steps=2)
    # without a snapshot (RunInputs.init_weights): the pinned checkpoint as Levanter's RepoRef
    assert initialize_from_hf(p.specs.students["qwen3-8b"], run) == f"Qwen/Qwen3-8B@{QWEN3_8B_REV}"
    assert step_configs.train(p, "minimax-m2.5").model.inputs["hf_checkpoint"] == {"hub": "Qwen/Qwen3-8B", "revision": QWEN3_8B_REV}
    # a new revision is a new student: new tokenized cache and checkpoint dir, same shards
    other = plan(students={"qwen3-8b": {"hf_revision": "0" * 40, "tokenizer_revision": "0" * 40}})
    a, b = names(p, "minimax-m2.5"), names(other, "minimax-m2.5")
    assert a["shards"] == b["shards"] and a["tokenized"] != b["tokenized"] and a["checkpoints"] != b["checkpoints"]
    assert a["models"] != b["models"]


def test_the_tokenized_data_is_named_by_the_tokenizer_not_by_where_it_is_read():
    # the same tokenizer (repo and revision) read from the Hub (a random-init student) or from the checkpoint's
    # snapshot (init: hf): the same tokenized artifact, with the snapshot as an input only where it is read
    p = plan()
    hub = plan(students={"qwen3-8b": {"init": "random"}})
    a, b = (next(x for x in q.chain("minimax-m2.5") if x.kind == "tokenized") for q in (p, hub))
    assert a.name == b.name and a.inputs == b.inputs
    assert [k for k, _ in a.deps] == ["shards", "models"] and [k for k, _ in b.deps] == ["shards"]
    assert b.spec["tokenizer"] == f"Qwen/Qwen3-8B@{QWEN3_8B_REV}"
    # another tokenizer than the checkpoint's own is not in the snapshot: read where it is
    own = plan(students={"qwen3-8b": {"tokenizer": "demo/tokenizer", "tokenizer_revision": None}})
    c = next(x for x in own.chain("minimax-m2.5") if x.kind == "tokenized")
    assert [k for k, _ in c.deps] == ["shards"] and c.spec["tokenizer"].endswith("demo/tokenizer")


def test_pinned_tokenizer_resolves_to_a_snapshot_of_that_revision(monkeypatch):
    import huggingface_hub

    from trajsft.data import cache as data_cache
    from trajsft.train import levanter_config

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, revision, allow_patterns: calls.append((repo, revision, allow_patterns)) or "/snap")
    assert data_cache.resolve_tokenizer(f"Qwen/Qwen3-8B@{QWEN3_8B_REV}") == "/snap"
    assert calls[0][:2] == ("Qwen/Qwen3-8B", QWEN3_8B_REV) and "tokenizer.json" in calls[0][2]
    assert all(not f.endswith(".safetensors") for f in calls[0][2])
    assert data_cache.resolve_tokenizer("demo/tokenizer") == "demo/tokenizer"
    cfg = {"data": {"tokenizer": f"Qwen/Qwen3-8B@{QWEN3_8B_REV}"}, "model": {"tokenizer": "Qwen/Qwen3-8B"}}
    assert levanter_config.resolve_hub_refs(cfg) == {"data": {"tokenizer": "/snap"}, "model": {"tokenizer": "Qwen/Qwen3-8B"}}


def test_a_remote_tokenizer_is_read_from_a_local_copy_of_its_files(tmp_path):
    """A tokenizer on a bucket (a student's gs:// snapshot): transformers would ask the Hub for the path's file list
    and fail, so its tokenizer files (not the weights) are copied to a local dir once per process; a remote dir
    without tokenizer files is one line."""
    import fsspec

    from trajsft.data import cache as data_cache

    fs = fsspec.filesystem("memory")
    src = C.REPO_DIR / "demo" / "tokenizer"
    ref = f"memory://tok-{tmp_path.name}/models/tiny-0123"
    for f in src.iterdir():
        fs.pipe(f"{ref}/{f.name}", f.read_bytes())
    fs.pipe(f"{ref}/model.safetensors", b"weights")
    local = data_cache.resolve_tokenizer(ref)
    assert os.path.isdir(local) and not os.path.exists(os.path.join(local, "model.safetensors"))
    assert sorted(os.listdir(local)) == sorted(f.name for f in src.iterdir() if f.name in data_cache.TOKENIZER_FILES)
    assert all((src / f).read_bytes() == open(os.path.join(local, f), "rb").read() for f in os.listdir(local))
    assert data_cache.resolve_tokenizer(ref) == local  # once per process
    fs.pipe(f"memory://tok-{tmp_path.name}/empty/README.md", b"x")
    from trajsft.errors import DataError

    with pytest.raises(DataError, match="empty: no tokenizer files"):
        data_cache.resolve_tokenizer(f"memory://tok-{tmp_path.name}/empty")


def test_seq_len_is_in_the_tokenized_hash():
    """The cache is written in packing order for seq_len: another seq_len is another tokenized artifact."""
    base = names(plan(), "minimax-m2.5")
    other = names(plan(training={"seq_len": 40960}), "minimax-m2.5")
    assert other["shards"] == base["shards"] and other["tokenized"] != base["tokenized"]
    assert KINDS["tokenized"].format == 3 and KINDS["shards"].format == 3


def test_multislice_is_refused_at_plan_time(tmp_path):
    """`ray.num_slices` > 1 reaches Levanter's run_on_pod but nothing tests multislice training: the
    plan refuses it in one line, before anything runs."""
    with pytest.raises(C.ConfigError, match=r"ray.num_slices: 2 is not supported") as e:
        C.load([C.DEFAULT_CONFIG, str(Path(C.REPO_DIR, "profiles/tpu-east5/cluster.yaml"))], {"ray": {"num_slices": 2}})
    assert "\n" not in str(e.value)
    extra = tmp_path / "two-slices.yaml"
    extra.write_text("ray:\n  num_slices: 2\n")
    out = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "minimax-m2.5", "--profile", "tpu-east5",
                          "--configfile", str(extra)], capture_output=True, text=True, cwd=C.REPO_DIR)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("trajsft: config: ray.num_slices: 2 is not supported") and out.stderr.count("\n") == 1
    C.load([C.DEFAULT_CONFIG, str(Path(C.REPO_DIR, "profiles/tpu-east5/cluster.yaml"))])  # the profiles' num_slices: 1 plans


def test_a_removed_setting_is_one_line_not_ignored():
    with pytest.raises(C.ConfigError) as e:
        C.load(overrides={"tokenize_engine": "ray"})
    assert str(e.value) == ("config: tokenize_engine: removed: the tokenize rule always builds the cache in its own "
                            "process (Levanter's Ray builder wrote the same cache 3.4x slower); delete the key")


def test_an_artifacts_manifest_is_read_in_one_place(tmp_path):
    from trajsft.errors import DataError

    plan = C.Plan(C.load(), state_dir=str(tmp_path / "results"))
    art = plan.target("demo")["tokenized"][0]
    with pytest.raises(DataError) as e:
        art.read_manifest()
    assert str(e.value) == f"{art.manifest} is missing: build tokenized/{art.name} first"
    Path(art.manifest).parent.mkdir(parents=True)
    Path(art.manifest).write_text(json.dumps({"location": art.location}))
    assert art.read_manifest() == {"location": art.location}


# ---- data named by what it holds (issue 42) -------------------------------------------------------------
MINIMAX_LR2 = {"teachers": {"minimax-lr2": {"dataset": "AlienKevin/SWE-smith-rs-minimax-m2.5-trajectories",
                                            "revision": "dfd98db", "rows": 5251,
                                            "training": {"learning_rate": 2.0e-5}}}}


def test_a_teacher_entry_that_reads_the_same_dataset_shares_its_data_and_trains_its_own_run():
    p = plan(**MINIMAX_LR2)
    a, b = ({x.kind: x for x in p.chain(t)} for t in ("minimax-m2.5", "minimax-lr2"))
    for kind in ("raw", "shards", "models", "tokenized"):
        assert a[kind] is b[kind], kind  # one artifact, one location
    assert a["raw"].name == "SWE-smith-rs-minimax-m2.5-trajectories-3a2ecb9bcc"  # the dataset's name, the same hash
    assert a["checkpoints"].location != b["checkpoints"].location
    assert p.users(a["tokenized"]) == ["minimax-m2.5", "minimax-lr2", "mix-minimax-gemini", "mix-all"]
    assert p.users(b["checkpoints"]) == ["minimax-lr2"]
    # rows are checked at download, not hashed: two entries of one dataset must agree on them, in one line
    bad = {"teachers": {"minimax-lr2": {**MINIMAX_LR2["teachers"]["minimax-lr2"], "rows": 5000}}}
    with pytest.raises(C.ConfigError, match=r"^config: teachers minimax-m2.5 and minimax-lr2 read the same data "
                                            r"\(raw/SWE-smith-rs-minimax-m2.5-trajectories-3a2ecb9bcc\) but set rows "
                                            r"5251 and 5000: make them equal"):
        plan(**bad)


def test_the_runs_and_their_data_keep_their_hashes():
    """Naming data by its dataset renamed raw, shards and tokenized only: every hash, and so every run's name and
    checkpoint directory, is what it was (the demo's local dir is named by its path). With ``tools: []`` the
    teachers' tools add nothing to a hash: the names from before tools were a setting (issue 64); with the default
    (``tools: bash``) the shards, tokenized data and runs are named anew, the raw snapshots are not."""
    assert {t: plan().target(t)["run"].name for t in plan().targets} == {
        "gpt-5-mini": "gpt-5-mini-fe1dd03d2a", "minimax-m2.5": "minimax-m2.5-cce1b876d2",
        "gemini-3-flash": "gemini-3-flash-eb31785c4a", "demo": "demo-6793026b50",
        "mix-minimax-gemini": "mix-minimax-gemini-c17a32be17", "mix-all": "mix-all-0491ec3747"}
    assert names(plan(), "demo") == {"raw": "demo-dataset-3423a9c9fb", "shards": "demo-dataset-773626607f",
                                     "tokenized": "demo-dataset-8224f08649", "checkpoints": "demo-6793026b50"}
    p = plan(tools=[])
    assert {t: p.target(t)["run"].name for t in p.targets} == {
        "gpt-5-mini": "gpt-5-mini-a8f91fe17d", "minimax-m2.5": "minimax-m2.5-b3b795e0cb",
        "gemini-3-flash": "gemini-3-flash-7a512659a0", "demo": "demo-4a31a8c394",
        "mix-minimax-gemini": "mix-minimax-gemini-0c97ef2a25", "mix-all": "mix-all-d929bc5b10"}
    assert names(p, "demo") == {"raw": "demo-dataset-3423a9c9fb", "shards": "demo-dataset-0477676eb2",
                                "tokenized": "demo-dataset-f350e7ac6b", "checkpoints": "demo-4a31a8c394"}


def test_plan_shows_shared_data_once_and_who_uses_it(tmp_path):
    import yaml

    (tmp_path / "copy.yaml").write_text(yaml.safe_dump(MINIMAX_LR2))
    cmd = [sys.executable, "-m", "trajsft.cli", "plan", "minimax-m2.5", "minimax-lr2", "--offline", "--configfile",
           str(tmp_path / "copy.yaml")]
    rows = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout)
    a, b = ({r["kind"]: r for r in t["artifacts"]} for t in rows)
    for kind in ("raw", "shards", "tokenized"):
        assert a[kind]["location"] == b[kind]["location"] and a[kind]["used_by"] == b[kind]["used_by"]
        assert "minimax-lr2" in a[kind]["used_by"]
    assert a["checkpoints"]["location"] != b["checkpoints"]["location"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert text.count(a["tokenized"]["location"]) == 1, text  # shown once, under the first target
    assert f"{a['tokenized']['name']}" in text.split("minimax-lr2:")[1] and "[shared: see minimax-m2.5 above]" in text
    # status: the rows' data, each artifact once, with every target that uses it
    status = [sys.executable, "-m", "trajsft.cli", "status", "minimax-m2.5", "minimax-lr2", "--offline",
              "--configfile", str(tmp_path / "copy.yaml")]
    srows = json.loads(subprocess.run([*status, "--json"], capture_output=True, text=True, check=True,
                                      cwd=tmp_path).stdout)
    assert srows[0]["data"] == srows[1]["data"] == [{"kind": "tokenized", "name": a["tokenized"]["name"],
                                                     "ready": False, "used_by": a["tokenized"]["used_by"]}]
    text = subprocess.run(status, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert text.count("data tokenized/") == 1 and "used by minimax-m2.5, minimax-lr2" in text, text


# ---- the tools a teacher was given (issue 64) -----------------------------------------------------------------
def test_tools_are_a_setting_over_every_teacher_and_mixtures_take_their_teachers():
    from trajsft.plan import tools

    p = plan(teachers={"demo": {"tools": []}})
    assert tools.load(p.specs.teachers["gpt-5-mini"].tools) == tools.PRESETS["bash"]
    assert p.specs.teachers["demo"].tools is None
    # byte-equal to mini-swe-agent's BASH_TOOL, key order included (the template's tojson keeps it)
    assert p.specs.teachers["gpt-5-mini"].tools == (
        '[{"type": "function", "function": {"name": "bash", "description": "Execute a bash command", "parameters": '
        '{"type": "object", "properties": {"command": {"type": "string", "description": "The bash command to '
        'execute"}}, "required": ["command"]}}}]')
    mixed = p.target("mix-all")["tokenized"]
    assert [a.spec["tools"] for a in mixed] == [tools.PRESETS["bash"]] * 3
    assert p.target("minimax-m2.5")["tokenized"][0] in mixed  # the mixture trains its teachers' own data


@pytest.mark.parametrize("where,value,said", [
    ("default", "bsh", "config: teachers.gpt-5-mini: tools: no preset 'bsh' (presets: bash; or give a list"),
    ("demo", {"name": "bash"}, "config: teachers.demo.tools: {'name': 'bash'} is not allowed (allowed: string or "
                               "array or null)"),  # the schema's line
    ("demo", [{"type": "retrieval"}], "config: teachers.demo: tools[0] is not a function tool"),
    ("demo", [{"type": "function", "function": {"name": "bash", "parameters": {"type": "array"}}}],
     "config: teachers.demo: tools[0].function.parameters is not an object schema"),
    ("demo", [{"type": "function", "function": {"description": "no name"}}],
     "config: teachers.demo: tools[0].function.name is missing"),
    ("demo", [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "required": "x"}}}],
     "config: teachers.demo: tools[0].function.parameters.required is not a list of names"),
])
def test_bad_tools_are_one_line_at_plan_time_naming_the_teacher_and_the_key(where, value, said):
    over = {"tools": value} if where == "default" else {"teachers": {where: {"tools": value}}}
    with pytest.raises(C.ConfigError) as e:
        plan(**over)
    assert str(e.value).startswith(said) and "\n" not in str(e.value), str(e.value)
