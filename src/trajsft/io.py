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

from .errors import one_line


def cache_root() -> Path:
    """This machine's cache of things made once and shared by every checkout (``$TRAJSFT_CACHE``, default
    ``~/.cache/trajsft``): the real tokenizer, compile results, task images' repositories."""
    return Path(os.environ.get("TRAJSFT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trajsft"))


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


def get_tree(src: str, local_dir: str | os.PathLike) -> None:
    """Copy every file under ``src`` (local or bucket) into ``local_dir``, at the same relative paths."""
    local_dir = Path(local_dir)
    fs, root = fs_and_path(src.rstrip("/"))
    for path in sorted(fs.find(root)):
        out = local_dir / path[len(root):].lstrip("/")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(fs.cat_file(path))


def glob(pattern: str) -> list[str]:
    fs, p = fs_and_path(pattern)
    found = sorted(fs.glob(p))
    if is_remote(pattern):
        proto = pattern.split("://", 1)[0]
        return [f"{proto}://{f}" for f in found]
    return found


# ---- a place that cannot be written: full, over quota, read-only, refused ------------------------------------------

# errno -> the cause as a user reads it (OSError's own strerror for the first three)
WRITE_FAULTS = {28: "No space left on device", 122: "Disk quota exceeded", 30: "Read-only file system",
                13: "Permission denied", 1: "Operation not permitted"}
# what a child process (train_lm, a library) says in its log when it met one of them: full, quota, read-only
_FAULT_TEXTS = tuple(WRITE_FAULTS[e] for e in (28, 122, 30))


def write_fault(exc: BaseException | None) -> tuple[str, str | None] | None:
    """``(cause, path)`` when ``exc`` (or an exception it was raised from or while handling) says a place could not be
    written: a full device, a quota, a read-only file system, a refused permission; on a bucket, a 403 or a quota
    answer (429 / "quota"). None for anything else."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in WRITE_FAULTS:
            return WRITE_FAULTS[exc.errno], exc.filename
        code = getattr(exc, "code", None)
        if type(exc).__name__ == "HttpError" and (code in (403, 429) or "quota" in str(exc).lower()):
            return (f"the bucket refused the write ({code}: {one_line(exc, 200)})", None)
        text = str(exc)
        for t in _FAULT_TEXTS:  # e.g. safetensors' "I/O error: No space left on device (os error 28)"
            if t in text and not isinstance(exc, OSError):
                return t, None
        exc = exc.__cause__ or exc.__context__
    return None


def fault_in_text(text: str) -> str | None:
    """The cause of the first write fault a log ``text`` reports (a child's traceback), else None."""
    found = [(text.find(t), t) for t in _FAULT_TEXTS if t in text]
    return min(found)[1] if found else None


def free_bytes(path: str) -> int | None:
    """Free bytes on the local file system holding ``path`` (its nearest existing parent); None for a bucket."""
    if is_remote(path):
        return None
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def fault_line(root: str, cause: str, path: str | None = None) -> str:
    """One line for a write fault met by a step whose storage root is ``root``: the place, the cause, and for a full
    local device what is free."""
    inside = path is None or is_remote(root) or Path(str(path)).absolute().is_relative_to(Path(root).absolute())
    place = root if inside else str(path)
    what = "the storage root" if inside else "the path"
    if cause == WRITE_FAULTS[28]:
        free = free_bytes(str(place))
        room = "" if free is None else f"; {free / 2**20:.1f} MiB free"
        line = f"{what} {place} is full: {cause}{room}"
    elif cause == WRITE_FAULTS[122]:
        line = f"{what} {place} is over its quota: {cause}"
    elif cause == WRITE_FAULTS[30]:
        line = f"{what} {place} is read-only: {cause}"
    else:
        line = f"{what} {place} cannot be written: {cause}"
    if path and inside:
        line += f" (writing {path})"
    return line + "; free space or point storage_root elsewhere, then run the same command again"
