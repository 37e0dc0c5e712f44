"""Episodes at once against one engine: the agent evaluation's throughput, measured in one run on the trained demo
student working the demo's task set through mini-swe-agent, at several ``agent.episodes_at_once`` settings.

    .venv/bin/python scripts/bench_agent.py [--workdir DIR] [--at-once 1,4,16] [--repeats 2] [--tasks N] [--json]

``--workdir``: a Snakemake workdir where the demo is trained (``checkpoints/demo/done``); without it the demo is
trained in a temp dir first (not measured); the task set is built there if it is not. Each setting runs the same
episodes (every task ``--repeats`` times, greedy: the same work in any batch) against a fresh engine whose
``max_seqs`` is the setting, into a location of its own. Measured from the first episode to the last (the engine's
start-up and compilation are not): the tokens the student generated per second, the engine's batches and their
mean occupancy (sequences per batch over max_seqs), and the CPU seconds of this process (the engine, the harness)
and of its children (the sandboxed commands and the grader's tests: on 2 cores they compete with the engine).
Printed: a row per setting with its tokens/s as a ratio to one episode at once. The setting with the most tokens/s
is what ``agent.episodes_at_once`` in config/config.yaml should hold on a machine like the one measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
AT_ONCE = (1, 4, 16)
COLUMNS = (("at once", "episodes_at_once"), ("episodes", "episodes"), ("tokens", "generated_tokens"),
           ("wall s", "wall_s"), ("tok/s", "tokens_per_s"), ("x one", "tokens_per_s_ratio_to_one"),
           ("batches", "batches"), ("seqs/batch", "mean_batch_seqs"), ("occupancy", "occupancy"),
           ("engine s", "engine_busy_s"), ("cpu s", "cpu_s"), ("sandbox cpu s", "sandbox_cpu_s"))


def snakemake(workdir: Path, target: str) -> None:
    subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2", target, "--quiet"],
                   check=True, cwd=workdir)


def measure(workdir: Path, at_once=AT_ONCE, repeats: int = 2, first: int | None = None) -> list[dict]:
    os.chdir(workdir)  # the demo's storage root (results) is relative to the workdir
    from trajsft.agent import evaluate
    from trajsft.plan import config as C
    from trajsft.plan import step_configs
    from trajsft.tasks import taskset

    plan = C.Plan(C.load(), base_dir=REPO, state_dir=str(workdir / "results"))
    if not (workdir / "checkpoints/demo/done").exists():
        snakemake(workdir, "checkpoints/demo/done")
    tasks = plan.get("tasks", plan.target("demo")["agent"].spec["tasks"])
    if not Path(tasks.manifest).exists():
        snakemake(workdir, os.path.relpath(tasks.manifest, workdir))
    # greedy repeats: every setting runs the same episodes (the plan refuses them for a user's evaluation: they
    # would measure nothing new; here they are the same work)
    cfg = dataclasses.replace(step_configs.eval_agent(plan, "demo"), repeats=repeats, temperature=0.0)
    only = [t.instance_id for t in taskset.load(tasks.location).tasks][:first] if first else None
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        for n in at_once:
            result = evaluate.episodes(dataclasses.replace(cfg, episodes_at_once=n), "student",
                                       location=str(Path(tmp) / f"at-once-{n}"), say=lambda _: None, only=only)
            out.append({"episodes_at_once": n, "resolved": result["resolved"], **result["engine"]})
    one = next((r for r in out if r["episodes_at_once"] == 1), out[0])
    for r in out:
        r["tokens_per_s_ratio_to_one"] = round(r["tokens_per_s"] / one["tokens_per_s"], 2) if one["tokens_per_s"] else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--at-once", default=",".join(map(str, AT_ONCE)), help="episodes at once, e.g. 1,4,16")
    ap.add_argument("--repeats", type=int, default=2, help="episodes per task (greedy: the same work each setting)")
    ap.add_argument("--tasks", type=int, help="the set's first N tasks only (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-agent-wd-") as tmp:
        wd = (args.workdir or Path(tmp)).resolve()
        rows = measure(wd, tuple(int(x) for x in args.at_once.split(",")), args.repeats, args.tasks)
    best = max(rows, key=lambda r: r["tokens_per_s"])
    if args.json:
        print(json.dumps({"settings": rows, "fastest": best["episodes_at_once"]}, indent=2))
        return 0
    widths = [max(len(title), 6) for title, _ in COLUMNS]
    print(" ".join(title.rjust(w) for (title, _), w in zip(COLUMNS, widths)))
    for r in rows:
        print(" ".join(str(r[key]).rjust(w) for (_, key), w in zip(COLUMNS, widths)))
    print(f"most tokens/s: {best['episodes_at_once']} episodes at once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
