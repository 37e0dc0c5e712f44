"""``trajsft fit`` (will the train step fit the slice, at what cost) and ``trajsft serve`` (a trained target behind
an OpenAI-compatible API)."""

from __future__ import annotations

import json
import sys

from ..errors import DataError
from .common import load_plan, named_trainings


def remat_choices() -> tuple[str, ...]:
    from ..train.remat import CHOICES

    return CHOICES


def cmd_fit(args) -> int:
    """Compile each target's train step for its TPU slice here (libtpu, no TPU): fit, HBM, FLOPs, hours."""
    import logging

    from ..fit import check as fit
    from ..train.target import explain, train_lm_config_for

    plan = load_plan(args)
    if not fit.progress.handlers:  # what is compiling, and for how long, on the terminal (stdout stays the result)
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("trajsft %(message)s"))
        fit.progress.addHandler(h)
        fit.progress.setLevel(logging.INFO)
    out, rc = [], 0
    for tc in named_trainings(plan, args.targets or list(plan.cfg["default_targets"])):
        t = tc.target
        try:
            lev = train_lm_config_for(tc, accelerator="tpu", untokenized_ok=True)
            s = fit.check(tc, lev, explain(tc)["steps"], tpu_type=args.tpu_type, mfu=args.mfu,
                          suggest_on_failure=not args.no_suggest, policy=args.remat)
        except (DataError, ValueError) as e:
            print(f"trajsft fit: {t}: {e}", file=sys.stderr)
            return 2
        out.append(s)
        if not s["fits"]:
            rc = 1
            print(f"trajsft fit: {fit.refusal(s, s.get('suggestion'))}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for s in out:
            for line in fit.render(s):
                print(line)
    return rc


def cmd_serve(args) -> int:
    """Serve a trained target until Ctrl-C (exit 0); what cannot be served is one line (exit 2)."""
    import signal

    from .. import logs
    from ..report.trained import locate
    from ..serve import server

    if not 0 <= args.port <= 65535:
        print(f"trajsft serve: --port {args.port} is not a TCP port (0-65535; 0: any free one)", file=sys.stderr)
        return 2
    if args.max_seqs < 1:
        print(f"trajsft serve: --max-seqs {args.max_seqs}: serve at least 1 sequence at once", file=sys.stderr)
        return 2
    plan = load_plan(args)
    [tc] = named_trainings(plan, [args.target])
    served = locate(tc, args.step)
    logs.setup(None, plan.cfg.get("log_level", "INFO"))
    # SIGTERM as SIGINT: both end the server the same way (uvicorn's graceful shutdown, then exit 0)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.serve(served, host=args.host, port=args.port, max_seqs=args.max_seqs,
                     out=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        pass
    print(f"trajsft serve: {served.target} stopped", flush=True)
    return 0
