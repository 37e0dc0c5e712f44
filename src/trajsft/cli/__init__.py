"""`trajsft` command line: where a target's artifacts live and what they hash (``plan``), the state of
every run (``status``), a training log (``logs``), the clusters of the profiles (``clusters``), stopping
a target's Ray jobs (``stop``), forgetting a configuration error after a fix (``retry``), the cross-teacher matrix (``eval``),
a trained target behind an OpenAI-compatible API (``serve``), a profile's checks
(``preflight``), whether a target's train step fits its TPU slice, with the run's cost (``fit``), and a task set's
controls (``tasks``). Running the pipeline itself is Snakemake's: ``snakemake checkpoints/<target>/done``.

One module per command group: ``runs`` (status, logs, clusters, stop, retry, preflight), ``plan``, ``eval``, ``model``
(fit, serve), ``tasks``; ``common`` reads the plan every command starts from."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import quiet_on_closed_pipe
from ..plan import config as C
from .eval import cmd_eval
from .model import cmd_fit, cmd_serve, remat_choices
from .plan import cmd_plan
from .runs import cmd_clusters, cmd_logs, cmd_preflight, cmd_retry, cmd_status, cmd_stop
from .tasks import cmd_tasks


class _Version(argparse.Action):
    """``--version``: trajsft's version and commit and the versions of the stack it trains with (a bug report's
    first line), read when asked: no jax import."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def version_line() -> str:
    from ..runtime.provenance import code_version, package_versions

    v = package_versions(("trajsft", "levanter", "jax", "snakemake", "ray"))
    code = code_version()
    commit = (f" (commit {code['git_commit'][:10]}{', uncommitted changes' if code['git_dirty'] else ''})"
              if code["git_commit"] else "")
    return f"trajsft {v.pop('trajsft')}{commit}; " + ", ".join(f"{k} {x or 'not installed'}" for k, x in v.items())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trajsft", description=__doc__)
    p.add_argument("--version", action=_Version, help="trajsft's version and commit, and its stack's; then exit")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--profile", help="a profile under profiles/ (e.g. tpu-east5), as given to snakemake")
        sp.add_argument("--configfile", action="extend", nargs="+", metavar="FILE",
                        help="extra config file(s) merged over config/config.yaml; like snakemake --configfile "
                             "it takes every following argument (put targets before it)")
        sp.add_argument("--storage-root", help="override storage_root (e.g. gs://marin-us-east5/trajsft)")

    sp = sub.add_parser("plan", help="where every artifact of a target lives (runs and downloads nothing)")
    common(sp)
    sp.add_argument("targets", nargs="*", help="teacher or mixture names (or checkpoints/<name>/done)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--explain", action="store_true", help="show what each hash covers, and the training length: steps, passes over each teacher's data, tokens seen")
    sp.add_argument("--offline", action="store_true", help="do not look for payloads in the storage roots")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("status", help="one row per target: state, hash, cluster/job, step/loss, W&B, checkpoints")
    common(sp)
    sp.add_argument("targets", nargs="*", help="default: every teacher and mixture")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--offline", action="store_true", help="do not query the Ray cluster")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("logs", help="tail the training log of a target (local or from its Ray job)")
    common(sp)
    sp.add_argument("target")
    sp.add_argument("-n", type=int, default=20, help="lines (default 20)")
    sp.add_argument("--follow", "-f", action="store_true")
    sp.set_defaults(func=cmd_logs)

    sp = sub.add_parser("clusters", help="per cluster profile: reachable, running/pending jobs (ours), TPUs free")
    sp.add_argument("profiles", nargs="*", help="default: every profile with a Ray cluster")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_clusters)

    sp = sub.add_parser("stop", help="stop the Ray jobs of targets on the profile's cluster")
    common(sp)
    sp.add_argument("targets", nargs="+")
    sp.set_defaults(func=cmd_stop)

    sp = sub.add_parser("retry", help="after fixing a job's environment outside the code and requirements: "
                                      "forget its configuration error, so the next snakemake run submits again")
    common(sp)
    sp.add_argument("targets", nargs="+")
    sp.set_defaults(func=cmd_retry)

    sp = sub.add_parser("eval", help="cross-teacher matrix: held-out loss of trained targets on teachers' held-out splits")
    common(sp)
    sp.add_argument("targets", nargs="*", help="rows (default: eval.targets, else default_targets)")
    sp.add_argument("--teachers", nargs="+", help="columns (default: eval.teachers, else every teacher of the rows); with --actions: "
                                                       "whose held-out chats (default: actions.teachers)")
    sp.add_argument("--model", choices=["latest", "hf_export", "checkpoint"],
                    help="which model of a target (default: eval.model, else latest)")
    sp.add_argument("--max-eval-batches", type=int, help="cap per held-out split")
    sp.add_argument("--out", default=os.path.join(C.STATE_DIR, "eval"), help="output dir (default results/eval)")
    sp.add_argument("--json", action="store_true", help="print the matrix (or the next-action scores) as JSON")
    sp.add_argument("--actions", action="store_true",
                    help="next-action scores instead: the student's turn against the teacher's on held-out chats "
                         "(tool calls, tool names, arguments, commands, ending the episode)")
    sp.add_argument("--agent", action="store_true",
                    help="the agent evaluation instead: the student works each task of its task set through "
                         "mini-swe-agent in a sandbox, graded by the tests (rule eval_agent's; the resolve rate)")
    sp.add_argument("--replay", action="store_true",
                    help="with --actions: score the teachers' own turns (every agreement is 1.0: the scores' check); "
                         "with --agent: a built-in model answers each task with its gold fix (resolves every task)")
    sp.add_argument("--watch", action="store_true",
                    help="with --actions or --agent and one target: evaluate each HF export of its run as it appears, "
                         "until the run is done (a row per step in the report)")
    sp.add_argument("--interval", type=float, default=30.0, help="with --watch: seconds between looks (default 30)")
    sp.add_argument("--max-turns", type=int, help="with --actions: turns sampled per teacher split (default: the "
                                                  "target's actions.max_turns)")
    sp.add_argument("--max-tokens", type=int,
                    help="with --actions: tokens the student may generate per turn (default: actions.max_tokens)")
    sp.set_defaults(func=cmd_eval)

    sp = sub.add_parser("fit", help="will the train step fit the profile's TPU slice, and what will the run cost? "
                                    "(compiles the step with libtpu here; no TPU, no weights)")
    common(sp)
    sp.add_argument("targets", nargs="*", help="teacher or mixture names (default: default_targets)")
    sp.add_argument("--tpu-type", help="the slice to check (default: the profile's ray.tpu_type), e.g. v5p-32")
    sp.add_argument("--mfu", type=float, default=None,
                    help="model-FLOPs utilisation the time estimate assumes (default 0.4; use your run's "
                         "throughput/mfu)")
    sp.add_argument("--no-suggest", action="store_true",
                    help="when it does not fit, do not compile smaller batches / larger slices to say what would")
    sp.add_argument("--remat", choices=remat_choices(),
                    help="the remat policy to compile (default: the target's training.remat; auto compiles each "
                         "and picks the least recompute that fits with 10%% of HBM free)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_fit)

    sp = sub.add_parser("serve", help="talk to a trained target through an OpenAI-compatible API "
                                      "(/v1/chat/completions, tools and tool calls included)")
    common(sp)
    sp.add_argument("target", help="a teacher or mixture name (or checkpoints/<name>/done)")
    sp.add_argument("--step", type=int, help="serve its HF export at this step (default: its newest model, trainer "
                                             "checkpoint or HF export)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=8701, help="port (default 8701; 0: any free port)")
    sp.add_argument("--max-seqs", type=int, default=4, help="sequences generated at once (default 4)")
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("tasks", help="task sets graded by their tests: `check` runs each task's controls (the gold "
                                      "fix resolves it, the empty patch does not)")
    sp.add_argument("action", choices=["check"])
    sp.add_argument("set", help="a task set of the config's tasks: (demo: made offline from the crates in "
                                "tasks/demo/crates)")
    sp.add_argument("--sandbox", choices=["bubblewrap", "none"], default=None,
                    help="where the tests run (default: the set's sandbox; none: a plain temporary directory, no "
                         "isolation)")
    common(sp)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_tasks)

    sp = sub.add_parser("preflight", help="check env vars, cluster, TPU resource and storage for a profile; say "
                                          "what the targets' trainings write to the storage root")
    sp.add_argument("targets", nargs="*", help="default: the config's default_targets")
    common(sp)
    sp.set_defaults(func=cmd_preflight)
    return p


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line (the children it started were stopped with it)
        print(f"trajsft {args.cmd}: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except C.ConfigError as e:
        for line in str(e).splitlines():
            print(f"trajsft: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # a cluster that is not up / rejects us: one line, not a traceback
        from ..cluster import jobs as cluster_jobs

        if not isinstance(e, cluster_jobs.RayJobsError):
            raise
        from ..cluster.submit import tunnel_hint

        ray = (getattr(args, "_cfg", None) or {}).get("ray") or {}
        address = ray.get("address", "the cluster")
        hint = {"ClusterUnreachable": tunnel_hint(ray) if ray.get("address") else "is the Ray cluster up?",
                "ClusterUnauthorized": "export RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) for this cluster"}
        print(f"trajsft {args.cmd}: cannot use Ray at {address}: {' '.join(str(e).split())[:300]}"
              f"{'; ' + hint[type(e).__name__] if type(e).__name__ in hint else ''}", file=sys.stderr)
        return 1
