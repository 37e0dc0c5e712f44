"""Rule ``eval_actions`` on a Ray profile: the next-action evaluation as one Ray job, its work on a single-host slice.

:func:`submit` (the rule job, on the Snakemake side) finds the target's model (:func:`trajsft.report.trained.locate`),
writes the job's spec (:data:`SPEC`) to the evaluation's location on the storage root and submits
``python -m trajsft.report.actions_job --spec <url> --tpu-type <ray.eval_tpu_type> --max-retries N``
(:mod:`trajsft.cluster.single_host`), following its log into the rule's. :func:`main` is that job's driver, on a
CPU node: it runs :func:`score_on_host` as one Ray task on the host of such a slice, which scores exactly as the
embedded default does (:func:`trajsft.report.actions.evaluate_trained`, each chat's turns streamed to ``chats/``)
and writes the result (:data:`RESULT`). A lost host or killed worker is retried by Ray on the next host, a failed
job by Snakemake; either way the next attempt scores only the chats the first did not store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys

from ..cluster.host_job import single_host_driver, single_host_task_start  # light: stdlib and our io
from ..errors import ClusterError, JobEnvironmentError

log = logging.getLogger("trajsft")

SPEC = "job.json"  # <location>/job.json: what the job evaluates (the EvalActionsConfig's fields, the located model)
RESULT = "job_result.json"  # <location>/job_result.json: the job's result (figures, chat counts, its host)


def submit(cfg, log_path: str) -> dict:
    """Score ``cfg`` (an :class:`trajsft.plan.step_configs.EvalActionsConfig`) in a Ray job whose work runs on the
    host of a single-host slice, or attach to the one running; its result, with the Ray job's id."""
    from .. import io, storage
    from ..cluster import single_host
    from ..cluster.submit import hub_refs
    from .trained import locate

    trained = locate(cfg.train)
    location = storage.absolute(cfg.location)
    spec = {"eval": {"target": cfg.target, "name": cfg.name, "location": location, "max_turns": cfg.max_turns,
                     "max_tokens": cfg.max_tokens, "max_seqs": cfg.max_seqs,
                     "held_out": {t: storage.absolute(loc) for t, loc in cfg.held_out.items()},
                     "tools": dict(cfg.tools)},
            "trained": dataclasses.asdict(trained)}
    spec_url = io.join(location, SPEC)
    io.write_json(spec_url, spec)
    result_url = io.join(location, RESULT)
    res = single_host.run(
        cfg.train.workflow, "trajsft.report.actions_job", ["--spec", spec_url], cfg.name.rsplit("-", 1)[1], log_path,
        record_dir=location, paths=[location, trained.run_dir, *spec["eval"]["held_out"].values()],
        metadata={"trajsft_target": cfg.target, "trajsft_evals": cfg.name, "trajsft_run": trained.name},
        reads_hub=bool(hub_refs(trained.train_cfg)),
        # a SUCCEEDED job of the same evaluation is attached to while its result is still there
        success_still_holds=lambda: io.exists(result_url))
    try:
        result = io.read_json(result_url)
    except FileNotFoundError:
        raise ClusterError(f"Ray job {res.job_id} SUCCEEDED but wrote no {result_url}") from None
    log.info("next actions of %s scored on %s by Ray job %s (attached=%s): %d chat(s) scored, %d reused",
             cfg.target, result.get("host"), res.job_id, res.attached, result.get("chats_scored", 0),
             result.get("chats_reused", 0))
    return {**result, "ray_job_id": res.job_id, "ray_attached": res.attached}


TASK = "score_next_actions"  # the Ray task on the slice's host (its workers' title: ray::score_next_actions)


def main(argv: list[str] | None = None) -> int:
    """The job's driver, on a CPU node: the evaluation as one task on a slice's host
    (:func:`trajsft.cluster.host_job.single_host_driver`). A configuration error (a package missing, a version not
    the lock's, here or on the host) ends in one :data:`~trajsft.cluster.setup_failure.MARK` line and exit code 3,
    as the training driver's does."""
    rc, result = single_host_driver(argv, "trajsft.report.actions_job", score_on_host, TASK, "trajsft.eval_actions")
    if result is not None:
        log.info("%d chat(s) scored on %s, %d reused from an earlier attempt", result["chats_scored"], result["host"],
                 result["chats_reused"])
    return rc


def score_on_host(spec_url: str) -> dict:
    """The task: the evaluation of ``spec_url`` on this host, its result also written to :data:`RESULT`."""
    here = f"the evaluation on {socket.gethostname()}"
    try:
        from .. import io
        from ..plan.step_configs import EvalActionsConfig
        from . import actions
        from .trained import Trained
    except ImportError as e:  # the host's environment lacks a package: a configuration error, in one line
        raise JobEnvironmentError(f"{here}: {type(e).__name__}: {e}") from None
    spec = single_host_task_start(spec_url, here, "trajsft.eval_actions")
    cfg = EvalActionsConfig(train=None, **spec["eval"])  # the model is located already: spec["trained"]
    trained = Trained(**spec["trained"])
    log.info("scoring %s (%s) on %s (pid %d)", cfg.target, trained.name, socket.gethostname(), os.getpid())
    result = actions.evaluate_trained(cfg, trained, cfg.location)
    result["host"] = socket.gethostname()
    io.write_json(io.join(cfg.location, RESULT), result)
    return result


if __name__ == "__main__":
    sys.exit(main())
