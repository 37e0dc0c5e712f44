"""``trajsft plan``: where every artifact of a target lives, what it hashes and whether it is built (here or in a
storage root)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .. import io
from ..errors import DataError
from ..plan import config as C
from ..plan import step_configs
from .common import load_plan, named_trainings


def _manifest_here(a: C.Artifact) -> bool:
    """The artifact's manifest exists and was written for its location under the current root (a
    manifest of another root is not done here: its rule reruns). Done markers have no location."""
    if a.kind == "checkpoints":
        return os.path.exists(a.manifest)
    try:
        return a.read_manifest().get("location") == a.location
    except (DataError, OSError, ValueError, AttributeError):
        return False


def _present_at(plan: C.Plan, a: C.Artifact, timeout_s: float = 20.0) -> list[str] | None:
    """The storage roots that hold a finished payload of ``a`` (None: the current root, or any root
    within ``timeout_s``, did not answer)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    from .. import storage

    root = storage.absolute(plan.root)
    if not storage.reachable(root):
        return None
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        found = pool.submit(storage.where, plan, a).result(timeout=timeout_s)
        return None if storage.refused(root) else found
    except FutureTimeout:
        return None
    finally:
        pool.shutdown(wait=False)


def _done_elsewhere(done: str, run: C.Artifact) -> str | None:
    """Where the current hash's run finished when its done marker names another run directory than this plan's
    (a local run's marker read under a Ray profile, or the reverse), else None."""
    from ..observe.status_row import same_run_dir

    try:
        rec = json.loads(Path(done).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("hash") != run.hash or same_run_dir(rec, run.location):
        return None
    return rec["checkpoint_dir"]


def cmd_plan(args) -> int:
    plan = load_plan(args)
    targets = args.targets or plan.cfg["default_targets"]
    out = []
    trainings = named_trainings(plan, targets)
    for tc in trainings:
        t = tc.target
        rows = []
        # the training chain, then the export, the next-action scores and the agent evaluation with its task set
        # (built on request: snakemake results/exports/<t>/manifest.json, evals/<t>/done, agent/<t>/done; an agent
        # evaluation that cannot be planned, its task set or harness unknown, is said when asked for)
        extra = [plan.get("exports", step_configs.export(plan, t).name),
                 plan.get("evals", step_configs.eval_actions(plan, t).name)]
        agent = plan.target(t)["agent"]
        if not agent.spec.get("problem"):
            extra += [plan.get("tasks", agent.spec["tasks"]), agent]
        for a in [*plan.chain(t), *extra]:
            row = {
                "kind": a.kind, "name": a.name, "hash": a.hash, "location": a.location,
                "manifest": a.manifest, "exists": _manifest_here(a),
                "present_at": _present_at(plan, a) if not args.offline else None,
            }
            if a.kind in ("exports", "evals", "tasks", "agent"):
                row["on_request"] = f"snakemake {a.manifest}"
            else:  # the targets that train on it (several: shared data, built once)
                row["used_by"] = plan.users(a)
            if args.explain:
                row["hash_inputs"] = a.inputs
            rows.append(row)
        run = tc.run
        done = C.Plan.done_path(t)
        done_hash = C.Plan.done_hash(done)
        away = _done_elsewhere(done, run)
        entry = {
            "target": t, "done": done, "done_exists": done_hash == run.hash and away is None, "done_hash": done_hash,
            "done_elsewhere": away,
            "checkpoint_dir": run.location, "hf_export": io.join(run.location, "hf"),
            "init_weights": tc.model and tc.model.location,
            "artifacts": rows,
        }
        if args.explain:
            from ..fit import check as fit
            from ..train.target import explain

            entry["training"] = explain(tc)
            entry["fit"] = fit.cached_summary(tc, entry["training"]["steps"])
            entry["fit_line"] = fit.short(entry["fit"], (plan.cfg.get("ray") or {}).get("tpu_type"))
        out.append(entry)
    from .. import storage
    from ..fit import disk

    online = not (args.offline and io.is_remote(plan.root))  # --offline: a bucket is not asked
    space = disk.check(plan.root, trainings, probe=online, look=online)
    if args.json:
        for t in out:  # the target's own share: the writes of its artifacts (shared data counted in full)
            mine = {a["name"] for a in t["artifacts"]}
            writes = None if space["writes"] is None else [w for w in space["writes"] if w["name"] in mine]
            t["storage"] = {**{k: v for k, v in space.items() if k != "lines"}, "target_writes": writes,
                            "target_writes_bytes": None if writes is None else sum(w["bytes"] for w in writes)}
        print(json.dumps(out, indent=2))
        return 0

    shown: dict[tuple[str, str], str] = {}  # shared data -> the target it was shown under
    for t in out:
        stale = f", {t['done']} is of an earlier config (hash {t['done_hash']})" if t["done_hash"] and not t["done_exists"] else ""
        if t["done_elsewhere"]:
            stale = f" here: {t['done']} is of this config's run in {t['done_elsewhere']}"
        print(f"{t['target']}:  {t['done']}  [{'done' if t['done_exists'] else 'not done' + stale}]")
        print(f"  weights (checkpoints): {t['checkpoint_dir']}")
        print(f"  HF exports:            {t['hf_export']}/step-<N>")
        if t["init_weights"]:
            print(f"  initial weights:       {t['init_weights']}")
        for a in t["artifacts"]:
            others = [u for u in a.get("used_by") or [] if u != t["target"]]
            if (a["kind"], a["name"]) in shown:  # shared data: shown once, under the first target that uses it
                print(f"  {a['kind']:<11} {a['name']:<60} [shared: see {shown[(a['kind'], a['name'])]} above]")
                continue
            shown[(a["kind"], a["name"])] = t["target"]
            state = "exists" if a["exists"] else ("on request" if a.get("on_request") else "missing")
            if others:
                state += f"; also used by {', '.join(others)}"
            if a["present_at"] is None:
                why = storage.refused(storage.absolute(plan.root))
                where = "" if args.offline else f"; {plan.root} " + (f"refused: {why}" if why else "did not answer")
            else:
                where = "; payload at " + ", ".join(a["present_at"]) if a["present_at"] else "; no payload"
            print(f"  {a['kind']:<11} {a['location']:<60} [{state}{where}]")
            if args.explain:
                print("              hash inputs: " + json.dumps(a["hash_inputs"], sort_keys=True))
        if args.explain:
            from ..plan.schedule import render

            for line in render(t["target"], t["training"]):
                print(line)
            print(f"  {t['fit_line']}")
    print(space["lines"][-1])
    if space["problem"]:  # said, as a root that does not answer is per row: the plan itself is shown
        print(f"trajsft plan: {space['problem']}", file=sys.stderr)
    return 0
