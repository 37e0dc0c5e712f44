"""Each step's typed config, resolved from the plan where the rule job starts: the step function reads this and
nothing else of the plan, so a test can build one by hand and run the step alone (as marin hands each step its
resolved config). A kind's record names its resolver (:attr:`trajsft.plan.kinds.Kind.config`); rule check_fit
runs on its target's :class:`TrainConfig`, rule eval_matrix on an :class:`EvalMatrixConfig`.

With :mod:`trajsft.plan.step` (a rule job's sub-plan), the only module that looks a target up in the plan
(``Plan.target``): everything else about a target (the CLI, status, the report, the fit check) reads its
:class:`TrainConfig` or :class:`ExportConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from ..errors import ConfigError
from ..io import is_remote
from .config import STATE_DIR, Artifact, Plan
from .placement import Placement, placement
from .specs import TargetSpec

STAGING = ".staging"  # <storage_root>/raw/.staging/<raw name>.<pid>-<start>: a download in progress


@dataclass(frozen=True)
class DownloadConfig:
    """One teacher's dataset at a pinned revision, to ``location`` (``raw/<name>``)."""

    name: str  # the raw artifact's name
    teacher: str
    dataset: str  # a Hub id "owner/name", or a path
    revision: str
    rows: int  # the train split's rows, as the config says (a mismatch fails)
    location: str  # where the payload goes: a local dir or gs://
    local_dataset: Path | None  # the dataset as a local directory when it is one, else None (the Hub)
    base_dir: Path  # what a relative dataset path is relative to
    # where a download is staged, then renamed into place: under the storage root (the workdir's results/ for a
    # gs:// root), never the system temp dir
    staging: Path


@dataclass(frozen=True)
class ShardConfig:
    """Validated jsonl.gz shards of one raw snapshot, to ``location`` (``shards/<name>``)."""

    name: str
    teacher: str
    transform: Mapping[str, Any]  # the teacher's transform settings (repairs, strict, ...)
    raw_location: str  # the raw snapshot it reads
    location: str
    skipped_list: Path  # every skipped row, one JSON object per line, next to the manifest
    tools: Optional[list] = None  # the teacher's tools (OpenAI function tools): every call is checked against them
    rows: Optional[int] = None  # the raw snapshot's rows (its download checked them): the progress's total


@dataclass(frozen=True)
class TokenizeConfig:
    """The Levanter chat cache of one shard set in packing order, to ``location`` (``tokenized/<name>``)."""

    name: str
    teacher: str
    tokenizer: str  # a Hub id or a local directory
    seq_len: int
    long_chats: str  # what happens to a chat longer than seq_len (keep: windowed, drop)
    shards_location: str
    shard_files: Mapping[str, list[str]]  # split -> the shard files (relative to shards_location), in order
    location: str
    tools: Optional[list] = None  # the teacher's tools: every chat renders with their block (None: none)
    chats: Optional[int] = None  # the shard set's kept chats (its manifest): the progress's total


def download(plan: Plan, name: str) -> DownloadConfig:
    art = plan.get("raw", name)
    spec = art.spec
    root = plan.root if not is_remote(plan.root) else STATE_DIR
    return DownloadConfig(name=art.name, teacher=spec["teacher"], dataset=spec["dataset"], revision=spec["revision"],
                          rows=int(spec["rows"]), location=art.location, local_dataset=plan.local_path(spec["dataset"]),
                          base_dir=plan.base_dir, staging=Path(root, "raw", STAGING))


def shard(plan: Plan, name: str) -> ShardConfig:
    art = plan.get("shards", name)
    spec = art.spec
    raw = plan.get("raw", spec["raw"])
    return ShardConfig(name=art.name, teacher=spec["teacher"], transform=spec["transform"],
                       raw_location=raw.location, location=art.location,
                       skipped_list=Path(art.manifest).parent / "skipped.jsonl", tools=spec.get("tools"),
                       rows=int(raw.spec["rows"]))


def tokenize(plan: Plan, name: str) -> TokenizeConfig:
    """Run where the job starts: it reads the shard set's manifest (its files), written by the shard job."""
    art = plan.get("tokenized", name)
    spec = art.spec
    shards = plan.get("shards", spec["shards"])
    made = shards.read_manifest()
    return TokenizeConfig(name=art.name, teacher=spec["teacher"], tokenizer=spec["tokenizer"],
                          seq_len=int(spec["seq_len"]), long_chats=spec["long_chats"], shards_location=shards.location,
                          shard_files=dict(made["files"]), location=art.location, tools=spec.get("tools"),
                          chats=made.get("kept_total"))


@dataclass(frozen=True)
class ModelConfig:
    """A student's initial weights (``init: hf``) at its pinned revision, to ``location`` (``models/<name>``)."""

    name: str
    ref: str  # a Hub id, or the local directory's path as the config gives it
    revision: str | None
    local: str | None  # the checkpoint as a local directory, else None (the Hub)
    location: str


@dataclass(frozen=True)
class TaskSetConfig:
    """A task set (``tasks/<name>``), to ``location``: the bug mutations of the crates in ``crates``, or the
    SWE-smith instances of ``dataset`` at ``revision`` from ``held_out_repos`` (each in its docker image), that pass
    their controls; the tests run in ``sandbox`` (an instance's: its image), each killed after ``command_seconds``."""

    name: str
    task_set: str  # its name in the config's tasks:
    crates: Optional[str]  # the directory of crates (a local path), or None: a dataset's instances
    sandbox: str
    command_seconds: float
    toolchain: str  # cargo --version as the plan hashed it (a dataset's: its instances' images)
    location: str
    dataset: Optional[str] = None  # a Hub dataset of SWE-smith instances
    revision: Optional[str] = None
    held_out_repos: tuple[str, ...] = ()
    max_tasks: Optional[int] = None


@dataclass(frozen=True)
class TrainConfig:
    """One target's training run, to ``run.location`` (``checkpoints/<run name>``); also what the fit check,
    ``status``, ``plan`` and the report read of a target."""

    target: str
    spec: TargetSpec  # its student, training settings and teacher weights (typed)
    run: Artifact  # the run: its hash is the W&B, trainer and Ray job id; spec holds the plain settings
    tokenized: Mapping[str, Artifact]  # teacher -> its tokenized data (manifests are read when the job runs)
    model: Artifact | None  # the initial weights' snapshot (init: hf), else None (random init)
    workflow: Mapping[str, Any]  # the validated workflow config: executor, checkpointing, wandb, ray, storage root
    base_dir: Path  # what the config's relative paths are relative to
    results: str  # the local results directory (the plan's state dir): fit summaries go under it
    # teacher -> its shard set, where the teacher is strict and the set, shared with a lenient entry, was built
    # leniently: the training starts only if it skipped no row (Plan.strict_shards)
    strict_shards: Mapping[str, Artifact] = field(default_factory=dict)

    @property
    def state_dir(self) -> str:
        """The run's local records (its log, the kept manifest), under results/checkpoints/."""
        return str(Path(STATE_DIR, "checkpoints", self.run.name))

    @property
    def log(self) -> str:
        return str(Path(self.state_dir, "train.log"))

    @property
    def placement(self) -> Placement:
        """Where its jobs run (the config's ``executor:``)."""
        return placement(self.workflow)


@dataclass(frozen=True)
class ExportConfig:
    """One target's shards for other trainers (TRL, LLaMA-Factory), to ``location`` (``exports/<name>``)."""

    target: str
    name: str
    location: str
    weights: Mapping[str, float]  # teacher -> its share
    shards: Mapping[str, str]  # teacher -> its shard set's name
    shard_locations: Mapping[str, str]  # teacher -> its shard set's location
    seq_len: int
    model: Mapping[str, Any] | None  # the student's checkpoint as the trainers name it (name_or_path, revision)
    tools: Mapping[str, Optional[list]] = field(default_factory=dict)  # teacher -> its tools (None: none)


def download_model(plan: Plan, name: str) -> ModelConfig:
    art = plan.get("models", name)
    spec = art.spec
    return ModelConfig(name=art.name, ref=spec["ref"], revision=spec["revision"], local=spec["local"],
                       location=art.location)


def make_tasks(plan: Plan, name: str) -> TaskSetConfig:
    art = plan.get("tasks", name)
    spec = art.spec
    return TaskSetConfig(name=art.name, task_set=spec["task_set"], crates=spec.get("crates"), sandbox=spec["sandbox"],
                         command_seconds=float(spec["command_seconds"]), toolchain=art.inputs["toolchain"],
                         location=art.location, dataset=spec.get("dataset"), revision=spec.get("revision"),
                         held_out_repos=tuple(spec.get("held_out_repos") or ()), max_tasks=spec.get("max_tasks"))


def train(plan: Plan, name: str) -> TrainConfig:
    """The target ``name``'s run (an unknown name: one line naming the targets)."""
    record = plan.target(name)
    run = record["run"]
    model = run.spec.get("model")
    return TrainConfig(target=name, spec=plan.specs.targets[name], run=run,
                       tokenized={t: plan.get("tokenized", tok) for t, tok in run.spec["tokenized"].items()},
                       model=plan.get("models", model) if model else None, workflow=plan.cfg,
                       base_dir=plan.base_dir, results=plan.state_dir or STATE_DIR,
                       strict_shards=plan.strict_shards(name))


def export(plan: Plan, name: str) -> ExportConfig:
    art = plan.target(name)["export"]
    spec = art.spec
    return ExportConfig(target=name, name=art.name, location=art.location, weights=dict(spec["weights"]),
                        shards=dict(spec["shards"]),
                        shard_locations={t: plan.get("shards", s).location for t, s in spec["shards"].items()},
                        seq_len=int(spec["seq_len"]), model=spec.get("model"),
                        tools={t: plan.get("shards", s).spec.get("tools") for t, s in spec["shards"].items()})


@dataclass(frozen=True)
class EvalActionsConfig:
    """The next-action scores of one target's trained student (rule ``eval_actions``), to ``location``
    (``evals/<name>``); its done marker is ``evals/<target>/done``."""

    target: str
    name: str
    location: str
    # the target's run: where its model is found (the current storage root first); None in the Ray job that scores
    # on a slice (trajsft.report.actions_job), which is handed the model its submitter located
    train: Optional[TrainConfig]
    held_out: Mapping[str, str]  # teacher -> the location of the shard set whose validation split is scored
    max_turns: int  # turns scored per teacher split (a deterministic sample)
    max_tokens: int  # the greedy generation cap per turn
    max_seqs: Optional[int] = None  # the engine's sequences at once (None: its measured default)
    # teacher -> the tools its turns' prompts render with (what the student trained with; None: no tools block)
    tools: Mapping[str, Optional[list]] = field(default_factory=dict)


def eval_actions(plan: Plan, name: str) -> EvalActionsConfig:
    """The target ``name``'s next-action evaluation."""
    art = plan.target(name)["evals"]
    spec = art.spec
    return EvalActionsConfig(target=name, name=art.name, location=art.location, train=train(plan, name),
                             held_out={t: plan.get("shards", s).location for t, s in spec["shards"].items()},
                             max_turns=int(spec["max_turns"]), max_tokens=int(spec["max_tokens"]),
                             max_seqs=spec.get("max_seqs"), tools=prompt_tools(plan, name, spec["shards"]))


@dataclass(frozen=True)
class EvalAgentConfig:
    """The agent evaluation of one target's trained student (rule ``eval_agent``), to ``location`` (``agent/<name>``):
    mini-swe-agent works each task of the set at ``tasks`` with ``harness``'s templates against the student; its
    done marker is ``agent/<target>/done``."""

    target: str
    name: str
    location: str
    # the target's run: where its model is found; its student's tokenizer and seq_len. None in the Ray job whose
    # episodes run on a slice's host (trajsft.agent.job), which is handed the model its submitter located
    train: Optional[TrainConfig]
    tasks: str  # the task set's location (trajsft.tasks.taskset: instances.jsonl, repos/)
    sandbox: str  # where the episodes' commands and the tests run (the task set's)
    harness: str  # mini-swe-agent's templates (a YAML file)
    step_limit: int
    max_tokens: int
    command_seconds: float
    episodes_at_once: int = 1  # episodes against one engine at once (its max_seqs)
    repeats: int = 1  # episodes per task
    temperature: float = 0.0  # the student's sampling temperature (0: greedy)


def eval_agent(plan: Plan, name: str) -> EvalAgentConfig:
    """The target ``name``'s agent evaluation."""
    art = plan.target(name)["agent"]
    if art.spec.get("problem"):
        raise ConfigError(art.spec["problem"])
    spec, tasks = art.spec, plan.get("tasks", art.spec["tasks"])
    return EvalAgentConfig(target=name, name=art.name, location=art.location, train=train(plan, name),
                           tasks=tasks.location, sandbox=tasks.spec["sandbox"], harness=spec["harness"],
                           step_limit=int(spec["step_limit"]), max_tokens=int(spec["max_tokens"]),
                           command_seconds=float(spec["command_seconds"]),
                           episodes_at_once=int(spec["episodes_at_once"]), repeats=int(spec.get("repeats") or 1),
                           temperature=float(spec.get("temperature") or 0.0))


def prompt_tools(plan: Plan, target: str, teachers) -> dict[str, Optional[list]]:
    """The tools each scored teacher's turns are prompted with: the tools the target's student trained with. A
    teacher of the target: its own; another teacher's split: the target's tools when its teachers agree on them,
    else that teacher's own."""
    own = {t: plan.shards(t).spec.get("tools") for t in plan.specs.targets[target].teachers}
    agreed = [*own.values()][0] if len({repr(v) for v in own.values()}) == 1 else None
    return {t: own[t] if t in own else (agreed if agreed is not None else plan.shards(t).spec.get("tools"))
            for t in teachers}


def held_out_problem(plan: Plan, name: str) -> str | None:
    """Why the target's next-action evaluation has nothing to score, in one line (a teacher it scores holds out no
    chats: the reference config's transform holds out nothing), else None."""
    for t in plan.target(name)["evals"].spec["shards"]:
        if float(plan.specs.teachers[t].transform.heldout_fraction) <= 0:
            return (f"teacher '{t}' holds out no chats (its transform.heldout_fraction is 0): set "
                    f"teachers.{t}.transform.heldout_fraction (or eval.heldout_fraction) above 0 (hashed: it trains "
                    f"again without them), or score other "
                    f"teachers' held-out chats with {name}'s actions.teachers")
    return None


@dataclass(frozen=True)
class EvalRow:
    """One row of the cross-teacher matrix: a trained target."""

    run: Artifact  # the target's run: its provenance holds the train_lm config the evaluation reuses
    tokenizer: str  # the student's tokenizer, resolved (a local dir, or repo@revision)
    cells: Mapping[str, Artifact]  # column teacher -> its held-out split, tokenized for this row's student


@dataclass(frozen=True)
class EvalMatrixConfig:
    """The cross-teacher matrix (rule eval_matrix, ``trajsft eval``): every row's model on every column."""

    rows: Mapping[str, EvalRow]  # row target -> its row, in the config's order
    columns: tuple[str, ...]  # the teachers whose held-out splits are evaluated, in the config's order
    max_eval_batches: int | None
    model: str  # which model of a run: latest, hf_export or checkpoint


def eval_matrix(plan: Plan, name: str = "") -> EvalMatrixConfig:
    """The matrix of the config's ``eval:`` section (none: one line saying it is opt-in); ``name`` is unused (the
    matrix is one per workflow)."""
    ev = plan.cfg.get("eval")
    if ev is None:
        raise ConfigError("config: no eval: section (the cross-teacher matrix is opt-in; see docs/eval-and-export.md)")
    columns = tuple(plan.eval_columns())
    rows = {}
    for r in plan.eval_rows():
        run = train(plan, r).run
        student = run.spec["student"]
        rows[r] = EvalRow(run=run, tokenizer=plan.resolve_ref(student["tokenizer"], student.get("tokenizer_revision")),
                          cells={c: plan.eval_cells[(r, c)] for c in columns})
    return EvalMatrixConfig(rows=rows, columns=columns, max_eval_batches=ev.get("max_eval_batches"),
                            model=ev.get("model", "latest"))
