"""``trajsft status``, ``logs``, ``clusters``, ``stop``, ``retry`` and ``preflight``: the runs of the targets and
the clusters they run on."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .. import io
from ..executor import executor_for
from .common import load_plan, named_trainings


def cmd_status(args) -> int:
    from ..observe import status
    from ..train.target import cell_of

    plan = load_plan(args)
    rows = []
    for tc in named_trainings(plan, args.targets):
        row = status.target_status(tc, query_ray=not args.offline)
        # the data it trains on, and every target that shares it (built once for all of them)
        row["data"] = [{"kind": a.kind, "name": a.name, "ready": Path(a.manifest).exists(), "used_by": plan.users(a)}
                       for a in tc.tokenized.values()]
        row["sweeps"] = sorted(cell_of(plan.cfg, tc.target))  # the sweeps it is a cell of
        rows.append(row)
    print(json.dumps(rows, indent=2) if args.json else status.render(rows))
    return 0


def cmd_logs(args) -> int:
    import time

    plan = load_plan(args)
    [tc] = named_trainings(plan, [args.target])
    t, path = tc.target, Path(tc.log)
    if not path.exists() and tc.placement.on_cluster:  # the newest Ray job's log
        lines = executor_for(plan.cfg).job_log(tc)
        if lines is None:
            print(f"trajsft: no log yet for {t} ({path}) and no Ray job for {tc.run.name}", file=sys.stderr)
            return 1
        print("\n".join(lines[-args.n:]))
        return 0
    if not path.exists():
        print(f"trajsft: no training log yet for {t} ({path})", file=sys.stderr)
        return 1
    for line in io.tail(path, args.n):
        print(line)
    if args.follow:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            try:
                while True:
                    chunk = f.read()
                    if chunk:
                        sys.stdout.write(chunk.decode(errors="replace"))
                        sys.stdout.flush()
                    else:
                        time.sleep(1)
            except KeyboardInterrupt:
                return 0
    return 0


def cmd_clusters(args) -> int:
    from ..observe import status

    rows = status.clusters(args.profiles or None)
    print(json.dumps(rows, indent=2) if args.json else status.render_clusters(rows))
    return 0


def cmd_stop(args) -> int:
    plan = load_plan(args)
    executor = executor_for(plan.cfg)
    rc = 0
    for tc in named_trainings(plan, args.targets):
        lines, code = executor.stop(tc)
        print("\n".join(lines), file=sys.stderr if code == 2 else sys.stdout)
        if code == 2:  # nothing to stop here (no cluster): said once
            return code
        rc |= code
    return rc


def cmd_retry(args) -> int:
    """Drop a target's configuration-error record, so the next ``snakemake`` submits its job again."""
    from ..cluster import setup_failure
    from ..storage import absolute

    plan = load_plan(args)
    for tc in named_trainings(plan, args.targets):
        t, rec = tc.target, setup_failure.clear(absolute(tc.run.location))
        print(f"{t}: " + (f"cleared the configuration error of Ray job {rec['ray_job_id']} ({rec['cause']}); "
                          f"the next snakemake run submits it again" if rec else "no configuration error recorded"))
    return 0


def cmd_preflight(args) -> int:
    from ..cluster.submit import say_preflight
    from ..fit import disk

    plan = load_plan(args)
    executor, notes = executor_for(plan.cfg), []
    if not say_preflight(notes, executor.preflight(notes)):
        return 1
    print(executor.ready_line())
    # what the targets' trainings write there, against its free space (a bucket's: what is written)
    print(disk.check(plan.root, named_trainings(plan, args.targets or plan.cfg["default_targets"]),
                     probe=False)["lines"][-1])
    return 0
