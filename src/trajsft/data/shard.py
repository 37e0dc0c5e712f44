"""Step ``shards``: validate, repair and transform the raw rows into jsonl.gz chat shards."""

from __future__ import annotations

import logging
import json
import os
from pathlib import Path

from .. import io
from ..errors import DataError, one_line
from ..io import is_remote, write_text
from ..plan import tools
from ..plan.step_configs import ShardConfig
from ..terminal import Counted
from . import transform
from .download import split_of

log = logging.getLogger("trajsft")


# ---- shards -----------------------------------------------------------------------------
READ_BATCH_ROWS = 64  # parquet rows decoded at a time: memory does not grow with the dataset


def _iter_rows(raw_location: str, batch_rows: int = READ_BATCH_ROWS):
    """``(Source, row dict)`` of every train-split parquet row, streamed by record batch."""
    import pyarrow.parquet as pq

    root = raw_location.rstrip("/")
    # the raw snapshot holds only the train split (download); the filter guards older snapshots
    files = [f for f in io.glob(root + "/**/*.parquet") if split_of(Path(f[len(root) + 1:])) == "train"]
    if not files:
        raise DataError(f"{raw_location}: no parquet files")
    for f in files:
        fs, p = io.fs_and_path(f)
        # relative to the snapshot under any root: skipped rows name the same file locally and in a bucket
        rel = os.path.relpath(f, raw_location) if not is_remote(f) else f[len(root) + 1:]
        with fs.open(p, "rb") as fh:
            try:
                pf = pq.ParquetFile(fh)
                names = pf.schema_arrow.names
            except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError: truncated / garbage / empty file
                raise DataError(f"{rel}: not a readable parquet file ({one_line(e, 200)})") from None
            if "messages" not in names:
                raise DataError(f"{rel}: missing column 'messages' (columns: {', '.join(names)})")
            batches = pf.iter_batches(batch_size=batch_rows)
            i = 0
            while True:
                try:
                    batch = next(batches, None)
                except Exception as e:  # noqa: BLE001 - a corrupt page / row group
                    raise DataError(f"{rel}: not a readable parquet file ({one_line(e, 200)})") from None
                if batch is None:
                    break
                for name, col in zip(batch.schema.names, batch.columns):
                    try:
                        col.validate(full=True)
                    except Exception as e:  # noqa: BLE001 - pyarrow.ArrowInvalid: invalid UTF-8 in a string column
                        raise DataError(f"{rel}: column '{name}': {one_line(e, 200)} (not valid UTF-8?)") from None
                for row in batch.to_pylist():
                    yield transform.Source(rel, i), row
                    i += 1


def shard(cfg: ShardConfig) -> dict:
    """Validated jsonl.gz shards of a raw snapshot, streamed: parquet record batches in, shards
    (cut at ``transform.SHARD_TOKENS`` estimated tokens) out as they fill."""
    writers = {split: transform.ShardWriter(split, lambda fname, data: io.write_bytes(f"{cfg.location}/{fname}", data))
               for split in ("train", "validation")}
    trajectories, resolved = [], []

    def sink(split: str, rec: dict) -> None:
        writers[split].add(rec)
        trajectories.append(dict(transform.trajectory_stats(rec), split=split))
        if isinstance(rec.get("resolved"), bool):
            resolved.append(rec["resolved"])

    rows = Counted(f"trajsft shard {cfg.name}", cfg.rows).counting(_iter_rows(cfg.raw_location))
    res = transform.transform_rows(rows, cfg.teacher, cfg.transform, sink=sink, tools=cfg.tools)
    listing = "".join(json.dumps(r, ensure_ascii=True, sort_keys=True) + "\n" for r in res.skipped_rows)
    write_text(cfg.skipped_list, listing)
    if str(cfg.skipped_list) != io.join(cfg.location, "skipped.jsonl"):  # in the payload too
        io.write_bytes(io.join(cfg.location, "skipped.jsonl"), listing.encode())
    if cfg.transform.get("strict") and res.strict_error():
        raise transform.BadRow("strict", f"{res.strict_error()}; every bad row is listed in {cfg.skipped_list}")
    files = {split: w.close() for split, w in writers.items()}
    files = {split: f for split, f in files.items() if f}
    kept = {split: res.kept[split] for split in ("train", "validation")}
    if not kept["train"]:
        raise DataError(f"{cfg.teacher}: no usable rows (skipped: {dict(res.skipped)})")
    for reason, n in sorted(res.skipped.items()):
        log.warning("%s: skipped %d row(s): %s", cfg.teacher, n, reason)
    return {
        "teacher": cfg.teacher,
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
        "transform": cfg.transform,
        "tools": tools.names(cfg.tools),  # the functions every call was checked against
        "trajectories": sorted(trajectories, key=lambda t: t["split"] != "train"),
    }
