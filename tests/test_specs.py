"""The typed specs of the plan (trajsft.plan.specs): every field is declared hashed (into which
artifact) or cosmetic, every config key reaches a field, and each declaration is true: changing a
hashed field changes the hash of the artifacts it is declared for and of their downstream ones, and
changing a cosmetic one changes no hash."""

import copy
import os
import dataclasses
import shutil
import typing
from collections import defaultdict

import pytest
import yaml

from trajsft.plan import step_configs
from trajsft.plan.kinds import KINDS
from trajsft.plan import config as C
from trajsft.plan import specs as S
from trajsft.plan.tools import BASH as BASH_TOOL

QWEN3_8B_REV = "b968826d9c46dd6066d109eabc6255188de91218"
SCHEMA = yaml.safe_load(C.SCHEMA_PATH.read_text())
BASE = C.load()
# Qwen/Qwen3-8B's config.json facts, kept in config/config.yaml beside its pinned revision
QWEN3_8B_DIMS = {"hidden_dim": 4096, "intermediate_dim": 12288, "num_layers": 36, "num_heads": 32, "num_kv_heads": 8,
                 "head_dim": 128}
assert BASE["students"]["qwen3-8b"]["model"] == QWEN3_8B_DIMS


def fields(cls):
    return {f.name: f for f in dataclasses.fields(cls)}


def spec_type(cls, name):
    """The Spec class a field holds (Optional unwrapped), else None."""
    hint = typing.get_type_hints(cls, vars(S))[name]
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and issubclass(t, S.Spec):
            return t
    return None


def kinds_of(cls) -> set[str]:
    return {k for f in dataclasses.fields(cls) for k in f.metadata["hashed"]}


# ---- every field is declared ----------------------------------------------------------------
def problems(cls) -> list[str]:
    out = []
    for name, f in fields(cls).items():
        md, where = f.metadata, f"{cls.__name__}.{name}"
        if not {"hashed", "cosmetic", "why"} <= set(md):
            out.append(f"{where} is not declared (use hashed or cosmetic)")
            continue
        if not md["why"].strip() or "\n" in md["why"]:
            out.append(f"{where}: give a one-line reason")
        if md["cosmetic"] == bool(md["hashed"]) and not (cls is S.Ref and not md["cosmetic"]):
            out.append(f"{where}: hashed into some artifact, or cosmetic")
        if not set(md["hashed"]) <= set(S.KINDS):
            out.append(f"{where}: unknown artifact kind")
        inner = spec_type(cls, name)
        if inner is not None and inner is not S.Ref and set(md["hashed"]) != kinds_of(inner):
            out.append(f"{where}: hashed into {md['hashed']}, the fields of {inner.__name__} into {kinds_of(inner)}")
    return out


@pytest.mark.parametrize("cls", S.SPEC_CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_hashed_or_cosmetic_with_a_reason(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert problems(cls) == []


def test_an_undeclared_or_inconsistent_field_is_caught():
    @dataclasses.dataclass(frozen=True)
    class Bad(S.Spec):
        x: int = S.hashed("checkpoints", why="fine")
        y: int = 0
        z: S.TrainingSpec = S.hashed("checkpoints", why="but seq_len also goes into tokenized", default=None)

    found = problems(Bad)
    assert len(found) == 2 and found[0] == "Bad.y is not declared (use hashed or cosmetic)"
    assert found[1].startswith("Bad.z: hashed into ('checkpoints',), the fields of TrainingSpec into")
    with pytest.raises(TypeError, match="Bad.y is neither hashed nor cosmetic"):
        Bad(1, 2).identity("checkpoints")


def test_identity_is_exactly_the_hashed_fields():
    p = C.Plan(BASE, base_dir=C.REPO_DIR)
    t = p.specs.targets["gpt-5-mini"]
    # max_steps: null, unset; remat: cosmetic (the same math)
    assert set(t.training.identity("checkpoints")) == set(fields(S.TrainingSpec)) - {"max_steps", "remat"}
    assert t.training.identity("tokenized") == {"seq_len": 32768}
    assert p.specs.teachers["demo"].transform.identity("shards") == {
        "drop_roles": ["exit"], "resolved_only": False, "dedup_traj_id": True, "heldout_fraction": 0.1}
    assert p.specs.teachers["demo"].transform.identity("tokenized") == {"long_chats": "truncate"}
    run = p.target("gpt-5-mini")["run"]
    assert run.inputs["training"] == t.training.identity("checkpoints")
    assert run.inputs["student"] == t.student.identity("checkpoints")
    assert run.inputs["student"]["model"] == QWEN3_8B_DIMS  # no longer outside the hash
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.training.seq_len = 1


# ---- every config key reaches a field --------------------------------------------------------
def keys(*classes) -> set[str]:
    return {k for cls in classes for f in dataclasses.fields(cls) for k in S.config_keys(f)}


def props(node) -> set[str]:
    node = node.get("additionalProperties", node) if "properties" not in node else node
    return set(node["properties"])


SECTIONS = {
    "transform": (SCHEMA["definitions"]["transform"], (S.TransformSpec,)),
    "training": (SCHEMA["definitions"]["training"], (S.TrainingSpec,)),
    "students": (SCHEMA["properties"]["students"], (S.StudentSpec,)),
    "students.model": (SCHEMA["properties"]["students"]["additionalProperties"]["properties"]["model"], (S.ModelSpec,)),
    "teachers": (SCHEMA["properties"]["teachers"], (S.TeacherSpec, S.TargetSpec)),
    "mixtures": (SCHEMA["properties"]["mixtures"], (S.TargetSpec,)),
    "actions": (SCHEMA["definitions"]["actions"], (S.ActionsSpec,)),
    "tasks": (SCHEMA["properties"]["tasks"], (S.TaskSetSpec,)),
    "agent": (SCHEMA["definitions"]["agent"], (S.AgentSpec,)),
}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_schema_key_maps_to_a_spec_field(section):
    node, classes = SECTIONS[section]
    missing = props(node) - keys(*classes)
    assert not missing, f"{section}: config key(s) {sorted(missing)} reach no spec field (so no hash)"


def test_every_declared_config_key_exists():
    every = set(SCHEMA["properties"]) | {k for node, _ in SECTIONS.values() for k in props(node)}
    assert keys(*S.SPEC_CLASSES) - {"ref", "local", "content"} <= every  # Ref's own fields are no config keys


JSON_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str, "array": tuple}


def _schema_type(node: dict) -> tuple[set, bool]:
    """The Python types a schema node allows, and whether it allows null."""
    if "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    if "enum" in node:
        return {type(v) for v in node["enum"]}, False
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    return {JSON_TYPES[t] for t in types if t != "null"}, "null" in types


def _field_type(cls, name: str) -> tuple[set, bool]:
    """The Python types a spec field holds (a tuple for any tuple), and whether it may be None."""
    hint = typing.get_type_hints(cls)[name]
    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    py = {typing.get_origin(a) or a for a in args if a is not type(None)}
    return py, type(None) in args


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_each_spec_field_holds_the_type_its_schema_key_allows(section):
    """The schema says a key's type once; the spec field that carries it holds that type (a number is a float, an
    enum a str, an array a tuple, a nullable key an Optional field): checked, so the two never drift."""
    node, classes = SECTIONS[section]
    node = node.get("additionalProperties", node) if "properties" not in node else node
    checked = 0
    for cls in classes:
        for f in dataclasses.fields(cls):
            if S.config_keys(f) != (f.name,) or f.name not in node["properties"]:
                continue  # a field made of several keys (a Ref) or of no key of this section
            sub = node["properties"][f.name]
            if sub.get("type") == "object" or ("$ref" in sub and "properties" in SCHEMA["definitions"][sub["$ref"].rsplit("/", 1)[1]]):
                continue  # a nested section: its own parametrization
            (held, none_ok), (allowed, null_ok) = _field_type(cls, f.name), _schema_type(sub)
            checked += 1
            if f.name in S.RESOLVED_KEYS:  # resolved from the config's form (tools: a preset or a list -> JSON text)
                assert held == {S.RESOLVED_KEYS[f.name]} and none_ok, (section, f.name, held)
                continue
            if all(isinstance(t, type) and issubclass(t, S.Spec) for t in held):
                assert allowed == {str}, (section, f.name)  # a key naming another section (a student): resolved
                continue
            assert held == allowed, (section, f.name, held, allowed)
            # None: the key allows null, or it may be left out (not required) and None is the field's default
            absent_is_none = f.name not in node.get("required", ()) and f.default is None
            assert none_ok == (null_ok or absent_is_none), (section, f.name)
    assert checked, section


def test_every_top_level_setting_is_a_spec_section_or_cosmetic():
    top = set(SCHEMA["properties"])
    assert not set(S.COSMETIC_SETTINGS) & set(S.SPEC_SETTINGS)
    assert set(S.COSMETIC_SETTINGS) | set(S.SPEC_SETTINGS) == top
    assert all(v.strip() for v in [*S.COSMETIC_SETTINGS.values(), *S.SPEC_SETTINGS.values()])


# ---- each declaration is true: perturbations -------------------------------------------------
def kind_hashes(p, target) -> dict[str, set[str]]:
    out = defaultdict(set)
    for a in p.chain(target):
        out[a.kind].add(a.hash)
    out["exports"].add(p.target(target)["export"].hash)
    out["evals"].add(p.target(target)["evals"].hash)
    out["agent"].add(p.target(target)["agent"].hash)
    out["tasks"] = {a.hash for k, a in p.artifacts.items() if k[0] == "tasks"}  # no target's: every set's
    return out


def changed_kinds(mutate, target, target_after=None, base=None) -> set[str]:
    cfg = copy.deepcopy(base or BASE)
    before = kind_hashes(C.Plan(C.validate(copy.deepcopy(cfg)), base_dir=C.REPO_DIR), target)
    mutate(cfg)
    after = kind_hashes(C.Plan(C.validate(cfg), base_dir=C.REPO_DIR), target_after or target)
    return {k for k in S.KINDS if before[k] != after[k]}


def closure(kinds) -> set[str]:
    return set(kinds) | {d for k in kinds for d in S.KINDS[k].downstream}


def teacher(name, **kw):
    return lambda c: c["teachers"][name].update(kw)


def student(name, **kw):
    return lambda c: c["students"][name].update(kw)


def model(name, **kw):
    return lambda c: c["students"][name].setdefault("model", {}).update(kw)


def training(**kw):
    return lambda c: c["training"].update(kw)


def transform(**kw):
    return lambda c: c["transform"].update(kw)


def rename(section, old, new):
    def f(c):
        c[section] = {(new if k == old else k): v for k, v in c[section].items()}
        for m in c["mixtures"].values():
            m["teachers"] = {(new if k == old else k): v for k, v in m["teachers"].items()}
        for t in c["teachers"].values():
            if t.get("student") == old:
                t["student"] = new
        if c["student"] == old:
            c["student"] = new
    return f


# (spec class, field) -> [(what changes in the config, target, target after or None)]
# gpt-5-mini: the qwen3-8b student (init: hf, Hub refs) with epochs_of: rows; demo: tiny (random, local dirs)
PERTURB = {
    ("TeacherSpec", "name"): [(rename("teachers", "gemini-3-flash", "gemini3"), "mix-minimax-gemini", None)],
    ("TeacherSpec", "dataset"): [(teacher("gpt-5-mini", dataset="someone/else"), "gpt-5-mini", None),
                                 (teacher("gpt-5-mini", revision="0" * 40), "gpt-5-mini", None)],
    ("TeacherSpec", "rows"): [(teacher("gpt-5-mini", rows=4000), "gpt-5-mini", None)],
    ("TeacherSpec", "transform"): [(teacher("demo", transform={"heldout_fraction": 0.2, "long_chats": "drop"}),
                                    "demo", None)],
    ("TeacherSpec", "tools"): [(teacher("demo", tools=[]), "demo", None),
                               (lambda c: c.update(tools=[{"type": "function", "function": {"name": "bash"}}]),
                                "gpt-5-mini", None),
                               # the same bash tool, its keys in another order: it renders differently
                               (teacher("gpt-5-mini", tools=[{"function": BASH_TOOL["function"], "type": "function"}]),
                                "gpt-5-mini", None)],
    ("TransformSpec", "drop_roles"): [(transform(drop_roles=["exit", "system"]), "gpt-5-mini", None)],
    ("TransformSpec", "resolved_only"): [(transform(resolved_only=True), "gpt-5-mini", None)],
    ("TransformSpec", "dedup_traj_id"): [(transform(dedup_traj_id=False), "gpt-5-mini", None)],
    ("TransformSpec", "heldout_fraction"): [(transform(heldout_fraction=0.05), "gpt-5-mini", None),
                                            (lambda c: c.update(eval={"heldout_fraction": 0.05}), "gpt-5-mini", None)],
    ("TransformSpec", "strict"): [(transform(strict=True), "gpt-5-mini", None)],
    ("TransformSpec", "long_chats"): [(transform(long_chats="drop"), "gpt-5-mini", None)],
    ("TrainingSpec", "epochs"): [(training(epochs=3), "gpt-5-mini", None)],
    ("TrainingSpec", "epochs_of"): [(training(epochs_of="packed_sequences"), "gpt-5-mini", None)],
    ("TrainingSpec", "batch_size"): [(training(batch_size=32), "gpt-5-mini", None)],
    ("TrainingSpec", "learning_rate"): [(training(learning_rate=1e-5), "gpt-5-mini", None)],
    ("TrainingSpec", "lr_schedule"): [(training(lr_schedule="linear"), "gpt-5-mini", None)],
    ("TrainingSpec", "warmup"): [(training(warmup=0.05), "gpt-5-mini", None)],
    ("TrainingSpec", "decay"): [(training(decay=0.5), "gpt-5-mini", None)],
    ("TrainingSpec", "min_lr_ratio"): [(training(min_lr_ratio=0.1), "gpt-5-mini", None)],
    ("TrainingSpec", "weight_decay"): [(training(weight_decay=0.1), "gpt-5-mini", None)],
    ("TrainingSpec", "max_grad_norm"): [(training(max_grad_norm=None), "gpt-5-mini", None)],
    ("TrainingSpec", "beta1"): [(training(beta1=0.95), "gpt-5-mini", None)],
    ("TrainingSpec", "beta2"): [(training(beta2=0.95), "gpt-5-mini", None)],
    ("TrainingSpec", "epsilon"): [(training(epsilon=1e-6), "gpt-5-mini", None)],
    ("TrainingSpec", "seq_len"): [(training(seq_len=16384), "gpt-5-mini", None)],
    ("TrainingSpec", "seed"): [(training(seed=0), "gpt-5-mini", None)],
    ("TrainingSpec", "max_steps"): [(training(max_steps=10), "gpt-5-mini", None)],
    ("ModelSpec", "hidden_dim"): [(model("tiny", hidden_dim=128), "demo", None)],
    ("ModelSpec", "intermediate_dim"): [(model("tiny", intermediate_dim=256), "demo", None),
                                        (model("qwen3-8b", intermediate_dim=1024), "gpt-5-mini", None)],
    ("ModelSpec", "num_layers"): [(model("tiny", num_layers=3), "demo", None),
                                  (model("qwen3-8b", num_layers=28), "gpt-5-mini", None)],
    ("ModelSpec", "num_heads"): [(model("tiny", num_heads=8), "demo", None)],
    ("ModelSpec", "num_kv_heads"): [(model("tiny", num_kv_heads=4), "demo", None)],
    ("ModelSpec", "head_dim"): [(model("tiny", head_dim=8), "demo", None)],
    ("StudentSpec", "name"): [(rename("students", "tiny", "tiny2"), "demo", None)],
    ("StudentSpec", "init"): [(student("tiny", init="hf", hf_checkpoint="someone/tiny"), "demo", None)],
    ("StudentSpec", "tokenizer"): [(student("qwen3-8b", tokenizer_revision="0" * 40), "gpt-5-mini", None),
                                   (student("qwen3-8b", tokenizer="Qwen/Qwen3-4B"), "gpt-5-mini", None)],
    ("StudentSpec", "rope_theta"): [(student("tiny", rope_theta=5e5), "demo", None)],
    ("StudentSpec", "model"): [(model("qwen3-8b", hidden_dim=2048), "gpt-5-mini", None)],
    ("StudentSpec", "hf_checkpoint"): [(student("qwen3-8b", hf_revision="0" * 40), "gpt-5-mini", None),
                                       (student("qwen3-8b", hf_checkpoint="Qwen/Qwen3-8B-Base"), "gpt-5-mini", None)],
    ("StudentSpec", "vocab_size"): [(student("qwen3-8b", vocab_size=151936), "gpt-5-mini", None)],
    ("TargetSpec", "name"): [(rename("mixtures", "mix-all", "mix-all2"), "mix-all", "mix-all2")],
    ("TargetSpec", "weights"): [(lambda c: c["mixtures"]["mix-minimax-gemini"]["teachers"].update({"minimax-m2.5": 0.7}),
                                 "mix-minimax-gemini", None)],
    ("TargetSpec", "student"): [(teacher("demo", student="qwen3-8b"), "demo", None)],
    ("TargetSpec", "training"): [(teacher("demo", training={"seq_len": 512}), "demo", None)],
    ("TargetSpec", "actions"): [(teacher("demo", actions={"max_turns": 5}), "demo", None),
                                (lambda c: c.update(actions={"max_tokens": 32}), "gpt-5-mini", None)],
    ("ActionsSpec", "max_turns"): [(lambda c: c.update(actions={"max_turns": 4}), "mix-all", None)],
    ("ActionsSpec", "max_tokens"): [(teacher("demo", actions={"max_tokens": 16}), "demo", None)],
    ("ActionsSpec", "teachers"): [(teacher("gpt-5-mini", actions={"teachers": ["demo"]}), "gpt-5-mini", None)],
    ("ActionsSpec", "max_seqs"): [(lambda c: c["teachers"]["demo"]["actions"].update(max_seqs=1), "demo", None)],
    ("TrainingSpec", "remat"): [(lambda c: c["teachers"]["demo"].setdefault("training", {}).update(
                                    remat="save_attention"), "demo", None),
                                (lambda c: c["training"].update(remat="auto"), "gpt-5-mini", None)],
    ("TargetSpec", "agent"): [(teacher("demo", agent={"step_limit": 6}), "demo", None),
                              (lambda c: c.update(agent={"max_tokens": 32}), "gpt-5-mini", None)],
    # the same task set under another name (its hash unchanged): the evaluation names its set
    ("AgentSpec", "tasks"): [(lambda c: c.update(tasks={"demo2": c["tasks"]["demo"]}, agent={"tasks": "demo2"}),
                              "demo", None)],
    ("AgentSpec", "harness"): [(lambda c: c.update(agent={"harness": str(C.REPO_DIR / "config/agent/demo.yaml")}),
                                "demo", None)],
    ("AgentSpec", "step_limit"): [(lambda c: c.update(agent={"step_limit": 2}), "mix-all", None)],
    ("AgentSpec", "max_tokens"): [(teacher("demo", agent={"max_tokens": 16}), "demo", None)],
    ("AgentSpec", "command_seconds"): [(teacher("demo", agent={"command_seconds": 5}), "demo", None)],
    ("AgentSpec", "episodes_at_once"): [(teacher("demo", agent={"episodes_at_once": 8}), "demo", None)],
    ("AgentSpec", "repeats"): [(teacher("demo", agent={"repeats": 3, "temperature": 0.0}), "demo", None)],
    ("AgentSpec", "temperature"): [(teacher("demo", agent={"temperature": 0.7}), "demo", None)],
    ("TaskSetSpec", "name"): [(lambda c: c["tasks"].update(demo2=c["tasks"]["demo"]), "demo", None)],
    ("TaskSetSpec", "crates"): [(lambda c: c["tasks"]["demo"].update(crates="tasks/demo/crates/mini_math"), "demo", None)],
    ("TaskSetSpec", "sandbox"): [(lambda c: c["tasks"]["demo"].update(sandbox="none"), "demo", None)],
    ("TaskSetSpec", "command_seconds"): [(lambda c: c["tasks"]["demo"].update(command_seconds=30), "demo", None)],
    # a dataset's task set (BASE_RS: the demo's agent graded on SWE-smith instances)
    ("TaskSetSpec", "dataset"): [(lambda c: c["tasks"]["rs"].update(dataset="someone/else"), "demo", None, "rs"),
                                 (lambda c: c["tasks"]["rs"].update(revision="0" * 40), "demo", None, "rs")],
    ("TaskSetSpec", "held_out_repos"): [(lambda c: c["tasks"]["rs"]["held_out_repos"].append("o/b.2"), "demo", None,
                                         "rs")],
    ("TaskSetSpec", "max_tasks"): [(lambda c: c["tasks"]["rs"].update(max_tasks=5), "demo", None, "rs")],
    # Ref: held by TeacherSpec.dataset here (tests below use a local copy of the demo dataset)
    ("Ref", "ref"): [(teacher("gpt-5-mini", dataset="someone/else"), "gpt-5-mini", None)],
    ("Ref", "revision"): [(teacher("gpt-5-mini", revision="1234567"), "gpt-5-mini", None)],
}
REF_HOLDER = fields(S.TeacherSpec)["dataset"]  # where the Ref cases above sit


def declared(cls_name, name) -> set[str]:
    f = fields(getattr(S, cls_name))[name]
    return set((REF_HOLDER if cls_name == "Ref" else f).metadata["hashed"])


def test_every_field_has_a_perturbation():
    every = {(cls.__name__, f.name) for cls in S.SPEC_CLASSES for f in dataclasses.fields(cls)}
    local_cases = {("Ref", "local"), ("Ref", "content")}  # test_local_ref_*
    assert every - set(PERTURB) == local_cases


BASES = {"rs": C.deep_merge(BASE, {"tasks": {"rs": {"dataset": "SWE-bench/SWE-smith-rs", "revision": "1234567",
                                                     "held_out_repos": ["o/a.1"]}}, "agent": {"tasks": "rs"}})}


@pytest.mark.parametrize("key", sorted(PERTURB), ids=lambda k: ".".join(k))
def test_changing_a_field_changes_exactly_its_declared_hashes(key):
    for mutate, target, after, *base in PERTURB[key]:
        assert changed_kinds(mutate, target, after, base=BASES[base[0]] if base else None) == \
            closure(declared(*key)), key


def test_rows_count_only_when_epochs_are_rows():
    assert changed_kinds(teacher("demo", rows=61), "demo") == set()  # demo: epochs_of packed_sequences


def test_given_preset_dimensions_are_the_preset():
    """The qwen3-8b dimensions, given or from the preset, are one student (the preset is hashed)."""
    assert changed_kinds(model("qwen3-8b", **QWEN3_8B_DIMS), "gpt-5-mini") == set()


@pytest.fixture
def local_demo(tmp_path):
    ds = tmp_path / "dataset"
    shutil.copytree(C.REPO_DIR / "demo" / "dataset", ds)
    return ds


def test_local_ref_location_is_cosmetic(local_demo):
    assert changed_kinds(teacher("demo", dataset=str(local_demo)), "demo") == set()
    assert fields(S.Ref)["local"].metadata["cosmetic"]


def test_local_ref_content_is_hashed(local_demo):
    base = copy.deepcopy(BASE)
    base["teachers"]["demo"]["dataset"] = str(local_demo)

    def touch(c):
        (local_demo / "README.md").write_text("changed\n")

    assert changed_kinds(touch, "demo", base=base) == closure(declared("Ref", "content"))


@pytest.mark.parametrize("key", sorted(S.COSMETIC_SETTINGS))
def test_cosmetic_settings_change_no_hash(key):
    values = {
        "storage_root": "gs://bucket/trajsft", "copy_from": ["gs://other/trajsft"], "executor": "ray", "log_level": "DEBUG",
        "wandb": {"mode": "online", "project": "p", "entity": "e", "watch_interval": 5},
        "checkpointing": {"save_interval_minutes": 3, "keep_every_steps": "quarter_epoch", "hf_export_every_steps": 7,
                          "hf_save_dtype": "float32"},
        "ray": {"cluster": "c", "tpu_type": "v5p-64", "max_preemptions": 3},
        "default_targets": ["gpt-5-mini"], "report_targets": ["demo"],
    }

    def mutate(c):
        c[key] = values[key]

    for target in ("demo", "gpt-5-mini", "mix-all"):
        assert changed_kinds(mutate, target) == set(), key


def test_eval_matrix_settings_change_no_hash():
    def mutate(c):
        c["eval"] = {"targets": ["demo"], "teachers": ["demo"], "max_eval_batches": 3, "model": "checkpoint"}

    assert changed_kinds(mutate, "demo") == set()


# ---- the pinned revisions and the model reach Levanter ----------------------------------------
def test_revisions_and_dimensions_are_passed_on_to_levanter(monkeypatch):
    from trajsft.train import target as train_target

    p = C.Plan(C.validate(copy.deepcopy(BASE)), base_dir=C.REPO_DIR)
    monkeypatch.setattr(train_target, "train_data", lambda tokenized: {
        "cache_dir": f"/cache/{tokenized.name}", "packed_sequences": 1000, "tokens_in_window": 10})
    lev = train_target.train_lm_config_for(step_configs.train(p, "gpt-5-mini"))
    # the pinned checkpoint is read from its snapshot under the storage root (rule download_model), named
    # by the repo and revision it holds; its tokenizer is the checkpoint's own: read from there too
    model = step_configs.train(p, "gpt-5-mini").model
    assert model.inputs == {"format": KINDS["models"].format, "init": "hf",
                            "hf_checkpoint": {"hub": "Qwen/Qwen3-8B", "revision": QWEN3_8B_REV}}
    assert model.spec == {"ref": "Qwen/Qwen3-8B", "revision": QWEN3_8B_REV, "local": None}
    snap = os.path.abspath(f"results/models/Qwen3-8B-{model.hash}")
    assert lev["initialize_from_hf"] == lev["model"]["reference_checkpoint"] == lev["data"]["tokenizer"] == snap
    for k, v in QWEN3_8B_DIMS.items():
        assert lev["model"][k] == v
    tok = next(a for a in p.chain("gpt-5-mini") if a.kind == "tokenized")
    # what the tokenize rule loads: the same snapshot (the tokenized data is still named by repo and revision)
    assert tok.spec["tokenizer"] == model.location and tok.inputs["tokenizer"] == {"hub": "Qwen/Qwen3-8B",
                                                                                  "revision": QWEN3_8B_REV}

    demo = train_target.train_lm_config_for(step_configs.train(p, "demo"))
    assert "initialize_from_hf" not in demo
    for k, v in BASE["students"]["tiny"]["model"].items():
        assert demo["model"][k] == v


# ---- hashed into a run => used by the run: each change reaches the Levanter config -----------
def levanter(cfg, target, monkeypatch) -> str:
    import json

    from trajsft.train import target as train_target

    monkeypatch.setattr(train_target, "train_data", lambda tokenized: {
        "cache_dir": f"/cache/{tokenized.name.rsplit('-', 1)[0]}", "packed_sequences": 1000, "tokens_in_window": 10})
    p = C.Plan(C.validate(cfg), base_dir=C.REPO_DIR)
    run = p.target(target)["run"]
    return json.dumps(train_target.train_lm_config_for(step_configs.train(p, target)), sort_keys=True).replace(run.hash, "<hash>")


RUN_FIELDS = sorted(k for k in PERTURB if declared(*k) & {"checkpoints"} and k[0] != "Ref"
                    and k not in {("TeacherSpec", "dataset"), ("TeacherSpec", "transform")})


@pytest.mark.parametrize("key", RUN_FIELDS, ids=lambda k: ".".join(k))
def test_every_run_field_reaches_levanter(key, monkeypatch):
    """A field hashed into a run and never passed on (like hf_revision once) fails here."""
    for mutate, target, after in PERTURB[key]:
        cfg = copy.deepcopy(BASE)
        before = levanter(copy.deepcopy(cfg), target, monkeypatch)
        mutate(cfg)
        assert levanter(cfg, after or target, monkeypatch) != before, key
