"""Typed, frozen specs built once from the validated config.

Every field of every spec says, in its ``field(metadata=...)``, whether it is **hashed** (and into
which artifact kinds: ``raw``, ``shards``, ``tokenized``, ``checkpoints`` (a training run),
``exports``, ``evals``) or **cosmetic**, with a one-line reason. :meth:`Spec.identity` returns exactly the
fields hashed into one kind; :class:`trajsft.plan.config.Plan` builds every artifact's hashed ``inputs``
from those identities (plus upstream hashes and code versions). ``tests/test_specs.py`` checks that
every field is declared, that every config key reaches a field, and that each declaration is true
(changing a hashed field changes that artifact's hash and its downstream ones; a cosmetic one none).

A hashed field enters an artifact directly; the artifacts built from it change through its hash (each kind's
``downstream`` in :data:`trajsft.plan.kinds.REGISTRY`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from . import hashing, tools
from ..errors import ConfigError
from .kinds import KINDS  # the artifact kinds a field can be hashed into

# Model dimensions (Levanter's Qwen3 ``model`` fields) of a student that gives none or only some:
# a random-init student starts from ``tiny``, an hf-init student from the entry of its name. Qwen/Qwen3-8B's
# dimensions live in config/config.yaml beside its pinned revision (the facts of its config.json, checked
# against it by ``trajsft fit`` when the Hub is reachable), spelled out so that *our* seq_len is kept.
MODEL_DIMS: dict[str, dict[str, int]] = {
    "tiny": {"hidden_dim": 64, "intermediate_dim": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
             "head_dim": 16},
}
RANDOM_INIT_DIMS = "tiny"
DEFAULT_ROPE_THETA = 1_000_000.0

# Top-level settings that never enter a hash, and why (tests/test_specs.py checks the schema's keys).
COSMETIC_SETTINGS = {
    "storage_root": "where artifacts live, not what they hold (their locations change, their names do not)",
    "copy_from": "other roots a finished payload may be copied from (verified object by object): where, not what",
    "executor": "where training runs (local or a Ray cluster): the same Levanter run either way",
    "log_level": "log verbosity",
    "wandb": "experiment tracking (mode, project, entity, norm logging): not the weights",
    "checkpointing": "checkpoint and HF export cadence and dtype: which snapshots are kept, not the training",
    "ray": "cluster settings set by the tpu-* profiles",
    "default_targets": "which targets `snakemake` builds with no target",
    "report_targets": "which targets the report compares",
}
# Keys whose config value is resolved into another form before it is held (their schema type is the config's, the
# field's is what is hashed): tools, a preset name or a list of function tools, held as the list's JSON text.
RESOLVED_KEYS = {"tools": str}
# Top-level settings that reach the hashes through the specs.
SPEC_SETTINGS = {
    "student": "TargetSpec.student: the student of every target that names none",
    "transform": "TransformSpec: the defaults under every teacher's own transform",
    "tools": "TeacherSpec.tools: the default of every teacher that names none",
    "training": "TrainingSpec: the defaults under every target's own training",
    "students": "StudentSpec, ModelSpec",
    "teachers": "TeacherSpec (data); TargetSpec (a teacher trained on its own: student, training)",
    "mixtures": "TargetSpec",
    "sweeps": "TargetSpec: each cell that is not its base is a mixture entry (trajsft.plan.sweeps), hashed as one",
    "eval": "eval.heldout_fraction: TransformSpec.heldout_fraction; the rest picks the matrix (no artifact)",
    "actions": "ActionsSpec: the defaults under every target's own actions (the next-action evaluation, evals)",
    "tasks": "TaskSetSpec: each task set (the tasks kind: a student's agent is graded on it)",
    "agent": "AgentSpec: the defaults under every target's own agent (the agent evaluation, agent)",
}


def hashed(*kinds: str, why: str, config: tuple[str, ...] | None = None, **kw) -> Any:
    """A field hashed into ``kinds`` (no kinds: into whatever the field holding this spec is hashed into)."""
    assert all(k in KINDS for k in kinds), kinds
    return field(metadata={"hashed": tuple(kinds), "why": why, "config": config, "cosmetic": False}, **kw)


def cosmetic(why: str, config: tuple[str, ...] | None = None, **kw) -> Any:
    """A field that never enters a hash."""
    return field(metadata={"hashed": (), "why": why, "config": config, "cosmetic": True}, **kw)


def config_keys(f: dataclasses.Field) -> tuple[str, ...]:
    """The config keys a spec field carries (its own name unless declared)."""
    return f.metadata.get("config") or (f.name,)


def _value(v: Any, kind: str) -> Any:
    if isinstance(v, Spec):
        return v.identity(kind)
    if isinstance(v, tuple):
        return [_value(x, kind) for x in v]
    return v


class Spec:
    """Base of the frozen specs: :meth:`identity` from the fields' declarations."""

    def identity(self, kind: str) -> dict:
        """Exactly the fields hashed into ``kind`` (None-valued ones left out: unset)."""
        out = {}
        for f in dataclasses.fields(self):
            if "hashed" not in f.metadata:
                raise TypeError(f"{type(self).__name__}.{f.name} is neither hashed nor cosmetic")
            if kind in f.metadata["hashed"]:
                v = _value(getattr(self, f.name), kind)
                if v is not None:
                    out[f.name] = v
        return out


@dataclass(frozen=True)
class Ref(Spec):
    """A dataset, tokenizer or checkpoint reference: a local dir (hashed by content) or a Hub repo at a revision."""

    ref: str = hashed(why="the Hub repo id (a local dir enters by content instead)")
    revision: Optional[str] = hashed(why="the pinned Hub revision (ignored for a local dir)")
    local: Optional[str] = cosmetic("where a local dir or file is read from; a dir's content is what is hashed",
                                     default=None)
    content: Optional[str] = hashed(why="the digest of a local dir's files", default=None)

    def identity(self, kind: str | None = None) -> dict:
        if self.content is not None:
            return {"local_content": self.content}
        return {"hub": self.ref, "revision": self.revision}

    def resolved(self) -> str:
        """A local dir as its path; a Hub repo as ``repo@revision`` when pinned (Levanter's RepoRef)."""
        if self.local is not None:
            return self.local
        return self.hub_ref()

    def hub_ref(self) -> str:
        return f"{self.ref}@{self.revision}" if self.revision else self.ref


@dataclass(frozen=True)
class TransformSpec(Spec):
    """How a teacher's rows become validated chats (rule ``shard``), and long chats at tokenize time."""

    drop_roles: tuple[str, ...] = hashed("shards", why="roles removed from every chat", default=())
    resolved_only: bool = hashed("shards", why="keeps only resolved trajectories", default=False)
    dedup_traj_id: bool = hashed("shards", why="keeps the first row of each traj_id", default=True)
    heldout_fraction: float = hashed("shards", why="which chats are held out (validation split)", default=0.0)
    strict: bool = cosmetic("decides whether a bad row fails the rule; a success writes the same bytes "
                            "(a params rerun trigger of rule shard)", default=False)
    long_chats: str = hashed("tokenized", why="chats longer than seq_len are truncated or dropped when tokenized "
                             "(needs token counts)", default="truncate")


@dataclass(frozen=True)
class TrainingSpec(Spec):
    """Every training setting of a target (its own over the defaults)."""

    epochs: float = hashed("checkpoints", why="passes over the data (with epochs_of: the step count)")
    epochs_of: str = hashed("checkpoints", why="what an epoch counts (rows or packed sequences): the step count")
    batch_size: int = hashed("checkpoints", why="sequences per optimizer step")
    learning_rate: float = hashed("checkpoints", why="optimizer")
    lr_schedule: str = hashed("checkpoints", why="optimizer")
    warmup: float = hashed("checkpoints", why="optimizer")
    decay: float = hashed("checkpoints", why="optimizer")
    min_lr_ratio: float = hashed("checkpoints", why="optimizer")
    weight_decay: float = hashed("checkpoints", why="optimizer")
    max_grad_norm: Optional[float] = hashed("checkpoints", why="gradient clipping (null: none)")
    beta1: float = hashed("checkpoints", why="optimizer")
    beta2: float = hashed("checkpoints", why="optimizer")
    epsilon: float = hashed("checkpoints", why="optimizer")
    seq_len: int = hashed("tokenized", "checkpoints", "exports", why="the tokenized cache is windowed and packed for it; "
                          "an export's cutoff_len / max_length; "
                          "the model's sequence length")
    seed: int = hashed("checkpoints", why="initialisation and data order")
    max_steps: Optional[int] = hashed("checkpoints", why="overrides the step count (null: from epochs)", default=None)
    remat: str = cosmetic("what the backward pass recomputes (trajsft.train.remat): the same math up to floating point, "
                          "so a resumed run may change it; auto: the policy trajsft fit picks", default="full")


@dataclass(frozen=True)
class ModelSpec(Spec):
    """Levanter Qwen3 model dimensions: the config's over the preset of the student (MODEL_DIMS)."""

    hidden_dim: Optional[int] = hashed("checkpoints", why="model architecture", default=None)
    intermediate_dim: Optional[int] = hashed("checkpoints", why="model architecture", default=None)
    num_layers: Optional[int] = hashed("checkpoints", why="model architecture", default=None)
    num_heads: Optional[int] = hashed("checkpoints", why="model architecture", default=None)
    num_kv_heads: Optional[int] = hashed("checkpoints", why="model architecture", default=None)
    head_dim: Optional[int] = hashed("checkpoints", why="model architecture", default=None)

    def dims(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class StudentSpec(Spec):
    """The model trained: its architecture, initialisation and tokenizer."""

    name: str = cosmetic("a label: what it selects (preset model dimensions) is resolved into model",
                         config=("students",))
    init: str = hashed("models", "checkpoints", "exports", why="random weights or a pretrained checkpoint (init: hf "
                       "adds the initial weights artifact; an export names the checkpoint as LLaMA-Factory's model)")
    tokenizer: Ref = hashed("tokenized", "checkpoints", why="token ids of the cache; the model's vocabulary",
                            config=("tokenizer", "tokenizer_revision"))
    rope_theta: float = hashed("checkpoints", why="rotary embedding base")
    model: ModelSpec = hashed("checkpoints", why="the model dimensions Levanter builds (config over preset)")
    hf_checkpoint: Optional[Ref] = hashed("models", "checkpoints", "exports", why="the initial weights (init: hf; none "
                                          "for random), snapshotted once into models/; an export's LLaMA-Factory "
                                          "model_name_or_path",
                                          config=("hf_checkpoint", "hf_revision"), default=None)
    vocab_size: Optional[int] = cosmetic("a fact of the tokenizer (hashed through tokenizer): len(tokenizer), for "
                                         "the fit check of a Hub tokenizer it does not download", default=None)


@dataclass(frozen=True)
class TeacherSpec(Spec):
    """A teacher's data: its dataset and how it is validated."""

    name: str = hashed("checkpoints", "exports", why="runs and exports list their teachers by name (raw, shards "
                       "and tokenized names only start with it)", config=("teachers",))
    dataset: Ref = hashed("raw", why="the downloaded snapshot", config=("dataset", "revision"))
    rows: int = hashed("checkpoints", why="with epochs_of: rows the step count is ceil(epochs * rows / batch); "
                       "download checks it (a params rerun trigger)")
    transform: TransformSpec = hashed("shards", "tokenized", why="see TransformSpec")
    tools: Optional[str] = hashed("shards", "tokenized", why="the tools the teacher was given (their JSON text, key "
                                  "order included): calls are checked against them, every chat renders with their "
                                  "block (None: no tools)", default=None)


@dataclass(frozen=True)
class ActionsSpec(Spec):
    """The next-action evaluation of a trained target (rule ``eval_actions``, ``evals/<target>/done``): its own
    settings over the config's ``actions:``, over these defaults (what a researcher reads: a few dozen turns, long
    enough for one tool call)."""

    max_turns: int = hashed("evals", why="how many held-out assistant turns are scored per teacher split", default=32)
    max_tokens: int = hashed("evals", why="the student's greedy generation cap per turn (reaching it: invalid)",
                             default=256)
    teachers: Optional[tuple[str, ...]] = hashed("evals", why="whose held-out splits are scored (None: the target's "
                                                 "own teachers)", default=None)
    max_seqs: Optional[int] = cosmetic(why="sequences the engine generates at once (None: the measured default, "
                                       "trajsft.train.generate.EVAL_MAX_SEQS): a greedy turn is the same in any batch",
                                       default=None)


@dataclass(frozen=True)
class AgentSpec(Spec):
    """The agent evaluation of a trained target (rule ``eval_agent``, ``agent/<target>/done``): its own settings over
    the config's ``agent:``, over these defaults (the demo's: its task set and its teacher's prompts, short episodes
    a student trained at seq_len 1024 can hold). The task set's hash and the harness file's content are hashed in
    beside the hashed fields by the plan."""

    tasks: str = hashed("agent", why="the task set the episodes work (its name; its hash enters beside it)",
                        default="demo")
    harness: str = cosmetic(why="where mini-swe-agent's templates are (a YAML file): its content, the prompts the "
                            "student sees, is hashed by the plan, not its path", default="config/agent/demo.yaml")
    step_limit: int = hashed("agent", why="model calls per episode: an episode that reaches it ends unsubmitted",
                             default=4)
    max_tokens: int = hashed("agent", why="the student's greedy generation cap per turn", default=64)
    command_seconds: float = hashed("agent", why="an agent's command's time limit in its sandbox: a slow command is "
                                    "killed, its output says so", default=30.0)
    episodes_at_once: int = cosmetic(why="episodes run at once against one engine, which batches their turns: a "
                                     "greedy turn is the same in any batch (4: scripts/bench_agent.py's best on 2 "
                                     "cores)", default=4)
    repeats: Optional[int] = hashed("agent", why="episodes per task (None: one): the resolve rate is their mean, "
                                    "reported with the spread of the repeats' rates", default=None)
    temperature: Optional[float] = hashed("agent", why="the student's sampling temperature (None: 0, greedy); each "
                                          "episode samples with a seed of its own (its task and repeat)", default=None)


@dataclass(frozen=True)
class TargetSpec(Spec):
    """A trained target: a teacher on its own, or a mixture."""

    name: str = hashed("checkpoints", "exports", why="the run's name is its W&B, trainer and Ray job id",
                       config=("teachers", "mixtures"))
    weights: tuple[tuple[str, float], ...] = hashed("checkpoints", "exports", why="each teacher's share (normalised)",
                                                    config=("teachers",))
    student: StudentSpec = hashed("tokenized", "models", "checkpoints", "exports", why="see StudentSpec")
    training: TrainingSpec = hashed("tokenized", "checkpoints", "exports", why="see TrainingSpec")
    actions: ActionsSpec = hashed("evals", why="see ActionsSpec", default=ActionsSpec())
    agent: AgentSpec = hashed("agent", why="see AgentSpec", default=AgentSpec())

    @property
    def teachers(self) -> list[str]:
        return [t for t, _ in self.weights]

    @property
    def scored_teachers(self) -> list[str]:
        """Whose held-out splits the next-action evaluation scores: ``actions.teachers``, else its own teachers."""
        return list(self.actions.teachers or self.teachers)


@dataclass(frozen=True)
class TaskSetSpec(Spec):
    """A task set (rule ``make_tasks``, ``trajsft tasks check <name>``), each task kept by its controls: the bug
    mutations of a directory of crates (the toolchain, ``cargo --version``, hashed in beside these fields by the
    plan), or SWE-smith's instances of the held-out repositories from a Hub dataset at its pinned revision (each
    graded in its docker image)."""

    name: str = cosmetic("the readable part of the set's artifact name (the same crates and settings: the same "
                         "tasks)", config=("tasks",))
    crates: Optional[Ref] = hashed("tasks", why="the crates whose mutations are the tasks (a local dir: its content)",
                                   default=None)
    dataset: Optional[Ref] = hashed("tasks", why="SWE-smith instances: a Hub dataset at its pinned revision",
                                    config=("dataset", "revision"), default=None)
    held_out_repos: Optional[tuple[str, ...]] = hashed("tasks", why="the repositories whose instances are the set "
                                                       "(those held out of training)", default=None)
    max_tasks: Optional[int] = hashed("tasks", why="the first N instances (by instance_id) of the held-out "
                                      "repositories", default=None)
    sandbox: str = cosmetic(why="where the tests run (bubblewrap, or none: the plain directory): the same "
                            "outcomes, which the controls check", default="bubblewrap")
    command_seconds: float = hashed("tasks", why="a test command's time limit: a test slower than it counts as "
                                    "hung, so the tasks kept can differ", default=120.0)


SPEC_CLASSES = (Ref, TransformSpec, TrainingSpec, ModelSpec, StudentSpec, TeacherSpec, ActionsSpec, AgentSpec,
                TargetSpec, TaskSetSpec)


@dataclass(frozen=True)
class Specs:
    """Every teacher, student and target by name (plain dicts: picklable, for rule jobs' params)."""

    teachers: Mapping[str, TeacherSpec]
    students: Mapping[str, StudentSpec]
    targets: Mapping[str, TargetSpec]
    task_sets: Mapping[str, TaskSetSpec] = field(default_factory=dict)


def deep_merge(base: dict, over: dict | None) -> dict:
    """``over`` merged into a copy of ``base``, dicts key by key (config files, profiles, overrides)."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merge(*layers: Mapping | None) -> dict:
    out: dict = {}
    for layer in layers:
        out = deep_merge(out, layer)
    return out


class _Refs:
    """Resolves references relative to the workflow dir, digesting each local dir once."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.digests: dict[str, str] = {}

    def __call__(self, ref: str, revision: str | None) -> Ref:
        cand = Path(ref) if os.path.isabs(ref) else self.base_dir / ref
        if not cand.exists():
            return Ref(ref=ref, revision=revision)
        content = None
        if cand.is_dir():
            if str(cand) not in self.digests:
                self.digests[str(cand)] = hashing.tree_digest(cand)
            content = self.digests[str(cand)]
        return Ref(ref=ref, revision=revision, local=str(cand), content=content)


def _spec(cls, values: Mapping, where: str, **extra):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:  # the schema rejects them first; a key added there needs a field here
        raise ConfigError(f"config: {where}: no spec field for {', '.join(sorted(unknown))}")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return cls(**kw, **extra)
    except TypeError:
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in kw and f.name not in extra
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"config: {where}: missing {', '.join(missing)}") from None


def student_spec(name: str, st: Mapping, refs: _Refs) -> StudentSpec:
    given = {k: v for k, v in (st.get("model") or {}).items()}
    if st["init"] == "random":
        base = MODEL_DIMS[RANDOM_INIT_DIMS]
    elif given or name in MODEL_DIMS:
        base = MODEL_DIMS.get(name, {})
    else:
        raise ConfigError(f"config: students.{name}: give model dimensions (no built-in preset of that name)")
    hf = None
    if st["init"] == "hf":
        hf = refs(st["hf_checkpoint"], st.get("hf_revision"))
    return StudentSpec(
        name=name, init=st["init"], tokenizer=refs(st["tokenizer"], st.get("tokenizer_revision")),
        rope_theta=float(st.get("rope_theta", DEFAULT_ROPE_THETA)),
        model=_spec(ModelSpec, {**base, **given}, f"students.{name}.model"), hf_checkpoint=hf,
        vocab_size=st.get("vocab_size"),
    )


def check_task_set(name: str, entry: Mapping) -> None:
    """A task set's entry names its tasks' source once: crates, or a dataset with its revision and held-out repos."""
    if ("crates" in entry) == ("dataset" in entry):
        raise ConfigError(f"config: tasks.{name}: give crates (a directory of crates: their bug mutations) or dataset "
                          "(SWE-smith instances on the Hub), one of them")
    if "crates" in entry:
        extra = sorted(set(entry) & {"revision", "held_out_repos", "max_tasks"})
        if extra:
            raise ConfigError(f"config: tasks.{name}: {', '.join(extra)} go with dataset, not crates")
        return
    if not entry.get("revision"):
        raise ConfigError(f"config: tasks.{name}: dataset {entry['dataset']} needs revision: the commit sha its "
                          "instances are read at (pinned: the tasks never change under a hash)")
    if not entry.get("held_out_repos"):
        raise ConfigError(f"config: tasks.{name}: dataset {entry['dataset']} needs held_out_repos: the repositories "
                          "whose instances are graded (those held out of training)")


def task_set_spec(name: str, entry: Mapping, refs: _Refs) -> TaskSetSpec:
    check_task_set(name, entry)
    values = dict(entry)
    if "crates" in entry:
        values["crates"] = refs(entry["crates"], None)
    else:
        values["dataset"] = Ref(ref=entry["dataset"], revision=values.pop("revision"))
    if "command_seconds" in values:
        values["command_seconds"] = float(values["command_seconds"])
    return _spec(TaskSetSpec, values, f"tasks.{name}", name=name)


def build(cfg: Mapping, base_dir: str | os.PathLike) -> Specs:
    """Every teacher, student and target of a validated config, as frozen specs."""
    refs = _Refs(Path(base_dir))
    students = {name: student_spec(name, st, refs) for name, st in cfg["students"].items()}
    ev = cfg.get("eval") or {}
    base_transform = dict(cfg["transform"])
    if ev.get("heldout_fraction") is not None:
        base_transform["heldout_fraction"] = float(ev["heldout_fraction"])
    teachers = {}
    for name, t in cfg["teachers"].items():
        tr = _spec(TransformSpec, _merge(base_transform, t.get("transform")), f"teachers.{name}.transform")
        teachers[name] = TeacherSpec(name=name, dataset=refs(t["dataset"], t["revision"]), rows=int(t["rows"]),
                                     transform=tr, tools=tools.resolve(t["tools"] if "tools" in t else cfg.get("tools"),
                                                                       f"teachers.{name}"))
    targets = {}
    entries = [(n, e, {n: 1.0}) for n, e in cfg["teachers"].items()]
    entries += [(n, e, dict(e["teachers"])) for n, e in (cfg.get("mixtures") or {}).items()]
    for name, entry, weights in entries:
        total = sum(weights.values())
        training = _spec(TrainingSpec, _merge(cfg["training"], entry.get("training")), f"{name}: training")
        actions = _spec(ActionsSpec, _merge(cfg.get("actions"), entry.get("actions")), f"{name}: actions")
        agent = _merge(cfg.get("agent"), entry.get("agent"))
        if "command_seconds" in agent:
            agent["command_seconds"] = float(agent["command_seconds"])
        # once and greedy are the defaults, unhashed (None): the evaluations made before these settings keep their hash
        if agent.get("repeats") == 1:
            agent["repeats"] = None
        if agent.get("temperature") is not None:
            agent["temperature"] = float(agent["temperature"]) or None
        agent = _spec(AgentSpec, agent, f"{name}: agent")
        targets[name] = TargetSpec(name=name, weights=tuple((t, w / total) for t, w in sorted(weights.items())),
                                   student=students[entry.get("student", cfg["student"])], training=training,
                                   actions=actions, agent=agent)
    task_sets = {name: task_set_spec(name, t, refs) for name, t in (cfg.get("tasks") or {}).items()}
    return Specs(teachers=teachers, students=students, targets=targets, task_sets=task_sets)


def as_dict(spec: Spec) -> dict:
    """A spec as plain JSON-able data (tuples as lists)."""
    return _value_plain(dataclasses.asdict(spec))


def _value_plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _value_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_value_plain(x) for x in v]
    return v
