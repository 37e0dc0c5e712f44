"""`trajsft` command line: where a target's artifacts live and what they hash (``plan``), the state of
every run (``status``), a training log (``logs``), the clusters of the profiles (``clusters``), stopping
a target's Ray jobs (``stop``), forgetting a configuration error after a fix (``retry``), the cross-teacher matrix (``eval``),
a trained target behind an OpenAI-compatible API (``serve``), a profile's checks
(``preflight``) and whether a target's train step fits its TPU slice, with the run's cost (``fit``). Running the pipeline itself is Snakemake's: ``snakemake checkpoints/<target>/done``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import io
from .errors import DataError, quiet_on_closed_pipe
from .plan import config as C
from .plan import step_configs
from .plan.step_configs import TrainConfig


def _load(args) -> C.Plan:
    from .observe.status import profile_configfiles

    overrides = {}
    if getattr(args, "storage_root", None):
        overrides["storage_root"] = args.storage_root
    extra = args.configfile or []
    for f in extra:
        if not os.path.exists(f):
            name = f.removeprefix("checkpoints/").removesuffix("/done")
            hint = (f" ({f!r} looks like a target: --configfile takes every following argument, as in snakemake; "
                    f"put targets first: trajsft {args.cmd} {name} --configfile ...)") if not f.endswith((".yaml", ".yml", ".json")) else ""
            raise C.ConfigError(f"config file not found: {f}{hint}")
    files = [C.DEFAULT_CONFIG, *profile_configfiles(getattr(args, "profile", None)), *extra]
    cfg = C.load(files, overrides)
    args._cfg = cfg
    return C.Plan(cfg, base_dir=C.REPO_DIR)


def _trainings(plan: C.Plan, names: list[str] | None) -> list[TrainConfig]:
    """The named targets' training configs (``checkpoints/<t>/done`` accepted), else every target's; an unknown
    name is one line naming the targets."""
    names = [n.removeprefix("checkpoints/").removesuffix("/done") for n in names or []]
    return [step_configs.train(plan, n) for n in names or list(plan.targets)]


def cmd_status(args) -> int:
    from .observe import status
    from .train.target import cell_of

    plan = _load(args)
    rows = []
    for tc in _trainings(plan, args.targets):
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

    plan = _load(args)
    [tc] = _trainings(plan, [args.target])
    t, path = tc.target, Path(tc.log)
    if not path.exists() and plan.cfg["executor"] == "ray":
        from .cluster import jobs as cluster_jobs

        jobs = cluster_jobs.run_jobs(plan.cfg["ray"]["address"], tc.run.hash)
        if not jobs:
            print(f"trajsft: no log yet for {t} ({path}) and no Ray job for {tc.run.name}", file=sys.stderr)
            return 1
        lines = cluster_jobs.job_logs(plan.cfg["ray"]["address"], jobs[-1]["submission_id"]).splitlines()
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
    from .observe import status

    rows = status.clusters(args.profiles or None)
    print(json.dumps(rows, indent=2) if args.json else status.render_clusters(rows))
    return 0


def cmd_stop(args) -> int:
    from .cluster import jobs as cluster_jobs

    plan = _load(args)
    if plan.cfg["executor"] != "ray":
        print("trajsft: stop needs a cluster profile (--profile tpu-east5 ...)", file=sys.stderr)
        return 2
    address = plan.cfg["ray"]["address"]
    rc = 0
    for tc in _trainings(plan, args.targets):
        t, run = tc.target, tc.run
        active = [j for j in cluster_jobs.run_jobs(address, run.hash) if j["status"] in ("PENDING", "RUNNING")]
        if not active:
            print(f"{t}: no running Ray job for {run.name} on {plan.cfg['ray'].get('cluster')}")
        for j in active:
            st = cluster_jobs.stop(address, j["submission_id"], 120)
            print(f"{t}: {j['submission_id']} {st}")
            rc |= st not in ("STOPPED", "SUCCEEDED", "FAILED")
    return rc


def cmd_retry(args) -> int:
    """Drop a target's configuration-error record, so the next ``snakemake`` submits its job again."""
    from .cluster import setup_failure
    from .storage import absolute

    plan = _load(args)
    for tc in _trainings(plan, args.targets):
        t, rec = tc.target, setup_failure.clear(absolute(tc.run.location))
        print(f"{t}: " + (f"cleared the configuration error of Ray job {rec['ray_job_id']} ({rec['cause']}); "
                          f"the next snakemake run submits it again" if rec else "no configuration error recorded"))
    return 0


def cmd_preflight(args) -> int:
    from . import storage
    from .cluster.submit import preflight, say_preflight, wandb_preflight
    from .fit import disk

    plan = _load(args)
    notes: list[str] = []
    if plan.cfg["executor"] != "ray":  # the local executor needs W&B (when online) and its storage root
        problem, note = wandb_preflight(plan.cfg)
        problems = [p for p in (problem, storage.probe_write(storage.absolute(plan.root))) if p]
        notes = [note] if note else []
    else:  # the storage root is probed there too
        problems = preflight(plan.cfg, notes)
    if not say_preflight(notes, problems):
        return 1
    if plan.cfg["executor"] != "ray":
        print(f"local executor: storage root writable, W&B {plan.cfg['wandb']['mode']}")
    else:
        print(f"preflight OK for {plan.cfg['ray'].get('cluster')} ({plan.cfg['ray']['address']})")
    # what the targets' trainings write there, against its free space (a bucket's: what is written)
    print(disk.check(plan.root, _trainings(plan, args.targets or plan.cfg["default_targets"]),
                     probe=False)["lines"][-1])
    return 0


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
    from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

    from . import storage

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
    from .observe.status_row import same_run_dir

    try:
        rec = json.loads(Path(done).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("hash") != run.hash or same_run_dir(rec, run.location):
        return None
    return rec["checkpoint_dir"]


def cmd_plan(args) -> int:
    plan = _load(args)
    targets = args.targets or plan.cfg["default_targets"]
    out = []
    trainings = _trainings(plan, targets)
    for tc in trainings:
        t = tc.target
        rows = []
        # the training chain, then the export and the next-action scores (built on request: snakemake
        # results/exports/<t>/manifest.json, evals/<t>/done)
        extra = [plan.get("exports", step_configs.export(plan, t).name),
                 plan.get("evals", step_configs.eval_actions(plan, t).name)]
        for a in [*plan.chain(t), *extra]:
            row = {
                "kind": a.kind, "name": a.name, "hash": a.hash, "location": a.location,
                "manifest": a.manifest, "exists": _manifest_here(a),
                "present_at": _present_at(plan, a) if not args.offline else None,
            }
            if a.kind in ("exports", "evals"):
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
            from .fit import check as fit
            from .train.target import explain

            entry["training"] = explain(tc)
            entry["fit"] = fit.cached_summary(tc, entry["training"]["steps"])
            entry["fit_line"] = fit.short(entry["fit"], (plan.cfg.get("ray") or {}).get("tpu_type"))
        out.append(entry)
    from . import storage
    from .fit import disk

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
            from .plan.schedule import render

            for line in render(t["target"], t["training"]):
                print(line)
            print(f"  {t['fit_line']}")
    print(space["lines"][-1])
    if space["problem"]:  # said, as a root that does not answer is per row: the plan itself is shown
        print(f"trajsft plan: {space['problem']}", file=sys.stderr)
    return 0


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
    import time

    from .report import actions
    from .report.matrix import hf_exports
    from .report.trained import locate

    ev = step_configs.eval_actions(plan, row.target)
    if args.max_turns or args.max_tokens or args.teachers or args.replay:
        raise C.ConfigError("--watch scores with the target's actions: settings (no --max-turns, --max-tokens, "
                            "--teachers or --replay): change them in the config")
    if problem := step_configs.held_out_problem(plan, row.target):
        raise C.ConfigError(f"{row.target}: {problem}")
    done_path = C.Plan.done_path(row.target)
    scored = set(actions.evaluated_steps(ev.location))
    print(f"trajsft eval --watch: {row.target} (run {row.run.name}): scoring each new HF export into "
          f"{io.join(ev.location, actions.STEPS)} (already scored: {sorted(scored) or 'none'})", file=sys.stderr,
          flush=True)
    while True:
        finished = C.Plan.done_hash(done_path) == row.run.hash  # read before the exports: none appears after it
        try:
            exports = hf_exports(locate(row).train_cfg["hf_save_path"])
        except C.ConfigError:  # not started yet: no provenance, no export
            exports = []
        for step, _ in exports:
            if step in scored:
                continue
            trained = locate(row, step)
            r = actions.evaluate_trained(ev, trained, actions.step_location(ev, step))
            scored.add(step)
            if args.json:
                print(json.dumps({k: r[k] for k in ("target", "model", "step", "splits", "chats_scored")}), flush=True)
            else:
                s = next(iter(r["splits"].values()))
                print(f"{row.target} step {step}: " + ", ".join(
                    f"{k} {s[k]:.3f}" for k in ("valid", "tool_or_text", "tool_name") if s.get(k) is not None),
                      flush=True)
        if finished:
            return 0
        time.sleep(args.interval)


def cmd_eval_actions(args) -> int:
    """Next-action scores of each target's student (or, with --replay, of the teachers' own turns) on the held-out
    chats its ``actions:`` settings name: the figures rule eval_actions wrote (evals/<target>/done) when they are of
    these settings, else computed here (--max-turns, --max-tokens and --teachers override the settings)."""
    from . import logs
    from .report import actions

    plan = _load(args)
    logs.setup(None, plan.cfg.get("log_level", "INFO"))
    if args.watch:
        rows = _trainings(plan, args.targets or plan.cfg["default_targets"])
        if len(rows) != 1:
            raise C.ConfigError("--watch follows one target: name it (trajsft eval demo --actions --watch)")
        return cmd_eval_watch(args, plan, rows[0])
    out = []
    for row in _trainings(plan, args.targets or plan.cfg["default_targets"]):
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
            from .report.trained import locate
            from .train import generate

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


def cmd_eval(args) -> int:
    """The cross-teacher matrix of the config's ``eval:`` section (rows and columns may be narrowed),
    from the targets' latest HF exports or checkpoints; the same code as rule ``eval_matrix``."""
    from .report import matrix
    from . import logs

    if args.actions:
        return cmd_eval_actions(args)
    if args.replay or args.watch:
        raise C.ConfigError(f"--{'replay' if args.replay else 'watch'} is of the next-action scores: use it with --actions")

    overrides = {}
    if args.targets:
        overrides["targets"] = [t.removeprefix("checkpoints/").removesuffix("/done") for t in args.targets]
    if args.teachers:
        overrides["teachers"] = args.teachers
    if args.model:
        overrides["model"] = args.model
    if args.max_eval_batches:
        overrides["max_eval_batches"] = args.max_eval_batches
    plan = _load(args)
    if plan.cfg.get("eval") is None and not overrides:
        raise C.ConfigError("config: no eval: section (the cross-teacher matrix is opt-in): add one, e.g. "
                            "--configfile config/eval.yaml, or name targets: trajsft eval demo")
    if overrides or plan.cfg.get("eval") is None:
        cfg = C.validate(C.deep_merge(plan.cfg, {"eval": {**(plan.cfg.get("eval") or {}), **overrides}}))
        plan = C.Plan(cfg, base_dir=C.REPO_DIR)
    from . import storage

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


def remat_choices() -> tuple[str, ...]:
    from .train.remat import CHOICES

    return CHOICES


def cmd_fit(args) -> int:
    """Compile each target's train step for its TPU slice here (libtpu, no TPU): fit, HBM, FLOPs, hours."""
    from .fit import check as fit
    from .train.target import explain, train_lm_config_for

    plan = _load(args)
    out, rc = [], 0
    for tc in _trainings(plan, args.targets or list(plan.cfg["default_targets"])):
        t = tc.target
        try:
            lev = train_lm_config_for(tc, accelerator="tpu", untokenized_ok=True)
            s = fit.check(tc, lev, explain(tc)["steps"], tpu_type=args.tpu_type, mfu=args.mfu,
                          suggest_on_failure=not args.no_suggest, policy=args.remat)
        except (DataError, ValueError) as e:
            print(f"trajsft fit: {t}: {e}", file=sys.stderr)
            return 2
        out.append(s)
        if not s["fits"]:
            rc = 1
            print(f"trajsft fit: {fit.refusal(s, s.get('suggestion'))}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for s in out:
            for line in fit.render(s):
                print(line)
    return rc


def cmd_serve(args) -> int:
    """Serve a trained target until Ctrl-C (exit 0); what cannot be served is one line (exit 2)."""
    import signal

    from . import logs
    from .report.trained import locate
    from .serve import server

    plan = _load(args)
    [tc] = _trainings(plan, [args.target])
    served = locate(tc, args.step)
    logs.setup(None, plan.cfg.get("log_level", "INFO"))
    # SIGTERM as SIGINT: both end the server the same way (uvicorn's graceful shutdown, then exit 0)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.serve(served, host=args.host, port=args.port, max_seqs=args.max_seqs,
                     out=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        pass
    print(f"trajsft serve: {served.target} stopped", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trajsft", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--profile", help="a profile under profiles/ (e.g. tpu-east5), as given to snakemake")
        sp.add_argument("--configfile", action="extend", nargs="+", metavar="FILE",
                        help="extra config file(s) merged over config/config.yaml; like snakemake --configfile "
                             "it takes every following argument (put targets before it)")
        sp.add_argument("--storage-root", help="override storage_root (e.g. gs://marin-us-east5/trajsft)")

    sp = sub.add_parser("plan", help="where every artifact of a target lives (runs and downloads nothing)")
    common(sp)
    sp.add_argument("targets", nargs="*", help="teacher or mixture names (or checkpoints/<name>/done)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--explain", action="store_true", help="show what each hash covers, and the training length: steps, passes over each teacher's data, tokens seen")
    sp.add_argument("--offline", action="store_true", help="do not look for payloads in the storage roots")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("status", help="one row per target: state, hash, cluster/job, step/loss, W&B, checkpoints")
    common(sp)
    sp.add_argument("targets", nargs="*", help="default: every teacher and mixture")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--offline", action="store_true", help="do not query the Ray cluster")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("logs", help="tail the training log of a target (local or from its Ray job)")
    common(sp)
    sp.add_argument("target")
    sp.add_argument("-n", type=int, default=20, help="lines (default 20)")
    sp.add_argument("--follow", "-f", action="store_true")
    sp.set_defaults(func=cmd_logs)

    sp = sub.add_parser("clusters", help="per cluster profile: reachable, running/pending jobs (ours), TPUs free")
    sp.add_argument("profiles", nargs="*", help="default: every profile with a Ray cluster")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_clusters)

    sp = sub.add_parser("stop", help="stop the Ray jobs of targets on the profile's cluster")
    common(sp)
    sp.add_argument("targets", nargs="+")
    sp.set_defaults(func=cmd_stop)

    sp = sub.add_parser("retry", help="after fixing a job's environment outside the code and requirements: "
                                      "forget its configuration error, so the next snakemake run submits again")
    common(sp)
    sp.add_argument("targets", nargs="+")
    sp.set_defaults(func=cmd_retry)

    sp = sub.add_parser("eval", help="cross-teacher matrix: held-out loss of trained targets on teachers' held-out splits")
    common(sp)
    sp.add_argument("targets", nargs="*", help="rows (default: eval.targets, else default_targets)")
    sp.add_argument("--teachers", nargs="+", help="columns (default: eval.teachers, else every teacher of the rows); with --actions: "
                                                       "whose held-out chats (default: actions.teachers)")
    sp.add_argument("--model", choices=["latest", "hf_export", "checkpoint"],
                    help="which model of a target (default: eval.model, else latest)")
    sp.add_argument("--max-eval-batches", type=int, help="cap per held-out split")
    sp.add_argument("--out", default=os.path.join(C.STATE_DIR, "eval"), help="output dir (default results/eval)")
    sp.add_argument("--json", action="store_true", help="print the matrix (or the next-action scores) as JSON")
    sp.add_argument("--actions", action="store_true",
                    help="next-action scores instead: the student's turn against the teacher's on held-out chats "
                         "(tool calls, tool names, arguments, commands, ending the episode)")
    sp.add_argument("--replay", action="store_true",
                    help="with --actions: score the teachers' own turns (every agreement is 1.0: the scores' check)")
    sp.add_argument("--watch", action="store_true",
                    help="with --actions and one target: score each HF export of its run as it appears, until the run "
                         "is done (a row per step in the report)")
    sp.add_argument("--interval", type=float, default=30.0, help="with --watch: seconds between looks (default 30)")
    sp.add_argument("--max-turns", type=int, help="with --actions: turns sampled per teacher split (default: the "
                                                  "target's actions.max_turns)")
    sp.add_argument("--max-tokens", type=int,
                    help="with --actions: tokens the student may generate per turn (default: actions.max_tokens)")
    sp.set_defaults(func=cmd_eval)

    sp = sub.add_parser("fit", help="will the train step fit the profile's TPU slice, and what will the run cost? "
                                    "(compiles the step with libtpu here; no TPU, no weights)")
    common(sp)
    sp.add_argument("targets", nargs="*", help="teacher or mixture names (default: default_targets)")
    sp.add_argument("--tpu-type", help="the slice to check (default: the profile's ray.tpu_type), e.g. v5p-32")
    sp.add_argument("--mfu", type=float, default=None,
                    help="model-FLOPs utilisation the time estimate assumes (default 0.4; use your run's "
                         "throughput/mfu)")
    sp.add_argument("--no-suggest", action="store_true",
                    help="when it does not fit, do not compile smaller batches / larger slices to say what would")
    sp.add_argument("--remat", choices=remat_choices(),
                    help="the remat policy to compile (default: the target's training.remat; auto compiles each "
                         "and picks the least recompute that fits with 10%% of HBM free)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_fit)

    sp = sub.add_parser("serve", help="talk to a trained target through an OpenAI-compatible API "
                                      "(/v1/chat/completions, tools and tool calls included)")
    common(sp)
    sp.add_argument("target", help="a teacher or mixture name (or checkpoints/<name>/done)")
    sp.add_argument("--step", type=int, help="serve its HF export at this step (default: its newest model, trainer "
                                             "checkpoint or HF export)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=8701, help="port (default 8701; 0: any free port)")
    sp.add_argument("--max-seqs", type=int, default=4, help="sequences generated at once (default 4)")
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("preflight", help="check env vars, cluster, TPU resource and storage for a profile; say "
                                          "what the targets' trainings write to the storage root")
    sp.add_argument("targets", nargs="*", help="default: the config's default_targets")
    common(sp)
    sp.set_defaults(func=cmd_preflight)
    return p


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except C.ConfigError as e:
        for line in str(e).splitlines():
            print(f"trajsft: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # a cluster that is not up / rejects us: one line, not a traceback
        from .cluster import jobs as cluster_jobs

        if not isinstance(e, cluster_jobs.RayJobsError):
            raise
        from .cluster.submit import tunnel_hint

        ray = (getattr(args, "_cfg", None) or {}).get("ray") or {}
        address = ray.get("address", "the cluster")
        hint = {"ClusterUnreachable": tunnel_hint(ray) if ray.get("address") else "is the Ray cluster up?",
                "ClusterUnauthorized": "export RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) for this cluster"}
        print(f"trajsft {args.cmd}: cannot use Ray at {address}: {' '.join(str(e).split())[:300]}"
              f"{'; ' + hint[type(e).__name__] if type(e).__name__ in hint else ''}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
