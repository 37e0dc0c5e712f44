"""Configuration: load + validate, resolve targets, and the content-addressed plan.

``Plan`` answers, without touching the network or running anything, what every artifact
of a target is called, where it lives and which inputs it hashes.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import hashing, toolchain, tools
from ..errors import ConfigError, DataError
from ..io import is_remote, join
from . import specs as S
from .kinds import KINDS
from .specs import deep_merge  # noqa: F401  (the config layers' merge; C.deep_merge for callers)

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # src/trajsft
REPO_DIR = PACKAGE_DIR.parent.parent  # src/trajsft -> repo root (editable install)
SCHEMA_PATH = REPO_DIR / "config" / "schema.yaml"
DEFAULT_CONFIG = REPO_DIR / "config" / "config.yaml"
TEMPLATE_PATH = PACKAGE_DIR / "data" / "templates" / "qwen3_chat_template.jinja"

STATE_DIR = "results"  # local manifests that Snakemake tracks (small files only)


REVISION_RE = re.compile(r"^(?:[0-9a-f]{7,40}|local)$")


def validate(cfg: dict) -> dict:
    """Validate against config/schema.yaml (filling defaults) plus cross-references.

    Numbers written the way YAML 1.1 reads as strings (``3e-3``, ``1e5``) are accepted where the
    schema wants a number. Problems raise one :class:`ConfigError` with one line per problem,
    each naming the key and what is allowed.
    """
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate as sm_validate

    problems = schema_problems(cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        sm_validate(cfg, str(SCHEMA_PATH))  # fills the schema's defaults
    except WorkflowError as e:
        msg = " ".join(str(e).split())
        raise ConfigError(f"invalid config: {msg[:500]}") from None
    from .sweeps import Schema, expand

    expand(cfg, Schema(_schema(), coerce_numbers))  # each sweep cell that is not its base becomes a target (a mixture entry)
    check_references(cfg)
    return cfg


_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _schema() -> dict:
    # libyaml's loader when built in (the same document, ~10x faster: read at every workflow start)
    with open(SCHEMA_PATH) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _resolve(node: dict, root: dict) -> dict:
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"].removeprefix("#/").split("/")
        node = root
        for part in ref:
            node = node[part]
    return node if isinstance(node, dict) else {}


def coerce_numbers(value: Any, schema: dict, root: dict) -> Any:
    """Strings such as ``"3e-3"`` (YAML 1.1 has no float without a dot) become numbers where the
    schema allows a number (integers only if integral and the schema allows an integer)."""
    schema = _resolve(schema, root)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for k, v in list(value.items()):
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            if sub is not None:
                value[k] = coerce_numbers(v, sub, root)
        return value
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        types = schema.get("type")
        types = [types] if isinstance(types, str) else (types or [])
        f = float(value)
        if "number" in types:
            return f
        if "integer" in types and f.is_integer():
            return int(f)
    return value


def _allowed(err) -> str:
    v, val = err.validator, err.validator_value
    if v == "minimum":
        return f"allowed: >= {val}"
    if v == "exclusiveMinimum":
        return f"allowed: > {val}"
    if v == "maximum":
        return f"allowed: <= {val}"
    if v == "exclusiveMaximum":
        return f"allowed: < {val}"
    if v == "enum":
        return "allowed: " + ", ".join(str(x) for x in val)
    if v == "type":
        return "allowed: " + (" or ".join(val) if isinstance(val, list) else str(val))
    if v == "additionalProperties":
        props = sorted(err.schema.get("properties") or {})
        return "allowed keys: " + ", ".join(props) if props else "no other keys"
    if v == "pattern":
        return f"allowed: names matching {val}"
    if v == "anyOf":
        return "allowed: " + (err.schema.get("description") or " or ".join(json.dumps(o) for o in val))
    if v == "minProperties":
        return f"allowed: at least {val} entr{'y' if val == 1 else 'ies'}"
    return f"{v}: {val}"


# settings that are gone: a config that still sets one is told so, not silently ignored
REMOVED = {"tokenize_engine": "removed: the tokenize rule always builds the cache in its own process (Levanter's Ray "
                              "builder wrote the same cache 3.4x slower); delete the key"}


def schema_problems(cfg: dict) -> list[str]:
    """One line per schema violation: ``config: <key>: <value> is not allowed (allowed: ...)``."""
    from jsonschema import Draft202012Validator

    root = _schema()
    coerce_numbers(cfg, root, root)
    out = [f"config: {k}: {why}" for k, why in REMOVED.items() if k in cfg]
    for err in sorted(Draft202012Validator(root).iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path]):
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        if err.validator == "required":
            out.append(f"config: {key}: {err.message}")
        elif err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties") or {}))
            out.append(f"config: {key}: unknown key(s) {', '.join(extra)} ({_allowed(err)})")
        else:
            out.append(f"config: {key}: {err.instance!r} is not allowed ({_allowed(err)})")
    return out


def check_references(cfg: dict) -> None:
    students, teachers, mixtures = cfg["students"], cfg["teachers"], cfg.get("mixtures") or {}
    for name in set(teachers) & set(mixtures):
        raise ConfigError(f"config: '{name}' is both a teacher and a mixture")
    for kind, entries in (("teachers", teachers), ("mixtures", mixtures)):
        for name, entry in entries.items():
            st = entry.get("student", cfg["student"])
            if st not in students:
                raise ConfigError(f"config: {kind}.{name}.student '{st}' is not in students ({', '.join(students)})")
    for name, mix in mixtures.items():
        for t in mix["teachers"]:
            if t not in teachers:
                raise ConfigError(f"config: mixtures.{name} uses unknown teacher '{t}'")
    ev = cfg.get("eval")
    if ev is not None:
        for t in ev.get("targets") or cfg.get("default_targets") or []:
            if t not in teachers and t not in mixtures:
                raise ConfigError(f"config: eval.targets: unknown target '{t}' (teachers and mixtures: "
                                  f"{', '.join([*teachers, *mixtures])})")
        for t in ev.get("teachers") or []:
            if t not in teachers:
                raise ConfigError(f"config: eval.teachers: unknown teacher '{t}' (teachers: {', '.join(teachers)})")
    scored = [("actions", cfg.get("actions") or {})] + [
        (f"{kind}.{name}.actions", e["actions"]) for kind, entries in (("teachers", teachers), ("mixtures", mixtures))
        for name, e in entries.items() if e.get("actions")]
    for where, actions in scored:
        for t in actions.get("teachers") or []:
            if t not in teachers:
                raise ConfigError(f"config: {where}.teachers: unknown teacher '{t}' (teachers: {', '.join(teachers)})")
    for name, t in teachers.items():
        if not REVISION_RE.match(str(t["revision"])):
            raise ConfigError(f"config: teachers.{name}.revision {t['revision']!r} is not a commit sha "
                              "(7-40 hex digits) or 'local'")
    slices = (cfg.get("ray") or {}).get("num_slices", 1)
    if slices != 1:
        # the knob reaches Levanter's run_on_pod, but nothing here exercises multislice training
        raise ConfigError(f"config: ray.num_slices: {slices} is not supported (multislice training is untested): "
                          "set num_slices: 1 and a larger ray.tpu_type (e.g. v5p-64) instead")
    for name, entry in (cfg.get("tasks") or {}).items():
        S.check_task_set(name, entry)
    for name, st in students.items():
        if st["init"] == "hf" and not st.get("hf_checkpoint"):
            raise ConfigError(f"config: students.{name} has init: hf but no hf_checkpoint")
        if st["init"] == "random" and not st.get("model"):
            raise ConfigError(f"config: students.{name} has init: random but no model dimensions")


def load(paths: list[str | os.PathLike] | None = None, overrides: dict | None = None) -> dict:
    """Load config files (later ones win), apply overrides, validate."""
    cfg: dict = {}
    for p in paths or [DEFAULT_CONFIG]:
        try:
            with open(p) as f:
                cfg = deep_merge(cfg, yaml.safe_load(f) or {})
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {' '.join(str(e).split())}") from None
    return validate(deep_merge(cfg, overrides))


@dataclass
class Artifact:
    kind: str  # raw | shards | tokenized | checkpoints
    name: str  # "<readable>-<hash>"
    hash: str
    inputs: dict  # everything hashed, for provenance and `trajsft plan --explain`
    location: str  # payload location under the storage root (local path or gs://)
    manifest: str  # local file Snakemake tracks
    deps: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) of upstream artifacts
    spec: dict = field(default_factory=dict)  # what the producing rule needs

    def read_manifest(self) -> dict:
        """The manifest its rule wrote; missing: one line saying which artifact to build first."""
        try:
            return json.loads(Path(self.manifest).read_text())
        except FileNotFoundError:
            raise DataError(f"{self.manifest} is missing: build {self.kind}/{self.name} first") from None


class Plan:
    """Every artifact of every configured target, content-addressed."""

    def __init__(self, cfg: dict, base_dir: str | os.PathLike = REPO_DIR, state_dir: str = STATE_DIR):
        self.cfg = cfg
        self.base_dir = Path(base_dir)
        self.state_dir = state_dir
        self.root = cfg["storage_root"]
        if not is_remote(self.root) and not os.path.isabs(self.root):
            self.root = str(self.root)  # relative to the working directory, like Snakemake paths
        self.artifacts: dict[tuple[str, str], Artifact] = {}
        self.specs = S.build(cfg, self.base_dir)  # typed, frozen: every hash input comes from them
        self.targets: dict[str, dict] = {}
        for name in list(cfg["teachers"]) + list(cfg.get("mixtures") or {}):
            self.targets[name] = self._resolve_target(name)
        for name in self.specs.task_sets:
            self.task_set(name)
        self.eval_cells: dict[tuple[str, str], Artifact] = {}  # (row target, column teacher) -> tokenized
        if cfg.get("eval") is not None:
            self._resolve_eval()

    # ---- resolution ---------------------------------------------------------------------
    def local_path(self, p: str) -> Path | None:
        """A config path that names a local dir (relative to the repo), else None."""
        cand = Path(p) if os.path.isabs(p) else self.base_dir / p
        return cand if cand.exists() else None

    def _resolve_target(self, name: str) -> dict:
        cfg = self.cfg
        spec = self.specs.targets[name]
        mixtures = cfg.get("mixtures") or {}
        entry = cfg["teachers"].get(name) or mixtures[name]
        student_name = spec.student.name
        student = copy.deepcopy(cfg["students"][student_name])
        training = deep_merge(cfg["training"], entry.get("training"))
        tokenized = [(teacher, w, self._tokenized(teacher, spec.student, spec.training)) for teacher, w in spec.weights]
        model = self._model(spec.student)  # the initial weights (init: hf), else None
        rows = {t: self.specs.teachers[t].rows for t in spec.teachers}
        run_inputs = {
            "format": KINDS["checkpoints"].format,
            # the run's name is part of its identity: the hash is also its W&B/trainer/Ray job id
            "target": spec.name,
            "data": [{"teacher": t, "weight": w, "tokenized": a.hash} for t, w, a in tokenized],
            "student": spec.student.identity("checkpoints"),
            "training": spec.training.identity("checkpoints"),
        }
        if spec.training.epochs_of == "rows":
            # the step count is ceil(epochs * rows / batch_size): the rows count is result-affecting
            run_inputs["rows"] = rows
        h = hashing.short(run_inputs)
        run_name = f"{name}-{h}"
        run = self._add(
            "checkpoints",
            run_name,
            h,
            run_inputs,
            deps=[(a.kind, a.name) for _, _, a in tokenized] + ([(model.kind, model.name)] if model else []),
            spec={
                "target": name,
                "model": model.name if model else None,
                "student_name": student_name,
                "student": student,
                "training": training,
                "weights": dict(spec.weights),
                "tokenized": {t: a.name for t, _, a in tokenized},
                "rows": rows,
            },
        )
        return {"name": name, "run": run, "tokenized": [a for _, _, a in tokenized],
                "export": self._export(name, dict(spec.weights), int(spec.training.seq_len), spec.student.hf_checkpoint),
                "evals": self._evals(spec, run), "agent": self._agent(spec, run)}

    def _evals(self, spec: S.TargetSpec, run: Artifact) -> Artifact:
        """The next-action scores of the target's trained student (rule ``eval_actions``) on the held-out chats of
        ``spec.scored_teachers``: content-addressed by the run (its final model) and those shard sets (their
        validation splits) and the evaluation's settings; its done marker is ``evals/<target>/done``."""
        shards = {t: self.shards(t) for t in spec.scored_teachers}
        inputs = {"format": KINDS["evals"].format, "target": spec.name, "run": run.hash,
                  "held_out": [{"teacher": t, "shards": a.hash} for t, a in shards.items()],
                  **spec.actions.identity("evals")}
        h = hashing.short(inputs)
        art = self._add("evals", f"{spec.name}-{h}", h, inputs,
                        deps=[(run.kind, run.name)] + [(a.kind, a.name) for a in shards.values()],
                        spec={"target": spec.name, "shards": {t: a.name for t, a in shards.items()},
                              "max_turns": spec.actions.max_turns, "max_tokens": spec.actions.max_tokens,
                              "max_seqs": spec.actions.max_seqs})
        art.manifest = self.evals_done_path(spec.name)  # per target, beside checkpoints/<target>/done
        return art

    def _agent(self, spec: S.TargetSpec, run: Artifact) -> Artifact:
        """The agent evaluation of the target's trained student (rule ``eval_agent``): content-addressed by the run
        (its final model), the task set, the harness file's content and the evaluation's settings; its done marker
        is ``agent/<target>/done``."""
        # what makes it impossible is said when it is asked for (its rule, trajsft eval --agent), never by every plan
        tasks = self.task_set(spec.agent.tasks) if spec.agent.tasks in self.specs.task_sets else None
        harness = self.local_path(spec.agent.harness)
        problem = None
        if tasks is None:
            problem = (f"config: {spec.name}: agent.tasks: unknown task set {spec.agent.tasks!r} (config tasks: "
                       f"{', '.join(self.specs.task_sets) or 'none'})")
        elif harness is None or not harness.is_file():
            problem = f"config: {spec.name}: agent.harness: {spec.agent.harness} is not a file"
        elif (spec.agent.repeats or 1) > 1 and not spec.agent.temperature:
            problem = (f"config: {spec.name}: agent.repeats is {spec.agent.repeats} with agent.temperature 0: greedy "
                       "episodes repeat themselves; set agent.temperature above 0 (0.7 is common)")
        inputs = {"format": KINDS["agent"].format, "target": spec.name, "run": run.hash,
                  "task_set": tasks.hash if tasks else None,
                  "harness_content": hashing.file_digest(harness) if harness and harness.is_file() else None,
                  **spec.agent.identity("agent")}
        h = hashing.short(inputs)
        deps = [(run.kind, run.name)] + ([(tasks.kind, tasks.name)] if tasks else [])
        art = self._add("agent", f"{spec.name}-{h}", h, inputs, deps=deps,
                        spec={**S.as_dict(spec.agent), "target": spec.name, "tasks": tasks.name if tasks else None,
                              "harness": str(harness) if harness else spec.agent.harness, "problem": problem})
        art.manifest = self.agent_done_path(spec.name)  # per target, beside checkpoints/<target>/done
        return art

    def _export(self, target: str, weights: dict[str, float], seq_len: int, model: S.Ref | None) -> Artifact:
        """The target's shards for other trainers (rule `export`): LLaMA-Factory + messages jsonl, with
        the training arguments that render them as trajsft trains (cutoff_len = seq_len, the template)."""
        shards = {t: self.shards(t) for t in sorted(weights)}
        inputs = {"format": KINDS["exports"].format, "target": target,
                  "data": [{"teacher": t, "weight": weights[t], "shards": a.hash} for t, a in shards.items()],
                  "seq_len": seq_len, "model": model.identity() if model else None, "template": hashing.file_digest(TEMPLATE_PATH)}
        h = hashing.short(inputs)
        art = self._add("exports", f"{target}-{h}", h, inputs, deps=[(a.kind, a.name) for a in shards.values()],
                        spec={"target": target, "weights": {t: weights[t] for t in shards},
                              "shards": {t: a.name for t, a in shards.items()}, "seq_len": seq_len,
                              "model": model and {"name_or_path": model.local or model.ref,
                                                  "revision": None if model.content else model.revision}})
        art.manifest = str(Path(self.state_dir, "exports", target, "manifest.json"))  # per target, like cards
        return art

    def _resolve_eval(self) -> None:
        """The cross-teacher matrix: rows are trained targets, columns teachers' held-out splits.
        A cell evaluates the row's model on the column teacher's validation split tokenized for the
        row's student and ``seq_len`` (the same artifact as the column's training data when they
        match, so every row that shares a student and seq_len sees exactly the same chats)."""
        for col in self.eval_columns():
            frac = float(self.teacher_transform(col).get("heldout_fraction") or 0)
            if frac <= 0:
                raise ConfigError(f"config: eval: teacher '{col}' has no held-out split (its transform.heldout_fraction "
                                  "is 0): set eval.heldout_fraction, or drop it from eval.teachers")
        for row in self.eval_rows():
            spec = self.specs.targets[row]
            for col in self.eval_columns():
                self.eval_cells[(row, col)] = self._tokenized(col, spec.student, spec.training)

    def eval_rows(self) -> list[str]:
        ev = self.cfg.get("eval") or {}
        return list(ev.get("targets") or self.cfg.get("default_targets") or [])

    def eval_columns(self) -> list[str]:
        ev = self.cfg.get("eval") or {}
        if ev.get("teachers"):
            return list(ev["teachers"])
        cols = {t for r in self.eval_rows() for t in self.targets[r]["run"].spec["weights"]}
        return [t for t in self.cfg["teachers"] if t in cols]  # config order

    def teacher_transform(self, teacher: str) -> dict:
        """The teacher's transform: its own settings over the defaults; with an ``eval:`` section that
        sets ``heldout_fraction``, that fraction for every teacher that sets none of its own."""
        return S.as_dict(self.specs.teachers[teacher].transform)

    def _model(self, student: S.StudentSpec) -> Artifact | None:
        """The student's initial weights (``init: hf``): a snapshot of its checkpoint at the pinned revision,
        made once (rule ``download_model``) into ``<storage_root>/models/<repo>-<hash>`` and read from there
        by every training host and the HF export; content-addressed by repo + revision (a local dir: its
        content), so students that share a checkpoint share it."""
        if student.init != "hf" or student.hf_checkpoint is None:
            return None
        ref = student.hf_checkpoint
        inputs = {"format": KINDS["models"].format, **student.identity("models")}
        h = hashing.short(inputs)
        readable = re.sub(r"[^A-Za-z0-9._-]", "-", Path(ref.local or ref.ref).name).lstrip("._-") or "model"
        return self._add("models", f"{readable}-{h}", h, inputs,
                         spec={"ref": ref.ref, "revision": ref.revision, "local": ref.local})

    def task_set(self, name: str) -> Artifact:
        """The task set ``name`` of the config's ``tasks:`` (rule ``make_tasks``): content-addressed by its crates'
        content, its settings and the toolchain its tests run with (``cargo --version``: their outcome depends on
        it); an unknown name: one line naming the sets."""
        spec = self.specs.task_sets.get(name)
        if spec is None:
            raise ConfigError(f"unknown task set {name!r} (config tasks: {', '.join(self.specs.task_sets) or 'none'})")
        # a dataset's instances run with the toolchain of their images (each instance names its own)
        tc = toolchain.cargo_version() if spec.crates is not None else toolchain.IMAGES
        inputs = {"format": KINDS["tasks"].format, **spec.identity("tasks"), "toolchain": tc}
        h = hashing.short(inputs)
        source = {"crates": spec.crates.local or spec.crates.ref} if spec.crates is not None else {
            "dataset": spec.dataset.ref, "revision": spec.dataset.revision,
            "held_out_repos": list(spec.held_out_repos or ()), "max_tasks": spec.max_tasks}
        return self._add("tasks", f"{name}-{h}", h, inputs,
                         spec={"task_set": name, **source, "sandbox": spec.sandbox,
                               "command_seconds": spec.command_seconds})

    def data_label(self, teacher: str) -> str:
        """The readable part of the names of a teacher's data (raw, shards, tokenized): its dataset's, not the
        teacher's, so that every teacher entry that reads the same dataset with the same settings shares them
        (``AlienKevin/SWE-smith-rs-minimax-m2.5-trajectories`` -> ``SWE-smith-rs-minimax-m2.5-trajectories``; a
        local dir, the last two parts of its path: ``demo/dataset`` -> ``demo-dataset``)."""
        ref = self.specs.teachers[teacher].dataset
        parts = [x for x in ref.ref.split("/") if x not in ("", ".", "..")]
        text = "-".join(parts[-2:] if ref.local is not None else parts[-1:])
        return re.sub(r"[^A-Za-z0-9._-]", "-", text).strip("._-") or "dataset"

    def _raw(self, teacher: str) -> Artifact:
        t = self.cfg["teachers"][teacher]
        inputs = {"format": KINDS["raw"].format, **self.specs.teachers[teacher].identity("raw")}
        h = hashing.short(inputs)
        return self._add("raw", f"{self.data_label(teacher)}-{h}", h, inputs,
                         spec={"teacher": teacher, "dataset": t["dataset"], "revision": t["revision"], "rows": t["rows"]})

    def shards(self, teacher: str) -> Artifact:
        """The teacher's validated chats (rule ``shard``): its training split and its held-out (validation) one."""
        raw = self._raw(teacher)
        transform = self.teacher_transform(teacher)
        # TransformSpec: `strict` is cosmetic, `long_chats` is hashed at tokenize time
        inputs = {"format": KINDS["shards"].format, "raw": raw.hash, **self.specs.teachers[teacher].identity("shards")}
        h = hashing.short(inputs)
        name = f"{self.data_label(teacher)}-{h}"
        have = self.artifacts.get(("shards", name))
        if have is not None and bool(have.spec["transform"].get("strict")) != bool(transform.get("strict")):
            # read by a strict and a lenient entry: built once, leniently (bad rows skipped, counted and listed);
            # a strict entry's training checks that it skipped none (strict_shards)
            have.spec["transform"] = {**have.spec["transform"], "strict": False}
            return have
        return self._add(
            "shards", name, h, inputs, deps=[(raw.kind, raw.name)],
            spec={"teacher": teacher, "transform": transform, "raw": raw.name, "expected_rows": self.cfg["teachers"][teacher]["rows"],
                  "tools": tools.load(self.specs.teachers[teacher].tools)},
        )

    def strict_shards(self, target: str) -> dict[str, Artifact]:
        """Teacher -> its shard set, for each of ``target``'s teachers that is strict while its shard set is built
        leniently (shared with a lenient entry of the same dataset): its training must find no skipped row."""
        teachers = self.specs.targets[target].teachers
        return {t: a for t in teachers if self.teacher_transform(t).get("strict")
                and not (a := self.shards(t)).spec["transform"].get("strict")}

    def _tokenized(self, teacher: str, student: S.StudentSpec, training: S.TrainingSpec) -> Artifact:
        shards = self.shards(teacher)
        if not TEMPLATE_PATH.exists():
            raise ConfigError(f"chat template missing: {TEMPLATE_PATH}")
        transform, tool_text = self.specs.teachers[teacher].transform, self.specs.teachers[teacher].tools
        seq_len, long_chats = int(training.seq_len), transform.long_chats
        inputs = {
            "format": KINDS["tokenized"].format,
            "shards": shards.hash,
            "template": hashing.file_digest(TEMPLATE_PATH),
            # the tokenizer; chats without a loss token in their first seq_len tokens are dropped;
            # long_chats decides whether longer chats are truncated or dropped
            **student.identity("tokenized"),
            **training.identity("tokenized"),
            **transform.identity("tokenized"),
            # every chat renders with the teacher's tools block (none: the hash of a config before tools were one)
            **({"tools": tool_text} if tool_text else {}),
        }
        h = hashing.short(inputs)
        # the student's own checkpoint's tokenizer is read from its models/ snapshot (what training reads), not
        # from the Hub: the same bytes (same repo and revision, so the same identity), one copy, no HF_TOKEN here
        model = self.tokenizer_snapshot(student)
        deps = [(shards.kind, shards.name)] + ([(model.kind, model.name)] if model else [])
        return self._add(
            "tokenized", f"{self.data_label(teacher)}-{h}", h, inputs, deps=deps,
            spec={"teacher": teacher, "shards": shards.name,
                  "tokenizer": model.location if model else student.tokenizer.resolved(),
                  "seq_len": seq_len, "long_chats": long_chats, "tools": tools.load(tool_text)},
        )

    def tokenizer_snapshot(self, student: S.StudentSpec) -> Artifact | None:
        """The ``models/`` snapshot that holds the student's tokenizer: its initial weights' (``init: hf``) when
        the tokenizer is the checkpoint's own (same repo and revision); None otherwise."""
        model = self._model(student)
        same = (model is not None and student.hf_checkpoint is not None
                and student.tokenizer.identity() == student.hf_checkpoint.identity())
        return model if same else None

    def resolve_ref(self, ref: str, revision: str | None = None) -> str:
        """A local dir as its path; a Hub repo as ``repo@revision`` when pinned (Levanter's RepoRef)."""
        local = self.local_path(ref)
        if local is not None:
            return str(local)
        return f"{ref}@{revision}" if revision else ref

    def _add(self, kind, name, h, inputs, deps=(), spec=None) -> Artifact:
        """The artifact ``kind``/``name``, made once: a later teacher entry that names the same one (the same
        dataset and settings: shared data) must agree on its checked settings (``rows``), else one line (a shard
        set's ``strict`` is settled by :meth:`shards`)."""
        key = (kind, name)
        if key in self.artifacts and spec is not None:
            have = self.artifacts[key]
            check = KINDS[kind].checked_settings
            if check(have.spec) != check(spec):
                a, b = have.spec.get("teacher"), spec.get("teacher")
                diff = "; ".join(f"{k} {v!r} and {check(spec)[k]!r}" for k, v in check(have.spec).items()
                                 if check(spec)[k] != v)
                raise ConfigError(f"config: teachers {a} and {b} read the same data ({kind}/{name}) but set {diff}: "
                                  "make them equal (the data is built once for both)")
        if key not in self.artifacts:
            self.artifacts[key] = Artifact(
                kind=kind, name=name, hash=h, inputs=inputs,
                location=join(self.root, kind, name),
                manifest=str(Path(self.state_dir, kind, name, "manifest.json")),
                deps=list(deps), spec=spec or {},
            )
        return self.artifacts[key]

    # ---- queries ------------------------------------------------------------------------
    def get(self, kind: str, name: str) -> Artifact:
        try:
            return self.artifacts[(kind, name)]
        except KeyError:
            known = sorted(n for k, n in self.artifacts if k == kind)
            raise ConfigError(
                f"{kind}/{name} is not produced by the current config (current {kind}: {', '.join(known) or 'none'})"
            ) from None

    def target(self, name: str) -> dict:
        if name not in self.targets:
            raise ConfigError(f"unknown target '{name}' (teachers and mixtures: {', '.join(self.targets)})")
        return self.targets[name]

    def chain(self, target: str) -> list[Artifact]:
        """All artifacts of a target, upstream first."""
        run = self.target(target)["run"]
        seen: dict[tuple[str, str], Artifact] = {}

        def visit(a: Artifact):
            for dep in a.deps:
                visit(self.artifacts[dep])
            seen.setdefault((a.kind, a.name), a)

        visit(run)
        return list(seen.values())

    def users(self, art: Artifact) -> list[str]:
        """The targets whose training chain holds ``art`` (more than one: shared data), in config order."""
        key = (art.kind, art.name)
        return [t for t in self.targets if any((a.kind, a.name) == key for a in self.chain(t))]

    @staticmethod
    def done_path(target: str) -> str:
        return f"checkpoints/{target}/done"

    @staticmethod
    def done_hash(path: str) -> str | None:
        """The run hash a done marker was written for (None: no marker, or unreadable)."""
        try:
            return json.loads(Path(path).read_text()).get("hash") or None
        except (OSError, ValueError, AttributeError):
            return None

    @staticmethod
    def evals_done_path(target: str) -> str:
        return f"evals/{target}/done"

    @staticmethod
    def agent_done_path(target: str) -> str:
        return f"agent/{target}/done"
