"""`trajsft status / logs / clusters`: what is running where, from markers, logs and Ray."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import psutil

from . import config as C
from . import provenance, storage

STATES = ("not started", "data ready", "training running", "retrying", "failed", "done")

# (cause, pattern) in priority order; matched against Ray's job message + the log tail
CAUSES = [
    ("preflight", re.compile(r"preflight failed|trajsft preflight:", re.I)),
    ("out of memory", re.compile(r"RESOURCE_EXHAUSTED|out of memory|\bOOM\b|MemoryError|oom-kill", re.I)),
    ("preempted / node lost", re.compile(r"preempt|node .{0,80}(died|dead|lost)|NodeDiedError|raylet.{0,40}died|"
                                         r"ActorDiedError|unexpected system error|heartbeat", re.I)),
    ("data error", re.compile(r"no usable rows|rows, config says|missing column|not valid JSON|BadRow|"
                              r"no finished Levanter cache|is missing: build", re.I)),
    ("stopped", re.compile(r"\bSTOPPED\b|stopped on SIG|interrupted", re.I)),
]


def profile_configfiles(profile: str | None) -> list[str]:
    """The configfiles a Snakemake profile adds (profiles/<name>/config.yaml), repo-relative."""
    if not profile:
        return []
    import yaml

    pdir = Path(profile) if os.sep in profile and os.path.isdir(profile) else C.REPO_DIR / "profiles" / profile
    cfg_path = pdir / "config.yaml"
    if not cfg_path.exists():
        known = sorted(p.name for p in (C.REPO_DIR / "profiles").iterdir() if (p / "config.yaml").exists())
        raise C.ConfigError(f"no profile '{profile}' (known: {', '.join(known)})")
    files = yaml.safe_load(cfg_path.read_text()).get("configfiles") or []
    return [str(f if os.path.isabs(f) else C.REPO_DIR / f) for f in files]


def classify(text: str) -> str | None:
    for cause, pat in CAUSES:
        if pat.search(text or ""):
            return cause
    return None


def tail(path: str | Path, n: int = 20) -> list[str]:
    """The last ``n`` lines, reading backwards in blocks (logs can be large, lines long)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            pos, buf = f.tell(), b""
            while pos > 0 and buf.count(b"\n") <= n:
                step = min(pos, 1 << 16)
                pos -= step
                f.seek(pos)
                buf = f.read(step) + buf
    except FileNotFoundError:
        return []
    return buf.decode(errors="replace").splitlines()[-n:] if n > 0 else []


def _read_json(path: str) -> dict | list | None:
    try:
        return json.loads(storage.read_bytes(path))
    except (FileNotFoundError, OSError, ValueError):
        return None


def _latest_hf_export(run_dir: str) -> str | None:
    from . import levanter_run as LR

    try:
        found = storage.glob(C.join(run_dir, "hf", "step-*"))
    except (OSError, ValueError):
        return None
    steps = sorted(found, key=lambda p: int(p.rsplit("step-", 1)[1]) if p.rsplit("step-", 1)[1].isdigit() else -1)
    for p in reversed(steps):
        if LR.hf_export_complete(p):
            return p
    return None


def _pid_alive(attempt: dict) -> bool:
    if attempt.get("hostname") != socket.gethostname():
        return False
    try:
        return psutil.Process(int(attempt.get("pid", -1))).status() != psutil.STATUS_ZOMBIE
    except (TypeError, ValueError, psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def slice_summary(attempts: list[dict]) -> dict:
    """Preemptions, failures and the slice story of a run, from its attempts.json (pure).

    Counts every slice attempt of every Snakemake attempt (the cluster driver records them);
    ``detail`` is one line, e.g. "preempted 2x, resumed at step 12 on slice s-b (2 hosts)".
    """
    slice_attempts = [sa for a in attempts for sa in a.get("slice_attempts") or []]
    out = {"preemptions": sum(sa.get("outcome") == "preempted" for sa in slice_attempts),
           "failures": sum(sa.get("outcome") == "failed" for sa in slice_attempts),
           "slice_attempts": len(slice_attempts), "slice": None, "detail": None}
    if not slice_attempts:
        return out
    last = slice_attempts[-1]
    out["slice"] = ", ".join(last.get("slices") or []) or None
    parts = []
    if out["preemptions"]:
        parts.append(f"preempted {out['preemptions']}x")
    if out["failures"]:
        parts.append(f"failed {out['failures']}x")
    where = f"slice {out['slice']} ({len(last.get('hosts') or [])} hosts)" if out["slice"] else None
    if last.get("outcome") == "waiting for slice" and not last.get("ended"):
        parts.append(f"waiting for a {last.get('tpu_type', 'TPU')} slice since {last.get('started')}"
                     f" (resumes at step {last.get('resumed_from_step', 0)})")
    elif len(slice_attempts) > 1 and where:
        parts.append(f"resumed at step {last.get('resumed_from_step', 0)} on {where}")
    elif where:
        parts.append(f"on {where}")
    if last.get("outcome") in ("preempted", "failed") and last.get("cause"):
        parts.append(f"last: {last['cause']}")
    out["detail"] = ", ".join(parts) or None
    return out


def previous_finished_run(target: str, current_hash: str, done: dict | None) -> dict | None:
    """The latest finished run of ``target`` under another config hash (its done marker, or the
    run manifest kept in results/checkpoints/<target>-<hash>/ after Snakemake deleted the marker)."""
    found = [done] if isinstance(done, dict) else []
    for m in Path(C.STATE_DIR, "checkpoints").glob(f"{target}-*/manifest.json"):
        d = _read_json(str(m))
        if isinstance(d, dict) and d.get("target") == target:
            found.append(d)
    found = [d for d in found if d.get("hash") and d["hash"] != current_hash and d.get("finished")]
    if not found:
        return None
    d = max(found, key=lambda d: d["finished"])
    return {k: d.get(k) for k in ("run", "hash", "finished", "hf_export", "steps", "final_loss")}


def target_status(plan: C.Plan, target: str, query_ray: bool = True) -> dict:
    from . import levanter_run as LR
    from .steps_train import run_paths, wandb_url

    tgt = plan.target(target)
    p = run_paths(plan, target)
    run, run_dir = p["run"], p["run_dir"]
    ray_cfg = plan.cfg.get("ray") or {}
    row = {
        "target": target, "state": "not started", "hash": run.hash, "run": run.name,
        "cluster": ray_cfg.get("cluster", "ray") if plan.cfg["executor"] == "ray" else "local",
        "ray_job_id": None, "attempt": None, "step": None, "steps_total": None, "loss": None, "eval_loss": None,
        "wandb_url": wandb_url(plan.cfg, run.hash), "checkpoint_dir": run_dir, "hf_export": None,
        "log": p["log"], "cause": None, "next": None, "preemptions": 0, "failures": 0, "detail": None,
    }
    attempts = provenance.read_attempts(run_dir) if storage.exists(run_dir) else []
    sl = slice_summary(attempts)
    row.update(preemptions=sl["preemptions"], failures=sl["failures"], detail=sl["detail"])
    done_path = Path(C.Plan.done_path(target))
    done = _read_json(str(done_path)) if done_path.exists() else None
    current_done = bool(done and done.get("hash") == run.hash)
    row["previous_done"] = None if current_done else previous_finished_run(target, run.hash, done)
    kept = None if current_done else _read_json(str(Path(p["state_dir"], "manifest.json")))
    if isinstance(kept, dict) and kept.get("hash") == run.hash and kept.get("finished"):
        # finished, but Snakemake deleted the marker (a failed run of another config): no retraining
        done, current_done = kept, True
        row["next"] = "rewrite the missing done marker (no training)"
    if current_done:
        row.update(state="done", step=done.get("steps"), steps_total=done.get("steps"), loss=done.get("final_loss"),
                   hf_export=done.get("hf_export"), ray_job_id=done.get("ray_job_id"), attempt=done.get("attempts"),
                   wandb_url=done.get("wandb_url") or row["wandb_url"])
        if done.get("cluster"):
            row["cluster"] = done["cluster"]
        return row
    if all(Path(a.manifest).exists() for a in tgt["tokenized"]):
        row["state"] = "data ready"
    lev = _read_json(C.join(run_dir, "levanter_config.json")) or (_read_json(C.join(run_dir, "provenance", "config.json")) or {}).get("levanter")
    if lev:
        row["steps_total"] = lev["trainer"]["num_train_steps"]
    metrics = LR.read_metrics(p["log"])
    losses = [(s, m["train/loss"]) for s, m in sorted(metrics["steps"].items()) if "train/loss" in m]
    if losses:
        row["step"], row["loss"] = losses[-1][0] + 1, losses[-1][1]
    evals = [(s, v) for s, m in sorted(metrics["steps"].items()) for k, v in m.items() if k == "eval/loss"]
    if evals:
        row["eval_loss"] = evals[-1][1]
    row["hf_export"] = _latest_hf_export(run_dir)
    text = "\n".join(tail(p["log"], 60))
    jobs = []
    if plan.cfg["executor"] == "ray" and query_ray and ray_cfg.get("address"):
        from . import rayjobs

        try:
            jobs = rayjobs.run_jobs(ray_cfg["address"], run.hash)
        except rayjobs.RayJobsError as e:
            row["cause"] = f"cluster not reachable: {e}"
    if jobs:
        last = jobs[-1]
        row["ray_job_id"], row["attempt"] = last["submission_id"], last["attempt"] + 1
        if last["status"] in ("PENDING", "RUNNING"):
            earlier_failed = any(j["status"] in ("FAILED", "STOPPED") for j in jobs[:-1])
            row["state"] = "retrying" if earlier_failed else "training running"
            if earlier_failed:
                row["cause"] = classify(jobs[-2]["message"] + "\n" + text) or "failed"
        elif last["status"] in ("FAILED", "STOPPED"):
            row["state"] = "failed"
            if last["status"] == "STOPPED":  # stopped by a user or our signal handling, whatever its log shows
                row["cause"] = "stopped"
            else:
                row["cause"] = classify(f"{last['status']} {last['message']}\n{text}") or last["message"][:200] or "failed"
    elif attempts:
        last = attempts[-1]
        row["attempt"] = last["attempt"]
        if last.get("outcome") == "running" and _pid_alive(last):
            row["state"] = "training running"
        elif last.get("outcome") in ("running", "interrupted", "failed"):
            row["state"] = "failed"
            err = last.get("error") or ("killed (no end recorded)" if last.get("outcome") != "failed" else "")
            row["cause"] = classify(f"{err}\n{text}") or (err[:200] if err else "failed")
    launcher = Path(p["state_dir"], "launcher.log")
    if row["state"] in ("data ready", "not started") and launcher.exists():
        pre = [ln for ln in tail(launcher, 20) if "preflight" in ln]
        if pre:
            row.update(state="failed", cause="preflight: " + pre[-1].split("preflight", 1)[1].strip(" :"))
    if row["state"] in ("failed", "retrying", "training running", "data ready"):
        ck = LR.latest_checkpoint(C.join(run_dir, "checkpoints"))
        row["next"] = f"resume from step {ck['completed_steps']}" if ck else "start from step 0"
    return row


def render(rows: list[dict]) -> str:
    cols = [("target", "TARGET"), ("state", "STATE"), ("hash", "HASH"), ("cluster", "CLUSTER"),
            ("ray_job_id", "RAY JOB"), ("attempt", "TRY"), ("progress", "STEP"), ("loss", "LOSS")]
    table = []
    for r in rows:
        r = dict(r)
        r["progress"] = f"{r['step'] if r['step'] is not None else '-'}/{r['steps_total'] or '?'}"
        r["loss"] = f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else "-"
        table.append([str(r.get(k)) if r.get(k) is not None else "-" for k, _ in cols])
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, (_, h) in enumerate(cols)] if table else []
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(cols, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(t, widths)) for t in table]
    for r in rows:
        extra = [f"  {r['target']}: checkpoints {r['checkpoint_dir']}"]
        if r.get("hf_export"):
            extra.append(f"latest HF export {r['hf_export']}")
        if r.get("wandb_url"):
            extra.append(f"W&B {r['wandb_url']}")
        lines.append("; ".join(extra))
        if r.get("detail"):
            lines.append(f"  {r['target']}: {r['detail']}")
        prev = r.get("previous_done")
        if prev:
            lines.append(f"  {r['target']}: config changed since the finished run {prev['run']} ({prev['finished']}, "
                         f"HF export {prev['hf_export']}); the row above is the current config (hash {r['hash']})")
        if r.get("cause") or r.get("next"):
            lines.append(f"  {r['target']}: " + "; ".join(x for x in (
                f"cause: {r['cause']}" if r.get("cause") else None,
                f"next rerun will {r['next']}" if r.get("next") else None) if x))
    return "\n".join(lines)


def clusters(profiles: list[str] | None = None) -> list[dict]:
    from . import rayjobs

    out = []
    if profiles:  # names under profiles/ or profile directories
        dirs = [Path(p) if os.path.isdir(p) else C.REPO_DIR / "profiles" / p for p in profiles]
    else:
        dirs = sorted((C.REPO_DIR / "profiles").iterdir())
    for pdir in dirs:
        try:
            plan_cfg = C.load([C.DEFAULT_CONFIG, *profile_configfiles(str(pdir))])
        except C.ConfigError:
            continue
        ray = plan_cfg.get("ray") or {}
        if plan_cfg["executor"] != "ray" or not ray.get("address"):
            continue
        s = rayjobs.cluster_summary(ray["address"])
        s.update(profile=pdir.name if pdir.parent == C.REPO_DIR / "profiles" else str(pdir), cluster=ray.get("cluster"), tpu_type=ray.get("tpu_type"))
        out.append(s)
    return out


def render_clusters(rows: list[dict]) -> str:
    lines = []
    for s in rows:
        head = f"{s['profile']} ({s.get('cluster')}, {s['address']}): "
        if not s["reachable"] or s.get("authenticated") is False:
            lines.append(head + f"UNREACHABLE - {s.get('error')}")
            continue
        j = s["jobs"]
        tpu = ", ".join(f"{k} {v['free']:g}/{v['total']:g} free" for k, v in s["tpu"].items()) or "no TPU resources"
        lines.append(head + f"{len(j['running'])} running ({len(j['ours_running'])} ours), "
                     f"{len(j['pending'])} pending ({len(j['ours_pending'])} ours); {tpu}")
        for sid in j["ours_running"] + j["ours_pending"]:
            lines.append(f"    ours: {sid}")
    return "\n".join(lines)
