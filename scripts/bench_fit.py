"""Benchmark: the real Qwen3-8B train step of minimax-m2.5 compiled for a v5p-32 on this machine (no TPU).

    uv run python scripts/bench_fit.py [--target minimax-m2.5] [--profile tpu-east5] [--oversized-batch 64]

Runs ``trajsft fit`` as a user would, with a fresh fit cache in a temporary directory (removed at the end),
so every figure is of a real compile: compile wall time and the compile's peak RSS on this machine, HBM per
chip (arguments = params + optimizer state, temporaries), model FLOPs per step against 6·N·tokens, the
estimated hours of the run, all under full remat; then ``training.remat auto`` (the other policies compiled, full
read from the cache): each policy's HBM and recompute, the one chosen and its chip-hours over full remat's; then
the same target with ``training.batch_size`` set to ``--oversized-batch`` (full remat), which must be refused in
one line (and what would fit). A benchmark, not a test: it prints, it asserts only that the refusal happened.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fit(tmp: Path, target: str, profile: str, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "TRAJSFT_FIT_CACHE": str(tmp / "cache")}
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "fit", target, "--profile", profile, "--json", *extra],
                       cwd=tmp, env=env, capture_output=True, text=True)
    return p, time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="minimax-m2.5")
    ap.add_argument("--profile", default="tpu-east5")
    ap.add_argument("--oversized-batch", type=int, default=64)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trajsft-bench-fit-"))
    try:
        p, wall = fit(tmp, args.target, args.profile, "--remat", "full")
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            return 1
        [s] = json.loads(p.stdout)
        six_nd = 6 * 8.19e9 * s["tokens_per_step"]
        print(f"{args.target} on {s['tpu_type']} ({s['topology']}, {s['devices']} chips): fits={s['fits']}")
        print(f"  wall {wall:.1f} s for the whole command (compile {s['compile_seconds']} s), compile peak RSS "
              f"{s['compile_peak_rss_gib']:.2f} GiB on {os.cpu_count()} cores")
        print(f"  HBM per chip: {s['hbm_used_gib']:.2f} of {s['hbm_limit_gib']:.2f} GiB = params "
              f"{s['hbm_params_gib']:.2f} + optimizer state {s['hbm_optimizer_state_gib']:.2f} + temporaries "
              f"{s['hbm_temporaries_gib']:.2f} ({s['attn_backend']} attention)")
        print(f"  model FLOPs per step {s['model_flops_per_step']:.3e} ({s['flops_count']}); causal count "
              f"{s['model_flops_per_step_causal']:.3e}; 6*N*tokens alone {six_nd:.3e} "
              f"(attention at seq_len {s['seq_len']}: x{s['model_flops_per_step'] / six_nd:.2f})")
        print(f"  estimate at {s['mfu_assumed']:.0%} MFU: {s['step_seconds_estimate']:.1f} s/step x {s['steps']} steps = "
              f"{s['slice_wall_hours']:.1f} h on the slice, {s['chip_hours']:.0f} chip-hours, "
              f"{s['tpu_core_hours']:.0f} TPU core-hours")
        p, wall = fit(tmp, args.target, args.profile, "--remat", "auto")
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            return 1
        [a] = json.loads(p.stdout)
        print(f"training.remat auto: {wall:.1f} s for the whole command; chose {a['remat']} "
              f"({a['remat_auto']['why']})")
        for c in a["remat_auto"]["candidates"]:
            if c.get("skipped"):
                print(f"  {c['remat']:<16} skipped: {c['skipped'][:200]}")
                continue
            print(f"  {c['remat']:<16} fits={c['fits']} {c['hbm_used_gib']} GiB HBM/chip, recompute "
                  f"{c['recompute_vs_no_remat']:.2f}x ({c['recompute_vs_full']:.3f} of full's), "
                  f"{c['step_seconds_estimate']:.1f} s/step, {c['chip_hours']:.0f} chip-hours")
        print(f"  chip-hours: {a['chip_hours']:.0f} against full remat's {s['chip_hours']:.0f} "
              f"(x{a['chip_hours'] / s['chip_hours']:.3f}; estimated: docs/fit.md, Remat)")
        cfg = tmp / "oversized.yaml"
        cfg.write_text(f"training:\n  batch_size: {args.oversized_batch}\n")
        p, wall = fit(tmp, args.target, args.profile, "--configfile", str(cfg), "--remat", "full")
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("trajsft fit:")]
        print(f"batch_size {args.oversized_batch}: exit {p.returncode} in {wall:.1f} s (with the bounded search for "
              f"what fits)")
        for ln in lines:
            print(f"  {ln}")
        return 0 if p.returncode == 1 and len(lines) == 1 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
