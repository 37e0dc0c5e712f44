"""The train rule on a Ray TPU cluster: preflight, submit-or-attach, stream, verify.

Design: a launcher called by the train rule (not a Snakemake executor plugin). Data rules
run where Snakemake runs and write to the region's storage root; only training, the one
step that needs TPU slices, becomes a Ray job. The job's entrypoint is a light driver
(:mod:`trajsft.cluster.entrypoint`) on a CPU node, pinned to nothing: it gets a slice through
Levanter's ``run_on_pod`` and runs one training process on every host of it, and it rides
out preemptions itself (new slice, resume from the latest checkpoint). Snakemake stays the
single source of truth: the `done` marker is written only after the Ray job SUCCEEDED *and*
the final HF export exists; a failed job (driver lost, or too many preemptions/failures)
fails the rule and Snakemake's `retries` resubmit it, which resumes the same run directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys

from .. import io, storage
from ..errors import ClusterError, ConfigError, JobEnvironmentError, PreflightError, TrainingFailed
from ..io import is_remote, join
from ..plan.config import REPO_DIR
from ..plan.placement import placement
from ..plan.step_configs import TrainConfig
from ..train import checkpoints
from . import hooks, jobs as cluster_jobs, preflight as cluster_preflight, run_job, setup_failure

log = logging.getLogger("trajsft")

# never uploaded with the workflow code (gitwildmatch patterns, as Ray matches them). ".?*" drops
# every dotfile/dotdir at any depth (.env, .envrc, .netrc, .git*, .venv, .snakemake, .ci ...):
# the job needs none of them ("." itself would match ".*", which would exclude everything).
# Plus secrets-looking files anywhere.
SECRET_EXCLUDES = [".?*", "*.pem", "*.key", "*.p12", "*.pfx", "*.keytab", "*credentials*", "id_rsa*", "id_ed25519*",
                   "*service-account*.json"]
WORKING_DIR_EXCLUDES = [".venv/", ".git/", ".snakemake/", "results/", "checkpoints/", "logs/", "benchmarks/",
                        "wandb/", "tests/", "**/__pycache__/", "*.png", "report.html", *SECRET_EXCLUDES]


def required_env(cfg: dict) -> list[str]:
    ray = cfg.get("ray") or {}
    req = list(ray.get("required_env") or [])
    if cfg["wandb"]["mode"] == "online" and "WANDB_API_KEY" not in req:
        req.append("WANDB_API_KEY")
    return req


HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # only a process that reads the Hub needs one


def forwarded_env(cfg: dict, hub_refs: list[str] | None = None) -> list[str]:
    """The set variables of ``forward_env`` + ``required_env`` the job gets; a Hub token only when the job reads
    the Hub (``hub_refs``: :func:`hub_refs` of its train_lm config; None: not known, forwarded)."""
    ray = cfg.get("ray") or {}
    names = list(dict.fromkeys(list(ray.get("forward_env") or []) + required_env(cfg)))
    if hub_refs is not None and not hub_refs:
        names = [n for n in names if n not in HUB_TOKENS]
    return [n for n in names if os.environ.get(n)]


def hub_refs(lev: dict) -> list[str]:
    """What a train_lm config would read from the Hugging Face Hub on the hosts: its tokenizer, initial weights
    or reference config when they are neither in a bucket nor a local dir (the job's working dir holds the
    repo's). An ``init: hf`` student reads its ``models/`` snapshot, and its own tokenizer from there."""
    refs = [(lev.get("data") or {}).get("tokenizer"), (lev.get("model") or {}).get("tokenizer"),
            lev.get("initialize_from_hf"), (lev.get("model") or {}).get("reference_checkpoint")]
    return sorted({r for r in refs if isinstance(r, str) and r and not is_remote(r) and not os.path.isabs(r)
                   and not (REPO_DIR / r).exists()})


# defaults of the cluster settings a profile may leave out
RAY_DEFAULTS = {"num_slices": 1, "max_preemptions": 100, "max_failures": 2, "failure_grace_seconds": 90,
                "stall_seconds": 1800, "runtime_env_setup_timeout_seconds": 1800, "fit_check": True, "installer": "uv"}


def ray_settings(cfg: dict) -> dict:
    ray = {**RAY_DEFAULTS, **(cfg.get("ray") or {})}
    if not ray.get("address"):
        raise ConfigError("executor: ray needs ray.address (use a tpu-* profile: snakemake --profile tpu-east5 ...)")
    if not ray.get("tpu_type"):
        raise ConfigError("executor: ray needs ray.tpu_type (e.g. v5p-32)")
    try:
        hooks.ray_tpu().get_tpu_config(ray["tpu_type"])
    except ValueError:
        raise ConfigError(f"ray.tpu_type: unknown TPU type {ray['tpu_type']!r} (e.g. v5p-8, v5p-16, v5p-32)") from None
    job_env(ray)  # a secret in ray.env: refused before anything
    pinned = [r for r in (ray.get("entrypoint_resources") or {}) if r.startswith("TPU")]
    if pinned:
        raise ConfigError(
            f"ray.entrypoint_resources pins the training job to {', '.join(pinned)}: that runs one process on one "
            "host of a multi-host slice, which waits for the others and times out. Remove it: the driver runs on a "
            "CPU node and schedules every host of a slice itself (run_on_pod)")
    return ray


def slice_head_resource(ray: dict) -> str:
    return f"TPU-{ray['tpu_type']}-head"


def preflight(cfg: dict, notes: list[str] | None = None) -> list[str]:
    """Everything a submission needs, checked in seconds. One line per problem.

    No live slice of the profile's TPU type is not a problem (autoscaled clusters, or right after a
    preemption): it becomes a note, "waiting for a v5p-32 slice".
    """
    try:
        ray = ray_settings(cfg)
    except ConfigError as e:
        return [str(e)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:  # W&B's one request, while the cluster is asked
        wandb = pool.submit(wandb_preflight, cfg)
        problems = cluster_preflight.preflight(ray["address"], required_env(cfg),
                                               {slice_head_resource(ray): ray["num_slices"]}, cfg["storage_root"],
                                               notes=notes, tunnel_hint=tunnel_hint(ray), probe=True,
                                               zone=ray.get("zone"))
        wandb_problem, wandb_note = wandb.result()
    if wandb_problem:
        problems.append(wandb_problem)
    if wandb_note and notes is not None and not problems:  # W&B silent from here: a note when all else is fine
        notes.append(wandb_note)
    if not is_remote(cfg["storage_root"]) and not on_this_machine(ray["address"]):
        problems.append(f"storage_root {cfg['storage_root']} is a local dir: the hosts of {ray['address']} cannot "
                        "read it (use a bucket, e.g. storage_root: gs://<bucket>/trajsft)")
    return problems


def say_preflight(notes: list[str], problems: list[str]) -> bool:
    """Print a preflight's notes and problems on stderr, one line each (``trajsft preflight``, a run's start);
    True when it found no problem."""
    for n in notes:
        print(f"trajsft preflight: note: {n}", file=sys.stderr)
    for p in problems:
        print(f"trajsft preflight: {p}", file=sys.stderr)
    return not problems


def wandb_preflight(cfg: dict, timeout_s: float = 5.0) -> tuple[str | None, str | None]:
    """``(problem, note)`` of W&B for an online run: the key asked once (:func:`trajsft.train.tracking.check_key`)
    at the W&B the training talks to (``ray.env``'s ``WANDB_BASE_URL`` on a cluster, else ``$WANDB_BASE_URL``,
    else W&B's own); nothing to say when offline or without a key (the env check says that)."""
    key = os.environ.get("WANDB_API_KEY")
    if cfg["wandb"]["mode"] != "online" or not key:
        return None, None
    from ..train import tracking

    hosts_env = job_env(placement(cfg).ray)  # {} locally
    return tracking.check_key(key, hosts_env.get("WANDB_BASE_URL") or tracking.base_url(), timeout_s=timeout_s)


def tunnel_hint(ray: dict) -> str:
    """How to reach the profile's head when its address does not answer: the dashboard tunnel of the
    cluster's yaml (``ray.cluster_config``), as marin's ``ray_run.py`` opens it."""
    from urllib.parse import urlsplit

    address = ray["address"] if "://" in ray["address"] else f"http://{ray['address']}"
    port = urlsplit(address).port
    opt = f" --port {port}" if port and port != 8265 else ""
    yaml = ray.get("cluster_config")
    if yaml:
        return f"open the tunnel to the head first: ray dashboard{opt} {yaml}"
    return (f"is the head up and its dashboard forwarded? `ray dashboard{opt} <the cluster's yaml>` opens the tunnel "
            "(set ray.cluster_config in the profile to have the exact command here)")


_LOCAL: dict[str, bool] = {}  # address -> its nodes share this machine's disk (asked once per process)


def on_this_machine(address: str) -> bool:
    """The cluster's nodes share this machine's disk (tpu-local, the tests), as the cluster says: every alive
    node's hostname is this machine's. The address alone cannot tell: the real profiles reach remote heads
    through a tunnel on 127.0.0.1. A head that does not answer is judged by its address (a loopback
    address: this machine); its being down is preflight's own line."""
    if address not in _LOCAL:  # asked once: refuse_foreign_paths asks for every path of a job
        local = cluster_preflight.nodes_on_this_machine(address)
        if local is None:
            from urllib.parse import urlsplit

            host = urlsplit(address if "://" in address else f"http://{address}").hostname or ""
            local = host == "localhost" or host == "::1" or host.startswith("127.")
        _LOCAL[address] = local
    return _LOCAL[address]


def job_paths(run_dir: str, lev: dict) -> dict[str, str]:
    """Every storage path a training job is handed: field -> path."""
    out = {"run_dir": run_dir}
    data = lev.get("data") or {}
    if data.get("cache_dir"):
        out["data.cache_dir"] = data["cache_dir"]
    for teacher, c in sorted((data.get("configs") or {}).items()):
        if c.get("cache_dir"):
            out[f"data.configs.{teacher}.cache_dir"] = c["cache_dir"]
    if lev.get("initialize_from_hf"):  # the student's initial weights: its models/ snapshot
        out["initialize_from_hf"] = lev["initialize_from_hf"]
    return out


def refuse_foreign_paths(cfg: dict, paths: dict[str, str]) -> None:
    """One line (ConfigError) if a path is not under the current storage root, or is local while the
    cluster is not on this machine: a job is never handed a path its hosts cannot read."""
    root = storage.absolute(cfg["storage_root"]).rstrip("/")
    address = ray_settings(cfg)["address"]
    for field, p in paths.items():
        if p != root and not p.startswith(root + "/"):
            raise ConfigError(f"refusing to submit: {field} {p} is not under storage_root {cfg['storage_root']} (an "
                            "artifact of another root: rerun its rule, it copies or rebuilds the payload there)")
        if not is_remote(p) and not on_this_machine(address):
            raise ConfigError(f"refusing to submit: {field} {p} is a local path the hosts of {address} cannot read")


def check_or_raise(cfg: dict) -> None:
    problems = preflight(cfg)
    if problems:
        cluster = (cfg.get("ray") or {}).get("cluster", "ray")
        raise PreflightError(f"preflight for {cluster} failed, nothing submitted: " + " | ".join(problems))


def fit_check(cfg: TrainConfig, lev: dict, steps: int | None) -> dict:
    """The fit check of preflight (``ray.fit_check``): the target's train step compiled for the profile's
    slice (cached, else compiled here, ~1 min for Qwen3-8B), refused in one line naming HBM and the knobs
    (PreflightError) when it does not fit or does not compile, before anything is submitted. Without
    libtpu, or switched off, it says so in one line and goes on: the summary, or ``{"skipped": why}``."""
    from ..fit import check as fit

    ray = ray_settings(cfg.workflow)
    if not ray.get("fit_check", True):
        log.info("fit check off (ray.fit_check: false)")
        return {"skipped": "ray.fit_check: false"}
    try:
        summary = fit.check(cfg, lev, steps)
    except fit.LibtpuMissing as e:
        log.warning("fit check skipped: %s", e)
        return {"skipped": str(e)}
    if not summary["fits"]:
        raise PreflightError(f"preflight for {ray.get('cluster', 'ray')} failed, nothing submitted: "
                             + fit.refusal(summary, summary.get("suggestion")))
    log.info("fit: %s", fit.render(summary)[0])
    return summary


def fit_or_raise(cfg: TrainConfig, lev: dict) -> dict | None:
    """:func:`fit_check` as the train rule runs it before submitting (the compile is cached by then: rule
    ``check_fit`` ran it while the data rules ran); the summary goes into the run's provenance."""
    summary = fit_check(cfg, lev, int(lev["trainer"]["num_train_steps"]))
    if "skipped" in summary:
        return None
    run_dir = storage.absolute(cfg.run.location)
    io.write_bytes(join(run_dir, "provenance", "fit.json"), json.dumps(summary, indent=2, sort_keys=True).encode())
    return summary


def with_remat_policy(cfg: TrainConfig, lev: dict, fitted: dict | None) -> tuple[dict, str]:
    """``lev`` with its remat policy (a new config; ``lev`` is not changed): training.remat, or for auto the one the
    fit check chose (full without one: fit_check off or no libtpu); and the policy, said in the rule's log."""
    from ..train import remat

    policy = cfg.spec.training.remat
    if policy == remat.AUTO:
        policy = (fitted or {}).get("remat") or remat.DEFAULT
        why = f"chosen by the fit check: {fitted['remat_auto']['why']}" if fitted and fitted.get("remat_auto") else \
            "training.remat auto without a fit check (ray.fit_check off or no libtpu): full"
    else:
        why = "training.remat"
    log.info("remat: %s (%s)", policy, why)
    return {**lev, "model": {**lev["model"], "gradient_checkpointing": remat.levanter_value(policy)}}, policy


def runtime_env(cfg: dict) -> dict:
    ray = cfg.get("ray") or {}
    env: dict = {"working_dir": str(REPO_DIR), "excludes": WORKING_DIR_EXCLUDES,
                 "env_vars": {"PYTHONPATH": "src", "PYTHONUNBUFFERED": "1", "RAY_COLOR_PREFIX": "0"},
                 # every worker of the job (orchestrator, slice and host actors): bound Levanter's GCE check
                 "worker_process_setup_hook": "trajsft.cluster.hooks.setup",
                 # pip on a fresh TPU host takes minutes (marin uses the same 30 min)
                 "config": {"setup_timeout_seconds": int({**RAY_DEFAULTS, **ray}["runtime_env_setup_timeout_seconds"])}}
    env["env_vars"].update(job_env(ray))
    req = ray.get("pip_requirements")
    if req:
        path = REPO_DIR / req
        pkgs = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        if {**RAY_DEFAULTS, **ray}["installer"] == "uv":  # the lock's closure in seconds, where pip takes minutes
            # no `--no-cache` (Ray's default option): a node installs from its uv cache when it holds the wheels
            # (a job after a failure, a new requirement), and honours the image's UV_* settings (index, find-links)
            env["uv"] = {"packages": pkgs, "uv_check": False, "uv_pip_install_options": []}
        else:
            env["pip"] = {"packages": pkgs, "pip_check": False}
    return env


def job_env(ray: dict) -> dict:
    """``ray.env``: plain variables of every process of the job (they win over the nodes' own). A name that
    looks like a secret is refused: its value would be shown by Ray's job listing (use ``forward_env``)."""
    from .secrets import SECRET_NAME_RE

    env = {str(k): str(v) for k, v in (ray.get("env") or {}).items()}
    secret = sorted(k for k in env if SECRET_NAME_RE.search(k))
    if secret:
        raise ConfigError(f"ray.env sets {', '.join(secret)}: Ray shows these values in its job listing; "
                          "put the name in ray.forward_env instead (delivered as a secret)")
    return env


def setup_fingerprint(address: str, renv: dict) -> str:
    """What a configuration error of this job depends on: its runtime env, the cluster's Ray version, our code."""
    try:
        ray_version = cluster_jobs.Conn(address).check().get("ray_version")
    except cluster_jobs.RayJobsError as e:
        raise ClusterError(f"Ray: {e}") from None
    return setup_failure.fingerprint(renv, ray_version, REPO_DIR / "src")


def configuration_error(address: str, job_id: str) -> str | None:
    """The one-line cause when the failed job never got to train (:mod:`trajsft.cluster.setup_failure`)."""
    conn = cluster_jobs.Conn(address)
    try:
        return setup_failure.from_failed_job(conn.job_info(job_id), conn.job_logs(job_id))
    except cluster_jobs.RayJobsError:
        return None


def driver_command(cfg_url: str, run_dir: str, ray: dict, attempt: int) -> tuple[str, str]:
    """The Ray job's entrypoint (the driver) and its identity: the same command without
    ``--attempt``. The attempt is the Snakemake-side record the driver files slice attempts under;
    a rerun that re-attaches to a running job has a new one, so it is not part of what makes two
    submissions the same job (``run_job`` warns only when the identities differ)."""
    parts = [
        "python -m trajsft.cluster.entrypoint", f"--config {shlex.quote(cfg_url)}", f"--run-dir {shlex.quote(run_dir)}",
        f"--attempt {int(attempt)}", f"--tpu-type {shlex.quote(str(ray['tpu_type']))}",
        f"--num-slices {int(ray['num_slices'])}", f"--max-preemptions {int(ray['max_preemptions'])}",
        f"--max-failures {int(ray['max_failures'])}", f"--failure-grace {float(ray['failure_grace_seconds']):g}",
        f"--stall-seconds {float(ray['stall_seconds'] or 0):g}"]
    if ray.get("export_memory_gib"):
        parts.append(f"--export-memory-gib {float(ray['export_memory_gib']):g}")
    return " ".join(parts), " ".join(p for p in parts if not p.startswith("--attempt "))


def train_on_ray(train: TrainConfig, lev: dict, attempt: int) -> dict:
    """One attempt of ``train``'s run as a Ray job (submitted, or re-attached to): preflight, the fit check, then
    the job followed to its end; its result (``training_result.json``)."""
    cfg = train.workflow
    ray = ray_settings(cfg)
    check_or_raise(cfg)
    run = train.run
    run_dir = storage.absolute(run.location)
    refuse_foreign_paths(cfg, job_paths(run_dir, lev))  # instant: before the fit check's compile
    renv = runtime_env(cfg)
    prior = setup_failure.read(run_dir)
    if prior and prior.get("fingerprint") == setup_fingerprint(ray["address"], renv):
        # Snakemake's retry of a configuration error: the same answer, nothing submitted
        raise JobEnvironmentError(setup_failure.line(prior, repeated=True))
    lev, _ = with_remat_policy(train, lev, fit_or_raise(train, lev))
    cfg_url = join(run_dir, "levanter_config.json")
    io.write_bytes(cfg_url, json.dumps(lev, indent=2, sort_keys=True).encode())
    entrypoint, identity = driver_command(cfg_url, run_dir, ray, attempt)
    metadata = {"trajsft_target": train.target, "trajsft_run": run.name, "trajsft_cluster": str(ray.get("cluster", "")),
                "trajsft_run_dir": run_dir}
    log.info("submitting %s to Ray cluster %s (%s)", run.name, ray.get("cluster", ""), ray["address"])

    def success_still_holds() -> bool:  # a job that SUCCEEDED before left a result and a complete final export
        with contextlib.suppress(FileNotFoundError, ValueError):
            done = json.loads(io.read_bytes(join(run_dir, "training_result.json")))
            return checkpoints.hf_export_complete(done.get("hf_export") or "")
        return False

    try:
        res = run_job.run_job(
            ray["address"], entrypoint, run.hash, train.log, identity=identity,
            runtime_env=renv,
            entrypoint_resources=None,  # the driver runs on a CPU node; it schedules the slice itself
            metadata=metadata,
            env_vars=forwarded_env(cfg, hub_refs(lev)),
            poll_s=float(ray.get("poll_seconds", 5)),
            success_still_holds=success_still_holds,
        )
    except cluster_jobs.JobFailed as e:
        cause = configuration_error(ray["address"], e.job_id)
        if cause:  # it failed before training started: record it, so Snakemake's retries do not resubmit it
            rec = setup_failure.write(run_dir, cause=cause, fingerprint=setup_fingerprint(ray["address"], renv),
                                      job_id=e.job_id)
            raise JobEnvironmentError(setup_failure.line(rec)) from None
        raise TrainingFailed(f"{e} (a Snakemake retry resumes from the latest checkpoint in {run_dir})") from None
    except cluster_jobs.JobInterrupted as e:
        raise TrainingFailed(f"interrupted: {e}") from None
    except cluster_jobs.RayJobsError as e:
        raise ClusterError(f"Ray: {e}") from None
    log.info("Ray job %s %s (attached=%s)", res.job_id, res.status, res.attached)
    try:
        result = json.loads(io.read_bytes(join(run_dir, "training_result.json")))
    except FileNotFoundError:
        raise TrainingFailed(f"Ray job {res.job_id} SUCCEEDED but wrote no {run_dir}/training_result.json") from None
    if not checkpoints.hf_export_complete(result.get("hf_export") or ""):
        raise TrainingFailed(f"Ray job {res.job_id} SUCCEEDED but the final HF export {result.get('hf_export')} is incomplete")
    result["ray_job_id"] = res.job_id
    result["ray_attached"] = res.attached
    return result
