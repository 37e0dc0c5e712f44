"""Each step's typed config, resolved from the plan where the rule job starts: the step function reads this and
nothing else of the plan, so a test can build one by hand and run the step alone (as marin hands each step its
resolved config). A kind's record names its resolver (:attr:`trajsft.plan.kinds.Kind.config`).

The data steps have theirs (download, shard, tokenize); the later steps still take ``(plan, name)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..io import is_remote
from .config import STATE_DIR, Plan

STAGING = ".staging"  # <storage_root>/raw/.staging/<raw name>.<pid>-<start>: a download in progress


@dataclass(frozen=True)
class DownloadConfig:
    """One teacher's dataset at a pinned revision, to ``location`` (``raw/<name>``)."""

    name: str  # the raw artifact's name
    teacher: str
    dataset: str  # a Hub id "owner/name", or a path
    revision: str
    rows: int  # the train split's rows, as the config says (a mismatch fails)
    location: str  # where the payload goes: a local dir or gs://
    local_dataset: Path | None  # the dataset as a local directory when it is one, else None (the Hub)
    base_dir: Path  # what a relative dataset path is relative to
    # where a download is staged, then renamed into place: under the storage root (the workdir's results/ for a
    # gs:// root), never the system temp dir
    staging: Path


@dataclass(frozen=True)
class ShardConfig:
    """Validated jsonl.gz shards of one raw snapshot, to ``location`` (``shards/<name>``)."""

    name: str
    teacher: str
    transform: Mapping[str, Any]  # the teacher's transform settings (repairs, strict, ...)
    raw_location: str  # the raw snapshot it reads
    location: str
    skipped_list: Path  # every skipped row, one JSON object per line, next to the manifest


@dataclass(frozen=True)
class TokenizeConfig:
    """The Levanter chat cache of one shard set in packing order, to ``location`` (``tokenized/<name>``)."""

    name: str
    teacher: str
    tokenizer: str  # a Hub id or a local directory
    seq_len: int
    long_chats: str  # what happens to a chat longer than seq_len (keep: windowed, drop)
    shards_location: str
    shard_files: Mapping[str, list[str]]  # split -> the shard files (relative to shards_location), in order
    location: str


def download(plan: Plan, name: str) -> DownloadConfig:
    art = plan.get("raw", name)
    spec = art.spec
    root = plan.root if not is_remote(plan.root) else STATE_DIR
    return DownloadConfig(name=art.name, teacher=spec["teacher"], dataset=spec["dataset"], revision=spec["revision"],
                          rows=int(spec["rows"]), location=art.location, local_dataset=plan.local_path(spec["dataset"]),
                          base_dir=plan.base_dir, staging=Path(root, "raw", STAGING))


def shard(plan: Plan, name: str) -> ShardConfig:
    art = plan.get("shards", name)
    spec = art.spec
    return ShardConfig(name=art.name, teacher=spec["teacher"], transform=spec["transform"],
                       raw_location=plan.get("raw", spec["raw"]).location, location=art.location,
                       skipped_list=Path(art.manifest).parent / "skipped.jsonl")


def tokenize(plan: Plan, name: str) -> TokenizeConfig:
    """Run where the job starts: it reads the shard set's manifest (its files), written by the shard job."""
    art = plan.get("tokenized", name)
    spec = art.spec
    shards = plan.get("shards", spec["shards"])
    return TokenizeConfig(name=art.name, teacher=spec["teacher"], tokenizer=spec["tokenizer"],
                          seq_len=int(spec["seq_len"]), long_chats=spec["long_chats"], shards_location=shards.location,
                          shard_files=dict(shards.read_manifest()["files"]), location=art.location)
