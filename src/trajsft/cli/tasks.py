"""`trajsft tasks check <set>`: a task set's controls (the gold fix resolves every task, the empty patch none)."""

from __future__ import annotations

import json
import sys

from ..errors import ConfigError
from ..plan import config as C

SETS = {"demo": "tasks/demo/crates"}  # a set made offline from the crates shipped in the repository


def cmd_tasks(args) -> int:
    from ..tasks import controls, mutate, sandbox

    if args.set not in SETS:
        raise ConfigError(f"unknown task set {args.set!r} (task sets: {', '.join(SETS)})")
    crates = C.REPO_DIR / SETS[args.set]
    lacking = sandbox.missing(args.sandbox)
    if lacking:
        raise ConfigError(f"tasks {args.set}: the sandbox ({args.sandbox}) needs {', '.join(lacking)}")
    made = mutate.make_tasks(crates, sandbox=args.sandbox)
    checked = controls.check(made.tasks, crates, sandbox=args.sandbox)
    gold, empty, n = checked.counts()
    if args.json:
        print(json.dumps({"set": args.set, "toolchain": sandbox.toolchain(), "sandbox": args.sandbox, "tasks": n,
                          "gold_resolved": gold, "empty_resolved": empty, "excluded": checked.excluded,
                          "dropped_mutations": dict(made.dropped), "rows": checked.rows,
                          "instances": [t.row() for t in made.tasks]}, indent=1))
    else:
        print(f"task set {args.set}: {n} tasks from {crates.relative_to(C.REPO_DIR)} ({sandbox.toolchain()}; "
              f"sandbox {args.sandbox}; mutations dropped: {dict(made.dropped) or 'none'})")
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
    if not checked.kept:
        print(f"trajsft tasks check {args.set}: no task passed its controls", file=sys.stderr)
        return 1
    return 0
