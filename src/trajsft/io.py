"""The one local-or-bucket file layer (fsspec/gcsfs): paths, reads, and atomic writes.

A path with ``://`` is a bucket URL; anything else is local. Local writes go to a temp file next
to the target and are renamed into place only if they succeed, so a killed job never leaves a half
file that looks complete; a bucket object PUT is all-or-nothing by itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


def is_remote(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def join(root: str, *parts: str) -> str:
    if is_remote(root):
        return "/".join([root.rstrip("/"), *parts])
    return str(Path(root, *parts))


def filesystem(path: str):
    """The fsspec filesystem of ``path`` (its methods take the full URL)."""
    import fsspec

    return fsspec.core.url_to_fs(str(path))[0]


def fs_and_path(path: str):
    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    return fs, p


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    fs, p = fs_and_path(path)
    return fs.exists(p)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to ``path``; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Local: temp + rename. Bucket: a single object PUT is all-or-nothing."""
    if is_remote(path):
        fs, p = fs_and_path(str(path))
        fs.pipe_file(p, data)
    else:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2, sort_keys: bool = True, end: str = "\n") -> None:
    """``obj`` as JSON; the defaults are the pipeline's manifests (sorted keys, final newline)."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + end)


def read_bytes(path: str) -> bytes:
    fs, p = fs_and_path(path)
    return fs.cat_file(p)


def read_json(path: str | os.PathLike):
    if is_remote(path):
        # one GET of the whole object: gcsfs' open() reads as many bytes as a listing it cached said, so an
        # object rewritten longer meanwhile (attempts.json while the driver updates it) came back cut short
        return json.loads(read_bytes(str(path)))
    with open(path) as f:
        return json.load(f)


def tail(path: str | os.PathLike, n: int = 20) -> list[str]:
    """The last ``n`` lines, reading backwards in blocks (logs can be large, lines long)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            pos, buf = f.tell(), b""
            while pos > 0 and buf.count(b"\n") <= n:
                step = min(pos, 1 << 16)
                pos -= step
                f.seek(pos)
                buf = f.read(step) + buf
    except FileNotFoundError:
        return []
    return buf.decode(errors="replace").splitlines()[-n:] if n > 0 else []


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
