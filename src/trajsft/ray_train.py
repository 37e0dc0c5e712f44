"""The train rule on a Ray TPU cluster: preflight, submit-or-attach, stream, verify.

Design: a launcher called by the train rule (not a Snakemake executor plugin). Data rules
run where Snakemake runs and write to the region's storage root; only training, the one
step that needs the TPU slice, becomes a Ray job. Snakemake stays the single source of
truth: the `done` marker is written only after the Ray job SUCCEEDED *and* the final HF
export exists; a failed job fails the rule and Snakemake's `retries` resubmit it, which
resumes from the latest checkpoint in the same content-addressed run directory.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from pathlib import Path

from . import levanter_run as LR
from . import rayjobs, storage
from .config import REPO_DIR, ConfigError, Plan, is_remote, join
from .steps import DataError

log = logging.getLogger("trajsft")

# never uploaded with the workflow code (gitwildmatch patterns, as Ray matches them). ".?*" drops
# every dotfile/dotdir at any depth (.env, .envrc, .netrc, .git*, .venv, .snakemake, .ci ...):
# the job needs none of them ("." itself would match ".*", which would exclude everything).
# Plus secrets-looking files anywhere.
SECRET_EXCLUDES = [".?*", "*.pem", "*.key", "*.p12", "*.pfx", "*.keytab", "*credentials*", "id_rsa*", "id_ed25519*",
                   "*service-account*.json"]
WORKING_DIR_EXCLUDES = [".venv/", ".git/", ".snakemake/", "results/", "checkpoints/", "logs/", "benchmarks/",
                        "wandb/", "tests/", "**/__pycache__/", "*.png", "report.html", *SECRET_EXCLUDES]


class PreflightError(ConfigError):
    pass


def required_env(cfg: dict) -> list[str]:
    ray = cfg.get("ray") or {}
    req = list(ray.get("required_env") or [])
    if cfg["wandb"]["mode"] == "online" and "WANDB_API_KEY" not in req:
        req.append("WANDB_API_KEY")
    return req


def forwarded_env(cfg: dict) -> list[str]:
    ray = cfg.get("ray") or {}
    names = list(dict.fromkeys(list(ray.get("forward_env") or []) + required_env(cfg)))
    return [n for n in names if os.environ.get(n)]


def ray_settings(cfg: dict) -> dict:
    ray = cfg.get("ray") or {}
    if not ray.get("address"):
        raise ConfigError("executor: ray needs ray.address (use a tpu-* profile: snakemake --profile tpu-east5 ...)")
    return ray


def preflight(cfg: dict) -> list[str]:
    """Everything a submission needs, checked in seconds. One line per problem."""
    ray = ray_settings(cfg)
    return rayjobs.preflight(ray["address"], required_env(cfg), ray.get("entrypoint_resources") or {},
                             cfg["storage_root"])


def check_or_raise(cfg: dict) -> None:
    problems = preflight(cfg)
    if problems:
        cluster = (cfg.get("ray") or {}).get("cluster", "ray")
        raise PreflightError(f"preflight for {cluster} failed, nothing submitted: " + " | ".join(problems))


def _abs(loc: str) -> str:
    return loc if is_remote(loc) else os.path.abspath(loc)


def runtime_env(cfg: dict) -> dict:
    ray = cfg.get("ray") or {}
    env: dict = {"working_dir": str(REPO_DIR), "excludes": WORKING_DIR_EXCLUDES,
                 "env_vars": {"PYTHONPATH": "src", "PYTHONUNBUFFERED": "1"}}
    req = ray.get("pip_requirements")
    if req:
        path = REPO_DIR / req
        pkgs = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        env["pip"] = {"packages": pkgs, "pip_check": False}
    return env


def train_on_ray(plan: Plan, target: str, lev: dict, paths: dict, attempt: int) -> dict:
    cfg = plan.cfg
    ray = ray_settings(cfg)
    check_or_raise(cfg)
    run = paths["run"]
    run_dir = _abs(run.location)
    cfg_url = join(run_dir, "levanter_config.json")
    storage.write_bytes(cfg_url, json.dumps(lev, indent=2, sort_keys=True).encode())
    entrypoint = (f"python -m trajsft.remote_train --config {shlex.quote(cfg_url)} "
                  f"--run-dir {shlex.quote(run_dir)}")
    metadata = {"trajsft_target": target, "trajsft_run": run.name, "trajsft_cluster": str(ray.get("cluster", "")),
                "trajsft_run_dir": run_dir}
    log.info("submitting %s to Ray cluster %s (%s)", run.name, ray.get("cluster", ""), ray["address"])
    try:
        res = rayjobs.run_job(
            ray["address"], entrypoint, run.hash, paths["log"],
            runtime_env=runtime_env(cfg),
            entrypoint_resources=ray.get("entrypoint_resources") or None,
            metadata=metadata,
            env_vars=forwarded_env(cfg),
            poll_s=float(ray.get("poll_seconds", 5)),
        )
    except rayjobs.JobFailed as e:
        raise DataError(f"{e} (a Snakemake retry resumes from the latest checkpoint in {run_dir})") from None
    except rayjobs.JobInterrupted as e:
        raise DataError(f"interrupted: {e}") from None
    except rayjobs.RayJobsError as e:
        raise DataError(f"Ray: {e}") from None
    log.info("Ray job %s %s (attached=%s)", res.job_id, res.status, res.attached)
    try:
        result = json.loads(storage.read_bytes(join(run_dir, "training_result.json")))
    except FileNotFoundError:
        raise DataError(f"Ray job {res.job_id} SUCCEEDED but wrote no {run_dir}/training_result.json") from None
    if not LR.hf_export_complete(result.get("hf_export") or ""):
        raise DataError(f"Ray job {res.job_id} SUCCEEDED but the final HF export {result.get('hf_export')} is incomplete")
    result["ray_job_id"] = res.job_id
    result["ray_attached"] = res.attached
    return result
