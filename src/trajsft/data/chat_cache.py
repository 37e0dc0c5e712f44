"""Levanter chat caches written in this process: Levanter's ``ChatProcessor`` + ``SerialCacheWriter``.

Levanter's own cache builder (``build_lm_dataset_cache``) runs on Ray: a local Ray start, builder and
writer actors and tokenize workers that each re-import levanter/jax. For one machine's worth of
chats that overhead is most of the tokenize step (README "Performance"), so this thin layer streams
the shards through the same ``ChatProcessor`` and writes the same ``TreeStore`` layout and ledger
(``CacheMetadata`` with the processor's metadata, as Levanter's builder writes it), which
``train_lm`` loads as is. Tokenization uses every core through the fast tokenizer's batch encode
(``TOKENIZERS_PARALLELISM=true`` for the build).

``copy_split`` writes an existing split again in another chat order (FFD packing order, with dropped
chats left out) without tokenizing again.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterable, Iterator, Sequence

import numpy as np

BATCH = 128  # levanter.store.cache.CacheOptions.default().batch_size
COPY_BATCH = 256


def exemplar() -> dict:
    return {"input_ids": np.zeros((0,), dtype=np.int32), "assistant_masks": np.zeros((0,), dtype=np.int32)}


def iter_records(urls: Sequence[str]) -> Iterator[dict]:
    """One dict per line of ``.jsonl`` / ``.jsonl.gz`` shards (anything fsspec opens), streamed."""
    import fsspec

    for url in urls:
        with fsspec.open(url, "rt", compression="infer", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _batches(items: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for x in items:
        batch.append(x)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@contextlib.contextmanager
def _tokenizers_parallel():
    """Let the fast tokenizer's batch encode use every core (``levanter_env`` turns it off for
    subprocesses that fork); restored afterwards."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def metadata(processor):
    from levanter.store.cache import CacheMetadata

    return CacheMetadata(preprocessor_metadata=processor.metadata)


def write_split(split_dir: str, urls: Sequence[str], processor, batch_size: int = BATCH) -> int:
    """Tokenize the chats of ``urls`` in order into a finished cache split at ``split_dir``; returns rows."""
    from levanter.store.cache import SerialCacheWriter

    rows = 0
    with _tokenizers_parallel(), SerialCacheWriter(split_dir, exemplar(), metadata(processor)) as writer:
        for batch in _batches(iter_records(urls), batch_size):
            writer.write_batch(processor(batch))
            rows += len(batch)
    return rows


def copy_split(src_dir: str, dst_dir: str, order: Sequence[int], batch_size: int = COPY_BATCH) -> int:
    """Write rows ``order`` of the finished split ``src_dir`` (in that order) as a finished split ``dst_dir``."""
    from levanter.store.cache import CacheLedger, SerialCacheWriter, TreeCache

    src = TreeCache.load(src_dir, exemplar())
    meta = CacheLedger.load(src_dir).metadata
    with SerialCacheWriter(dst_dir, exemplar(), meta) as writer:
        for lo in range(0, len(order), batch_size):
            rows = src.store.get_batch_sync([int(i) for i in order[lo : lo + batch_size]])
            writer.write_batch([{k: np.asarray(v, dtype=np.int32) for k, v in r.items()} for r in rows])
    return len(order)
