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
    keys = {d: _sort_key(fs, d) for d in ckpt_dirs}
    # one difference: a metadata.json cut off mid-write (a kill during Levanter's last save step, on a local
    # root) is not a checkpoint here, where Levanter's json.load would raise; set_aside_cut_checkpoints moves
    # it out of Levanter's way before a launch
    ckpt_dirs = [d for d in ckpt_dirs if keys[d] is not None]
    return max(ckpt_dirs, key=keys.__getitem__) if ckpt_dirs else None


def _sort_key(fs, ckpt_dir: str):
    """Levanter's sort key (timestamp, step) from ``ckpt_dir/metadata.json``, or None if it is unreadable."""
    import datetime
    import json

    try:
        with fs.open(os.path.join(ckpt_dir, "metadata.json")) as f:
            metadata = json.load(f)
        return (datetime.datetime.fromisoformat(metadata["timestamp"]), int(metadata["step"]))
    except (ValueError, KeyError, TypeError):  # JSONDecodeError is a ValueError
        return None


CUT_OFF = "metadata.json.cut-off"


def set_aside_cut_checkpoints(checkpoint_path: str) -> list[str]:
    """Rename the ``metadata.json`` Levanter could not finish writing (empty or partial: the process was killed
    while saving) to ``metadata.json.cut-off`` in every checkpoint dir under ``checkpoint_path``, so Levanter's
    own discovery, which would raise on it, resumes from the checkpoint before. The tensors of that dir may be
    complete but nothing vouches for them. Returns the dirs set aside."""
    import fsspec

    fs, _, _ = fsspec.get_fs_token_paths(str(checkpoint_path))
    if not fs.exists(checkpoint_path):
        return []
    cut = []
    for meta in sorted(fs.glob(os.path.join(str(checkpoint_path), "*", "metadata.json"))):
        d = os.path.dirname(meta)
        if _sort_key(fs, d) is None:
            fs.mv(meta, os.path.join(d, CUT_OFF))
            cut.append(d)
    return cut


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
