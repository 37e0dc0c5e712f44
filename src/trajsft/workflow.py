"""What the Snakemake workflow (``Snakefile``, ``rules/*.smk``) knows of trajsft, in one object: the checks made while
the workflow is read (a target given as a ``--configfile``, the config's schema and references), the
:class:`~trajsft.plan.config.Plan`, the rules' input, params and resource functions, the lists ``rule all`` builds
and the checks made when a run starts (``onstart``: the Ray preflight, the storage root, the run's id).

``rules/common.smk`` makes one :class:`Rules` (``W = Rules.read(config, workflow)``) and the ``rules/*.smk`` name
its methods; no ``.smk`` file imports another trajsft module (``tests/test_workflow.py``). Testable without
Snakemake: the ``workflow`` handed in is used for its ``configfiles``, ``basedir``, resources and DAG only.

A user error met here is a :class:`~trajsft.logs.WorkflowStop` (never ``sys.exit``): Snakemake reports it and
exits 1, and :func:`~trajsft.logs.one_line_stops` makes that report the message alone.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

from .logs import WorkflowStop, one_line_stops
from .plan import step_configs
from .plan.config import STATE_DIR, ConfigError, Plan, validate
from .plan.kinds import KINDS, Resources
from .plan.placement import placement
from .plan.step import resolve as resolve_step

__all__ = ["STATE_DIR", "NAME_PATTERN", "Rules"]

# an artifact's content-addressed name: <readable>-<10 hex digits>
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*-[0-9a-f]{10}"
# a target that Snakemake would read as a --configfile (it takes every following argument)
_TARGET_LIKE = re.compile(r"(^|/)checkpoints/[^/]+/done$|(^|/)results/.+/manifest\.json$")


def validate_or_stop(cfg: Mapping) -> None:
    """Schema + references; one line per problem (key and allowed values), no schema dump."""
    try:
        validate(cfg)
    except ConfigError as e:
        raise WorkflowStop(str(e)) from None


def targets_given_as_configfiles(configfiles) -> None:
    """``snakemake --configfile mine.yaml checkpoints/x/done`` reads the target as a config file (``--configfile``
    takes every following argument); an existing done marker would even load."""
    bad = [str(f) for f in configfiles if _TARGET_LIKE.search(str(f))]
    if bad:
        raise WorkflowStop(
            f"trajsft: {', '.join(bad)} was read as a --configfile (it takes every following "
            "argument): put targets before --configfile, e.g. snakemake checkpoints/demo/done --configfile mine.yaml"
        )


@dataclass
class Rules:
    """The workflow's view of one config: ``plan`` and the functions its rules name.

    ``train_local``: the train rule runs Levanter on this machine's CPUs; on a Ray profile it runs only a light
    submitter that follows the job (its resources: ``KINDS["checkpoints"].on_cluster``). ``fit_check``: a Ray
    profile compiles the train step for its TPU slice before submitting (rule ``check_fit``)."""

    config: Mapping
    plan: Plan
    workflow: Any = None  # Snakemake's Workflow: global resources (sweep_slots) and the DAG (start)

    @classmethod
    def read(cls, config: Mapping, workflow) -> "Rules":
        """The checks made while the workflow is read, then the plan (``rules/common.smk``)."""
        one_line_stops()  # a WorkflowStop is reported as its message alone, exit 1
        targets_given_as_configfiles(workflow.configfiles)
        validate_or_stop(config)
        try:  # what only the plan sees (two entries of one dataset that disagree...): one line too, no frames
            plan = Plan(config, base_dir=workflow.basedir)
        except ConfigError as e:
            raise WorkflowStop(f"trajsft: {e}") from None
        return cls(config, plan, workflow)

    @property
    def train_local(self) -> bool:
        return not placement(self.config).on_cluster

    @property
    def fit_check(self) -> bool:
        return not self.train_local and bool((self.config.get("ray") or {}).get("fit_check", True))

    def target_pattern(self) -> str:
        """Wildcard constraint of ``{target}``: a configured target."""
        return "|".join(re.escape(t) for t in self.plan.targets)

    def not_a_target(self) -> str:
        """Wildcard constraint: a ``checkpoints/<x>/done``, ``evals/<x>/done`` or ``agent/<x>/done`` name that is not a
        configured target (the name ends at the next / in the output's pattern, or at the end of a wildcard value
        checked alone)."""
        return f"(?!(?:{self.target_pattern()})(?:/|$))[^/]+"

    # ---- what rule all builds ----------------------------------------------------------------------------------
    def done_targets(self, targets) -> list[str]:
        return [self.plan.done_path(self.plan.target(t)["name"]) for t in targets]

    def evals_of(self, targets) -> list[str]:
        """The ``evals/<target>/done`` markers built by default: those of ``targets`` that hold out chats to score,
        when training runs here. On a Ray profile each is a Ray job on a TPU host: built when named."""
        if not self.train_local:
            return []
        return [
            self.plan.evals_done_path(t) for t in targets if step_configs.held_out_problem(self.plan, t) is None
        ]

    def eval_outputs(self) -> list[str]:
        """``rule all``'s evaluations: the cross-teacher matrix when the config has an ``eval:`` section, and the
        default targets' next-action scores (:meth:`evals_of`)."""
        from .report import matrix

        outs = list(matrix.outputs(STATE_DIR).values()) if self.config.get("eval") is not None else []
        return outs + self.evals_of(self.config["default_targets"])

    def report_targets(self) -> list[str]:
        """Targets compared in ``results/cards/teachers.html``: ``report_targets``, else ``default_targets``."""
        from .report.build import report_targets

        return report_targets(self.plan, self.config)

    def actions_targets(self) -> list[str]:
        """The targets whose next-action scores the report tabulates (those that hold out chats, trained here)."""
        both = dict.fromkeys([*self.report_targets(), *self.config["default_targets"]])
        return [t for t in both if self.evals_of([t])]

    def agent_targets(self) -> list[str]:
        """The targets whose resolve rates ``results/agent/resolve_rate.html`` plots (on request: an agent evaluation
        needs bubblewrap and cargo): the report and default targets whose agent evaluation can be planned."""
        both = dict.fromkeys([*self.report_targets(), *self.config["default_targets"]])
        return [t for t in both if not self.plan.target(t)["agent"].spec.get("problem")]

    def agent_steps(self, wildcards) -> dict[str, list]:
        """Params of report_agent: the exports ``trajsft eval --agent --watch`` evaluated since, per target (a new
        one reruns the plot: a point per step)."""
        from .agent.evaluate import evaluated_steps

        return {t: list(evaluated_steps(self.plan.target(t)["agent"].location)) for t in self.agent_targets()}

    def report_outputs(self) -> list[str]:
        """Table + cards of the report targets and default targets + curves of the default targets (+ the
        next-action table)."""
        from .report.build import report_outputs

        outs = report_outputs(self.plan, self.report_targets(), self.config["default_targets"], STATE_DIR)
        return outs + ([f"{STATE_DIR}/evals/actions.html"] if self.actions_targets() else [])

    # ---- artifact rules (trajsft.plan.kinds) -------------------------------------------------------------------
    def planned(self, kind: str, wildcards):
        """The ``kind`` artifact that a job writes, named by the ``name`` wildcard, or its target's own (a
        per-target kind, :attr:`trajsft.plan.kinds.Kind.of_target`)."""
        of_target = KINDS[kind].of_target
        if of_target:
            return self.plan.target(wildcards.target)[of_target]
        return self.plan.get(kind, wildcards.name)

    def job_resources(self, kind: str) -> Resources:
        """The rule's threads and memory, from the kind's record (its on_cluster share on a Ray profile)."""
        k = KINDS[kind]
        return k.on_cluster if k.on_cluster and not self.train_local else k.resources

    def artifact_inputs(self, kind: str) -> Callable:
        """Input function: the manifests of every artifact this ``kind`` artifact is built from (its deps)."""
        return lambda wildcards: [self.plan.get(*dep).manifest for dep in self.planned(kind, wildcards).deps]

    def artifact_name(self, kind: str) -> Callable:
        """Params function: the artifact's content-addressed name (a rerun trigger: a changed hashed setting names
        another artifact)."""
        return lambda wildcards: self.planned(kind, wildcards).name

    def payload_location(self, kind: str) -> Callable:
        """Params function: the artifact's payload location under the current storage root (a rerun trigger: a
        manifest written for another root is not done for this one)."""
        return lambda wildcards: self.planned(kind, wildcards).location

    def checked_setting(self, kind: str, key: str) -> Callable:
        """Params function: a setting of the kind's record that is not hashed but must match for a built payload
        to be reused: a changed value reruns the rule (params rerun trigger)."""
        return lambda wildcards: KINDS[kind].checked[key](self.planned(kind, wildcards).spec)

    def job_step(self, step: str) -> Callable:
        """Params function: the job's typed step (:class:`trajsft.plan.step.Step`), resolved once here, so that no
        job rebuilds the plan (never a rerun trigger: not a builtin value)."""
        return lambda wildcards: resolve_step(
            self.plan, step, wildcards.get("name") or wildcards.get("target") or ""
        )

    # ---- per-rule input functions ------------------------------------------------------------------------------
    def typo_target(self, wildcards) -> list:
        """Input function for a typo in ``checkpoints/<target>/done`` or ``evals/<target>/done`` (rule
        unknown_target)."""
        try:
            self.plan.target(wildcards.other)
        except ConfigError as e:  # unknown target 'x' (teachers and mixtures: ...)
            raise WorkflowStop(f"trajsft: {wildcards.marker}/{wildcards.other}/done: {e}") from None
        return []

    def train_inputs(self, wildcards) -> list[str]:
        """Input function (train): the tokenized manifests of the target's teachers, the manifest of the student's
        initial weights (init: hf) and, on a Ray profile, the fit check of its slice."""
        train = step_configs.train(self.plan, wildcards.target)
        return (
            [a.manifest for a in train.tokenized.values()]
            + ([train.model.manifest] if train.model else [])
            + ([f"{STATE_DIR}/fit/{wildcards.target}/preflight.json"] if self.fit_check else [])
        )

    def fit_versions(self, wildcards) -> dict:
        """Params of check_fit: the compiler's versions (jax, jaxlib, libtpu, levanter): another compiler reruns it."""
        from .fit.check import versions

        return versions()

    def eval_matrix_inputs(self, wildcards) -> dict[str, list[str]]:
        """Input function of eval_matrix: each row's done marker, each cell's tokenized manifest."""
        from .report.matrix import eval_inputs

        if self.config.get("eval") is None:
            raise WorkflowStop(
                "trajsft: results/eval/matrix.* needs an eval: section in the config (the cross-teacher "
                "matrix is opt-in): e.g. --configfile config/eval.yaml"
            )
        return eval_inputs(self.plan)

    def eval_matrix_spec(self, wildcards) -> dict:
        """Params of eval_matrix: rows' runs, columns, the tokenized artifact of every cell, options."""
        from .report.matrix import matrix_spec

        return matrix_spec(step_configs.eval_matrix(self.plan))

    def eval_actions_inputs(self, wildcards) -> list[str]:
        """Input function of eval_actions: the target's done marker and the shard sets whose held-out chats are
        scored; a teacher that holds out nothing stops the workflow in one line (which setting to change)."""
        problem = step_configs.held_out_problem(self.plan, wildcards.target)
        if problem:
            raise WorkflowStop(f"trajsft: {self.plan.evals_done_path(wildcards.target)}: {problem}")
        ev = self.plan.target(wildcards.target)["evals"]
        return [self.plan.done_path(wildcards.target)] + [
            self.plan.get(*dep).manifest for dep in ev.deps if dep[0] == "shards"
        ]

    def eval_agent_inputs(self, wildcards) -> list[str]:
        """Input function of eval_agent: the target's done marker and its task set's manifest."""
        ag = self.plan.target(wildcards.target)["agent"]
        if ag.spec.get("problem"):
            raise WorkflowStop(f"trajsft: {self.plan.agent_done_path(wildcards.target)}: {ag.spec['problem']}")
        return [self.plan.done_path(wildcards.target)] + [
            self.plan.get(*dep).manifest for dep in ag.deps if dep[0] == "tasks"
        ]

    def card_paths(self, target: str) -> dict[str, str]:
        from .report.build import card_paths

        return card_paths(target, STATE_DIR)

    def card_inputs(self, wildcards) -> dict[str, list[str]]:
        """Input function of report_card: the target's shards and tokenized manifests."""
        from .report.build import card_inputs

        return card_inputs(self.plan, wildcards.target)

    def card_param(self, key: str) -> Callable:
        """Params function of report_card: ``seq_len``, ``weights``, ``mixture`` or ``native_seq_len``."""
        from .report.build import card_params

        return lambda wildcards: card_params(self.plan, wildcards.target)[key]

    def actions_steps(self, wildcards) -> dict[str, list]:
        """Params of report_actions: the exports ``trajsft eval --actions --watch`` scored since, per target (a new
        one reruns the table: a row per step)."""
        from .report.actions import evaluated_steps

        return {t: list(evaluated_steps(self.plan.target(t)["evals"].location)) for t in self.actions_targets()}

    def sweep_outputs(self, sweep: str) -> dict[str, str]:
        from .report.sweeps import outputs

        return outputs(sweep)

    def sweep_inputs(self, wildcards) -> list[str]:
        """Input function of the sweep rule: the done marker of every cell (a cell that is its base: the base's)."""
        from .plan.sweeps import cells

        found = cells(self.config)
        if wildcards.sweep not in found:
            raise WorkflowStop(
                f"trajsft: sweeps/{wildcards.sweep}/done: unknown sweep '{wildcards.sweep}' "
                f"(sweeps: {', '.join(found) or 'none in the config'})"
            )
        return [self.plan.done_path(c.target) for c in found[wildcards.sweep]]

    def sweep_slots(self) -> dict[str, Callable]:
        """The train rule's sweep resources: on a Ray profile, each sweep with max_parallel is a Snakemake global
        resource of that many slots and each of its cells' trainings takes one, so at most max_parallel trainings
        of a sweep are submitted at once; the rest wait here, not in the Ray queue. Locally, cores schedule them."""
        from .plan.sweeps import slots

        if self.train_local:
            return {}
        out = {}
        for s in slots(self.config):
            # --resources sweep_<name>=N on the command line wins
            if s.resource not in self.workflow.global_resources:
                self.workflow.register_resource(s.resource, s.cap)
            out[s.resource] = partial(_slot_taken, members=s.targets)
        return out

    # ---- onstart ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """The checks made when a run starts (``onstart``): this run's id exported to the jobs (they die with this
        Snakemake), the Ray preflight, the storage root, then signals forwarded to the rule jobs."""
        from .runtime.signals import forward_to_rule_jobs, register_run

        register_run()
        self.preflight()
        self.check_storage()
        forward_to_rule_jobs()

    def preflight(self) -> None:
        """On a Ray cluster profile: refuse to start (in seconds) if training could not run."""
        if self.train_local:
            return
        from snakemake.exceptions import WorkflowError

        from .cluster.submit import say_preflight
        from .executor import executor_for

        notes: list[str] = []
        problems = executor_for(self.config).preflight(notes)
        if not say_preflight(notes, problems):
            raise WorkflowError(f"preflight failed ({len(problems)} problem(s) above); nothing was submitted")

    def check_storage(self) -> None:
        """Every executor: the storage root takes a write (a Ray profile's preflight asked already), and a note when
        what this run's trainings write there is more than it has free (:mod:`trajsft.fit.disk`)."""
        from .fit import disk

        jobs = self.workflow.dag.needrun_jobs()
        targets = sorted({str(j.wildcards.target) for j in jobs if j.rule.name == "train"})
        trainings = [step_configs.train(self.plan, t) for t in targets]
        space = disk.check(self.plan.root, trainings, probe=self.train_local)
        if space["problem"]:
            raise WorkflowStop(f"trajsft: {space['problem']}")
        if space["short"]:
            print(f"trajsft: note: {space['lines'][-1]}", file=sys.stderr)


def _slot_taken(wildcards, members) -> int:
    return int(wildcards.target in members)
