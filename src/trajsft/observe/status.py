"""`trajsft status` and `trajsft clusters`: what is running where. This module gathers the facts (done
markers, manifests, attempts.json, Levanter's log, the Ray job list, checkpoints: all the I/O);
:mod:`trajsft.observe.status_row` turns them into a row (pure)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ..executor import executor_for
from ..plan import config as C
from ..plan.placement import placement
from ..plan.step_configs import TrainConfig
from ..runtime import provenance
from .. import io
from .status_row import (  # noqa: F401  (classify, render, slice_summary ... stay importable from here)
    CAUSES, STATES, Facts, Job, classify, finish_record, needs_resume_point, previous_finished_run, render,
    render_clusters, row, slice_summary,
)


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


def _read_json(path: str) -> dict | list | None:
    try:
        return json.loads(io.read_bytes(path))
    except (FileNotFoundError, OSError, ValueError):
        return None


def _latest_hf_export(run_dir: str) -> str | None:
    from ..train import checkpoints

    try:
        found = io.glob(io.join(run_dir, "hf", "step-*"))
    except (OSError, ValueError):
        return None
    steps = sorted(found, key=lambda p: int(p.rsplit("step-", 1)[1]) if p.rsplit("step-", 1)[1].isdigit() else -1)
    for p in reversed(steps):
        if checkpoints.hf_export_complete(p):
            return p
    return None


def _jobs(tc: TrainConfig) -> tuple[tuple[Job, ...], str | None]:
    jobs, err = executor_for(tc.workflow).jobs(tc)
    return tuple(Job(j["submission_id"], j["attempt"], j["status"], j["message"]) for j in jobs), err


def _training_facts(tc: TrainConfig, query_ray: bool, attempts: tuple[dict, ...], run_dir_readable: bool = True) -> dict:
    """The facts of a run that is not finished: data, progress, Ray jobs, the newest attempt, the launcher.
    Nothing is read from the run dir when its bucket did not answer (``run_dir_readable``)."""
    from ..train import metrics

    run_dir, cfg = tc.run.location, tc.workflow
    lev = (_read_json(io.join(run_dir, "levanter_config.json")) or (
        _read_json(io.join(run_dir, "provenance", "config.json")) or {}).get("levanter")) if run_dir_readable else None
    jobs, err = _jobs(tc) if query_ray else ((), None)
    last = attempts[-1] if attempts else {}
    launcher = Path(tc.state_dir, "launcher.log")
    return {
        "data_ready": all(Path(a.manifest).exists() for a in tc.tokenized.values()),
        "steps_total": lev["trainer"]["num_train_steps"] if lev else None,
        "metrics": metrics.read_metrics(tc.log)["steps"],
        "hf_export": _latest_hf_export(run_dir) if run_dir_readable else None,
        "log_tail": "\n".join(io.tail(tc.log, 60)),
        "jobs": jobs, "cluster_error": err,
        "attempt_alive": last.get("outcome") == "running" and provenance.attempt_alive(last),
        "launcher_tail": tuple(io.tail(launcher, 20)) if launcher.exists() else (),
        "config_failure": executor_for(cfg).config_failure(run_dir) if run_dir_readable else None,
    }


def gather(tc: TrainConfig, query_ray: bool = True) -> Facts:
    """Everything status needs to know about ``tc.target``, reading only what its state needs: nothing
    about training for a finished run, the resume checkpoint only for a resumable state."""
    from .. import storage
    from ..train import tracking
    from ..train.target import run_wandb_url, wandb_url

    target, cfg, run, run_dir = tc.target, tc.workflow, tc.run, tc.run.location
    # a bucket that does not answer is said in the row, at once: gcsfs would retry it for about a minute
    readable = storage.reachable(run_dir)
    storage_error = None if readable else f"storage root {cfg['storage_root']} did not answer (no network, DNS or the endpoint down)"
    done = _read_json(C.Plan.done_path(target)) if Path(C.Plan.done_path(target)).exists() else None
    facts = Facts(
        target=target, hash=run.hash, run=run.name,
        cluster=tc.placement.cluster,
        checkpoint_dir=run_dir, log=tc.log, wandb_url=wandb_url(cfg, run.hash),
        done=done if isinstance(done, dict) else None,
        kept=_read_json(str(Path(tc.state_dir, "manifest.json"))),
        manifests=tuple(_read_json(str(m)) for m in Path(C.STATE_DIR, "checkpoints").glob(f"{target}-*/manifest.json")),
        storage_error=storage_error,
    )
    if readable:
        try:
            facts = replace(facts, attempts=tuple(provenance.read_attempts(run_dir)) if io.exists(run_dir) else ())
        except Exception as e:  # noqa: BLE001 - a bucket that refuses us (401/403...): said in the row, not raised
            readable = False
            facts = replace(facts, storage_error=f"storage root {cfg['storage_root']} refused the request: "
                                                 f"{' '.join(str(e).split())[:200]}")
    if readable and cfg["wandb"]["mode"] == "offline":  # where its W&B runs wait to be synced
        facts = replace(facts, wandb_offline=tracking.offline_runs(run_dir))
    if finish_record(facts) is not None:
        return facts
    if readable and cfg["wandb"]["mode"] == "online":  # the run's page as W&B named it, once it started
        facts = replace(facts, wandb_url=run_wandb_url(cfg, run.hash, run_dir))
    facts = replace(facts, **_training_facts(tc, query_ray, facts.attempts, readable))
    if readable and needs_resume_point(facts):
        from ..train.checkpoints import latest_checkpoint  # the one Levanter resumes from (no jax import)

        ck = latest_checkpoint(io.join(run_dir, "checkpoints"))
        facts = replace(facts, resume_step=ck["completed_steps"] if ck else None)
    return facts


def target_status(tc: TrainConfig, query_ray: bool = True) -> dict:
    """``tc.target``'s row of ``trajsft status``."""
    r = row(gather(tc, query_ray))
    tpu_type = tc.placement.tpu_type
    if tpu_type:  # the cached fit check of the profile's slice (trajsft fit)
        from ..fit import check as fit
        from ..train.target import explain

        r["fit"] = fit.short(fit.cached_summary(tc, explain(tc)["steps"]), tpu_type)
    return r


def clusters(profiles: list[str] | None = None) -> list[dict]:
    from ..cluster import preflight as cluster_preflight

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
        where = placement(plan_cfg)
        if not where.ray_reachable:
            continue
        ray = where.ray
        s = cluster_preflight.cluster_summary(ray["address"])
        s.update(profile=pdir.name if pdir.parent == C.REPO_DIR / "profiles" else str(pdir), cluster=ray.get("cluster"), tpu_type=ray.get("tpu_type"))
        out.append(s)
    return out
