"""Generation throughput of the next-action evaluation's engine (Levanter's, as ``trajsft serve`` uses it), measured in
one run on the demo's trained tiny Qwen3 on CPU, at several engine settings (sequences at once, KV page size).

    .venv/bin/python scripts/bench_generate.py [--workdir DIR] [--turns 24] [--max-tokens 64] [--settings 4x128,8x32] [--json]

``--workdir``: a Snakemake workdir where the demo is trained (``checkpoints/demo/done``); without it the demo is
trained in a temp dir first (not measured). For each setting: the engine is built and the sampled held-out turns of
the demo (cycled to ``--turns`` prompts) are generated twice, greedily: the first pass includes the engine's compilation (what one evaluation pays),
the second is the steady state. Printed: tokens generated, tokens/s of each pass, the evaluation's wall time, and
each setting's steady throughput as a ratio to the slowest; the fastest is the one ``trajsft.train.generate``'s
``EVAL_MAX_SEQS`` / ``EVAL_PAGE_SIZE`` should hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
SETTINGS = ((1, 128), (4, 128), (8, 128), (8, 32))  # (max_seqs, page_size)


def trained_demo(workdir: Path) -> None:
    if not (workdir / "checkpoints/demo/done").exists():
        subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2",
                        "checkpoints/demo/done", "--quiet"], check=True, cwd=workdir)


def measure(workdir: Path, turns: int, max_tokens: int, settings=SETTINGS) -> list[dict]:
    os.chdir(workdir)  # the demo's storage root (results) is relative to the workdir
    from trajsft.plan import config as C
    from trajsft.plan import step_configs
    from trajsft.report import actions
    from trajsft.report.trained import locate
    from trajsft.train import generate

    plan = C.Plan(C.load(), base_dir=REPO, state_dir=str(workdir / "results"))
    ev = step_configs.eval_actions(plan, "demo")
    trained = locate(ev.train)
    held = [t for ts in actions.sampled(ev.held_out, turns, ev.tools).values() for t in ts]  # prompted as scored
    warm = generate.load(trained.train_cfg, trained.source)  # JAX's and Levanter's process start-up, not measured
    # the turns the evaluation asks: a prompt that fills the student's seq_len is skipped there, so here too
    held = [t for t in held if generate.room(warm, warm.tokenizer.encode(actions.prompt_text(warm.tokenizer, t),
                                                                      add_special_tokens=False)) > 0]
    sample = [held[i % len(held)] for i in range(turns)]  # the demo holds out a few turns: cycled to --turns
    out = []
    for max_seqs, page_size in settings:
        t0 = time.perf_counter()
        loaded = generate.load(trained.train_cfg, trained.source, max_seqs=max_seqs, page_size=page_size)
        tok = loaded.tokenizer
        prompts = [tok.encode(actions.prompt_text(tok, t), add_special_tokens=False) for t in sample]
        t1 = time.perf_counter()
        first = generate.generate(loaded, prompts, max_tokens)
        t2 = time.perf_counter()
        second = generate.generate(loaded, prompts, max_tokens)
        t3 = time.perf_counter()
        n1, n2 = sum(len(t) for t, _ in first), sum(len(t) for t, _ in second)
        assert first == second, "greedy generation is not deterministic across passes"
        out.append({"max_seqs": max_seqs, "page_size": page_size, "turns": len(prompts), "tokens": n2,
                    "load_s": round(t1 - t0, 2), "first_pass_s": round(t2 - t1, 2), "steady_s": round(t3 - t2, 2),
                    "first_tokens_per_s": round(n1 / (t2 - t1), 1), "steady_tokens_per_s": round(n2 / (t3 - t2), 1),
                    "evaluation_wall_s": round(t2 - t0, 2)})
    slowest = min(r["steady_tokens_per_s"] for r in out)
    for r in out:
        r["steady_ratio_to_slowest"] = round(r["steady_tokens_per_s"] / slowest, 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--turns", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--settings", help="engine settings as max_seqs x page_size, e.g. 4x128,8x32 (default: "
                    + ",".join(f"{a}x{b}" for a, b in SETTINGS) + ")")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        wd = (args.workdir or Path(tmp)).resolve()
        trained_demo(wd)
        settings = (tuple(tuple(int(x) for x in s.split("x")) for s in args.settings.split(","))
                    if args.settings else SETTINGS)
        rows = measure(wd, args.turns, args.max_tokens, settings)
    best = max(rows, key=lambda r: r["steady_tokens_per_s"])
    if args.json:
        print(json.dumps({"settings": rows, "fastest": {k: best[k] for k in ("max_seqs", "page_size")}}, indent=2))
        return 0
    print(f"{'max_seqs':>8} {'page':>5} {'turns':>5} {'tokens':>6} {'load s':>7} {'1st pass s':>10} {'tok/s 1st':>9} "
          f"{'tok/s steady':>12} {'x slowest':>9} {'eval wall s':>11}")
    for r in rows:
        print(f"{r['max_seqs']:>8} {r['page_size']:>5} {r['turns']:>5} {r['tokens']:>6} {r['load_s']:>7} "
              f"{r['first_pass_s']:>10} {r['first_tokens_per_s']:>9} {r['steady_tokens_per_s']:>12} "
              f"{r['steady_ratio_to_slowest']:>9} {r['evaluation_wall_s']:>11}")
    print(f"fastest steady: max_seqs {best['max_seqs']}, page_size {best['page_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
