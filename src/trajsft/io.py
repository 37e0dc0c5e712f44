"""Local-or-bucket file access (fsspec/gcsfs) with atomic local writes."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec

from .atomic import atomic_path
from .plan.config import is_remote


def fs_and_path(path: str):
    fs, p = fsspec.core.url_to_fs(path)
    return fs, p


def exists(path: str) -> bool:
    fs, p = fs_and_path(path)
    return fs.exists(p)


def write_bytes(path: str, data: bytes) -> None:
    """Local: temp + rename. Bucket: a single object PUT is all-or-nothing."""
    if is_remote(path):
        fs, p = fs_and_path(path)
        fs.pipe_file(p, data)
    else:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)


def read_bytes(path: str) -> bytes:
    fs, p = fs_and_path(path)
    return fs.cat_file(p)


def put_tree(local_dir: str | os.PathLike, dest: str) -> None:
    """Copy a local directory's files to ``dest`` (local or bucket)."""
    local_dir = Path(local_dir)
    for p in sorted(local_dir.rglob("*")):
        if p.is_file():
            write_bytes(f"{dest.rstrip('/')}/{p.relative_to(local_dir).as_posix()}", p.read_bytes())


def glob(pattern: str) -> list[str]:
    fs, p = fs_and_path(pattern)
    found = sorted(fs.glob(p))
    if is_remote(pattern):
        proto = pattern.split("://", 1)[0]
        return [f"{proto}://{f}" for f in found]
    return found
