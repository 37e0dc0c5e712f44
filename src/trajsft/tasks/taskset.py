"""A task set as an artifact (rule ``make_tasks``, ``tasks/<name>-<hash>``): the bug mutations of a directory of
crates that pass their controls (the gold fix resolves each, the empty patch none), in SWE-smith's fields, beside
copies of the crates the grader checks each task out of, so that the set grades itself wherever it is read:

- ``instances.jsonl``: one task per line (:meth:`trajsft.tasks.record.Task.row`), the kept ones, in order;
- ``controls.json``: every task's gold and empty rows, the tasks excluded with their reasons, the mutations
  dropped by reason, the toolchain and the sandbox;
- ``repos/<crate>/``: each crate's files (no build output).

Read back with :func:`load`."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import io
from ..errors import ConfigError, DataError
from ..plan.step_configs import TaskSetConfig
from . import controls, mutate, sandbox
from .record import Task, from_row

log = logging.getLogger("trajsft")

INSTANCES, CONTROLS, REPOS = "instances.jsonl", "controls.json", "repos"


def check(task_set: str, crates: Path, kind: str, limits: sandbox.Limits) -> tuple[mutate.Made, controls.Checked]:
    """The tasks of ``crates`` and their controls (what ``trajsft tasks check`` prints and the rule keeps); a tool
    the sandbox lacks: one line naming its package."""
    if not crates.is_dir():
        raise ConfigError(f"tasks {task_set}: crates directory {crates} does not exist (config tasks.{task_set}.crates)")
    lacking = sandbox.missing(kind)
    if lacking:
        raise ConfigError(f"tasks {task_set}: the sandbox ({kind}) needs {', '.join(lacking)}")
    made = mutate.from_crates(crates, sandbox=kind, limits=limits)
    log.info("tasks %s: %d mutations kept as tasks (dropped: %s); running their controls", task_set,
             len(made.tasks), dict(made.dropped) or "none")
    return made, controls.check(made.tasks, crates, sandbox=kind, limits=limits)


def make_tasks(cfg: TaskSetConfig) -> dict:
    """The task set of ``cfg`` written to its location; the step's result (what the manifest records)."""
    here = sandbox.toolchain()
    if here != cfg.toolchain:  # the set's identity would lie about what its tests ran with
        raise ConfigError(f"tasks {cfg.task_set}: the plan hashed {cfg.toolchain!r} but the tests would run with "
                          f"{here!r}: run the workflow on the machine that grades")
    start = time.monotonic()
    crates = Path(cfg.crates)
    made, checked = check(cfg.task_set, crates, cfg.sandbox, sandbox.Limits(command_s=cfg.command_seconds))
    gold, empty, n = checked.counts()
    kept = [t for t in made.tasks if t.instance_id in set(checked.kept)]
    for tid, why in checked.excluded.items():
        log.warning("tasks %s: %s excluded: %s", cfg.task_set, tid, why)
    if not kept:
        raise DataError(f"tasks {cfg.task_set}: no task passed its controls ({len(made.tasks)} made from {crates}, "
                        f"mutations dropped: {dict(made.dropped) or 'none'})")
    io.write_text(io.join(cfg.location, INSTANCES),
                  "".join(json.dumps(t.row(), sort_keys=True) + "\n" for t in kept))
    io.write_json(io.join(cfg.location, CONTROLS), {
        "toolchain": cfg.toolchain, "sandbox": cfg.sandbox, "gold_resolved": gold, "empty_resolved": empty,
        "tasks": n, "excluded": checked.excluded, "dropped_mutations": dict(made.dropped), "rows": checked.rows})
    with tempfile.TemporaryDirectory(prefix="trajsft-repos-") as tmp:
        for repo in sorted({t.repo for t in kept}):
            shutil.copytree(crates / repo, Path(tmp) / repo, ignore=shutil.ignore_patterns("target", ".*"))
        io.put_tree(tmp, io.join(cfg.location, REPOS))
    return {"task_set": cfg.task_set, "tasks": len(kept), "made": n, "excluded": checked.excluded,
            "dropped_mutations": dict(made.dropped), "gold_resolved": gold, "empty_resolved": empty,
            "toolchain": cfg.toolchain, "sandbox": cfg.sandbox, "repos": sorted({t.repo for t in kept}),
            "seconds": round(time.monotonic() - start, 1)}


@dataclass(frozen=True)
class TaskSet:
    tasks: list[Task]
    repos: Path  # the directory holding each task's repository (``repos / task.repo``)


def load(location: str) -> TaskSet:
    """The task set a ``make_tasks`` job wrote at ``location`` (a local directory); a malformed row: one line naming
    the file, the row and the field."""
    path = Path(location) / INSTANCES
    if not path.is_file():
        raise DataError(f"{path} is missing: build the task set first (rule make_tasks)")
    tasks = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except ValueError as e:
            raise DataError(f"{path} row {i}: not JSON ({e.msg})") from None
        tasks.append(from_row(row, f"{path} row {i}"))
    return TaskSet(tasks=tasks, repos=Path(location) / REPOS)
