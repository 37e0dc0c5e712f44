"""The train rule's own overhead over bare ``train_lm`` (CPU seconds, measured in one run).

Used by ``scripts/benchmark.py --train-overhead``; runnable alone::

    .venv/bin/python scripts/bench_train.py [--workdir DIR] [--json]

(without ``--workdir`` the scratch dir is a temp dir, removed at the end, also on failure).

On the bundled demo (tiny Qwen3 on CPU), in a scratch Snakemake workdir:

1. builds the demo's data up to the tokenized cache with the real workflow (not measured);
2. ``snakemake -n`` of the train target: Snakemake's own start-up and DAG (measured, for reference);
3. ``snakemake checkpoints/demo/done``: the real train rule, i.e. Snakemake + the rule script +
   the ``train_lm`` child it launches (CPU of the whole process tree, from ``getrusage``);
4. bare ``train_lm`` on the identical config (the rule's own ``levanter_config.yaml``; fresh checkpoint,
   export, log and JAX-compilation-cache dirs so it compiles cold like step 3), launched exactly as the
   rule launches it (``trajsft.train.train_lm_main``: train_lm with the end-of-training hooks run once);
5. with ``--unpatched``, also Levanter's own ``python -m levanter.main.train_lm`` (final hooks twice).

Ratios: ``rule_over_bare = (3 - 2) / 4`` (the rule's own overhead, the <= 1.05x target) and
``job_over_bare = 3 / 4`` (Snakemake's start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], env: dict, cwd: Optional[str] = None, log: Optional[Path] = None) -> dict:
    """Wall and CPU seconds (the whole reaped process tree) of one command."""
    c0, t0 = _children_cpu(), time.monotonic()
    out = open(log, "a") if log else subprocess.DEVNULL
    try:
        p = subprocess.run(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log:
            out.close()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}); see {log}")
    return {"wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(_children_cpu() - c0, 2)}


def _snakemake(workdir: Path, *args: str) -> list[str]:
    return [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2", *args]


def bench_train_overhead(workdir: Optional[str] = None, unpatched: bool = False, log=print) -> dict:
    import yaml

    sys.path.insert(0, str(REPO / "src"))
    from trajsft.plan import config as C
    from trajsft.train import launch
    from trajsft.train import levanter_config
    from trajsft.plan import step_configs

    own = workdir is None  # a temp dir of ours is removed at the end, whatever happens
    wd = Path(workdir or tempfile.mkdtemp(prefix="trajsft-bench-train-"))
    wd.mkdir(parents=True, exist_ok=True)
    try:
        return _bench_train_overhead(wd, unpatched, log, C, launch, levanter_config, step_configs, yaml)
    except RuntimeError as e:
        if own:  # the log goes with the dir: keep its tail in the error
            tail = (wd / "bench_train.log").read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"{e}\n" + "\n".join(tail)) from None
        raise
    finally:
        if own:
            shutil.rmtree(wd, ignore_errors=True)


def _bench_train_overhead(wd: Path, unpatched: bool, log, C, launch, levanter_config, step_configs, yaml) -> dict:
    logf = wd / "bench_train.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    env.setdefault("RAY_TMPDIR", "/tmp/rt-bench")
    plan = C.Plan(C.load(), base_dir=REPO)
    tok = next(a for a in plan.chain("demo") if a.kind == "tokenized")
    log(f"train overhead: building the demo data in {wd} (not measured)")
    _timed(_snakemake(wd, tok.manifest), env, log=logf)
    log("train overhead: snakemake -n (Snakemake's own start-up)")
    dry = _timed(_snakemake(wd, "-n", "checkpoints/demo/done"), env, log=logf)
    log("train overhead: the train rule (snakemake checkpoints/demo/done)")
    rule = _timed(_snakemake(wd, "checkpoints/demo/done"), env, log=logf)

    run_dir = wd / step_configs.train(plan, "demo").run.location
    cfg = yaml.safe_load((run_dir / "levanter_config.yaml").read_text())

    def bare(name: str, launcher: list[str]) -> dict:
        d = wd / name
        c = json.loads(json.dumps(cfg))
        c["trainer"]["checkpointer"]["base_path"] = str(d / "checkpoints")
        c["trainer"]["log_dir"] = str(d / "logs")
        c["trainer"]["jax_compilation_cache_dir"] = str(d / "jax-compilation-cache")  # cold, like the rule's first run
        c["hf_save_path"] = str(d / "hf")
        d.mkdir(parents=True, exist_ok=True)
        path = levanter_config.write_config(c, str(d / "levanter_config.yaml"))
        log(f"train overhead: {name}")
        res = _timed([sys.executable, *launcher, "--config_path", path], launch.levanter_env(str(d), env), cwd=str(d), log=logf)
        res["hf_exports_written"] = _hf_saves(d / "logs")
        return res

    out = {"workdir": str(wd), "snakemake_dry_run": dry, "rule": rule}
    out["bare"] = bare("bare-train_lm", ["-c", "from trajsft.train.train_lm_main import main; main()"])
    if unpatched:
        out["bare_unpatched"] = bare("bare-levanter-train_lm", ["-m", "levanter.main.train_lm"])
    out["rule"]["hf_exports_written"] = _hf_saves(run_dir / "logs")
    b = out["bare"]["cpu_s"]
    out["rule_over_bare"] = round((rule["cpu_s"] - dry["cpu_s"]) / b, 3)
    out["job_over_bare"] = round(rule["cpu_s"] / b, 3)
    return out


def _hf_saves(log_dir: Path) -> int:
    """How many times Levanter's HF export hook wrote a checkpoint (its own log line)."""
    return sum(f.read_text(errors="replace").count("Saving HF-compatible checkpoint to")
               for f in log_dir.glob("*.log*") if f.is_file())


def format_train_overhead(r: dict) -> str:
    lines = ["train rule overhead over bare train_lm (demo, CPU):",
             f"  snakemake -n (Snakemake start-up)   {r['snakemake_dry_run']['cpu_s']:8.1f} CPU-s",
             f"  train rule via snakemake            {r['rule']['cpu_s']:8.1f} CPU-s  {r['rule']['wall_s']:6.1f} s wall"
             f"  (HF exports written: {r['rule']['hf_exports_written']})",
             f"  bare train_lm (same child)          {r['bare']['cpu_s']:8.1f} CPU-s  {r['bare']['wall_s']:6.1f} s wall"]
    if "bare_unpatched" in r:
        u = r["bare_unpatched"]
        lines.append(f"  Levanter's own train_lm             {u['cpu_s']:8.1f} CPU-s  {u['wall_s']:6.1f} s wall"
                     f"  (HF exports written: {u['hf_exports_written']})")
    lines += [f"  rule's own overhead: (rule - snakemake -n) / bare = {r['rule_over_bare']:.3f}x  (target <= 1.05x)",
              f"  whole job / bare = {r['job_over_bare']:.3f}x"]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", help="scratch Snakemake workdir, kept (default: a new temp dir, removed at the end)")
    ap.add_argument("--unpatched", action="store_true", help="also time Levanter's own train_lm (final hooks twice)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = bench_train_overhead(a.workdir, a.unpatched, log=lambda s: print(f"[benchmark] {s}", file=sys.stderr, flush=True))
    print(json.dumps(r, sort_keys=True) if a.json else format_train_overhead(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
