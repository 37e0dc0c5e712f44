"""The two ends of a single-host job (the next-action scores' :mod:`trajsft.report.actions_job`, the agent
evaluation's :mod:`trajsft.agent.job`): the driver, on a CPU node, and the start of its task, on the slice's host.
Light: stdlib and our io until the secret bundle is gone (:func:`trajsft.cluster.entrypoint.delete_secret_bundle`)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from ..errors import JobEnvironmentError
from .entrypoint import delete_secret_bundle
from .setup_failure import MARK


def single_host_driver(argv: list[str] | None, prog: str, fn, name: str,
                       label: str) -> tuple[int, dict | None]:
    """The driver of a single-host job (the next-action scores', the agent evaluation's), on a CPU node:
    ``fn(--spec)`` as one Ray task named ``name`` on the host of a ``--tpu-type`` slice
    (:func:`trajsft.cluster.single_host.call_on_host`, retried on the next host ``--max-retries`` times), its lines
    prefixed ``[label]``. (0, the task's result), or (3, None) after one :data:`MARK` line for a configuration error
    (a package missing, a version not the lock's, a host's tool missing: here or on the host)."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--spec", required=True, help="the job's spec (job.json under the evaluation's location)")
    ap.add_argument("--tpu-type", required=True, help="a single-host slice type (ray.eval_tpu_type)")
    ap.add_argument("--max-retries", type=int, default=100, help="lost hosts the task is retried after")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"[{label}] %(message)s", stream=sys.stdout)
    import ray

    ray.init(logging_level="WARNING")
    delete_secret_bundle()  # first: a driver that cannot go on leaves no secret in the cluster
    try:
        try:
            from . import single_host
        except ImportError as e:  # the job's environment lacks a package: a configuration error, in one line
            raise JobEnvironmentError(f"the driver on {socket.gethostname()}: {type(e).__name__}: {e}") from None
        try:
            return 0, single_host.call_on_host(fn, args.spec, tpu_type=args.tpu_type, max_retries=args.max_retries,
                                               name=name)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, JobEnvironmentError):
                raise e.cause from None
            raise
    except JobEnvironmentError as e:
        print(f"{MARK} {e}", flush=True)
        return 3, None


def single_host_task_start(spec_url: str, here: str, label: str) -> dict:
    """First thing a single-host job's task does on its host: its lines prefixed ``[label]``, our hooks, this Python
    checked to be the lock's (else :class:`JobEnvironmentError` naming ``here``); the job's spec."""
    logging.basicConfig(level=logging.INFO, format=f"[{label}] %(message)s", stream=sys.stdout, force=True)
    from .. import io
    from . import hooks, requirements, setup_failure

    hooks.setup()
    setup_failure.check_installed(here, requirements.REPO_DIR / requirements.OUT)
    return io.read_json(spec_url)
