"""LLaMA-Factory and TRL themselves on trajsft's exports, token for token against trajsft's own cache.

    uv run python scripts/check_trainers.py [--json OUT] [--keep DIR]

1. Exports, through the real data steps (download -> shard -> export), the demo and the hostile
   corpus's kept rows (tests/hostile_corpus.py).
2. Builds trajsft's own chat cache of the same shards (trajsft.data.cache.build_chat_cache, what the
   tokenize rule runs) with the real Qwen3 tokenizer (trajsft.data.qwen3_tokenizer).
3. In a separate environment built from envs/trainers-requirements.txt (llamafactory 0.9.5, trl
   0.24.0, torch 2.11.0 from PyPI; LLaMA-Factory pins datasets<=4.0.0, trajsft 4.8.5, so it cannot
   share trajsft's; cached in $TRAJSFT_CACHE/trainers-<hash>, ~5.5 GB), runs
   scripts/trainers_probe.py: LLaMA-Factory's own get_dataset with the exported train_args.yaml and
   TRL's own SFTTrainer dataset preparation and collator with the exported sft_config.json.
4. Compares input ids and trained positions per row and prints the agreement; exit 1 when a
   trainer disagrees beyond what docs/export.md documents:

   - TRL: every row's ids and trained positions equal trajsft's (its first seq_len tokens).
   - LLaMA-Factory, without truncation: ids equal for every row the export counts exact (a prefix
     for a lossy row), and the trained positions are trajsft's plus the "\\n" after each trained
     <|im_end|> (LLaMA-Factory's assistant slot is "{{content}}<|im_end|>\\n": it trains that
     newline, which no data value can change).
   - LLaMA-Factory with cutoff_len = seq_len: as above for every chat that fits seq_len; a longer
     chat LLaMA-Factory truncates turn by turn, trajsft keeps its first seq_len tokens (counted).

Not a pytest test: the trainers' environment is ~5.5 GB of CUDA wheels (docs/export.md has the
measured install time); run by hand after changing the export or the template.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "envs" / "trainers-requirements.txt"
PROBE = REPO / "scripts" / "trainers_probe.py"
NO_TRUNCATION = 1_000_000


class CheckError(RuntimeError):
    """One line: why the check could not run."""


def trainers_python() -> Path:
    """The trainers' environment, built once per requirements file. A venv names its own path, so it
    is built in place; the ``.complete`` marker is written last, and a venv without it (a killed
    build) is removed and built again."""
    from trajsft.data.qwen3_tokenizer import cache_dir

    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = cache_dir().parent / f"trainers-{digest}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    uv = shutil.which("uv")
    cmd = [uv] if uv else [sys.executable, "-m", "uv"]
    started = time.time()
    for args in (["venv", "-q", "-p", "3.11", str(venv)], ["pip", "install", "-q", "-p", str(python), "-r", str(REQUIREMENTS)]):
        r = subprocess.run(cmd + args, capture_output=True, text=True)
        if r.returncode:
            raise CheckError(f"uv {args[0]} failed: {' '.join(r.stderr.split())[-400:]}")
    seconds = time.time() - started
    (venv / ".complete").write_text(f"{seconds:.1f}\n")
    print(f"trainers' environment: built {venv} in {seconds:.0f} s", file=sys.stderr)
    return python


# ---- trajsft's side: the exports and its own cache of the same shards --------------------------------
def export_and_cache(work: Path, key: str, teacher_over: dict | None, tokenizer: str) -> dict:
    """Download -> shard -> export one target (the demo config; ``teacher_over`` replaces the demo
    teacher's dataset), and trajsft's chat cache of its shards with the real Qwen3 tokenizer."""
    from trajsft.data import cache, download, export, shard
    from trajsft.plan import step_configs
    from trajsft.data.template import load_template
    from trajsft.plan import config as C

    over = {"storage_root": str(work / key / "store")}
    if teacher_over:
        over["teachers"] = {"demo": teacher_over}
    plan = C.Plan(C.load(None, over), base_dir=C.REPO_DIR, state_dir=str(work / key / "state"))
    names = {a.kind: a.name for a in plan.chain("demo")}
    download.download(step_configs.download(plan, names["raw"]))
    shard.shard(step_configs.shard(plan, names["shards"]))
    res = export.export(step_configs.export(plan, "demo"))
    out = Path(plan.target("demo")["export"].location)
    shards = Path(plan.get("shards", names["shards"]).location)
    splits = {s: sorted(shards.glob(f"{s}-*.jsonl.gz")) for s in ("train", "validation")}
    cache_dir = work / key / "trajsft-cache"
    cache.build_chat_cache([str(f) for f in splits["train"]], [str(f) for f in splits["validation"]], str(cache_dir),
                           tokenizer, load_template(), tools=step_configs.export(plan, "demo").tools.get("demo"))
    datasets = []
    for split, files in splits.items():
        if not files:
            continue
        recs = [json.loads(x) for f in files for x in gzip.decompress(f.read_bytes()).splitlines()]
        rows = cache._open_chat_split(str(cache_dir / split))
        got = rows.get_batch_sync(list(range(len(recs))))
        skipped = {json.loads(x)["traj_id"] for x in (out / "llamafactory" / "skipped.jsonl").read_text().splitlines()}
        lossy = {json.loads(x)["traj_id"] for x in (out / "llamafactory" / "lossy.jsonl").read_text().splitlines()}
        datasets.append({
            "key": f"{key}/{split}", "lf_dataset": "demo" if split == "train" else "demo_validation",
            "train_args": res["llamafactory"]["train_args"], "sft_config": res["trl"]["sft_config"],
            "messages_files": [str(out / f) for f in res["messages"]["files"][f"demo/{split}"]],
            "seq_len": res["llamafactory"]["train_args"]["cutoff_len"],
            "cutoff_lens": [res["llamafactory"]["train_args"]["cutoff_len"], NO_TRUNCATION],
            "trajsft": [{"traj_id": r["traj_id"], "ids": [int(x) for x in g["input_ids"]],
                         "mask": [int(x) for x in g["assistant_masks"]], "in_llamafactory": r["traj_id"] not in skipped,
                         "lossy": r["traj_id"] in lossy} for r, g in zip(recs, got)],
        })
    return {"datasets": datasets, "export": res}


def hostile_dataset(work: Path) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    import hostile_corpus as H

    where = H.write_rows_dataset(work / "hostile-ds")
    return {"dataset": str(work / "hostile-ds"), "rows": len(where)}


# ---- the comparison ---------------------------------------------------------------------------------
def _positions(mask: list[int]) -> list[int]:
    return [i for i, m in enumerate(mask) if m]


def _with_newlines(ids: list[int], trained: list[int], im_end: int) -> list[int]:
    """trajsft's trained positions plus the token after each trained <|im_end|> (LLaMA-Factory's "\\n")."""
    extra = [p + 1 for p in trained if ids[p] == im_end and p + 1 < len(ids)]
    return sorted(set(trained) | set(extra))


def compare(d: dict, probe: dict, im_end: int) -> dict:
    """Agreement figures of one dataset (rows counted; ``failures`` lists disagreements beyond the documented)."""
    n = d["seq_len"]
    ours = d["trajsft"]
    lf_rows = [t for t in ours if t["in_llamafactory"]]
    f: dict = {"rows": len(ours), "llamafactory_rows": len(lf_rows), "failures": []}
    trl = probe["trl"]
    f["trl_rows_loaded"] = len(trl)
    f["trl_ids_equal"] = sum(a["ids"] == t["ids"][:n] for a, t in zip(trl, ours))
    f["trl_trained_equal"] = sum(a["trained"] == _positions(t["mask"][:n]) for a, t in zip(trl, ours))
    if not (len(trl) == len(ours) == f["trl_ids_equal"] == f["trl_trained_equal"]):
        f["failures"].append(f"TRL: ids {f['trl_ids_equal']}/{len(ours)}, trained {f['trl_trained_equal']}/{len(ours)}")
    full, cut = probe["llamafactory"][str(NO_TRUNCATION)], probe["llamafactory"][str(n)]
    f["llamafactory_rows_loaded"] = len(full)
    if len(full) != len(lf_rows) or len(cut) != len(lf_rows):
        f["failures"].append(f"LLaMA-Factory loaded {len(full)}/{len(cut)} rows of {len(lf_rows)}")
    ids_eq = ids_prefix = tr_eq = tr_nl = 0
    for a, t in zip(full, lf_rows):
        ok_ids = a["ids"] == t["ids"]
        ids_eq += ok_ids
        ids_prefix += (not ok_ids) and t["lossy"] and t["ids"][:len(a["ids"])] == a["ids"]
        want = _positions(t["mask"])
        tr_eq += a["trained"] == want
        tr_nl += a["trained"] == [p for p in _with_newlines(t["ids"], want, im_end) if p < len(a["ids"])]
    exact = sum(not t["lossy"] for t in lf_rows)
    f.update(llamafactory_ids_equal=ids_eq, llamafactory_ids_prefix_lossy=ids_prefix, llamafactory_rows_exact=exact,
             llamafactory_trained_equal=tr_eq, llamafactory_trained_equal_plus_newline=tr_nl)
    if ids_eq + ids_prefix != len(lf_rows) or ids_eq < exact or tr_nl != len(lf_rows):
        f["failures"].append(f"LLaMA-Factory (no truncation): ids {ids_eq}+{ids_prefix} prefix/{len(lf_rows)}, "
                             f"trained (+newline) {tr_nl}/{len(lf_rows)}")
    fits = [(a, t) for a, t in zip(cut, lf_rows) if len(t["ids"]) <= n]
    f["llamafactory_fit_seq_len"] = len(fits)
    f["llamafactory_cut_ids_equal"] = sum(a["ids"] == t["ids"][:n] for a, t in zip(cut, lf_rows))
    fit_ok = sum(a["ids"] == t["ids"] or (t["lossy"] and t["ids"][:len(a["ids"])] == a["ids"]) for a, t in fits)
    if fit_ok != len(fits):
        f["failures"].append(f"LLaMA-Factory (cutoff_len {n}): {fit_ok}/{len(fits)} chats that fit agree")
    return f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="work in this directory (kept) instead of a temporary one")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from trajsft.data.qwen3_tokenizer import FetchError, fetch

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="check-trainers-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.time()
        tokenizer = str(fetch())
        python = trainers_python()
        t_env = time.time() - t0
        demo = export_and_cache(work, "demo", None, tokenizer)
        hostile = export_and_cache(work, "hostile", hostile_dataset(work), tokenizer)
        datasets = demo["datasets"] + hostile["datasets"]
        job = {"tokenizer": tokenizer, "work": str(work / "probe"), "datasets": [
            {k: d[k] for k in ("key", "train_args", "lf_dataset", "cutoff_lens", "messages_files", "sft_config")}
            for d in datasets]}
        (work / "job.json").write_text(json.dumps(job))
        t1 = time.time()
        r = subprocess.run([str(python), str(PROBE), str(work / "job.json"), str(work / "probe.json")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})
        if r.returncode:
            raise CheckError(f"the trainers' probe failed: {' '.join(r.stderr.split())[-1500:]}")
        t_probe = time.time() - t1
        probe = json.loads((work / "probe.json").read_text())
        im_end = AutoTokenizer.from_pretrained(tokenizer).convert_tokens_to_ids("<|im_end|>")
        figures = {d["key"]: compare(d, probe[d["key"]], im_end) for d in datasets}
    except (CheckError, FetchError) as e:
        print(f"check_trainers: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    summary = {"seconds": {"environment": round(t_env, 1), "probe": round(t_probe, 1),
                           "total": round(time.time() - t0, 1)}, "datasets": figures}
    for key, f in figures.items():
        print(f"{key}: {f['rows']} chats; TRL ids {f['trl_ids_equal']}/{f['rows']}, trained {f['trl_trained_equal']}/{f['rows']}; "
              f"LLaMA-Factory {f['llamafactory_rows']} rows (exact {f['llamafactory_rows_exact']}): ids "
              f"{f['llamafactory_ids_equal']} equal + {f['llamafactory_ids_prefix_lossy']} lossy prefix, trained "
              f"{f['llamafactory_trained_equal']} equal / {f['llamafactory_trained_equal_plus_newline']} equal plus the "
              f"newline after <|im_end|>; at cutoff_len {f['llamafactory_fit_seq_len']} fit, "
              f"{f['llamafactory_cut_ids_equal']} ids equal to trajsft's window")
        for msg in f["failures"]:
            print(f"  DISAGREES: {msg}")
    print(f"seconds: {summary['seconds']}")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=2))
    return 1 if any(f["failures"] for f in figures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
