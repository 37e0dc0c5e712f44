"""What each Snakemake rule does. Rule scripts call :func:`run_rule`; logic lives here."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from . import signals, storage, transform
from .atomic import write_json, write_text
from .config import STATE_DIR, Plan, is_remote
from .errors import ConfigError, DataError

log = logging.getLogger("trajsft")


USER_ERRORS = (ConfigError, DataError, transform.BadRow)


# ---- download ---------------------------------------------------------------------------
def _split_of(rel: Path) -> str:
    """HF split of a parquet file: ``data/train-00000-of-00002.parquet`` -> train."""
    stem = rel.name.split(".", 1)[0]
    head = re.split(r"[-_]", stem, maxsplit=1)[0]
    if head in HF_SPLITS:
        return head
    return next((part for part in rel.parts[:-1] if part in HF_SPLITS), "train")


HF_SPLITS = ("train", "test", "validation", "valid", "dev", "eval")


def _parquet_files(root: Path) -> tuple[list[Path], list[str]]:
    """(train split files, other splits' files). Only the train split is used: other splits
    (``test-*``, ``validation-*``) are listed in the download manifest and not downloaded."""
    files = sorted(p for p in root.glob("**/*.parquet") if not any(x.startswith(".") for x in p.relative_to(root).parts))
    train = [f for f in files if _split_of(f.relative_to(root)) == "train"]
    other = [str(f.relative_to(root)) for f in files if f not in train]
    if not train:
        found = f" (found only other splits: {', '.join(other)})" if other else ""
        raise DataError(f"{root}: no train-split parquet files in the HF dataset layout (expected data/train-*.parquet){found}")
    return train, other


def _num_rows(f: Path, rel: str) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f).metadata.num_rows
    except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError: truncated / garbage / empty file
        raise DataError(f"{rel}: not a readable parquet file ({_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def _hf_snapshot(dataset: str, revision: str, dest: Path) -> str:
    """Download a dataset repo at a pinned revision; returns the resolved commit sha."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    token = os.environ.get("HF_TOKEN") or None  # honoured, never logged
    try:
        sha = HfApi(token=token).dataset_info(dataset, revision=revision).sha or revision
        snapshot_download(
            repo_id=dataset, repo_type="dataset", revision=sha, token=token, local_dir=str(dest),
            allow_patterns=["*.parquet", "README.md"],
        )
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", "?")
        hint = " (set HF_TOKEN for gated/private datasets)" if status in (401, 403) and not token else ""
        raise DataError(f"{dataset}@{revision}: Hugging Face Hub answered HTTP {status}{hint}") from None
    except OSError as e:  # offline, DNS, ...
        raise DataError(f"{dataset}@{revision}: cannot reach the Hugging Face Hub ({type(e).__name__})") from None
    return sha


STAGING = ".staging"  # <storage_root>/raw/.staging/<raw name>.<pid>-<start>: a download in progress


def staging_root(plan: Plan) -> Path:
    """Downloads are staged under the storage root (a local dir in the workdir for gs:// roots),
    never in the system temp dir, and renamed into place when complete."""
    root = plan.root if not is_remote(plan.root) else STATE_DIR
    return Path(root, "raw", STAGING)


def remove_stale_staging(root: Path) -> list[Path]:
    """Remove staging dirs whose download process is gone (killed downloads)."""
    from .signals import process_of

    removed = []
    for d in sorted(root.glob("*")) if root.is_dir() else []:
        rid = d.name.rsplit(".", 1)[-1]
        if process_of(rid) is None:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def download(plan: Plan, name: str) -> dict:
    import psutil

    from .signals import run_id

    art = plan.get("raw", name)
    spec = art.spec
    local = plan.local_path(spec["dataset"])
    ds = spec["dataset"]
    if local is None and (spec["revision"] == "local" or ds.startswith(("/", ".", "~")) or ds.count("/") != 1):
        # a path, not a Hub id "owner/name": never fall through to the Hub
        path = ds if os.path.isabs(ds) else plan.base_dir / ds
        raise DataError(f"{spec['teacher']}: local dataset {path} does not exist (teachers.{spec['teacher']}.dataset)")
    sroot = staging_root(plan)
    for d in remove_stale_staging(sroot):
        log.info("removed the staging dir of a killed download: %s", d)
    tmp = sroot / f"{art.name}.{run_id(psutil.Process())}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)  # normal permissions (umask), unlike a mkdtemp dir
    try:
        if local is not None:
            log.info("copying local dataset %s", local)
            if not local.is_dir():
                raise DataError(f"{local}: not a directory in the HF dataset layout")
            train, _ = _parquet_files(local)
            for f in train + [p for p in [local / "README.md"] if p.exists()]:
                dst = tmp / f.relative_to(local)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst)
            resolved = "local"
        else:
            log.info("downloading %s at revision %s", spec["dataset"], spec["revision"])
            resolved = _hf_snapshot(spec["dataset"], spec["revision"], tmp)
        files, other = _parquet_files(local if local is not None else tmp)
        if local is None:
            for rel in other:  # only the train split is used
                (tmp / rel).unlink()
        files = [tmp / f.relative_to(local) for f in files] if local is not None else files
        for rel in other:
            log.warning("%s: split file %s is not used (trajsft trains on the train split only)", spec["teacher"], rel)
        counts = {str(f.relative_to(tmp)): _num_rows(f, str(f.relative_to(tmp))) for f in files}
        rows = sum(counts.values())
        if rows != spec["rows"]:
            raise DataError(
                f"{spec['teacher']}: {spec['dataset']}@{spec['revision']} has {rows} rows, config says {spec['rows']} "
                f"(teachers.{spec['teacher']}.rows): wrong revision or changed dataset"
            )
        if is_remote(art.location):
            storage.put_tree(tmp, art.location)
        else:
            dest = Path(art.location)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows, "files": counts, "ignored_split_files": other, "resolved_revision": resolved,
            "dataset": spec["dataset"], "revision": spec["revision"]}


# ---- shards -----------------------------------------------------------------------------
READ_BATCH_ROWS = 64  # parquet rows decoded at a time: memory does not grow with the dataset


def _iter_rows(raw_location: str, batch_rows: int = READ_BATCH_ROWS):
    """``(Source, row dict)`` of every train-split parquet row, streamed by record batch."""
    import pyarrow.parquet as pq

    root = raw_location.rstrip("/")
    # the raw snapshot holds only the train split (download); the filter guards older snapshots
    files = [f for f in storage.glob(root + "/**/*.parquet") if _split_of(Path(f[len(root) + 1:])) == "train"]
    if not files:
        raise DataError(f"{raw_location}: no parquet files")
    for f in files:
        fs, p = storage.fs_and_path(f)
        rel = os.path.relpath(f, raw_location) if not is_remote(f) else f
        with fs.open(p, "rb") as fh:
            try:
                pf = pq.ParquetFile(fh)
                names = pf.schema_arrow.names
            except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError: truncated / garbage / empty file
                raise DataError(f"{rel}: not a readable parquet file ({_one_line(e)})") from None
            if "messages" not in names:
                raise DataError(f"{rel}: missing column 'messages' (columns: {', '.join(names)})")
            batches = pf.iter_batches(batch_size=batch_rows)
            i = 0
            while True:
                try:
                    batch = next(batches, None)
                except Exception as e:  # noqa: BLE001 - a corrupt page / row group
                    raise DataError(f"{rel}: not a readable parquet file ({_one_line(e)})") from None
                if batch is None:
                    break
                for name, col in zip(batch.schema.names, batch.columns):
                    try:
                        col.validate(full=True)
                    except Exception as e:  # noqa: BLE001 - pyarrow.ArrowInvalid: invalid UTF-8 in a string column
                        raise DataError(f"{rel}: column '{name}': {_one_line(e)} (not valid UTF-8?)") from None
                for row in batch.to_pylist():
                    yield transform.Source(rel, i), row
                    i += 1


def skipped_path(plan: Plan, name: str) -> Path:
    """Every skipped row of a shard set, one JSON object per line, next to its manifest."""
    return Path(plan.get("shards", name).manifest).parent / "skipped.jsonl"


def shards(plan: Plan, name: str) -> dict:
    """Validated jsonl.gz shards of a raw snapshot, streamed: parquet record batches in, shards
    (cut at ``transform.SHARD_TOKENS`` estimated tokens) out as they fill."""
    art = plan.get("shards", name)
    spec = art.spec
    raw = plan.get("raw", spec["raw"])
    writers = {split: transform.ShardWriter(split, lambda fname, data: storage.write_bytes(f"{art.location}/{fname}", data))
               for split in ("train", "validation")}
    trajectories, resolved = [], []

    def sink(split: str, rec: dict) -> None:
        writers[split].add(rec)
        trajectories.append(dict(transform.trajectory_stats(rec), split=split))
        if isinstance(rec.get("resolved"), bool):
            resolved.append(rec["resolved"])

    res = transform.transform_rows(_iter_rows(raw.location), spec["teacher"], spec["transform"], sink=sink)
    listing = "".join(json.dumps(r, ensure_ascii=True, sort_keys=True) + "\n" for r in res.skipped_rows)
    write_text(skipped_path(plan, name), listing)
    if is_remote(art.location):
        storage.write_bytes(f"{art.location}/skipped.jsonl", listing.encode())
    if spec["transform"].get("strict") and res.strict_error():
        raise transform.BadRow("strict", f"{res.strict_error()}; every bad row is listed in {skipped_path(plan, name)}")
    files = {split: w.close() for split, w in writers.items()}
    files = {split: f for split, f in files.items() if f}
    kept = {split: res.kept[split] for split in ("train", "validation")}
    if not kept["train"]:
        raise DataError(f"{spec['teacher']}: no usable rows (skipped: {dict(res.skipped)})")
    for reason, n in sorted(res.skipped.items()):
        log.warning("%s: skipped %d row(s): %s", spec["teacher"], n, reason)
    return {
        "teacher": spec["teacher"],
        "rows_in": res.rows_in,
        "kept": kept,
        "kept_total": sum(kept.values()),
        "skipped": dict(sorted(res.skipped.items())),
        "skipped_total": sum(res.skipped.values()),
        "skipped_examples": res.skipped_examples,
        "skipped_list": "skipped.jsonl",
        "events": dict(sorted(res.events.items())),
        "resolved_rate": (sum(resolved) / len(resolved)) if resolved else None,
        "files": files,
        "shard_tokens": transform.SHARD_TOKENS,
        "transform": spec["transform"],
        "trajectories": sorted(trajectories, key=lambda t: t["split"] != "train"),
    }


# ---- rule entry point -------------------------------------------------------------------
STEPS: dict[str, Callable[[Plan, str], dict]] = {"download": download, "shards": shards}


def run_rule(snakemake) -> None:
    """Run one step for a Snakemake ``script:`` job; user errors become one line, exit 1.

    The step comes from ``snakemake.params.step`` (a :class:`trajsft.plan.step.Step` that
    rules/common.smk resolved once from the workflow's plan); the result goes to ``snakemake.output``.
    """
    from . import logs

    job = snakemake.params.step
    step, name, plan = job.step, job.name, job.plan
    cfg = plan.cfg
    log_path = snakemake.log[0] if snakemake.log else None
    if step not in STEPS:
        from . import steps_train  # tokenize/train need jax & levanter: import lazily
    if step == "train" and log_path:
        log_path = steps_train.link_rule_log(plan, name, log_path)
    logs.setup(log_path, cfg.get("log_level", "INFO"))
    # die with our Snakemake run (even after `kill -9` of Snakemake), cleaning up like on SIGTERM
    signals.install_stop_handler()
    detach = step == "train" and cfg.get("executor") == "ray"  # the Ray job lives on: a rerun re-attaches
    signals.watch_snakemake(on_gone=steps_train.detach_from_ray_job if detach else None, log_path=log_path)
    started = time.time()
    try:
        if step == "train":
            result = steps_train.train(plan, name, done_path=snakemake.output[0])
        elif step in STEPS:
            result = STEPS[step](plan, name)
        else:
            result = steps_train.STEPS[step](plan, name)
    except USER_ERRORS as e:
        msg = f"trajsft {step} {name}: {e}"
        log.error(msg)
        print(msg, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as e:  # SIGINT, SIGTERM (signals.SnakemakeGone), or our Snakemake died
        msg = f"trajsft {step} {name}: stopped ({e or 'SIGINT'}); nothing was marked complete"
        log.error(msg)
        with contextlib.suppress(OSError):
            print(msg, file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:  # a local Ray's SIGTERM handler is sys.exit(15)
        if e.code != signal.SIGTERM:
            raise
        msg = f"trajsft {step} {name}: stopped (got SIGTERM); nothing was marked complete"
        log.error(msg)
        with contextlib.suppress(OSError):
            print(msg, file=sys.stderr)
        sys.exit(143)
    except Exception:
        log.error("trajsft %s %s failed:\n%s", step, name, traceback.format_exc())
        raise
    if step != "train":
        art = job.artifact
        manifest = {
            "kind": art.kind, "name": art.name, "hash": art.hash, "location": art.location,
            "hash_inputs": art.inputs, "seconds": round(time.time() - started, 3), **result,
        }
        if is_remote(art.location):
            storage.write_bytes(f"{art.location}/manifest.json", json.dumps(manifest, indent=2).encode())
        write_json(snakemake.output[0], manifest)
    log.info("%s %s done in %.1fs", step, name, time.time() - started)
