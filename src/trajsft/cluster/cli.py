"""``python -m trajsft.cluster.cli run|stop|summary|preflight ...``: a small CLI around the Ray job
client (``run`` exits 0 on SUCCEEDED, 1 on failure, 128+signal when interrupted)."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

from ..errors import quiet_on_closed_pipe
from .jobs import TERMINAL_STATUSES, JobInterrupted, RayJobsError, stop
from .preflight import cluster_summary, preflight
from .run_job import run_job

log = logging.getLogger("trajsft.rayjobs")  # the name in log lines, as before the re-layout


# --------------------------------------------------------------------------- CLI


def _parse_kv_floats(items: list[str]) -> dict[str, float]:
    out = {}
    for it in items or []:
        k, _, v = it.partition("=")
        out[k] = float(v or 1)
    return out


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trajsft.cluster.cli")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="submit-or-attach, follow, stop on SIGINT/SIGTERM")
    r.add_argument("--address", required=True)
    r.add_argument("--hash", required=True, dest="content_hash")
    r.add_argument("--log", required=True)
    r.add_argument("--resource", action="append", default=[], help="NAME=QTY entrypoint resource")
    r.add_argument("--env", action="append", default=[], help="env var NAME to forward (secret)")
    r.add_argument("--runtime-env-json", default=None)
    r.add_argument("--retries", type=int, default=0)
    r.add_argument("--poll", type=float, default=2.0)
    r.add_argument("--python", default="python")
    r.add_argument("entrypoint", nargs=argparse.REMAINDER)
    s = sub.add_parser("stop")
    s.add_argument("--address", required=True)
    s.add_argument("--wait", type=float, default=60.0)
    s.add_argument("job_id")
    c = sub.add_parser("summary")
    c.add_argument("--address", required=True)
    f = sub.add_parser("preflight")
    f.add_argument("--address", required=True)
    f.add_argument("--require-env", action="append", default=[])
    f.add_argument("--resource", action="append", default=[])
    f.add_argument("--storage-root", required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    if a.cmd == "run":
        ep = a.entrypoint[1:] if a.entrypoint[:1] == ["--"] else a.entrypoint
        if not ep:
            p.error("missing entrypoint (after --)")
        entrypoint = ep[0] if len(ep) == 1 else shlex.join(ep)
        try:
            res = run_job(
                a.address,
                entrypoint,
                a.content_hash,
                a.log,
                runtime_env=json.loads(a.runtime_env_json) if a.runtime_env_json else None,
                entrypoint_resources=_parse_kv_floats(a.resource) or None,
                env_vars=a.env or None,
                retries=a.retries,
                poll_s=a.poll,
                python=a.python,
            )
        except JobInterrupted as e:
            log.error("%s", e)
            return 128 + e.signum
        except RayJobsError as e:
            log.error("%s", e)
            return 1
        log.info("Ray job %s SUCCEEDED", res.job_id)
        return 0
    if a.cmd == "stop":
        st = stop(a.address, a.job_id, a.wait)
        print(st)
        return 0 if st in TERMINAL_STATUSES else 1
    if a.cmd == "summary":
        print(json.dumps(cluster_summary(a.address), indent=2))
        return 0
    if a.cmd == "preflight":
        probs = preflight(a.address, a.require_env, _parse_kv_floats(a.resource), a.storage_root)
        for line in probs:
            print(line)
        return 1 if probs else 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
