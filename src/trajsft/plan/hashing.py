"""Content hashes for artifact names.

An artifact's name is ``<readable-name>-<short hash>``; the hash covers everything that
affects the artifact's bytes (see docs/training-and-content-addressing.md) and nothing cosmetic.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

SHORT = 10  # hex digits in a name; 40 bits is plenty for a few thousand artifacts


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"cannot hash non-finite float {obj!r}")
        # 4e-5 written as 0.00004 or 4.0e-05 must hash the same; ints and integral floats too
        return int(obj) if obj.is_integer() else repr(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    raise TypeError(f"cannot hash value of type {type(obj).__name__}: {obj!r}")


def canonical_json(obj: Any) -> str:
    return json.dumps(_canonical(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(obj: Any) -> str:
    """Full sha256 hex digest of a JSON-able value (key order and float spelling ignored)."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def short(obj: Any) -> str:
    return digest(obj)[:SHORT]


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: str | os.PathLike) -> str:
    """Digest of a local directory's files (relative paths + contents; hidden files ignored)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_dir() or any(part.startswith(".") for part in rel.parts):
            continue
        h.update(str(rel).encode() + b"\0" + file_digest(p).encode() + b"\n")
    return h.hexdigest()
