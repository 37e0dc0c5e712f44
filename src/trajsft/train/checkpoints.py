"""What a run has written: the latest trainer checkpoint and whether an HF export is complete."""

from __future__ import annotations

import os
from typing import Optional

from ..io import exists, filesystem, is_remote, read_json


# --------------------------------------------------------------------------------------
# checkpoints, exports, metrics
# --------------------------------------------------------------------------------------


def discover_latest_checkpoint(checkpoint_path: str) -> Optional[str]:
    """``levanter.checkpoint.discover_latest_checkpoint`` (Levanter 1.2.dev1644): the same fsspec
    calls, candidates and sort key, without importing ``levanter.checkpoint``, which imports jax and
    Levanter (~5 CPU-s in the train rule's process, which only launches and waits for its train_lm
    child; docs/performance.md, "No wasted work"). ``tests/test_levanter_run.py`` checks it against Levanter's on
    local and ``memory://`` layouts."""
    import datetime
    import json
    import urllib.parse

    import fsspec

    checkpoint_path = str(checkpoint_path)
    fs, _, _ = fsspec.get_fs_token_paths(checkpoint_path)

    def is_checkpoint_dir(path: str) -> bool:
        return fs.exists(os.path.join(path, "metadata.json"))

    def maybe_unstrip_protocol(path: str) -> str:
        base_path_protocol = urllib.parse.urlparse(checkpoint_path).scheme
        if base_path_protocol != "" and not urllib.parse.urlparse(path).scheme != "":
            return f"{base_path_protocol}://{path}"
        return path

    ckpt_dirs = [maybe_unstrip_protocol(d) for d in fs.glob(os.path.join(checkpoint_path, "*")) if fs.isdir(d)]
    ckpt_dirs.append(checkpoint_path)
    ckpt_dirs = [d for d in ckpt_dirs if is_checkpoint_dir(d)]

    def checkpoint_sort_key(ckpt_dir: str):
        with fs.open(os.path.join(ckpt_dir, "metadata.json")) as f:
            metadata = json.load(f)
        return (datetime.datetime.fromisoformat(metadata["timestamp"]), metadata["step"])

    return max(ckpt_dirs, key=checkpoint_sort_key) if ckpt_dirs else None


def latest_checkpoint(checkpoint_dir: str) -> Optional[dict]:
    """The checkpoint Levanter resumes from (``levanter.checkpoint.discover_latest_checkpoint``: a
    subdir with ``metadata.json``, newest by (timestamp, step)), with what callers need from its
    metadata: ``{"path", "step" (metadata step = 0-based index of the last completed step),
    "completed_steps" (step + 1 = trainer state step), "is_temporary", "timestamp"}``, or None."""
    if not exists(checkpoint_dir):
        return None
    d = discover_latest_checkpoint(checkpoint_dir)
    if d is None:
        return None
    meta = read_json(os.path.join(d, "metadata.json"))
    return {
        "path": d,
        "step": int(meta["step"]),
        "completed_steps": int(meta["step"]) + 1,
        "is_temporary": bool(meta.get("is_temporary", False)),
        "timestamp": meta["timestamp"],
    }


def hf_export_complete(path: str) -> bool:
    """True if ``path`` is a finished HF export: ``config.json`` (Levanter writes it after the
    weights) and every safetensors file (single or the ones named in the index) with a readable
    header."""
    if is_remote(path):
        fs = filesystem(path)
        if not fs.exists(os.path.join(path, "config.json")):
            return False
        idx = os.path.join(path, "model.safetensors.index.json")
        if fs.exists(idx):
            files = set(read_json(idx)["weight_map"].values())
            return all(fs.exists(os.path.join(path, f)) for f in files)
        return fs.exists(os.path.join(path, "model.safetensors"))
    if not os.path.isfile(os.path.join(path, "config.json")):
        return False
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(idx):
        files = sorted(set(read_json(idx)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    try:
        from safetensors import safe_open

        for f in files:
            with safe_open(os.path.join(path, f), framework="numpy") as sf:
                sf.keys()
    except Exception:  # noqa: BLE001 - missing / truncated file
        return False
    return True
