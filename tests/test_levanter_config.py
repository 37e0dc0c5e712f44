"""The Levanter config of a training run: where each spec field of a target lands
(``trajsft.train.target.levanter_config``, the plan-to-config mapping), and that each section is what
Levanter's own config dataclasses decode (``trajsft.train.levanter_config``), with no unknown or
misspelled key, and the whole dict round-trips through ``TrainLmConfig`` without losing a value."""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import pytest

from spec_utils import run_inputs, target_spec
from trajsft.plan import step_configs
from trajsft.plan.kinds import KINDS
from trajsft.plan import config as C
from trajsft.plan import specs as S
from trajsft.train import levanter_config
from trajsft.train import target as train_target

REV = "b968826d9c46dd6066d109eabc6255188de91218"  # the pinned Qwen/Qwen3-8B revision of config.yaml
PACKED = 1000  # every teacher's packed sequences (fake manifests)
ABSENT = object()


def plan_config(overrides: dict, target: str, monkeypatch) -> dict:
    monkeypatch.setattr(train_target, "train_data", lambda tokenized: {
        "cache_dir": f"/cache/{tokenized.name}", "packed_sequences": PACKED, "tokens_in_window": 10})
    p = C.Plan(C.load(None, copy.deepcopy(overrides)), base_dir=C.REPO_DIR)
    return train_target.train_lm_config_for(step_configs.train(p, target))


def at(cfg: dict, key: str):
    for part in key.split("."):
        if isinstance(cfg, list):
            cfg = cfg[int(part)]
        elif part not in cfg:
            return ABSENT
        else:
            cfg = cfg[part]
    return cfg


def student(name: str, **fields) -> dict:
    return {"students": {name: fields}}


def snapshot(repo: str, revision: str) -> str:
    """Where an init: hf student's checkpoint is read from: its models/ snapshot under the (local) root,
    named by the repo and content-addressed by repo + revision."""
    from trajsft.plan import hashing

    h = hashing.short({"format": KINDS["models"].format, "init": "hf",
                       "hf_checkpoint": {"hub": repo, "revision": revision}})
    return os.path.abspath(f"results/models/{repo.rsplit('/', 1)[-1]}-{h}")


# (spec field, config override, target, Levanter key, the value there)
# gpt-5-mini: 3953 rows, the reference training (7 epochs of rows, batch 16), the qwen3-8b student;
# demo: the tiny random-init student.
MAPPING = [
    ("TrainingSpec.epochs", {"training": {"epochs": 3}}, "gpt-5-mini", "trainer.num_train_steps", math.ceil(3 * 3953 / 16)),
    ("TrainingSpec.epochs_of", {"training": {"epochs_of": "packed_sequences"}}, "gpt-5-mini",
     "trainer.num_train_steps", math.ceil(7 * PACKED / 16)),
    ("TrainingSpec.batch_size", {"training": {"batch_size": 8}}, "gpt-5-mini", "trainer.train_batch_size", 8),
    ("TrainingSpec.learning_rate", {"training": {"learning_rate": 1.5e-5}}, "gpt-5-mini", "optimizer.learning_rate",
     1.5e-5),
    ("TrainingSpec.lr_schedule", {"training": {"lr_schedule": "linear"}}, "gpt-5-mini", "optimizer.lr_schedule",
     "linear"),
    ("TrainingSpec.warmup", {"training": {"warmup": 0.05}}, "gpt-5-mini", "optimizer.warmup", 0.05),
    ("TrainingSpec.decay", {"training": {"decay": 0.5}}, "gpt-5-mini", "optimizer.decay", 0.5),
    ("TrainingSpec.min_lr_ratio", {"training": {"min_lr_ratio": 0.2}}, "gpt-5-mini", "optimizer.min_lr_ratio", 0.2),
    ("TrainingSpec.weight_decay", {"training": {"weight_decay": 0.01}}, "gpt-5-mini", "optimizer.weight_decay", 0.01),
    ("TrainingSpec.max_grad_norm", {"training": {"max_grad_norm": 2.0}}, "gpt-5-mini", "optimizer.max_grad_norm", 2.0),
    ("TrainingSpec.max_grad_norm", {"training": {"max_grad_norm": None}}, "gpt-5-mini", "optimizer.max_grad_norm",
     None),
    ("TrainingSpec.beta1", {"training": {"beta1": 0.8}}, "gpt-5-mini", "optimizer.beta1", 0.8),
    ("TrainingSpec.beta2", {"training": {"beta2": 0.999}}, "gpt-5-mini", "optimizer.beta2", 0.999),
    ("TrainingSpec.epsilon", {"training": {"epsilon": 1e-6}}, "gpt-5-mini", "optimizer.epsilon", 1e-6),
    ("TrainingSpec.seq_len", {"training": {"seq_len": 4096}}, "gpt-5-mini", "model.seq_len", 4096),
    ("TrainingSpec.seed", {"training": {"seed": 7}}, "gpt-5-mini", "trainer.seed", 7),
    ("TrainingSpec.max_steps", {"training": {"max_steps": 123}}, "gpt-5-mini", "trainer.num_train_steps", 123),
    ("StudentSpec.init", student("tiny", init="hf", hf_checkpoint="Org/M", hf_revision="r"), "demo",
     "initialize_from_hf", snapshot("Org/M", "r")),
    ("StudentSpec.init", student("tiny", init="hf", hf_checkpoint="Org/M", hf_revision="r"), "demo",
     "use_hf_model_config", False),
    ("StudentSpec.init", student("tiny", init="hf", hf_checkpoint="Org/M", hf_revision="r"), "demo",
     "model.reference_checkpoint", snapshot("Org/M", "r")),
    ("StudentSpec.tokenizer", student("qwen3-8b", tokenizer="Org/Tok"), "gpt-5-mini", "data.tokenizer",
     f"Org/Tok@{REV}"),
    ("StudentSpec.tokenizer", student("qwen3-8b", tokenizer_revision="r2"), "gpt-5-mini", "data.tokenizer",
     "Qwen/Qwen3-8B@r2"),
    ("StudentSpec.tokenizer", student("qwen3-8b", tokenizer_revision="r2"), "gpt-5-mini", "model.tokenizer",
     "Qwen/Qwen3-8B@r2"),
    ("StudentSpec.rope_theta", student("tiny", rope_theta=5e5), "demo", "model.rope.theta", 5e5),
    ("StudentSpec.hf_checkpoint", student("qwen3-8b", hf_checkpoint="Org/M"), "gpt-5-mini", "initialize_from_hf",
     snapshot("Org/M", REV)),
    ("StudentSpec.hf_checkpoint", student("qwen3-8b", hf_revision="r3"), "gpt-5-mini", "initialize_from_hf",
     snapshot("Qwen/Qwen3-8B", "r3")),
    ("StudentSpec.hf_checkpoint", student("qwen3-8b", hf_revision="r3"), "gpt-5-mini", "model.reference_checkpoint",
     snapshot("Qwen/Qwen3-8B", "r3")),
    # the checkpoint's own tokenizer (same repo and revision) is read from the snapshot too
    ("StudentSpec.hf_checkpoint", student("qwen3-8b", hf_revision="r3", tokenizer_revision="r3"), "gpt-5-mini",
     "data.tokenizer", snapshot("Qwen/Qwen3-8B", "r3")),
    ("StudentSpec.model", student("qwen3-8b", model={"num_layers": 4}), "gpt-5-mini", "model.num_layers", 4),
    *[(f"ModelSpec.{k}", student("tiny", model={k: v}), "demo", f"model.{k}", v)
      for k, v in {"hidden_dim": 96, "intermediate_dim": 256, "num_layers": 3, "num_heads": 8, "num_kv_heads": 4,
                   "head_dim": 32}.items()],
    ("TargetSpec.weights", {"mixtures": {"mix-minimax-gemini": {"teachers": {"minimax-m2.5": 3, "gemini-3-flash": 1}}}},
     "mix-minimax-gemini", "data.train_weights", {"gemini-3-flash": 0.25, "minimax-m2.5": 0.75}),
    ("TargetSpec.weights", {"mixtures": {"mix-minimax-gemini": {"teachers": {"minimax-m2.5": 1, "gpt-5-mini": 1}}}},
     "mix-minimax-gemini", "data.configs.gpt-5-mini.tags", ["gpt-5-mini"]),
    ("TargetSpec.student", {"teachers": {"demo": {"student": "qwen3-8b"}}}, "demo", "model.hidden_dim", 4096),
    ("TargetSpec.training", {"teachers": {"demo": {"training": {"seed": 3}}}}, "demo", "trainer.seed", 3),
    # settings outside the specs (cosmetic: never hashed)
    ("checkpointing", {"checkpointing": {"save_interval_minutes": 3}}, "gpt-5-mini",
     "trainer.checkpointer.save_interval", "3m"),
    ("checkpointing", {"checkpointing": {"keep_every_steps": 100}}, "gpt-5-mini", "trainer.checkpointer.keep",
     [{"every": 100, "until": 1728}, {"every": 1729, "until": None}]),
    ("checkpointing", {"checkpointing": {"keep_every_steps": "quarter_epoch"}}, "gpt-5-mini",
     "trainer.checkpointer.keep.0.every", (3953 // 16) // 4),
    ("checkpointing", {"checkpointing": {"hf_export_every_steps": 7}}, "gpt-5-mini", "hf_save_steps", 7),
    ("checkpointing", {"checkpointing": {"hf_save_dtype": "float32"}}, "gpt-5-mini", "hf_save_dtype", "float32"),
    ("wandb", {"wandb": {"mode": "online"}}, "gpt-5-mini", "trainer.tracker.0.mode", "online"),
    ("wandb", {"wandb": {"project": "p"}}, "gpt-5-mini", "trainer.tracker.0.project", "p"),
    ("wandb", {"wandb": {"entity": "e"}}, "gpt-5-mini", "trainer.tracker.0.entity", "e"),
    ("wandb", {"wandb": {"watch_interval": 5}}, "gpt-5-mini", "trainer.watch", {"interval": 5}),
    ("wandb", {"wandb": {"watch_interval": 10}}, "gpt-5-mini", "trainer.watch", ABSENT),  # Levanter's default
    ("executor", {"executor": "ray"}, "gpt-5-mini", "trainer.mp", "p=f32,c=bfloat16"),
    ("executor", {"executor": "ray"}, "gpt-5-mini", "trainer.require_accelerator", True),
    ("executor", {"executor": "ray"}, "demo", "data.tokenizer", "demo/tokenizer"),  # relative: ships with the code
    ("storage_root", {"storage_root": "gs://b/t"}, "gpt-5-mini", "trainer.jax_compilation_cache_dir",
     "gs://b/t/jax-compilation-cache"),
]


@pytest.mark.parametrize("field,override,target,key,value", MAPPING,
                         ids=[f"{m[0]}->{m[3]}" for m in MAPPING])
def test_each_setting_lands_in_its_levanter_key(field, override, target, key, value, monkeypatch):
    before = at(plan_config({}, target, monkeypatch), key)
    assert before != value, "the override must change the value, or this row tests nothing"
    assert at(plan_config(override, target, monkeypatch), key) == value


def test_every_training_and_student_field_has_a_row():
    """A spec field added without saying where it goes in the Levanter config fails here."""
    rows = {m[0] for m in MAPPING}
    want = {f"{cls.__name__}.{f.name}" for cls in (S.TrainingSpec, S.StudentSpec, S.ModelSpec, S.TargetSpec)
            for f in dataclasses.fields(cls) if not f.metadata["cosmetic"]}
    want -= {"TargetSpec.name"}  # the run's name: it enters the run id (the hash) and the W&B tag below
    want -= {"TargetSpec.actions"}  # the next-action evaluation's settings (evals): after training, not in it
    want -= {"TargetSpec.agent"}  # the agent evaluation's settings (agent): after training, not in it
    assert want - rows == set()


def test_the_target_name_is_the_wandb_tag_and_the_run_id_the_hash(monkeypatch):
    cfg = plan_config({}, "demo", monkeypatch)
    p = C.Plan(C.load(), base_dir=C.REPO_DIR)
    run = p.target("demo")["run"]
    [tok] = run.deps  # the target, then its content-addressed inputs (kind:name) as W&B tags
    assert cfg["trainer"]["tracker"][0]["tags"] == ["demo", f"tokenized:{tok[1]}"] and tok[0] == "tokenized"
    assert cfg["trainer"]["id"] == cfg["trainer"]["tracker"][0]["id"] == run.hash
    assert cfg["hf_save_path"] == os.path.join(os.path.abspath(run.location), "hf")


# ---- the sections, from specs ---------------------------------------------------------------------
def test_single_teacher(tmp_path):
    cfg = levanter_config.train_lm_config(
        target_spec(batch_size=8, seq_len=512),
        run_inputs(str(tmp_path), {"demo": ("/c/a", 100)}, num_train_steps=38, keep_every=10))
    assert cfg["trainer"]["num_train_steps"] == 38
    assert cfg["epoch"] == 3  # a single source cycles its data: 38 batches of 8 need 3 passes over 100
    d = cfg["data"]
    assert d["cache_dir"] == "/c/a" and "configs" not in d and d["tags"] == ["demo"]
    assert d["format"]["type"] == "chat" and d["format"]["pack"] and d["format"]["mask_user_turns"]
    assert d["format"]["chat_template"].startswith("{% generation %}")
    m = cfg["model"]
    assert m["type"] == "qwen3" and m["seq_len"] == 512 and m["rope"]["theta"] == 1e6
    assert m["tokenizer"] == "tok" and m["reference_checkpoint"] == os.path.join(str(tmp_path), "hf_reference")
    assert "initialize_from_hf" not in cfg
    t = cfg["trainer"]
    assert t["id"] == "r1" and t["require_accelerator"] is False and t["mp"] == "f32"
    # the final step (index 37) is always a permanent checkpoint, plus every 10 before it
    assert t["checkpointer"]["keep"] == [{"every": 10, "until": 36}, {"every": 37, "until": None}]
    assert t["checkpointer"]["append_run_id_to_base_path"] is False
    wandb, jl = t["tracker"]
    assert wandb["type"] == "wandb" and wandb["id"] == "r1" and wandb["resume"] == "allow"
    assert jl == {"type": "json_logger"}
    assert cfg["hf_save_path"] == os.path.join(str(tmp_path), "hf") and cfg["hf_save_steps"] == 38
    assert cfg["optimizer"]["type"] == "adam"
    one_pass = levanter_config.train_lm_config(
        target_spec(batch_size=8), run_inputs(str(tmp_path), {"demo": ("/c/a", 100)}, num_train_steps=13))
    assert one_pass["epoch"] == 0


def test_mixture_of_an_hf_student(tmp_path):
    spec = target_spec("mix-minimax-gemini", batch_size=64, seq_len=8192)
    cfg = levanter_config.train_lm_config(spec, run_inputs(
        str(tmp_path), {"minimax-m2.5": ("gs://b/a", 300), "gemini-3-flash": ("gs://b/b", 100)}, num_train_steps=13,
        tokenizer=f"Qwen/Qwen3-8B@{REV}", accelerator="tpu", hf_save_dtype="bfloat16"))
    d = cfg["data"]
    assert set(d["configs"]) == {"minimax-m2.5", "gemini-3-flash"} and d["configs"]["minimax-m2.5"]["cache_dir"] == "gs://b/a"
    assert d["train_weights"] == {"minimax-m2.5": 0.5, "gemini-3-flash": 0.5} and d["stop_strategy"] == "restart"
    assert cfg["epoch"] == 0  # Levanter rejects epochs for mixtures; the mixture restarts instead
    assert cfg["initialize_from_hf"] == f"Qwen/Qwen3-8B@{REV}" and cfg["use_hf_model_config"] is False
    assert cfg["model"]["reference_checkpoint"] == f"Qwen/Qwen3-8B@{REV}"
    assert cfg["model"]["seq_len"] == 8192 and cfg["model"]["num_layers"] == 36
    assert cfg["trainer"]["require_accelerator"] is True and cfg["trainer"]["mp"] == "p=f32,c=bfloat16"
    assert cfg["hf_save_dtype"] == "bfloat16"


def test_bad_inputs_are_refused(tmp_path):
    spec = target_spec()
    with pytest.raises(ValueError, match="run_id"):
        levanter_config.train_lm_config(spec, run_inputs(str(tmp_path), {"demo": ("/c", 10)}, 4, run_id="bad/id"))
    with pytest.raises(ValueError, match="num_train_steps must be >= 2"):
        levanter_config.train_lm_config(spec, run_inputs(str(tmp_path), {"demo": ("/c", 10)}, 1))
    with pytest.raises(ValueError, match="no data sources"):
        levanter_config.train_lm_config(spec, run_inputs(str(tmp_path), {}, 4))
    with pytest.raises(ValueError, match="accelerator"):
        levanter_config.train_lm_config(spec, run_inputs(str(tmp_path), {"demo": ("/c", 10)}, 4, accelerator="npu"))


# ---- Levanter's own dataclasses decode every section ------------------------------------------------
def _configs(tmp_path, monkeypatch) -> dict[str, dict]:
    """Configs of the repo's plan (one teacher, a mixture; random and hf init; CPU and TPU) and built
    from specs with every optional key set."""
    out = {f"{ex}/{t}": plan_config({"executor": ex}, t, monkeypatch)
           for ex in ("local", "ray") for t in ("demo", "gpt-5-mini", "mix-all")}
    out["all-optional"] = levanter_config.train_lm_config(target_spec(), run_inputs(
        str(tmp_path), {"demo": ("/c", 10)}, 40, keep_every=5, hf_save_steps=10, hf_save_dtype="float32",
        watch_interval=0, jax_compilation_cache_dir=str(tmp_path / "jcc")))
    return out


def _decode(cls, value):
    """``value`` decoded into Levanter's ``cls`` (a choice type through its registry, by ``type``)."""
    import draccus

    if isinstance(value, dict) and "type" in value:
        registries = (draccus.ChoiceRegistry, draccus.PluginRegistry)
        base = next(b for b in cls.__mro__ if any(r in b.__bases__ for r in registries))  # e.g. LmConfig
        obj = draccus.decode(base, value)
    else:
        obj = draccus.decode(cls, value)
    assert type(obj) is cls
    return obj


def test_each_section_decodes_into_its_levanter_dataclass(tmp_path, monkeypatch):
    import levanter.config  # noqa: F401  (draccus codecs)
    from levanter.checkpoint import CheckpointerConfig
    from levanter.data.text import (ChatLmDatasetFormat, LMMixtureDatasetConfig, UrlDatasetSourceConfig,
                                    UrlSingleDatasetLMConfig)
    from levanter.models.qwen import Qwen3Config
    from levanter.optim import AdamConfig
    from levanter.tracker.json_logger import JsonLoggerConfig
    from levanter.tracker.wandb import WandbConfig
    from levanter.trainer import TrainerConfig

    for name, cfg in _configs(tmp_path, monkeypatch).items():
        data = cfg["data"]
        if "configs" in data:
            _decode(LMMixtureDatasetConfig, data)
            for source in data["configs"].values():
                _decode(UrlDatasetSourceConfig, source)
                _decode(ChatLmDatasetFormat, source["format"])
        else:
            _decode(UrlSingleDatasetLMConfig, data)
            _decode(ChatLmDatasetFormat, data["format"])
        model = _decode(Qwen3Config, cfg["model"])
        assert model.seq_len == cfg["model"]["seq_len"] and model.rope.theta == cfg["model"]["rope"]["theta"], name
        _decode(TrainerConfig, cfg["trainer"])
        _decode(CheckpointerConfig, cfg["trainer"]["checkpointer"])
        wandb, json_logger = cfg["trainer"]["tracker"]
        _decode(WandbConfig, wandb)
        _decode(JsonLoggerConfig, json_logger)
        _decode(AdamConfig, cfg["optimizer"])


def test_a_misspelled_key_is_caught():
    """The decoding above fails on a key Levanter does not know (so it can catch a typo of ours)."""
    import draccus
    import levanter.config  # noqa: F401
    from levanter.optim import AdamConfig
    from levanter.trainer import TrainerConfig

    spec = target_spec()
    cfg = levanter_config.train_lm_config(spec, run_inputs("/tmp/x", {"demo": ("/c", 10)}, 4))
    with pytest.raises(draccus.utils.DecodingError, match="learning_rat"):
        _decode(AdamConfig, {**cfg["optimizer"], "learning_rat": 1e-3})
    with pytest.raises(draccus.utils.DecodingError, match="checkpointer"):
        _decode(TrainerConfig, {**cfg["trainer"], "checkpointer": {**cfg["trainer"]["checkpointer"], "keeep": []}})


def _leaves(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(x, list) and x and all(isinstance(v, dict) for v in x):
        for i, v in enumerate(x):
            yield from _leaves(v, (*path, i))
    else:
        yield path, x


def test_the_whole_config_round_trips_through_train_lm_config(tmp_path, monkeypatch):
    """``draccus.encode(draccus.decode(TrainLmConfig, cfg))`` keeps every value we set.

    What Levanter spells differently: ``mp`` is a jmp policy (``f32`` -> ``compute=float32,...``), and
    draccus's encode drops a tracker's ``type`` (an entry of a tuple of choice types), so that one is
    checked on the decoded tracker's class. A gs:// ``trainer.log_dir`` (a ``Path`` in Levanter) would lose a
    slash: ``run.prepare_run`` replaces it by a local dir before ``train_lm`` reads it, as it must (the
    log file is a plain FileHandler), so it is compared after that."""
    import draccus
    import jmp
    import levanter.config  # noqa: F401
    from levanter.main.train_lm import TrainLmConfig
    from levanter.tracker import TrackerConfig

    for name, cfg in _configs(tmp_path, monkeypatch).items():
        if "://" in cfg["trainer"]["log_dir"]:
            cfg = copy.deepcopy(cfg)
            cfg["trainer"]["log_dir"] = str(tmp_path / "logs")
        decoded = draccus.decode(TrainLmConfig, cfg)
        encoded = draccus.encode(decoded)
        for path, ours in _leaves(cfg):
            if path[:2] == ("trainer", "tracker") and path[-1] == "type":
                tracker = decoded.trainer.tracker[path[2]]
                assert TrackerConfig.get_choice_name(type(tracker)) == ours, name
                continue
            theirs = encoded
            for p in path:
                theirs = theirs[p]
            if path == ("trainer", "mp"):
                assert jmp.get_policy(theirs) == jmp.get_policy(ours), name
            elif isinstance(ours, list):
                assert list(theirs) == ours, (name, path)
            else:
                assert theirs == ours, (name, path)


def test_qwen3_8b_matches_the_hf_architecture(tmp_path):
    """The qwen3-8b student has Qwen3-8B's 8.19B parameters (shape-only, no weights)."""
    import draccus
    import equinox as eqx
    import jax
    import numpy as np
    import levanter.config  # noqa: F401
    from haliax import Axis
    from levanter.main.train_lm import TrainLmConfig

    cfg = levanter_config.train_lm_config(
        target_spec("gpt-5-mini", seq_len=16384, batch_size=32),
        run_inputs(str(tmp_path), {"gpt-5-mini": ("/c", 1000)}, 63, tokenizer="Qwen/Qwen3-8B", accelerator="tpu"))
    path = levanter_config.write_config(cfg, str(tmp_path / "c.yaml"))
    parsed = draccus.parse(config_class=TrainLmConfig, config_path=path, args=[])
    assert parsed.model.seq_len == 16384 and parsed.epoch == 2 and parsed.trainer.num_train_steps == 63
    model = eqx.filter_eval_shape(parsed.model.build, Axis("vocab", 151936), key=jax.random.PRNGKey(0))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(model) if hasattr(x, "shape"))
    assert abs(n - 8_190_735_360) < 1e6


def test_the_checkpoint_policy_as_levanter_reads_it(tmp_path):
    """Parsed from the YAML we write: a permanent checkpoint every keep_every steps and always at the
    final step index N-1; temporary ones every save_interval."""
    import draccus
    import levanter.config  # noqa: F401
    from levanter.main.train_lm import TrainLmConfig

    for n, keep_every in ((10, 2), (7, None)):
        cfg = levanter_config.train_lm_config(target_spec(batch_size=2), run_inputs(
            str(tmp_path), {"demo": ("/c", 10)}, n, run_id="rt", keep_every=keep_every, save_interval="30m"))
        path = levanter_config.write_config(cfg, str(tmp_path / "c.yaml"))
        parsed = draccus.parse(config_class=TrainLmConfig, config_path=path, args=[])
        ckp = parsed.trainer.checkpointer.create("rt")
        assert (n - 1) % ckp._get_current_step_save_interval(n - 1) == 0
        if keep_every:
            assert ckp._get_current_step_save_interval(2) == 2
        assert parsed.trainer.checkpointer.save_interval.total_seconds() == 1800
        assert [type(t).__name__ for t in parsed.trainer.tracker] == ["WandbConfig", "JsonLoggerConfig"]
