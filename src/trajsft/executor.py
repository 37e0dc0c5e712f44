"""Where a job's work runs, as one small interface with two implementations, chosen once from the config
(:func:`executor_for`, from :func:`trajsft.plan.placement.placement`): :class:`Local` (this machine's CPUs: Levanter
in a child process) and :class:`Ray` (a Ray job on the cluster's TPU slices, submitted and followed from here).

What differs between them and nothing else: an attempt of a training run (submitted and followed to its end), an
evaluation that needs one host (next-action scores, agent episodes), where the following process writes its log, stopping a target's jobs, the log of a
target's job when there is no local one, the jobs and configuration error status shows, the preflight, and what a
training job does when its Snakemake vanishes. A fact about the place (accelerator, cluster name, TPU type) is the
:class:`~trajsft.plan.placement.Placement`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from . import storage
from .plan.placement import Placement, placement
from .plan.step_configs import TrainConfig


class Executor(Protocol):
    placement: Placement

    def train_attempt(self, tc: TrainConfig, lev: dict, attempt: int) -> dict:
        """One attempt of ``tc``'s run, followed to its end: the training's result (``steps``, ``hf_export``...)."""

    def on_eval_host(self, cfg, rule_log: str, here: Callable[[Any], dict],
                     on_slice: Callable[[Any, str], dict]) -> Callable[[], dict]:
        """The work of an evaluation that needs one host (a target's next-action scores, its agent evaluation), to
        run once its payload is needed: ``here(cfg)`` on this machine (the step), else ``on_slice(cfg, rule_log)``
        (the Ray job on a single-host slice that runs it, submitted and followed into the rule's log)."""

    def process_log(self, tc: TrainConfig, rule_log: str) -> str:
        """The training rule's log becomes a link to the run's durable log; where this process writes its lines."""

    def stop(self, tc: TrainConfig) -> tuple[list[str], int]:
        """Stop ``tc``'s running jobs: lines to print and an exit code."""

    def job_log(self, tc: TrainConfig) -> list[str] | None:
        """The log of ``tc``'s newest job when there is no local one (None: no job to ask)."""

    def jobs(self, tc: TrainConfig) -> tuple[tuple, str | None]:
        """``tc``'s jobs as status shows them, and why they could not be listed."""

    def config_failure(self, run_dir: str) -> dict | None:
        """A recorded configuration error of the run's job (answered once, until ``trajsft retry``)."""

    def preflight(self, notes: list[str]) -> list[str]:
        """Everything a run needs, checked in seconds: one line per problem (notes appended to ``notes``)."""

    def ready_line(self) -> str:
        """What a passed preflight says."""

    def on_snakemake_gone(self) -> Callable[[str], None] | None:
        """What a training job does when its Snakemake vanishes (None: stop it, as any job)."""


class Local:
    """This machine: Levanter trains in a child process on the CPU; nothing to list, stop or submit."""

    def __init__(self, where: Placement, cfg: Mapping[str, Any]):
        self.placement, self.cfg = where, cfg

    def train_attempt(self, tc: TrainConfig, lev: dict, attempt: int) -> dict:
        from .train.target import train_here

        return train_here(tc, lev, attempt)

    def on_eval_host(self, cfg, rule_log: str, here: Callable[[Any], dict],
                     on_slice: Callable[[Any, str], dict]) -> Callable[[], dict]:
        return lambda: here(cfg)

    def process_log(self, tc: TrainConfig, rule_log: str) -> str:
        _link_rule_log(tc, rule_log)
        return rule_log  # the training's child writes the same file

    def stop(self, tc: TrainConfig) -> tuple[list[str], int]:
        return ["trajsft: stop needs a cluster profile (--profile tpu-east5 ...)"], 2

    def job_log(self, tc: TrainConfig) -> list[str] | None:
        return None

    def jobs(self, tc: TrainConfig) -> tuple[tuple, str | None]:
        return (), None

    def config_failure(self, run_dir: str) -> dict | None:
        return None

    def preflight(self, notes: list[str]) -> list[str]:
        """W&B (when online) and the storage root."""
        from .cluster.submit import wandb_preflight

        problem, note = wandb_preflight(dict(self.cfg))
        notes += [note] if note else []
        return [p for p in (problem, storage.probe_write(storage.absolute(self.cfg["storage_root"]))) if p]

    def ready_line(self) -> str:
        return f"local executor: storage root writable, W&B {self.cfg['wandb']['mode']}"

    def on_snakemake_gone(self) -> Callable[[str], None] | None:
        return None


class Ray:
    """The profile's Ray cluster: a training is a Ray job whose driver runs one process on every host of a slice, a
    target's next-action scores or agent evaluation a job on a single-host slice; this process submits (or re-attaches to) and follows
    them. A job outlives this process: stopped by ``trajsft stop``, left running when Snakemake vanishes."""

    def __init__(self, where: Placement, cfg: Mapping[str, Any]):
        self.placement, self.cfg = where, cfg

    @property
    def address(self) -> str:
        return self.placement.address

    def train_attempt(self, tc: TrainConfig, lev: dict, attempt: int) -> dict:
        from .cluster.submit import train_on_ray
        from .train.progress import Progress, shown_while

        # its progress from the job's log as the follower writes it (json_logger lines of process 0)
        with shown_while(Progress(f"trajsft train {tc.target}", tc.log, int(lev["trainer"]["num_train_steps"]))):
            return train_on_ray(tc, lev, attempt)

    def on_eval_host(self, cfg, rule_log: str, here: Callable[[Any], dict],
                     on_slice: Callable[[Any, str], dict]) -> Callable[[], dict]:
        return lambda: on_slice(cfg, rule_log)

    def process_log(self, tc: TrainConfig, rule_log: str) -> str:
        _link_rule_log(tc, rule_log)
        # the job's log is written by the log follower alone (it tracks byte offsets to re-attach without duplicates)
        return str(Path(tc.state_dir, "launcher.log"))

    def stop(self, tc: TrainConfig) -> tuple[list[str], int]:
        from .cluster import jobs as cluster_jobs

        lines, rc = [], 0
        active = [j for j in cluster_jobs.run_jobs(self.address, tc.run.hash) if j["status"] in ("PENDING", "RUNNING")]
        if not active:
            lines.append(f"{tc.target}: no running Ray job for {tc.run.name} on {self.placement.cluster_name}")
        for j in active:
            st = cluster_jobs.stop(self.address, j["submission_id"], 120)
            lines.append(f"{tc.target}: {j['submission_id']} {st}")
            rc |= st not in ("STOPPED", "SUCCEEDED", "FAILED")
        return lines, int(rc)

    def job_log(self, tc: TrainConfig) -> list[str] | None:
        from .cluster import jobs as cluster_jobs

        jobs = cluster_jobs.run_jobs(self.address, tc.run.hash)
        if not jobs:
            return None
        return cluster_jobs.job_logs(self.address, jobs[-1]["submission_id"]).splitlines()

    def jobs(self, tc: TrainConfig) -> tuple[tuple, str | None]:
        from .cluster import jobs as cluster_jobs

        if not self.placement.ray_reachable:
            return (), None
        try:
            return tuple(cluster_jobs.run_jobs(self.address, tc.run.hash)), None
        except cluster_jobs.RayJobsError as e:
            return (), str(e)

    def config_failure(self, run_dir: str) -> dict | None:
        from .cluster import setup_failure

        return setup_failure.read(run_dir)

    def preflight(self, notes: list[str]) -> list[str]:
        """The cluster, its TPUs, the forwarded variables, W&B and the storage root (probed there too)."""
        from .cluster.submit import preflight

        return preflight(dict(self.cfg), notes)

    def ready_line(self) -> str:
        return f"preflight OK for {self.placement.cluster_name} ({self.address})"

    def on_snakemake_gone(self) -> Callable[[str], None] | None:
        from .train.target import detach_from_ray_job

        return detach_from_ray_job


def executor_for(cfg: Mapping[str, Any]) -> Executor:
    """The executor of a validated config: the one choice between the two."""
    where = placement(cfg)
    return (Ray if where.on_cluster else Local)(where, cfg)


def _link_rule_log(tc: TrainConfig, rule_log: str) -> None:
    """Snakemake deletes a rule's log before every attempt: point it at the run's durable training log."""
    os.makedirs(tc.state_dir, exist_ok=True)
    Path(tc.log).touch()
    Path(rule_log).parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(rule_log):
        os.unlink(rule_log)
    os.symlink(os.path.relpath(tc.log, os.path.dirname(os.path.abspath(rule_log))), rule_log)
