"""`trajsft` command line: plan (and, as they land, status/logs/clusters/submit helpers)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import config as C
from . import storage


def _load(args) -> C.Plan:
    overrides = {}
    if getattr(args, "storage_root", None):
        overrides["storage_root"] = args.storage_root
    cfg = C.load([C.DEFAULT_CONFIG, *(args.configfile or [])], overrides)
    return C.Plan(cfg, base_dir=C.REPO_DIR)


def _exists(path: str) -> bool:
    try:
        return storage.exists(path)
    except Exception:  # unreachable bucket: say so rather than guess
        return False


def cmd_plan(args) -> int:
    plan = _load(args)
    targets = args.targets or plan.cfg["default_targets"]
    out = []
    for t in targets:
        t = t.removeprefix("checkpoints/").removesuffix("/done")
        tgt = plan.target(t)
        rows = []
        for a in plan.chain(t):
            row = {
                "kind": a.kind, "name": a.name, "hash": a.hash, "location": a.location,
                "manifest": a.manifest, "exists": os.path.exists(a.manifest),
            }
            if args.explain:
                row["hash_inputs"] = a.inputs
            rows.append(row)
        run = tgt["run"]
        done = C.Plan.done_path(t)
        out.append({
            "target": t, "done": done, "done_exists": os.path.exists(done),
            "checkpoint_dir": run.location, "hf_export": C.join(run.location, "hf"),
            "artifacts": rows,
        })
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for t in out:
        print(f"{t['target']}:  {t['done']}  [{'done' if t['done_exists'] else 'not done'}]")
        print(f"  weights (checkpoints): {t['checkpoint_dir']}")
        print(f"  HF exports:            {t['hf_export']}/step-<N>")
        for a in t["artifacts"]:
            state = "exists" if a["exists"] else "missing"
            print(f"  {a['kind']:<11} {a['location']:<60} [{state}]")
            if args.explain:
                print("              hash inputs: " + json.dumps(a["hash_inputs"], sort_keys=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trajsft", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--configfile", action="append", help="extra config file(s) merged over config/config.yaml, as with snakemake --configfile")
        sp.add_argument("--storage-root", help="override storage_root (e.g. gs://marin-us-east5/trajsft)")

    sp = sub.add_parser("plan", help="where every artifact of a target lives (runs and downloads nothing)")
    common(sp)
    sp.add_argument("targets", nargs="*", help="teacher or mixture names (or checkpoints/<name>/done)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--explain", action="store_true", help="show what each hash covers")
    sp.set_defaults(func=cmd_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except C.ConfigError as e:
        print(f"trajsft: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
