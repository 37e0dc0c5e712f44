"""The typed step a rule job gets through ``params:``, resolved once by the Snakemake process.

``trajsft.workflow`` (for ``rules/*.smk``) resolves each job's :class:`Step` from the workflow's one ``Plan``; the rule
script reads ``snakemake.params.step`` and writes ``snakemake.output``: no job re-reads the config,
re-validates it or digests local dirs again. A step is picklable (Snakemake pickles a script job's
``params``) and, being no builtin value, never a params rerun trigger: the rules keep their explicit
triggers (``rows``, ``strict``, ``run``, ``name``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .kinds import BY_RULE

if TYPE_CHECKING:
    from .config import Artifact, Plan

STEPS = (*BY_RULE, "check_fit", "eval_matrix")  # a step per rule: one per artifact kind, two that write none


@dataclass(frozen=True)
class Step:
    """One rule job: ``step`` (its rule: download, shard, tokenize, download_model, train, check_fit, export,
    eval_actions, eval_matrix; :data:`STEPS`), ``name`` (the artifact's name, or the target of train, check_fit,
    export and eval_actions) and ``plan``: a copy of the workflow's plan that holds only the artifacts this step
    writes and reads (and, for train, check_fit, export, eval_actions and eval_matrix, its targets)."""

    step: str
    name: str
    plan: Plan
    artifact: Artifact | None  # what it writes (check_fit and eval_matrix write a summary and the matrix: none)


def resolve(plan: Plan, step: str, name: str = "") -> Step:
    """The :class:`Step` of a job, from the workflow's plan (resolved once, in the Snakemake process)."""
    if step not in STEPS:
        raise ValueError(f"unknown step {step!r} (steps: {', '.join(STEPS)})")
    cells = {}
    kind = BY_RULE.get(step)
    artifact = None
    if step == "check_fit" or (kind and kind.of_target):  # check_fit reads what its target's run would
        target = plan.target(name)
        targets = {name: target}
        roots = [target[kind.of_target if kind else "run"]]
        artifact = roots[0] if kind else None
    elif step == "eval_matrix":
        targets = {r: plan.target(r) for r in plan.eval_rows()}
        cells = dict(plan.eval_cells)
        roots = [t["run"] for t in targets.values()] + list(cells.values())
    else:
        artifact = plan.get(kind.name, name)
        targets, roots = {}, [artifact]
    keep: dict = {}

    def visit(a):
        if (a.kind, a.name) not in keep:
            keep[(a.kind, a.name)] = a
            for dep in a.deps:
                visit(plan.artifacts[dep])

    for a in roots:
        visit(a)
    sub = copy.copy(plan)
    sub.artifacts, sub.targets, sub.eval_cells = keep, targets, cells
    return Step(step=step, name=name, plan=sub, artifact=artifact)
