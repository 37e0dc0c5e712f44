"""A task set as an artifact (rule ``make_tasks``, ``tasks/<name>-<hash>``): the tasks that pass their controls (the
gold fix resolves each, the empty patch none), in SWE-smith's fields, so that the set grades itself wherever it is
read. Its tasks are either the bug mutations of a directory of crates (copied into the set: the grader checks each
task out of them) or SWE-smith's instances of the held-out repositories, read from their Hub dataset at its pinned
revision, each naming the docker image that holds its repository (pulled by this host; a failed pull excludes the
task, said in one line):

- ``instances.jsonl``: one task per line (:meth:`trajsft.tasks.record.Task.row`), the kept ones, in order;
- ``controls.json``: every task's gold and empty rows, the tasks excluded with their reasons, the mutations
  (or dataset rows) dropped by reason, the toolchain and the sandbox;
- ``repos/<crate>/``: each crate's files (no build output); none for a dataset's instances (their images hold them).

Read back with :func:`load`."""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import io
from ..errors import ConfigError, DataError
from ..plan import toolchain
from ..plan.step_configs import TaskSetConfig
from ..runtime import hub
from . import controls, docker, mutate, sandbox
from .record import RUST_TEST_CMD, Task, from_row

log = logging.getLogger("trajsft")

INSTANCES, CONTROLS, REPOS = "instances.jsonl", "controls.json", "repos"


def upstream(repo: str) -> str:
    """The repository a SWE-smith mirror stands for: ``swesmith/BurntSushi__ripgrep.3b7fd442`` ->
    ``BurntSushi/ripgrep`` (another name: itself)."""
    owner, _, rest = repo.partition("/")
    if owner != "swesmith" or "__" not in rest:
        return repo
    name, _, commit = rest.rpartition(".")
    if not (name and re.fullmatch(r"[0-9a-f]{7,40}", commit)):
        name = rest
    return name.replace("__", "/", 1)


def instances(cfg: TaskSetConfig, dest: Path) -> tuple[mutate.Made, str]:
    """The SWE-smith instances of ``cfg.dataset`` at ``cfg.revision`` (downloaded into ``dest``) whose repository is
    one of ``cfg.held_out_repos`` (the rows' ``repo``, or the repository it mirrors: ``owner/name``), by instance_id
    (the first ``cfg.max_tasks``), and the resolved commit; a malformed row is skipped, counted and said in one line
    naming its file, row and field. A row without ``test_cmd`` runs its repository's SWE-smith profile's command
    (:func:`trajsft.plan.toolchain.test_command`), else ``cargo test``."""
    import pyarrow.parquet as pq

    where = f"{cfg.dataset}@{cfg.revision}"
    sha = hub.dataset_snapshot(cfg.dataset, cfg.revision, dest, ["*.parquet", "README.md"])
    files = sorted(f for f in dest.glob("**/*.parquet")
                   if not any(x.startswith(".") for x in f.relative_to(dest).parts))
    if not files:
        raise DataError(f"{where}: no parquet file in the dataset (expected data/*.parquet)")
    held, made, seen, rows = set(cfg.held_out_repos), mutate.Made(), set(), 0
    by_id: dict[str, Task] = {}
    for f in files:
        rel = f"{where}:{f.relative_to(dest)}"
        try:
            table = pq.read_table(f).to_pylist()
        except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError: a truncated or garbage file
            raise DataError(f"{rel}: not a readable parquet file ({type(e).__name__})") from None
        for i, row in enumerate(table, 1):
            rows += 1
            repo = row.get("repo") if isinstance(row, dict) else None
            named = held & {repo, upstream(repo)} if isinstance(repo, str) else set()
            if not named:
                continue
            seen |= named
            try:
                if row.get("test_cmd") is None:  # absent, or null in a parquet column some other row fills
                    row = {**row, "test_cmd": toolchain.test_command(repo) or RUST_TEST_CMD}
                task = from_row(row, f"{rel} row {i}")
                if not task.image_name:
                    raise DataError(f"{rel} row {i}: field image_name: missing (the image holding its repository)")
            except DataError as e:
                made.dropped["malformed row"] += 1
                log.warning("tasks %s: skipped: %s", cfg.task_set, e)
                continue
            if task.instance_id in by_id:
                made.dropped["duplicate instance_id"] += 1
                log.warning("tasks %s: skipped: %s row %d: instance %s is there twice", cfg.task_set, rel, i,
                            task.instance_id)
                continue
            by_id[task.instance_id] = task
    absent = sorted(held - seen)
    if absent:
        raise DataError(f"{where}: no instance of held-out repo {', '.join(absent)} in its {rows} rows "
                        f"(config tasks.{cfg.task_set}.held_out_repos)")
    made.tasks = [by_id[k] for k in sorted(by_id)]
    if cfg.max_tasks is not None and len(made.tasks) > cfg.max_tasks:
        made.dropped["beyond max_tasks"] += len(made.tasks) - cfg.max_tasks
        made.tasks = made.tasks[:cfg.max_tasks]
    return made, sha


def pull(tasks: list[Task]) -> dict[str, str]:
    """Each task whose image this host could not get -> why (one line per image, said once)."""
    why_not: dict[str, str | None] = {}
    for image in sorted({t.image_name for t in tasks if t.image_name}):
        _, why_not[image] = docker.ensure(image)
        if why_not[image]:
            log.warning("%s", why_not[image])
    return {t.instance_id: why_not[t.image_name] for t in tasks if t.image_name and why_not.get(t.image_name)}


def ran_in(cfg: TaskSetConfig, kind: str) -> str:
    """Where the set's tests run: ``kind`` (the config's, or the user's choice) for crates, docker for a dataset's
    instances (each in its image, whatever ``kind`` says)."""
    return kind if cfg.crates is not None else sandbox.DOCKER


def check(cfg: TaskSetConfig, kind: str, limits: sandbox.Limits) -> tuple[mutate.Made, controls.Checked]:
    """The tasks of ``cfg`` and their controls (what ``trajsft tasks check`` prints and the rule keeps); a tool the
    sandbox lacks: one line naming its package. A task whose image could not be pulled is excluded with why."""
    if cfg.crates is None:
        lacking = docker.missing()
        if lacking:
            raise ConfigError(f"tasks {cfg.task_set}: its instances run in docker images: missing {', '.join(lacking)}")
        with tempfile.TemporaryDirectory(prefix="trajsft-instances-") as tmp:
            made, sha = instances(cfg, Path(tmp))
        unavailable = pull(made.tasks)
        log.info("tasks %s: %d instances of %s at %s (%d images unavailable; dropped: %s); running their controls",
                 cfg.task_set, len(made.tasks), cfg.dataset, sha[:12], len(set(unavailable)),
                 dict(made.dropped) or "none")
        checked = controls.check([t for t in made.tasks if t.instance_id not in unavailable], Path(REPOS),
                                 sandbox=kind, limits=limits)
        checked.excluded.update(unavailable)
        return made, checked
    crates = Path(cfg.crates)
    if not crates.is_dir():
        raise ConfigError(f"tasks {cfg.task_set}: crates directory {crates} does not exist "
                          f"(config tasks.{cfg.task_set}.crates)")
    lacking = sandbox.missing(kind)
    if lacking:
        raise ConfigError(f"tasks {cfg.task_set}: the sandbox ({kind}) needs {', '.join(lacking)}")
    made = mutate.from_crates(crates, sandbox=kind, limits=limits)
    log.info("tasks %s: %d mutations kept as tasks (dropped: %s); running their controls", cfg.task_set,
             len(made.tasks), dict(made.dropped) or "none")
    return made, controls.check(made.tasks, crates, sandbox=kind, limits=limits)


def make_tasks(cfg: TaskSetConfig) -> dict:
    """The task set of ``cfg`` written to its location; the step's result (what the manifest records)."""
    if cfg.crates is not None:
        here = sandbox.toolchain()
        if here != cfg.toolchain:  # the set's identity would lie about what its tests ran with
            raise ConfigError(f"tasks {cfg.task_set}: the plan hashed {cfg.toolchain!r} but the tests would run "
                              f"with {here!r}: run the workflow on the machine that grades")
    start = time.monotonic()
    made, checked = check(cfg, cfg.sandbox, sandbox.Limits(command_s=cfg.command_seconds))
    gold, empty, n = checked.counts()
    kept = [t for t in made.tasks if t.instance_id in set(checked.kept)]
    for tid, why in checked.excluded.items():
        log.warning("tasks %s: %s excluded: %s", cfg.task_set, tid, why)
    source, tested_in = cfg.crates or f"{cfg.dataset}@{cfg.revision}", ran_in(cfg, cfg.sandbox)
    if not kept:
        raise DataError(f"tasks {cfg.task_set}: no task passed its controls ({len(made.tasks)} made from {source}, "
                        f"dropped: {dict(made.dropped) or 'none'}; excluded: {len(checked.excluded)})")
    io.write_text(io.join(cfg.location, INSTANCES),
                  "".join(json.dumps(t.row(), sort_keys=True) + "\n" for t in kept))
    io.write_json(io.join(cfg.location, CONTROLS), {
        "toolchain": cfg.toolchain, "sandbox": tested_in, "gold_resolved": gold, "empty_resolved": empty,
        "tasks": n, "excluded": checked.excluded, "dropped_mutations": dict(made.dropped), "rows": checked.rows})
    repos = sorted({t.repo for t in kept if not t.image_name})
    with tempfile.TemporaryDirectory(prefix="trajsft-repos-") as tmp:
        for repo in repos:
            shutil.copytree(Path(cfg.crates) / repo, Path(tmp) / repo, ignore=shutil.ignore_patterns("target", ".*"))
        if repos:
            io.put_tree(tmp, io.join(cfg.location, REPOS))
    return {"task_set": cfg.task_set, "tasks": len(kept), "made": len(made.tasks), "excluded": checked.excluded,
            "dropped_mutations": dict(made.dropped), "gold_resolved": gold, "empty_resolved": empty,
            "toolchain": cfg.toolchain, "sandbox": tested_in, "repos": sorted({t.repo for t in kept}),
            "images": sorted({t.image_name for t in kept if t.image_name}),
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
