"""Work for one host of a single-host TPU slice (``ray.eval_tpu_type``, v5p-8 unless the profile says), as a Ray job.

The next-action evaluation generates with Levanter's inference engine, which is single-host: it needs one host,
not the training slice. As the training's, the job's entrypoint is a light driver on a CPU node (the head), pinned
to nothing; it runs the work as one Ray task (:func:`call_on_host`) that asks for a slice's ``TPU-<type>-head`` and
every chip of its host, so it never shares chips with a training and waits while every such slice is busy. The
driver's log holds the task's output (Ray forwards it), and a lost host (a preemption, a killed worker) is a system
failure Ray retries, up to ``ray.max_preemptions`` times, on the next such host: work the task streamed to storage
is kept, and its retry resumes from it. A failed or lost driver fails the job; Snakemake's retry submits the next.

Preflight is the training's (the head, its Ray, the image's Python, the storage root, the zone) for this slice.
A job that fails before its work starts (the runtime env, a package) is a one-line configuration error, recorded
as the training's are (:mod:`trajsft.cluster.setup_failure`): Snakemake's retry of it submits nothing.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable, Iterable, Mapping

from ..errors import ClusterError, ConfigError, JobEnvironmentError, PreflightError
from ..io import is_remote
from . import hooks, jobs as cluster_jobs, preflight as cluster_preflight, run_job, setup_failure
from .submit import (HUB_TOKENS, RAY_DEFAULTS, configuration_error, on_this_machine, ray_settings, runtime_env,
                     setup_fingerprint, tunnel_hint)

log = logging.getLogger("trajsft")

DEFAULT_TYPE = "v5p-8"  # the smallest v5p slice: one host, 4 chips


def resources_of(tpu_type: str) -> dict[str, float]:
    """What a task on the host of a ``tpu_type`` slice asks for: the slice's head resource and all its chips;
    ConfigError (one line) for an unknown type or one of several hosts."""
    try:
        tpu = hooks.ray_tpu().get_tpu_config(tpu_type)
    except ValueError:
        raise ConfigError(f"ray.eval_tpu_type: unknown TPU type {tpu_type!r} (a single-host type: v5p-8, v4-8)") from None
    if tpu.vm_count != 1:
        raise ConfigError(f"ray.eval_tpu_type {tpu_type} has {tpu.vm_count} hosts: the generation engine is "
                          "single-host, use a one-host type (v5p-8, v4-8)")
    return {f"TPU-{tpu_type}-head": 1.0, "TPU": float(tpu.chips_per_vm)}


def slice_of(ray: Mapping) -> tuple[str, dict[str, float]]:
    """``ray.eval_tpu_type`` (default v5p-8) and :func:`resources_of` it."""
    name = str(ray.get("eval_tpu_type") or DEFAULT_TYPE)
    return name, resources_of(name)


def run(workflow: dict, module: str, args: Iterable[str], content_hash: str, log_path: str, *, record_dir: str,
        paths: Iterable[str], metadata: Mapping[str, str], reads_hub: bool,
        success_still_holds: Callable[[], bool]) -> cluster_jobs.JobResult:
    """Run ``python -m module args... --tpu-type T --max-retries N`` as the Ray job of ``content_hash`` (a driver that
    calls :func:`call_on_host` with those two), or attach to it (a job of the same hash left running, or SUCCEEDED
    with ``success_still_holds()``), its log followed into ``log_path``. ``paths``: every storage path the job is
    handed (a local one the hosts cannot read is refused); ``record_dir``: where a configuration error is recorded;
    ``reads_hub``: a Hub token is forwarded (no other secret is). Errors are one line: PreflightError, ConfigError,
    JobEnvironmentError, ClusterError."""
    ray = ray_settings(workflow)
    tpu_type, _ = slice_of(ray)
    address = ray["address"]
    notes: list[str] = []
    problems = cluster_preflight.preflight(address, [], {f"TPU-{tpu_type}-head": 1}, workflow["storage_root"],
                                           notes=notes, tunnel_hint=tunnel_hint(ray), probe=True, zone=ray.get("zone"))
    if problems:
        raise PreflightError(f"preflight for {ray.get('cluster', 'ray')} failed, nothing submitted: "
                             + " | ".join(problems))
    for n in notes:
        log.info("note: %s", n)
    for p in paths:
        if not is_remote(p) and not on_this_machine(address):
            raise ConfigError(f"refusing to submit: {p} is a local path the hosts of {address} cannot read "
                              "(use a bucket: storage_root: gs://<bucket>/trajsft)")
    renv = runtime_env(workflow)
    prior = setup_failure.read(record_dir)
    if prior and prior.get("fingerprint") == setup_fingerprint(address, renv):
        raise JobEnvironmentError(setup_failure.line(prior, repeated=True))
    retries = int({**RAY_DEFAULTS, **ray}["max_preemptions"])
    entrypoint = " ".join([f"python -m {module}", *(shlex.quote(a) for a in args),
                           f"--tpu-type {shlex.quote(tpu_type)}", f"--max-retries {retries}"])
    log.info("submitting %s to Ray cluster %s (%s): its work on a %s host", content_hash, ray.get("cluster", ""),
             address, tpu_type)
    try:
        return run_job.run_job(
            address, entrypoint, content_hash, log_path, runtime_env=renv,
            entrypoint_resources=None,  # the driver runs on a CPU node; its task asks for the slice's host
            metadata={**metadata, "trajsft_cluster": str(ray.get("cluster", "")), "trajsft_tpu_type": tpu_type},
            env_vars=[n for n in HUB_TOKENS if os.environ.get(n)] if reads_hub else [],
            poll_s=float(ray.get("poll_seconds", 5)), success_still_holds=success_still_holds)
    except cluster_jobs.JobFailed as e:
        cause = configuration_error(address, e.job_id)
        if cause:
            rec = setup_failure.write(record_dir, cause=cause, fingerprint=setup_fingerprint(address, renv),
                                      job_id=e.job_id)
            raise JobEnvironmentError(setup_failure.line(rec)) from None
        raise ClusterError(str(e)) from None
    except cluster_jobs.JobInterrupted as e:
        raise ClusterError(f"interrupted: {e}") from None
    except cluster_jobs.RayJobsError as e:
        raise ClusterError(f"Ray: {e}") from None


def call_on_host(fn: Callable, *args, tpu_type: str, max_retries: int, name: str):
    """In the job's driver (inside its Ray session): ``fn(*args)`` as one Ray task named ``name`` on the host of a
    ``tpu_type`` slice; its return value. The job's forwarded secrets reach the task as the training's reach its
    hosts (:func:`trajsft.cluster.slices.driver_channel`: never in a task spec, runtime env or file). A lost host or
    worker is retried ``max_retries`` times, a Python error in ``fn`` is not."""
    import ray

    from .entrypoint import forwarded_secrets
    from .slices import driver_channel

    secrets = forwarded_secrets()
    channel = driver_channel(secrets) if secrets else None
    task = ray.remote(_on_host).options(name=name, num_cpus=1, resources=resources_of(tpu_type),
                                        max_retries=max_retries, retry_exceptions=False)
    return ray.get(task.remote(fn, channel, *args))


def _on_host(fn: Callable, channel, *args):
    if channel is not None:
        import ray

        os.environ.update(ray.get(channel.secrets.remote()))
    return fn(*args)
