"""The artifact kinds, each declared once: one :class:`Kind` record per kind in :data:`REGISTRY`.

A kind's record says where its artifacts live (``name``: the directory under ``results/`` and under the
storage root: a noun), which rule writes them (a verb, also the name of the rule job's step and of the module that
holds the rule's code, ``trajsft/rules/<rule>.py``: its typed config and its step function, imported there, never
named here by a string), the format version hashed into each of them, the kinds built from it, the settings that are
not hashed but must match for a payload to be reused, what its seal covers and what its rule job asks Snakemake for.
Everything else reads these records: the hashes (:class:`trajsft.plan.config.Plan`, :mod:`trajsft.plan.specs`), the
typed step of a rule job (:mod:`trajsft.plan.step`), payload reuse (:mod:`trajsft.storage`) and the rules' parameters
(:mod:`trajsft.workflow`). ``tests/test_kinds.py`` checks that every kind has a rule whose script is its module, a step
function, a format version and a plan path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Resources:
    """What a rule job of the kind asks Snakemake for (its ``threads:`` and ``resources: mem_mb``)."""

    threads: int = 1
    mem_mb: int = 4000


@dataclass(frozen=True)
class Kind:
    name: str  # the directory of its artifacts under results/ and under the storage root
    rule: str  # the Snakemake rule that writes an artifact of this kind, and the name of its job's step
    format: int  # hashed into every artifact of the kind: bump it when what a payload holds changes
    downstream: tuple[str, ...] = ()  # the kinds built from it, directly or not
    # settings that are not hashed but must match for a built payload to be reused (the rule's params rerun
    # triggers): name -> its value from the artifact's spec
    checked: Mapping[str, Callable[[dict], Any]] = field(default_factory=dict)
    sealed: tuple[str, ...] | None = None  # what the payload's seal covers (prefixes), None: every object
    # one artifact per target, held under this key of the target's record (``Plan.targets[name][of_target]``),
    # not one per content shared by targets
    of_target: str | None = None
    resources: Resources = Resources()  # the rule job's threads and memory on this machine
    # the rule job's share when its step runs on a Ray cluster (it only submits and follows); None: as above
    on_cluster: Resources | None = None

    def checked_settings(self, spec: Mapping) -> dict:
        return {k: value(spec) for k, value in self.checked.items()}


REGISTRY = (
    Kind("raw", rule="download", format=2,
         downstream=("shards", "tokenized", "checkpoints", "exports", "evals", "agent"), checked={"rows": lambda s: int(s["rows"])},
         resources=Resources(threads=1, mem_mb=4000)),  # network-bound: parquet pages from the Hub
    Kind("shards", rule="shard", format=3,
         downstream=("tokenized", "checkpoints", "exports", "evals", "agent"),
         checked={"strict": lambda s: bool(s["transform"].get("strict"))}, resources=Resources(threads=1, mem_mb=4000)),
    Kind("tokenized", rule="tokenize", format=3,
         downstream=("checkpoints", "evals", "agent"), resources=Resources(threads=2, mem_mb=8000)),  # tokenizer workers share the cores
    Kind("models", rule="download_model", format=1,
         downstream=("checkpoints", "evals", "agent"), resources=Resources(threads=1, mem_mb=4000)),  # network-bound: safetensors
    # a training run's seal covers its weights only (trainer checkpoints, HF exports): its records (attempts,
    # provenance, result, logs) change with every attempt and are written again where it runs
    Kind("checkpoints", rule="train", format=1,
         sealed=("checkpoints/", "hf/"), of_target="run", downstream=("evals", "agent"),
         # Levanter on this machine's CPUs, or, on a Ray profile, a light submitter that follows the job (so that
         # every target of a `--cores 4` profile can be submitted at once)
         resources=Resources(threads=2, mem_mb=16000), on_cluster=Resources(threads=1, mem_mb=1000)),
    Kind("exports", rule="export", format=2, of_target="export",
         resources=Resources(threads=1, mem_mb=4000)),
    # the next-action scores of a target's trained student on the held-out chats (its done marker is
    # evals/<target>/done, beside checkpoints/<target>/done): generation on this machine's CPUs, or, on a Ray profile,
    # a light submitter that follows one Ray job on a single-host slice (trajsft.report.actions_job)
    Kind("evals", rule="eval_actions", format=1, of_target="evals",
         resources=Resources(threads=2, mem_mb=8000), on_cluster=Resources(threads=1, mem_mb=1000)),
    # the agent evaluation of a target's trained student (its done marker agent/<target>/done): mini-swe-agent works
    # each task of a task set against the student behind trajsft's chat route, each episode in a sandbox, graded by
    # the tests (trajsft.agent); generation and the tests on this machine's CPUs, or, on a Ray profile, a light
    # submitter that follows one Ray job on a single-host slice (trajsft.agent.job)
    Kind("agent", rule="eval_agent", format=1, of_target="agent",
         resources=Resources(threads=2, mem_mb=8000), on_cluster=Resources(threads=1, mem_mb=1000)),
    # a task set (trajsft.tasks.taskset): the bug mutations of a directory of crates that pass their controls, with
    # copies of the crates the grader checks them out of; one test run per mutation and two per task (cargo is
    # single-threaded on these tiny crates, its link step the memory)
    Kind("tasks", rule="make_tasks", format=2, downstream=("agent",), resources=Resources(threads=1, mem_mb=3000)),
)
KINDS: dict[str, Kind] = {k.name: k for k in REGISTRY}
BY_RULE: dict[str, Kind] = {k.rule: k for k in REGISTRY}
