"""`trajsft tasks check <set>`: a task set's controls (the gold fix resolves every task, the empty patch none), for a
set of the config's ``tasks:`` (the same tasks rule ``make_tasks`` keeps in the set's artifact)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..plan import config as C
from ..plan import step_configs
from .common import load_plan


def cmd_tasks(args) -> int:
    from ..tasks import sandbox, taskset

    plan = load_plan(args)
    art = plan.task_set(args.set)  # an unknown set: one line naming the config's sets
    cfg = step_configs.make_tasks(plan, art.name)
    kind = args.sandbox or cfg.sandbox
    made, checked = taskset.check(cfg, kind, sandbox.Limits(command_s=cfg.command_seconds))
    kind = taskset.ran_in(cfg, kind)
    gold, empty, n = checked.counts()
    if cfg.crates is not None:
        crates = Path(cfg.crates)
        shown = crates.relative_to(C.REPO_DIR) if crates.is_relative_to(C.REPO_DIR) else crates
    else:
        shown = f"{cfg.dataset}@{cfg.revision} ({', '.join(cfg.held_out_repos)})"
    if args.json:
        print(json.dumps({"set": args.set, "artifact": art.location, "manifest": art.manifest,
                          "built": os.path.exists(art.manifest), "toolchain": cfg.toolchain,
                          "sandbox": kind, "tasks": n, "gold_resolved": gold, "empty_resolved": empty,
                          "excluded": checked.excluded, "dropped_mutations": dict(made.dropped), "rows": checked.rows,
                          "instances": [t.row() for t in made.tasks]}, indent=1))
    else:
        print(f"task set {args.set} (tasks/{art.name}): {n} tasks from {shown} ({cfg.toolchain}; sandbox {kind}; "
              f"{'mutations' if cfg.crates is not None else 'rows'} dropped: {dict(made.dropped) or 'none'})")
        width = max((len(r["instance_id"]) for r in checked.rows), default=4)
        print(f"{'TASK'.ljust(width)}  GOLD        EMPTY       F2P  P2P  SECONDS")
        for r in checked.rows:
            g, e = r["gold"], r["empty"]
            print(f"{r['instance_id'].ljust(width)}  {'resolved' if g['resolved'] else 'unresolved':10}  "
                  f"{'resolved' if e['resolved'] else 'unresolved':10}  {len(g['fail_to_pass']):>3}  "
                  f"{len(g['pass_to_pass']):>3}  {g['seconds'] + e['seconds']:7.1f}")
        for tid, why in checked.excluded.items():
            print(f"excluded {tid}: {why}")
        print(f"gold fix: resolved {gold}/{n}; empty patch: resolved {empty}/{n}; {len(checked.kept)} tasks kept")
        built = "built" if os.path.exists(art.manifest) else "not built"
        print(f"the set's artifact: {art.location} ({built}; alone: snakemake --cores 2 {art.manifest})")
    if not checked.kept:
        print(f"trajsft tasks check {args.set}: no task passed its controls", file=sys.stderr)
        return 1
    return 0
