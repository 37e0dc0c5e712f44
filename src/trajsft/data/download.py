"""Step ``download``: a teacher's dataset snapshot from the HF Hub (or a local dir) into ``raw/``."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from .. import io
from ..errors import DataError, one_line
from ..io import is_remote
from ..plan.step_configs import DownloadConfig
from ..runtime.hub import dataset_snapshot

log = logging.getLogger("trajsft")


# ---- download ---------------------------------------------------------------------------
def split_of(rel: Path) -> str:
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
    train = [f for f in files if split_of(f.relative_to(root)) == "train"]
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
        raise DataError(f"{rel}: not a readable parquet file ({one_line(e, 200)})") from None


def _hf_snapshot(dataset: str, revision: str, dest: Path) -> str:
    """Download a dataset repo at a pinned revision; returns the resolved commit sha."""
    return dataset_snapshot(dataset, revision, dest, ["*.parquet", "README.md"])


def remove_stale_staging(root: Path) -> list[Path]:
    """Remove staging dirs whose download process is gone (killed downloads)."""
    from ..runtime.signals import process_of

    removed = []
    for d in sorted(root.glob("*")) if root.is_dir() else []:
        rid = d.name.rsplit(".", 1)[-1]
        if process_of(rid) is None:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def download(cfg: DownloadConfig) -> dict:
    from ..runtime.signals import own_run_id

    local, ds = cfg.local_dataset, cfg.dataset
    if local is None and (cfg.revision == "local" or ds.startswith(("/", ".", "~")) or ds.count("/") != 1):
        # a path, not a Hub id "owner/name": never fall through to the Hub
        path = ds if os.path.isabs(ds) else cfg.base_dir / ds
        raise DataError(f"{cfg.teacher}: local dataset {path} does not exist (teachers.{cfg.teacher}.dataset)")
    for d in remove_stale_staging(cfg.staging):
        log.info("removed the staging dir of a killed download: %s", d)
    tmp = cfg.staging / f"{cfg.name}.{own_run_id()}"
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
            log.info("downloading %s at revision %s", cfg.dataset, cfg.revision)
            resolved = _hf_snapshot(cfg.dataset, cfg.revision, tmp)
        files, other = _parquet_files(local if local is not None else tmp)
        if local is None:
            for rel in other:  # only the train split is used
                (tmp / rel).unlink()
        files = [tmp / f.relative_to(local) for f in files] if local is not None else files
        for rel in other:
            log.warning("%s: split file %s is not used (trajsft trains on the train split only)", cfg.teacher, rel)
        counts = {str(f.relative_to(tmp)): _num_rows(f, str(f.relative_to(tmp))) for f in files}
        rows = sum(counts.values())
        if rows != cfg.rows:
            raise DataError(
                f"{cfg.teacher}: {cfg.dataset}@{cfg.revision} has {rows} rows, config says {cfg.rows} "
                f"(teachers.{cfg.teacher}.rows): wrong revision or changed dataset"
            )
        if is_remote(cfg.location):
            io.put_tree(tmp, cfg.location)
        else:
            dest = Path(cfg.location)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows, "files": counts, "ignored_split_files": other, "resolved_revision": resolved,
            "dataset": cfg.dataset, "revision": cfg.revision}
