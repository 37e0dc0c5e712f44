"""The tokenize rule vs the same work in one process; the in-process build vs the raw batch encode; shard memory."""

from __future__ import annotations

import os
import sys
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from .common import REPO_ROOT, WARMUP_CHATS
from .tokenization import best_of, render_texts, tokenize_raw


# --------------------------------------------------------------------------------------
# tokenize: the rule vs the same work in-process; in-process build vs the raw batch-encode limit
# --------------------------------------------------------------------------------------


def _write_shards(records: Sequence[dict], root: str) -> list[str]:
    from trajsft.data.transform import ShardWriter

    os.makedirs(root, exist_ok=True)
    urls: list[str] = []

    def put(name: str, data: bytes) -> None:
        Path(root, name).write_bytes(data)
        urls.append(os.path.join(root, name))

    w = ShardWriter("train", put)
    for r in records:
        w.add({"messages": r["messages"], "traj_id": r["traj_id"]})
    w.close()
    return urls


def time_inprocess_build(urls: Sequence[str], tokenizer_path: str, seq_len: int,
                         workers: Optional[int] = None, repeats: int = 1) -> dict:
    """``trajsft.data.cache.build_chat_cache`` (what the tokenize rule runs) in this process, the
    best of ``repeats`` builds; ``workers`` as in ``build_chat_cache`` (None: what the rule uses)."""
    from trajsft.data import cache as data_cache
    from trajsft.data import chat_cache
    from trajsft.data.template import load_template

    best = None
    for _ in range(max(1, repeats)):
        out_dir = tempfile.mkdtemp(prefix="trajsft-bench-cache-")
        try:
            t0 = time.perf_counter()
            st = data_cache.build_chat_cache(list(urls), [], os.path.join(out_dir, "cache"), os.path.abspath(tokenizer_path),
                                     load_template(), seq_len=seq_len, workers=workers)
            dt = time.perf_counter() - t0
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        best = dt if best is None else min(best, dt)
    used = chat_cache.pool_workers(chat_cache.shard_bytes(urls)) if workers is None else workers
    return {"seconds": best, "tokens": st["train"]["tokens"], "chats": st["train"]["chats"],
            "tokens_per_s": st["train"]["tokens"] / best, "workers": used,
            "shard_bytes": chat_cache.shard_bytes(urls)}


def raw_all_cores(tokenizer, texts: Sequence[str], repeats: int) -> float:
    """Best seconds of the raw fast-tokenizer batch encode of ``texts`` on every core."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        return best_of(lambda: tokenize_raw(tokenizer, texts), repeats,
                       warmup=lambda: tokenize_raw(tokenizer, texts[:WARMUP_CHATS]))[0]
    finally:
        os.environ["TOKENIZERS_PARALLELISM"] = old or "false"


def bench_tokenize_scaling(records: Sequence[dict], tokenizer, tokenizer_path: str, template: str, seq_len: int,
                           repeats: int, log: Callable[[str], None]) -> dict:
    """In-process builds of 1x / 4x / 16x of the data (``len(records)`` = 16x), and the 16x build
    against the raw batch encode of the same rendered text on all cores."""
    tmp = tempfile.mkdtemp(prefix="trajsft-bench-scale-")
    try:
        unit = max(1, len(records) // 16)
        runs = {}
        # warm-up: imports, tokenizer load, template compilation (paid once per rule process too)
        time_inprocess_build(_write_shards(records[:2], os.path.join(tmp, "warm")), tokenizer_path, seq_len)
        for k in (1, 4, 16):
            log(f"in-process build of {k}x ({unit * k} chats) ...")
            urls = _write_shards(records[: unit * k], os.path.join(tmp, f"x{k}"))
            runs[k] = time_inprocess_build(urls, tokenizer_path, seq_len)
        texts = render_texts(tokenizer, records[: unit * 16], template)
        # 16x: the rule's build, the same in one process (workers=0: before the worker pool) and the raw
        # encode, interleaved `repeats` times (the load of a shared machine drifts), best of each
        serial, pooled, raw_s = None, None, None
        pool_n = max(2, os.cpu_count() or 1)
        for r in range(max(1, repeats)):
            log(f"16x, round {r + 1}/{repeats}: the rule's build, the build in one process, with a pool of "
                f"{pool_n}, the raw encode ...")
            a = time_inprocess_build(urls, tokenizer_path, seq_len)
            b = time_inprocess_build(urls, tokenizer_path, seq_len, workers=0)
            p = time_inprocess_build(urls, tokenizer_path, seq_len, workers=pool_n)
            c = raw_all_cores(tokenizer, texts, 1)
            runs[16] = a if r == 0 or a["seconds"] < runs[16]["seconds"] else runs[16]
            serial = b if serial is None or b["seconds"] < serial["seconds"] else serial
            pooled = p if pooled is None or p["seconds"] < pooled["seconds"] else pooled
            raw_s = c if raw_s is None else min(raw_s, c)
        base = runs[1]["seconds"] / runs[1]["tokens"]
        # linear = a fixed start cost (tokenizer load, cache open) + a constant cost per token:
        # the marginal seconds per token from 4x to 16x over that from 1x to 4x is ~1
        marginal = lambda a, b: (runs[b]["seconds"] - runs[a]["seconds"]) / (runs[b]["tokens"] - runs[a]["tokens"])  # noqa: E731
        return {
            "runs": {str(k): dict(r, seconds_per_token_vs_1x=(r["seconds"] / r["tokens"]) / base) for k, r in runs.items()},
            "marginal_4x_16x_over_1x_4x": marginal(4, 16) / marginal(1, 4),
            "raw_all_cores": {"seconds": raw_s, "tokens_per_s": runs[16]["tokens"] / raw_s},
            "ratio_inprocess_over_raw": (runs[16]["tokens"] / runs[16]["seconds"]) / (runs[16]["tokens"] / raw_s),
            "serial_16x": serial,
            "pool_16x": pooled,
            "ratio_serial_over_raw": raw_s / serial["seconds"],
            "cpus": os.cpu_count(),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_measured(cmd: Sequence[str], cwd: str, env: dict) -> dict:
    """Wall seconds and peak summed RSS of a command's whole process tree (sampled every 50 ms)."""
    import psutil

    t0 = time.perf_counter()
    p = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc, peak, pids = psutil.Process(p.pid), 0, set()
    while p.poll() is None:
        total = 0
        try:
            tree = [proc] + proc.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for c in tree:
            with contextlib.suppress(psutil.Error):
                total += c.memory_info().rss
                pids.add(c.pid)
        peak = max(peak, total)
        time.sleep(0.05)
    out = p.communicate()[0].decode(errors="replace")
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{out[-3000:]}")
    return {"seconds": dt, "peak_rss_bytes": peak, "processes": len(pids)}


_FRESH_BUILD = """
import json, sys

from trajsft.data import cache as data_cache
from trajsft.data.template import load_template
a = json.loads(sys.argv[1])
data_cache.build_chat_cache(a["train"], a["validation"], a["cache"], a["tokenizer"], load_template(), seq_len=a["seq_len"])
"""


def bench_rule_demo(log: Callable[[str], None]) -> dict:
    """The real ``tokenize`` rule (Snakemake, demo data and tokenizer) against the same cache build
    in this process."""
    import yaml

    from trajsft.plan import config as C

    plan = C.Plan(C.load(), base_dir=REPO_ROOT)
    arts = {a.kind: a for a in plan.chain("demo")}
    wd = tempfile.mkdtemp(prefix="trajsft-bench-rule-")
    snakemake = str(Path(sys.executable).parent / "snakemake")
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    env.pop("TOKENIZERS_PARALLELISM", None)  # as in a user's shell

    def smk(*args: str, config: Optional[dict] = None) -> list[str]:
        extra = []
        if config:
            Path(wd, "over.yaml").write_text(yaml.safe_dump(config))
            extra = ["--configfile", os.path.join(wd, "over.yaml")]
        return [snakemake, *args, "-s", str(REPO_ROOT / "Snakefile"), "-d", wd, "--cores", "2", *extra, "--quiet", "all"]

    try:
        log("demo: download + shard (not timed) ...")
        _run_measured(smk(arts["shards"].manifest), wd, env)
        out = {}
        log("demo: the tokenize rule (Snakemake) ...")
        out["rule"] = _run_measured(smk(arts["tokenized"].manifest), wd, env)
        shards = json.loads(Path(wd, arts["shards"].manifest).read_text())
        loc = Path(wd, arts["shards"].location)
        urls = [str(loc / f) for f in shards["files"]["train"]]
        val = [str(loc / f) for f in shards["files"].get("validation", [])]
        args = json.dumps({"train": urls, "validation": val, "cache": os.path.join(wd, "inprocess-cache"),
                           "tokenizer": str(REPO_ROOT / "demo" / "tokenizer"),
                           "seq_len": int(arts["tokenized"].spec["seq_len"])})
        log("demo: the same build in one fresh Python process (imports included, as the rule pays them) ...")
        out["inprocess"] = _run_measured([sys.executable, "-c", _FRESH_BUILD, args], wd, env)
        log("demo: the same build in this (warm) process ...")
        time_inprocess_build(urls[:1], str(REPO_ROOT / "demo" / "tokenizer"), 1024)  # warm-up
        out["inprocess_warm"] = time_inprocess_build(urls + val, str(REPO_ROOT / "demo" / "tokenizer"),
                                                     int(arts["tokenized"].spec["seq_len"]))
        out["ratio_rule_over_inprocess"] = out["rule"]["seconds"] / out["inprocess"]["seconds"]
        return out
    finally:
        shutil.rmtree(wd, ignore_errors=True)


_SHARD_MEMORY = """
import json, sys
from pathlib import Path

import pyarrow as pa, pyarrow.parquet as pq
from trajsft.data import download, shard
from trajsft.plan import config as C, step_configs
copies, root, demo = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(root / "ds/data").mkdir(parents=True)
base = pa.concat_tables([pq.read_table(f) for f in sorted((demo / "data").glob("*.parquet"))])
ids = base.column("traj_id").to_pylist()
parts = [base.set_column(base.schema.get_field_index("traj_id"), "traj_id",
                         pa.array([f"{t}-c{k}" if t else t for t in ids], pa.string())) for k in range(copies)]
pq.write_table(pa.concat_tables(parts), root / "ds/data/train-00000-of-00001.parquet", row_group_size=256)
del parts, base
over = {"storage_root": str(root / "store"), "teachers": {"demo": {"dataset": str(root / "ds"), "rows": 60 * copies}}}
plan = C.Plan(C.load(None, over), base_dir=C.REPO_DIR, state_dir=str(root / "state"))
names = {a.kind: a.name for a in plan.chain("demo")}
download.download(step_configs.download(plan, names["raw"]))
res = shard.shard(step_configs.shard(plan, names["shards"]))
# VmHWM, not ru_maxrss: a forked child inherits its parent's ru_maxrss across exec
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps({"rows": 60 * copies, "kept": res["kept_total"], "peak_rss_bytes": hwm * 1024}))
"""


def bench_shard_memory(copies: Sequence[int] = (1, 20, 80)) -> list[dict]:
    """Peak RSS of the shard step (one fresh process each) on the demo rows repeated 1x/20x/80x."""
    out = []
    for c in copies:
        tmp = tempfile.mkdtemp(prefix="trajsft-bench-shards-")
        try:
            p = subprocess.run([sys.executable, "-c", _SHARD_MEMORY, str(c), tmp, str(REPO_ROOT / "demo" / "dataset")],
                               capture_output=True, text=True, check=True)
            out.append(json.loads(p.stdout.strip().splitlines()[-1]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
