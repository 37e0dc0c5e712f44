"""`trajsft status`'s state machine: a pure function from a target's gathered facts to its row.

No I/O here: :mod:`trajsft.observe.status` gathers the :class:`Facts` (done markers, manifests,
attempts.json, Levanter's log, the Ray job list, checkpoints) and calls :func:`row`.

States, in precedence order: ``done`` (a done marker or kept run manifest of the current hash, written
for this row's run directory: a run of the same hash that finished under another storage root is said in
``finished_elsewhere``, not counted done, as Snakemake trains it again there) beats everything; else the newest Ray job decides (``training running`` / ``retrying`` /
``failed``), else, without Ray jobs, the newest local attempt (``training running`` if its process
lives, else ``failed``); else ``data ready`` (every tokenized manifest exists) or ``not started``,
which a preflight refusal in the launcher log turns into ``failed``. Preemptions, failures and a
wait for a slice are counted in ``detail`` from the slice attempts, whatever the state.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from .. import io

STATES = ("not started", "data ready", "training running", "retrying", "stopped", "failed", "done",
          "configuration error", "unknown")  # stopped: by a signal or trajsft stop; unknown: the bucket did not answer
# states whose row says where the next rerun starts (needs the checkpoint Levanter resumes from)
RESUMABLE = ("stopped", "failed", "retrying", "training running", "data ready")
CONFIG_ERROR = "configuration error"  # = cluster.setup_failure.OUTCOME

# (cause, pattern) in priority order; matched against Ray's job message + the log tail
CAUSES = [
    ("preflight", re.compile(r"preflight failed|trajsft preflight:", re.I)),
    ("out of memory", re.compile(r"RESOURCE_EXHAUSTED|out of memory|\bOOM\b|MemoryError|oom-kill", re.I)),
    ("preempted / node lost", re.compile(r"preempt|node .{0,80}(died|dead|lost)|NodeDiedError|raylet.{0,40}died|"
                                         r"ActorDiedError|unexpected system error|heartbeat", re.I)),
    ("data error", re.compile(r"no usable rows|rows, config says|missing column|not valid JSON|BadRow|"
                              r"no finished Levanter cache|is missing: build", re.I)),
    ("stopped", re.compile(r"\bSTOPPED\b|stopped on SIG|interrupted|\bgot SIG(INT|TERM)\b", re.I)),
]


@dataclass(frozen=True)
class Job:
    """One Ray job of the run (``trajsft-<hash>-a<attempt>``), as the job list reports it."""

    submission_id: str
    attempt: int  # 0-based, from the submission id
    status: str  # PENDING / RUNNING / SUCCEEDED / FAILED / STOPPED
    message: str = ""


@dataclass(frozen=True)
class Facts:
    """What status knows about one target. Identity comes from the plan; ``done`` .. ``attempts``
    are always gathered; the training fields only for a run that is not finished; ``resume_step``
    only when the row's state is in :data:`RESUMABLE` (see :func:`needs_resume_point`)."""

    target: str
    hash: str
    run: str  # <target>-<hash>
    cluster: str  # "local", or the configured Ray cluster's name
    checkpoint_dir: str  # the run directory (local or bucket)
    log: str  # the durable training log
    wandb_url: str | None = None  # as W&B named the run once it started (train.tracking), else from the config
    wandb_offline: str | None = None  # the glob of its offline W&B runs (wandb.mode: offline; tracking.offline_runs)
    done: dict | None = None  # checkpoints/<target>/done, of whatever hash
    kept: dict | None = None  # results/checkpoints/<run>/manifest.json (survives Snakemake deleting done)
    manifests: tuple = ()  # every results/checkpoints/<target>-*/manifest.json, parsed (any JSON)
    attempts: tuple[dict, ...] = ()  # the run's attempts.json
    # ---- gathered only for an unfinished run
    data_ready: bool = False  # every tokenized manifest of the target exists
    steps_total: int | None = None  # num_train_steps of the run's Levanter config
    metrics: Mapping[int, Mapping] = field(default_factory=dict)  # Levanter's json_logger: step -> metrics
    hf_export: str | None = None  # the newest complete HF export of the run
    log_tail: str = ""  # the last 60 lines of the training log
    jobs: tuple[Job, ...] = ()  # the run's Ray jobs, oldest attempt first (empty offline / local)
    cluster_error: str | None = None  # the Ray job list could not be read
    attempt_alive: bool = False  # the newest attempt is "running" and its process lives on this host
    launcher_tail: tuple[str, ...] = ()  # the last 20 lines of the Ray launcher log
    config_failure: dict | None = None  # the run's configuration-error record (cluster.setup_failure), if any
    storage_error: str | None = None  # the run dir's bucket did not answer: nothing was read from it
    # ---- gathered only when the state is in RESUMABLE
    resume_step: int | None = None  # completed steps of the checkpoint Levanter resumes from; None: none


def classify(text: str | None) -> str | None:
    """The first cause (in :data:`CAUSES` priority order) whose pattern ``text`` matches."""
    for cause, pat in CAUSES:
        if pat.search(text or ""):
            return cause
    return None


def slice_summary(attempts: list[dict] | tuple[dict, ...]) -> dict:
    """Preemptions, failures and the slice story of a run, from its attempts.json.

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


def same_run_dir(record: dict, checkpoint_dir: str) -> bool:
    """A finished run's record (done marker or kept manifest) was written where ``checkpoint_dir`` is: the run's
    hash is the same under every profile (the storage root is cosmetic), its payload is not. A record that names
    no directory (written before it did) counts as here."""
    theirs = record.get("checkpoint_dir")
    if not theirs:
        return True
    if io.is_remote(theirs) or io.is_remote(checkpoint_dir):
        return theirs.rstrip("/") == checkpoint_dir.rstrip("/")
    return os.path.normpath(theirs) == os.path.normpath(checkpoint_dir)


def finished_elsewhere(f: Facts) -> dict | None:
    """The current hash's finished run under another storage root (a local run's marker read under a Ray
    profile, or the reverse): where its weights are. Not ``done`` here: Snakemake trains it again under this
    profile (the rule's output location changed), into :attr:`Facts.checkpoint_dir`."""
    found = [d for d in ([f.done] if isinstance(f.done, dict) else []) + [f.kept if isinstance(f.kept, dict) else {}]
             if d.get("hash") == f.hash and d.get("finished") and not same_run_dir(d, f.checkpoint_dir)]
    if not found:
        return None
    d = found[0]
    return {k: d.get(k) for k in ("run", "checkpoint_dir", "cluster", "finished", "hf_export", "steps", "final_loss")}


def previous_finished_run(target: str, current_hash: str, done: dict | None, manifests=()) -> dict | None:
    """The latest finished run of ``target`` under another config hash: its done marker, or a run
    manifest kept in results/checkpoints/<target>-<hash>/ after Snakemake deleted the marker."""
    found = [done] if isinstance(done, dict) else []
    found += [d for d in manifests if isinstance(d, dict) and d.get("target") == target]
    found = [d for d in found if d.get("hash") and d["hash"] != current_hash and d.get("finished")]
    if not found:
        return None
    d = max(found, key=lambda d: d["finished"])
    return {k: d.get(k) for k in ("run", "hash", "finished", "hf_export", "steps", "final_loss")}


def marker_current(f: Facts) -> bool:
    """The done marker was written for the current hash, in this run's directory."""
    return bool(f.done and f.done.get("hash") == f.hash and same_run_dir(f.done, f.checkpoint_dir))


def finish_record(f: Facts) -> dict | None:
    """The record of the current hash's finished run: its done marker, else the kept run manifest
    (finished, but Snakemake deleted the marker after a failed run of another config), else None."""
    if marker_current(f):
        return f.done
    if (isinstance(f.kept, dict) and f.kept.get("hash") == f.hash and f.kept.get("finished")
            and same_run_dir(f.kept, f.checkpoint_dir)):
        return f.kept
    return None


def _failure_cause(err: str | None, outcome: str | None, log_tail: str) -> str:
    err = err or ("killed (no end recorded)" if outcome != "failed" else "")
    if io.fault_in_text(err):  # a full or read-only storage root: the recorded line says which and what to do
        return err[:400]
    return classify(f"{err}\n{log_tail}") or (err[:200] if err else "failed")


def training_state(f: Facts) -> dict:
    """``state``, ``cause``, ``ray_job_id`` and ``attempt`` of a run that is not finished."""
    out = {"state": "data ready" if f.data_ready else "not started", "cause": None, "ray_job_id": None,
           "attempt": None}
    if f.cluster_error:
        out["cause"] = f"cluster not reachable: {f.cluster_error}"
    if f.jobs:  # Ray's job list is the truth for a Ray run
        last = f.jobs[-1]
        out["ray_job_id"], out["attempt"] = last.submission_id, last.attempt + 1
        if last.status in ("PENDING", "RUNNING"):
            earlier_failed = any(j.status in ("FAILED", "STOPPED") for j in f.jobs[:-1])
            out["state"] = "retrying" if earlier_failed else "training running"
            if earlier_failed:
                out["cause"] = classify(f.jobs[-2].message + "\n" + f.log_tail) or "failed"
        elif last.status == "STOPPED":  # stopped by a user or our signal handling, whatever its log shows
            out.update(state="stopped", cause="stopped")
        elif last.status == "FAILED":
            out.update(state="failed", cause=classify(f"{last.status} {last.message}\n{f.log_tail}")
                       or last.message[:200] or "failed")
    elif f.attempts:  # a local run (or Ray unreachable / offline): the newest attempt
        last = f.attempts[-1]
        out["attempt"] = last["attempt"]
        if last.get("outcome") == "running" and f.attempt_alive:
            out["state"] = "training running"
        elif last.get("outcome") in ("running", "interrupted", "failed"):
            cause = _failure_cause(last.get("error"), last.get("outcome"), f.log_tail)
            out.update(state="stopped" if cause == "stopped" else "failed", cause=cause)
    if out["state"] in ("data ready", "not started"):  # refused before any job: the launcher log says why
        pre = [ln for ln in f.launcher_tail if "preflight" in ln]
        if pre:
            out.update(state="failed", cause="preflight: " + pre[-1].split("preflight", 1)[1].strip(" :"))
    if f.storage_error and out["state"] in ("data ready", "not started"):  # its run dir could not be read
        out.update(state="unknown", cause=f.storage_error + (f"; {out['cause']}" if out["cause"] else ""))
    if f.config_failure and out["state"] in ("failed", "stopped", "data ready", "not started"):
        # the job failed before training: reruns answer this at once until what caused it changes
        out.update(state=CONFIG_ERROR, cause=f.config_failure["cause"],
                   ray_job_id=out["ray_job_id"] or f.config_failure.get("ray_job_id"))
    return out


def needs_resume_point(f: Facts) -> bool:
    """The row will say where the next rerun starts, so the resume checkpoint must be gathered."""
    return finish_record(f) is None and training_state(f)["state"] in RESUMABLE


def row(f: Facts) -> dict:
    """The status row of one target (the ``--json`` record; :func:`render` draws the table)."""
    r = {
        "target": f.target, "state": "not started", "hash": f.hash, "run": f.run, "cluster": f.cluster,
        "ray_job_id": None, "attempt": None, "step": None, "steps_total": None, "loss": None, "eval_loss": None,
        "wandb_url": f.wandb_url, "checkpoint_dir": f.checkpoint_dir, "hf_export": None,
        "log": f.log, "cause": None, "next": None, "preemptions": 0, "failures": 0, "detail": None,
        "wandb_offline": f.wandb_offline,
    }
    sl = slice_summary(f.attempts)
    r.update(preemptions=sl["preemptions"], failures=sl["failures"], detail=sl["detail"])
    r["previous_done"] = None if marker_current(f) else previous_finished_run(f.target, f.hash, f.done, f.manifests)
    r["finished_elsewhere"] = finished_elsewhere(f)
    done = finish_record(f)
    if done is not None:
        if not marker_current(f):
            r["next"] = "rewrite the missing done marker (no training)"
        r.update(state="done", step=done.get("steps"), steps_total=done.get("steps"), loss=done.get("final_loss"),
                 hf_export=done.get("hf_export"), ray_job_id=done.get("ray_job_id"), attempt=done.get("attempts"),
                 wandb_url=done.get("wandb_url") or r["wandb_url"])
        if done.get("cluster"):
            r["cluster"] = done["cluster"]
        return r
    r["steps_total"] = f.steps_total
    # the log's figures are the run's that finished elsewhere until this directory's run has an attempt or a job
    metrics = {} if r["finished_elsewhere"] and not (f.attempts or f.jobs) else f.metrics
    losses = [(s, m["train/loss"]) for s, m in sorted(metrics.items()) if "train/loss" in m]
    if losses:
        r["step"], r["loss"] = losses[-1][0] + 1, losses[-1][1]
    evals = [v for s, m in sorted(metrics.items()) for k, v in m.items() if k == "eval/loss"]
    if evals:
        r["eval_loss"] = evals[-1]
    r["hf_export"] = f.hf_export
    r.update(training_state(f))
    if r["state"] in RESUMABLE:
        r["next"] = f"resume from step {f.resume_step}" if f.resume_step is not None else "start from step 0"
    elif r["state"] == CONFIG_ERROR:
        r["next"] = (f"fix the job's environment and rerun (after a fix outside the code and requirements: "
                     f"trajsft retry {f.target})")
    return r


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
        if r.get("wandb_offline"):
            lines.append(f"  {r['target']}: W&B offline: `wandb sync {r['wandb_offline']}` uploads its runs (with "
                         "WANDB_API_KEY; wandb.mode: online logs the next ones live)")
        if r.get("detail"):
            lines.append(f"  {r['target']}: {r['detail']}")
        if r.get("fit"):
            lines.append(f"  {r['target']}: {r['fit']}")
        prev = r.get("previous_done")
        if prev:
            lines.append(f"  {r['target']}: config changed since the finished run {prev['run']} ({prev['finished']}, "
                         f"HF export {prev['hf_export']}); the row above is the current config (hash {r['hash']})")
        away = r.get("finished_elsewhere")
        if away:
            lines.append(f"  {r['target']}: this config finished as {away['run']} in {away['checkpoint_dir']} (cluster "
                         f"{away['cluster']}, {away['finished']}, HF export {away['hf_export']}), not in this row's "
                         f"{r['checkpoint_dir']}")
        if r.get("cause") or r.get("next"):
            lines.append(f"  {r['target']}: " + "; ".join(x for x in (
                f"cause: {r['cause']}" if r.get("cause") else None,
                f"next rerun will {r['next']}" if r.get("next") else None) if x))
    sweeps: dict[str, list[str]] = {}  # the rows grouped under the sweeps they are cells of
    for r in rows:
        for s in r.get("sweeps") or []:
            sweeps.setdefault(s, []).append(r["target"])
    for s, cells in sweeps.items():
        done = sum(1 for r in rows if r["target"] in cells and r["state"] == "done")
        lines.append(f"  sweep {s}: {done}/{len(cells)} cell(s) done: {', '.join(cells)} (sweeps/{s}/done compares them)")
    shown = set()  # the data of the rows, each artifact once (targets with the same data share it)
    for r in rows:
        for d in r.get("data") or []:
            if (d["kind"], d["name"]) not in shown:
                shown.add((d["kind"], d["name"]))
                lines.append(f"  data {d['kind']}/{d['name']}: {'ready' if d['ready'] else 'not built'}; used by "
                             + ", ".join(d["used_by"]))
    return "\n".join(lines)


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
