"""Levanter chat caches written in this process: Levanter's ``ChatProcessor`` + ``SerialCacheWriter``.

Levanter's own cache builder (``build_lm_dataset_cache``) runs on Ray: a local Ray start, builder and
writer actors and tokenize workers that each re-import levanter/jax. For one machine's worth of
chats that overhead is most of the tokenize step (docs/performance.md), so this thin layer streams
the shards through the same ``ChatProcessor`` and writes the same ``TreeStore`` layout and ledger
(``CacheMetadata`` with the processor's metadata, as Levanter's builder writes it), which
``train_lm`` loads as is. Tokenization uses every core through the fast tokenizer's batch encode
(``TOKENIZERS_PARALLELISM=true`` for the build).

Large inputs (``POOL_MIN_BYTES`` of shards or more) are tokenized by a pool of forked worker processes,
one per core, each running the same ``ChatProcessor`` object on whole chats, while this process reads
the shards and writes the results in shard order. The processor's Python part (HF
``apply_chat_template``: Jinja rendering, the assistant mask, the id lists) is single-threaded and
cannot overlap with the tokenizer's batch encode in one process; in the pool every part runs on
every core. The pool is forked before any tensorstore writer exists (``tokenize_pool``), the
workers only call the processor (never jax; the tokenizer's own thread pool is off in them, one
process per core instead) and exit with this process. Each chat is tokenized on its own by the
processor (the batch only groups calls), so the cache holds the same rows in the same order either
way (``tests/test_packing.py`` compares both paths on token ids).

``copy_split`` writes an existing split again in another chat order (FFD packing order, with dropped
chats left out) without tokenizing again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections import deque
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

BATCH = 128  # levanter.store.cache.CacheOptions.default().batch_size
COPY_BATCH = 256


def exemplar() -> dict:
    return {"input_ids": np.zeros((0,), dtype=np.int32), "assistant_masks": np.zeros((0,), dtype=np.int32)}


# shards of at least this many bytes (as stored, summed over a cache's splits) are tokenized by a
# worker pool; smaller builds (the demo's 36 KB, ~0.4M tokens of the benchmark's chats) take a second or
# two in one process and do not pay the fork (docs/performance.md; the crossover is not measured)
POOL_MIN_BYTES = 1 << 20
# and only on machines with at least this many cores: on 2 cores the pool measured 0.77x of one
# process on a quiet machine (two single-threaded workers plus the writer on 2 cores, against one
# process whose encode already uses both), so there the build stays in one process
POOL_MIN_CPUS = 4
# a pool task: whole chats, up to this many bytes of JSON (or BATCH chats): small enough to keep
# every worker busy to the end
POOL_TASK_BYTES = 256 << 10


def iter_lines(urls: Sequence[str]) -> Iterator[str]:
    """The non-empty lines of ``.jsonl`` / ``.jsonl.gz`` shards (anything fsspec opens), streamed."""
    import fsspec

    for url in urls:
        with fsspec.open(url, "rt", compression="infer", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield line


def iter_records(urls: Sequence[str]) -> Iterator[dict]:
    """One dict per line of ``.jsonl`` / ``.jsonl.gz`` shards (anything fsspec opens), streamed."""
    for line in iter_lines(urls):
        yield json.loads(line)


def shard_bytes(urls: Sequence[str]) -> int:
    """Summed size of the shard files as stored (compressed)."""
    import fsspec

    total = 0
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        total += int(fs.size(path) or 0)
    return total


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


def write_split(split_dir: str, urls: Sequence[str], processor, batch_size: int = BATCH, pool=None,
                progress=None) -> int:
    """Tokenize the chats of ``urls`` in order into a finished cache split at ``split_dir``; returns rows.

    With ``pool`` (a :func:`tokenize_pool` made for this ``processor``) the chats are tokenized by
    its workers and written here in shard order; the rows are the same. ``progress``
    (:class:`trajsft.terminal.Counted`) counts each batch written."""
    from levanter.store.cache import SerialCacheWriter

    if pool is not None:  # the workers tokenize (one process per core: no tokenizer threads here)
        outputs, parallel = _pooled(pool, _tasks(iter_lines(urls), batch_size)), contextlib.nullcontext()
    else:
        outputs = (processor(batch) for batch in _batches(iter_records(urls), batch_size))
        parallel = _tokenizers_parallel()
    rows = 0
    with parallel, SerialCacheWriter(split_dir, exemplar(), metadata(processor)) as writer:
        for out in outputs:
            writer.write_batch(out)
            rows += len(out)
            if progress is not None:
                progress.add(len(out))
    return rows


# ---- the worker pool ---------------------------------------------------------------------------
_WORKER_PROCESSOR = None  # the processor a forked worker inherits (set just before the fork)


def _worker_init() -> None:
    # one process per core: the tokenizer's own thread pool stays off (tokenizers also turns it off
    # after a fork); SIGINT/SIGTERM are for the parent, which ends the pool
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(Exception):  # die with the parent even if it is SIGKILLed (Linux)
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _work(lines: list[str]) -> list[dict]:
    return list(_WORKER_PROCESSOR([json.loads(line) for line in lines]))


def _tasks(lines: Iterable[str], max_chats: int, max_bytes: int = POOL_TASK_BYTES) -> Iterator[list[str]]:
    task: list[str] = []
    size = 0
    for line in lines:
        task.append(line)
        size += len(line)
        if len(task) >= max_chats or size >= max_bytes:
            yield task
            task, size = [], 0
    if task:
        yield task


def _pooled(pool, tasks: Iterable[list[str]]) -> Iterator[list[dict]]:
    """The workers' results of ``tasks`` in order, at most two tasks per worker in flight (the
    shards are read only as fast as they are tokenized)."""
    pending: deque = deque()
    limit = 2 * pool.trajsft_workers
    for task in tasks:
        pending.append(pool.apply_async(_work, (task,)))
        if len(pending) >= limit:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def pool_workers(total_bytes: int, workers: Optional[int] = None) -> int:
    """How many worker processes a build of ``total_bytes`` of shards uses (0: none, in this process).

    ``workers`` forces a pool of that size (the benchmark and tests); by default one worker per core,
    on machines with at least ``POOL_MIN_CPUS`` cores."""
    if workers is None:
        n = os.cpu_count() or 1
        if n < POOL_MIN_CPUS:
            return 0
    else:
        n = workers
    return n if n > 1 and total_bytes >= POOL_MIN_BYTES else 0


@contextlib.contextmanager
def tokenize_pool(processor, workers: int):
    """``workers`` forked processes that run ``processor`` (``None`` if ``workers`` is 0).

    Call it before any cache writer is open: the fork copies this process as it is."""
    global _WORKER_PROCESSOR
    if workers <= 0:
        yield None
        return
    import multiprocessing

    _WORKER_PROCESSOR = processor
    # set (restored afterwards), so that a worker of a parent that already ran the tokenizer in
    # parallel does not print tokenizers' "just got forked" warning
    with _tokenizers_parallel():
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)
        pool.trajsft_workers = workers  # what _pooled keeps in flight (not the pool's private _processes)
        try:
            yield pool
            pool.close()
            pool.join()
        finally:
            pool.terminate()
            _WORKER_PROCESSOR = None


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
