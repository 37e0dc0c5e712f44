"""``trajsft eval``: the cross-teacher matrix, next-action scores (``--actions``, ``--replay``, ``--watch``) and the
agent evaluation (``--agent``, ``--replay``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator

from .. import io
from ..plan import config as C
from ..plan import step_configs
from ..plan.step_configs import TrainConfig
from .common import load_plan, named_trainings


def _held_out(plan: C.Plan, teacher: str) -> str:
    """Where ``teacher``'s held-out chats are (its shard set: built, else one line saying how)."""
    if teacher not in plan.cfg["teachers"]:
        raise C.ConfigError(f"unknown teacher '{teacher}' (teachers: {', '.join(plan.cfg['teachers'])})")
    shards = plan.shards(teacher)
    if not os.path.exists(shards.manifest):
        raise C.ConfigError(f"{teacher}: {shards.manifest} is missing: build it first (snakemake {shards.manifest})")
    return shards.location


def _stored_actions(ev) -> dict | None:
    """The figures rule eval_actions wrote for exactly this evaluation (same hash), else None."""
    try:
        done = json.loads(Path(C.Plan.evals_done_path(ev.target)).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return done if done.get("name") == ev.name else None


def cmd_eval_watch(args, plan: C.Plan, row: TrainConfig) -> int:
    """``trajsft eval TARGET --actions --watch``: score each HF export of the target's run as it appears (its figures
    under the evaluation's ``steps/step-<N>/``, a row per step in the report), until the run is done (its done
    marker) and every export is scored, or Ctrl-C. One line (``--json``: one JSON object) per export scored."""
    from ..report import actions
    from ..report.trained import locate

    ev = step_configs.eval_actions(plan, row.target)
    if args.max_turns or args.max_tokens or args.teachers or args.replay:
        raise C.ConfigError("--watch scores with the target's actions: settings (no --max-turns, --max-tokens, "
                            "--teachers or --replay): change them in the config")
    if problem := step_configs.held_out_problem(plan, row.target):
        raise C.ConfigError(f"{row.target}: {problem}")
    scored = set(actions.evaluated_steps(ev.location))
    print(f"trajsft eval --watch: {row.target} (run {row.run.name}): scoring each new HF export into "
          f"{io.join(ev.location, actions.STEPS)} (already scored: {sorted(scored) or 'none'})", file=sys.stderr,
          flush=True)
    for step in new_exports(row, scored, args.interval):
        r = actions.evaluate_trained(ev, locate(row, step), actions.step_location(ev, step))
        if args.json:
            print(json.dumps({k: r[k] for k in ("target", "model", "step", "splits", "chats_scored")}), flush=True)
        else:
            s = next(iter(r["splits"].values()))
            print(f"{row.target} step {step}: " + ", ".join(
                f"{k} {s[k]:.3f}" for k in ("valid", "tool_or_text", "tool_name") if s.get(k) is not None), flush=True)
    return 0


def new_exports(row: TrainConfig, seen: set[int], interval: float) -> Iterator[int]:
    """The step of each HF export of ``row``'s run not in ``seen``, as it appears (looking every ``interval``
    seconds), until the run is done (its done marker) and every export was yielded (each added to ``seen``)."""
    import time

    from ..report.matrix import hf_exports
    from ..report.trained import locate

    done_path = C.Plan.done_path(row.target)
    while True:
        finished = C.Plan.done_hash(done_path) == row.run.hash  # read before the exports: none appears after it
        try:
            exports = hf_exports(locate(row).train_cfg["hf_save_path"])
        except C.ConfigError:  # not started yet: no provenance, no export
            exports = []
        for step, _ in exports:
            if step not in seen:
                seen.add(step)
                yield step
        if finished:
            return
        time.sleep(interval)


def cmd_eval_actions(args) -> int:
    """Next-action scores of each target's student (or, with --replay, of the teachers' own turns) on the held-out
    chats its ``actions:`` settings name: the figures rule eval_actions wrote (evals/<target>/done) when they are of
    these settings, else computed here (--max-turns, --max-tokens and --teachers override the settings)."""
    from .. import logs
    from ..report import actions

    plan = load_plan(args)
    logs.setup(None, plan.cfg.get("log_level", "INFO"))
    if args.watch:
        rows = named_trainings(plan, args.targets or plan.cfg["default_targets"])
        if len(rows) != 1:
            raise C.ConfigError("--watch follows one target: name it (trajsft eval demo --actions --watch)")
        return cmd_eval_watch(args, plan, rows[0])
    out = []
    for row in named_trainings(plan, args.targets or plan.cfg["default_targets"]):
        ev = step_configs.eval_actions(plan, row.target)
        max_turns = args.max_turns or ev.max_turns
        max_tokens = args.max_tokens or ev.max_tokens
        stored = None
        if not args.replay and (max_turns, max_tokens) == (ev.max_turns, ev.max_tokens) and not args.teachers:
            stored = _stored_actions(ev)
        if stored is not None:
            out.append({"target": row.target, "model": stored["model"], "max_turns": max_turns,
                        "max_tokens": max_tokens, "splits": stored["splits"], "from": C.Plan.evals_done_path(row.target),
                        "side_by_side": stored.get("side_by_side")})
            continue
        if not args.teachers and (problem := step_configs.held_out_problem(plan, row.target)):
            raise C.ConfigError(f"{row.target}: {problem}")
        held_out = {t: _held_out(plan, t) for t in args.teachers or ev.held_out}
        turns = actions.sampled(held_out, max_turns, step_configs.prompt_tools(plan, row.target, held_out))
        if args.replay:
            from transformers import AutoTokenizer

            student = row.run.spec["student"]
            model = actions.Replay(AutoTokenizer.from_pretrained(
                plan.resolve_ref(student["tokenizer"], student.get("tokenizer_revision"))))
        else:
            from ..report.trained import locate
            from ..train import generate

            trained = locate(row)
            model = actions.Student(trained.name, generate.load(trained.train_cfg, trained.source, ev.max_seqs),
                                    max_tokens)
        out.append({"target": row.target, "model": model.name, "max_turns": max_turns,
                    "max_tokens": None if args.replay else max_tokens, "splits": actions.scores(model, turns),
                    "from": "computed"})
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for r in out:
            src = "" if r["from"] == "computed" else f", from {r['from']}"
            print(f"{r['target']} ({r['model']}{src}), turns per split: "
                  + ", ".join(f"{c} {s['turns']}" for c, s in r["splits"].items()))
            print(actions.table({r["model"]: r["splits"]}))
            if r.get("side_by_side"):
                print(f"  the student's turns beside the teacher's: {r['side_by_side']}")
    return 0


def cmd_eval_agent(args) -> int:
    """``trajsft eval TARGET... --agent [--replay]``: each target's agent evaluation (rule ``eval_agent``'s, into the
    same location: a killed run, or the rule's, is resumed; figures the rule wrote for this very evaluation are read
    back), or, with ``--replay``, the built-in model that answers each episode with the task's gold fix through the
    same harness and route (it must resolve every task). The resolve rate with its count, a row per task."""
    from .. import logs
    from ..agent import evaluate

    if args.actions:
        raise C.ConfigError("--agent evaluates the student on the task set; --actions are the next-action scores")
    plan = load_plan(args)
    logs.setup(None, plan.cfg.get("log_level", "INFO"))
    targets = [t.removeprefix("agent/").removeprefix("checkpoints/").removesuffix("/done")
               for t in args.targets or plan.cfg["default_targets"]]
    if args.watch:
        if len(targets) != 1 or args.replay:
            raise C.ConfigError("--watch follows one target's student: name it (trajsft eval demo --agent --watch)")
        return cmd_eval_agent_watch(args, plan, targets[0])
    docs = []
    for t in targets:
        cfg = _agent_cfg(plan, t)
        model = "replay" if args.replay else "student"
        stored = None if args.replay else io.join(cfg.location, evaluate.RESULTS)
        if stored and _built(C.Plan.agent_done_path(t), cfg.name) and os.path.exists(stored):
            doc = io.read_json(stored)
        else:
            evaluate.eval_agent(cfg, model, location=io.join(cfg.location, "replay") if args.replay else None)
            doc = io.read_json(io.join(cfg.location, "replay", evaluate.RESULTS) if args.replay else stored)
        docs.append(doc)
    if args.json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1))
        return 0
    if len(docs) > 1:
        print("\n".join(agent_side_by_side(docs)))
        return 0
    for doc in docs:
        print(f"{doc['target']} ({doc['model']}): {rate_text(doc)} on {Path(doc['task_set']).name}")
        width = max(len(r["instance_id"]) for r in doc["rows"])
        repeats = doc.get("repeats", 1) > 1
        print(f"  {'TASK'.ljust(width)}  {'REPEAT  ' if repeats else ''}RESOLVED  STEPS  EXIT                  "
              "TOKENS  SECONDS")
        for r in doc["rows"]:
            print(f"  {r['instance_id'].ljust(width)}  {str(r.get('repeat', 0)).rjust(6) + '  ' if repeats else ''}"
                  f"{'yes' if r['resolved'] else 'no':8}  {r['steps']:>5}  {r['exit_status'][:20]:20}  "
                  f"{r['prompt_tokens'] + r['completion_tokens']:>6}  {r['seconds']:7.1f}")
        for tid, why in (doc.get("excluded") or {}).items():
            print(f"  excluded by the task set's controls: {tid}: {why}")
    return 0


def _agent_cfg(plan: C.Plan, target: str):
    """The target's agent evaluation, its task set built (else one line: the command that builds it)."""
    plan.target(target)  # an unknown target: one line naming them
    cfg = step_configs.eval_agent(plan, target)  # no such task set or harness file: one line
    tasks = plan.get("tasks", plan.target(target)["agent"].spec["tasks"])
    if not os.path.exists(tasks.manifest):
        raise C.ConfigError(f"{target}: its task set {tasks.name} is not built: snakemake --cores 2 {tasks.manifest}")
    return cfg


def cmd_eval_agent_watch(args, plan: C.Plan, target: str) -> int:
    """``trajsft eval TARGET --agent --watch``: the agent evaluation of each HF export of the target's run as it
    appears (its rows under the evaluation's ``steps/step-<N>/``), here or, on a Ray profile, as a Ray job on a
    single-host slice each, until the run is done (its done marker) and every export is evaluated, or Ctrl-C. One
    line (``--json``: one JSON object) per export."""
    from ..agent import evaluate, watch

    cfg = _agent_cfg(plan, target)
    evaluated = set(evaluate.evaluated_steps(cfg.location))
    print(f"trajsft eval --agent --watch: {target} (run {cfg.train.run.name}): evaluating each new HF export into "
          f"{io.join(cfg.location, evaluate.STEPS)} (already evaluated: {sorted(evaluated) or 'none'})",
          file=sys.stderr, flush=True)
    for step in new_exports(cfg.train, evaluated, args.interval):
        r = watch.at_step(cfg, step, f"logs/eval_agent/{target}-step-{step}.log")
        if args.json:
            print(json.dumps({k: r.get(k) for k in ("target", "step", "tasks", "episodes", "resolved", "resolve_rate",
                                                    "resolve_rate_std", "exit_statuses", "ray_job_id", "results")}),
                  flush=True)
        else:
            print(f"{target} step {step}: {rate_text(r)}", flush=True)
    return 0


def rate_text(doc: dict) -> str:
    """An agent evaluation's rate: ``resolved 5/15 (33.3%)``; with repeats ``resolved 14/45 episodes: 31.1% ± 3.8%
    (mean ± std of 3 repeats)``."""
    from ..agent.evaluate import rate_shown

    n = doc.get("episodes", doc["tasks"])
    if doc.get("repeats", 1) > 1:
        return f"resolved {doc['resolved']}/{n} episodes: {rate_shown(doc)} (mean ± std of {doc['repeats']} repeats)"
    return f"resolved {doc['resolved']}/{n} ({rate_shown(doc)})"


def agent_side_by_side(docs: list[dict]) -> list[str]:
    """Several targets' agent evaluations side by side: a row per task (each target's verdict and exit status, or with
    repeats how many of its episodes resolved it; a task a target's set does not hold is blank), then each target's
    resolve rate with its count (and the repeats' std)."""
    ids = list(dict.fromkeys(r["instance_id"] for d in docs for r in d["rows"]))
    by: list[dict[str, list]] = [{} for _ in docs]
    for b, d in zip(by, docs):
        for r in d["rows"]:
            b.setdefault(r["instance_id"], []).append(r)

    def cell(rows: list) -> str:
        if len(rows) > 1:
            return f"{sum(bool(r['resolved']) for r in rows)}/{len(rows)} resolved"
        return f"{'resolved' if rows[0]['resolved'] else 'no'} ({rows[0]['exit_status'][:12]})"

    width = max(len(i) for i in ids + ["RESOLVED"])
    totals = [rate_text(d).removeprefix("resolved ") for d in docs]
    cols = [max(22, len(d["target"]), len(t)) for d, t in zip(docs, totals)]
    out = ["  ".join(["TASK".ljust(width)] + [d["target"].ljust(c) for d, c in zip(docs, cols)])]
    for i in ids:
        cells = [cell(b[i]) if i in b else "" for b in by]
        out.append("  ".join([i.ljust(width)] + [x.ljust(c) for x, c in zip(cells, cols)]))
    out.append("  ".join(["RESOLVED".ljust(width)] + [t.ljust(c) for t, c in zip(totals, cols)]))
    return [line.rstrip() for line in out]


def _built(done: str, name: str) -> bool:
    """Whether the done marker ``done`` was written for the evaluation ``name``."""
    try:
        return json.loads(Path(done).read_text()).get("name") == name
    except (FileNotFoundError, ValueError):
        return False


def cmd_eval(args) -> int:
    """The cross-teacher matrix of the config's ``eval:`` section (rows and columns may be narrowed),
    from the targets' latest HF exports or checkpoints; the same code as rule ``eval_matrix``."""
    from .. import logs
    from ..report import matrix

    if args.agent:
        return cmd_eval_agent(args)
    if args.actions:
        return cmd_eval_actions(args)
    if args.replay or args.watch:
        raise C.ConfigError(f"--{'replay' if args.replay else 'watch'} is of the next-action scores or the agent "
                            "evaluation: use it with --actions or --agent")

    overrides = {}
    if args.targets:
        overrides["targets"] = [t.removeprefix("checkpoints/").removesuffix("/done") for t in args.targets]
    if args.teachers:
        overrides["teachers"] = args.teachers
    if args.model:
        overrides["model"] = args.model
    if args.max_eval_batches:
        overrides["max_eval_batches"] = args.max_eval_batches
    plan = load_plan(args)
    if plan.cfg.get("eval") is None and not overrides:
        raise C.ConfigError("config: no eval: section (the cross-teacher matrix is opt-in): add one, e.g. "
                            "--configfile config/eval.yaml, or name targets: trajsft eval demo")
    if overrides or plan.cfg.get("eval") is None:
        cfg = C.validate(C.deep_merge(plan.cfg, {"eval": {**(plan.cfg.get("eval") or {}), **overrides}}))
        plan = C.Plan(cfg, base_dir=C.REPO_DIR)
    from .. import storage

    why = storage.unusable(plan.root)  # the matrix reads checkpoints and caches there: one line, not a retry storm
    if why:
        raise C.ConfigError(f"storage root {plan.root} {why}: the matrix reads the targets' checkpoints there")
    for (row, col), art in plan.eval_cells.items():
        if not os.path.exists(art.manifest):
            raise C.ConfigError(f"{row} on {col}: {art.manifest} is missing: build it first "
                                f"(snakemake {art.manifest})")
    logs.setup(None, plan.cfg.get("log_level", "INFO"))
    out = {k: str(Path(args.out, f"matrix.{k}")) for k in ("json", "png", "html")}
    doc = matrix.eval_matrix(step_configs.eval_matrix(plan), out)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(matrix.render_text(doc))
        print(f"written: {out['json']}, {out['png']}, {out['html']}")
    return 0
