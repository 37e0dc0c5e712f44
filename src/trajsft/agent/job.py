"""Rule ``eval_agent`` on a Ray profile: the agent evaluation as one Ray job, its episodes on a single-host slice.

:func:`submit` (the rule job, on the Snakemake side) finds the target's model (:func:`trajsft.report.trained.locate`),
writes the job's spec (:data:`SPEC`: the evaluation's settings, the harness file's text, the located model) to the
evaluation's location on the storage root and submits ``python -m trajsft.agent.job --spec <url> --tpu-type
<ray.eval_tpu_type> --max-retries N`` (:mod:`trajsft.cluster.single_host`), following its log into the rule's.
:func:`main` is that job's driver, on a CPU node: it runs :func:`episodes_on_host` as one Ray task on the host of
such a slice, which first checks the host has the harness and the sandbox's tools (one line naming them, a
configuration error: never retried), then serves the student there and runs the episodes exactly as the embedded
default does (:func:`trajsft.agent.evaluate.episodes`: each graded row stored under the evaluation's location as
its episode ends). A lost host or killed worker is retried by Ray on the next such host, a failed job by Snakemake;
either way the next attempt runs only the tasks without a graded row. The W&B run is logged from the Snakemake side
(:func:`trajsft.agent.evaluate.finish`): no key goes to the cluster for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import tempfile

from ..cluster.host_job import single_host_driver, single_host_task_start  # light: stdlib and our io
from ..errors import ClusterError, JobEnvironmentError

log = logging.getLogger("trajsft")

SPEC = "job.json"  # <location>/job.json: what the job evaluates (the EvalAgentConfig's fields, the located model)
TASK = "agent_episodes"  # the Ray task on the slice's host (its workers' title: ray::agent_episodes)


def submit(cfg, log_path: str, trained=None, location: str | None = None, key: str = "") -> dict:
    """Evaluate ``cfg`` (an :class:`trajsft.plan.step_configs.EvalAgentConfig`) in a Ray job whose episodes run on
    the host of a single-host slice, or attach to the one running; its figures, with the Ray job's id. ``trained``,
    ``location`` and ``key`` (in the job's id): an export of the run evaluated into a location of its own
    (``trajsft eval --agent --watch``; its W&B run is the final evaluation's)."""
    from pathlib import Path

    from .. import io, storage
    from ..cluster import single_host
    from ..cluster.submit import hub_refs
    from ..report.trained import locate
    from .evaluate import RESULTS, finish

    final = trained is None
    trained = trained or locate(cfg.train)
    location, tasks = storage.absolute(location or cfg.location), storage.absolute(cfg.tasks)
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("train", "harness")}
    spec = {"eval": {**fields, "location": location, "tasks": tasks},
            "harness": Path(cfg.harness).read_text(),  # its text: the hosts have no checkout of the config
            "trained": dataclasses.asdict(trained)}
    spec_url = io.join(location, SPEC)
    io.write_json(spec_url, spec)
    results = io.join(location, RESULTS)
    res = single_host.run(
        cfg.train.workflow, "trajsft.agent.job", ["--spec", spec_url], "-".join(filter(None, (
            cfg.name.rsplit("-", 1)[1], key))), log_path,
        record_dir=location, paths=[location, trained.run_dir, tasks],
        metadata={"trajsft_target": cfg.target, "trajsft_agent": cfg.name, "trajsft_run": trained.name},
        reads_hub=bool(hub_refs(trained.train_cfg)),
        # a SUCCEEDED job of the same evaluation is attached to while its result is still there
        success_still_holds=lambda: io.exists(results))
    try:
        result = io.read_json(results)
    except FileNotFoundError:
        raise ClusterError(f"Ray job {res.job_id} SUCCEEDED but wrote no {results}") from None
    log.info("agent evaluation of %s on %s by Ray job %s (attached=%s): %d/%d resolved, %d episode(s) run, %d reused",
             cfg.target, result.get("host"), res.job_id, res.attached, result["resolved"], result["episodes"],
             result.get("episodes_run", 0), result.get("episodes_reused", 0))
    return {**finish(cfg, location, result, wandb=final), "ray_job_id": res.job_id, "ray_attached": res.attached}


def main(argv: list[str] | None = None) -> int:
    """The job's driver, on a CPU node: the episodes as one task on a slice's host
    (:func:`trajsft.cluster.host_job.single_host_driver`). A configuration error (a package or a sandbox tool
    missing, here or on the host) ends in one :data:`~trajsft.cluster.setup_failure.MARK` line and exit code 3, as
    the training driver's does."""
    rc, result = single_host_driver(argv, "trajsft.agent.job", episodes_on_host, TASK, "trajsft.eval_agent")
    if result is not None:
        log.info("%d episode(s) run on %s, %d graded by an earlier attempt: %d/%d resolved", result["episodes_run"],
                 result["host"], result["episodes_reused"], result["resolved"], result["episodes"])
    return rc


def episodes_on_host(spec_url: str) -> dict:
    """The task: the episodes of ``spec_url`` on this host, their result also written to ``results.json``."""
    here = f"the agent evaluation on {socket.gethostname()}"
    try:
        from .. import io
        from ..plan.step_configs import EvalAgentConfig
        from ..report.trained import Trained
        from . import evaluate
    except ImportError as e:  # the host's environment lacks a package: a configuration error, in one line
        raise JobEnvironmentError(f"{here}: {type(e).__name__}: {e}") from None
    spec = single_host_task_start(spec_url, here, "trajsft.eval_agent")
    with tempfile.TemporaryDirectory(prefix="trajsft-harness-") as tmp:
        harness = os.path.join(tmp, "harness.yaml")
        with open(harness, "w") as f:
            f.write(spec["harness"])
        cfg = EvalAgentConfig(train=None, harness=harness, **spec["eval"])  # the model is located: spec["trained"]
        why = evaluate.unmet(cfg, here)  # before any episode: the harness, the sandbox's tools
        if why:
            raise JobEnvironmentError(why)
        trained = Trained(**spec["trained"])
        log.info("episodes of %s (%s) on %s (pid %d)", cfg.target, trained.name, socket.gethostname(), os.getpid())
        result = evaluate.episodes(cfg, "student", cfg.location, trained=trained)
    result["host"] = socket.gethostname()
    io.write_json(io.join(cfg.location, evaluate.RESULTS), result)
    return {k: v for k, v in result.items() if k != "rows"}


if __name__ == "__main__":
    sys.exit(main())
