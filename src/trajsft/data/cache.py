"""Levanter chat caches: build (in this process), reorder, and their token statistics.

``build_chat_cache(train_urls, validation_urls, cache_dir, tokenizer, chat_template, ...) -> dict``
    Tokenize ``.jsonl(.gz)`` chat shards into Levanter's chat cache with Levanter's own processor
    and writer (``ChatLmDatasetFormat``'s ``ChatProcessor``, ``SerialCacheWriter``), so
    ``train_lm`` later loads the identical cache. Returns token statistics read back from the cache.
``chat_cache_stats(cache_dir, seq_len=None) -> dict``
    The same statistics for an existing cache (no rebuild).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
import uuid
from typing import Any, Iterable, Mapping, Optional, Sequence

from ..errors import DataError
from ..io import filesystem, is_remote, read_json, write_json
from ..terminal import Counted
from .packing import MAX_SEGMENTS


# Levanter's chat format: pack several chats per sequence, loss only on assistant tokens
# (the template's {% generation %} ... {% endgeneration %} spans).
CHAT_FORMAT: dict = {"type": "chat", "pack": True, "mask_user_turns": True}

_SPLITS = ("train", "validation")
_STATS_FILE = "trajsft_cache_stats.json"


# what a tokenizer needs from a model repo (no weights)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja", "tokenizer.model", "config.json",
                   "generation_config.json"]


def resolve_tokenizer(ref: str) -> str:
    """A pinned Hub tokenizer ``repo@revision`` as a local snapshot of that revision (tokenizer files only).

    Levanter's data config loads its tokenizer with ``AutoTokenizer.from_pretrained(name)`` and no
    revision; its ``initialize_from_hf`` does understand ``repo@revision``. This thin layer gives the
    tokenizer the same pin. A gs:// (any remote) dir is copied to a local one (its tokenizer files, once per
    process): transformers' ``from_pretrained`` asks the Hub for a remote path's file list (``additional_chat_templates``,
    which Levanter's gs:// patch of ``hf_hub_download`` does not cover) and fails with RepositoryNotFoundError.
    Local dirs and unpinned names pass through unchanged."""
    if is_remote(ref):
        return _local_tokenizer_copy(ref)
    if "@" not in ref or os.path.exists(ref):
        return ref
    repo, revision = ref.rsplit("@", 1)
    from huggingface_hub import snapshot_download

    return snapshot_download(repo, revision=revision, allow_patterns=TOKENIZER_FILES)


@functools.lru_cache(maxsize=None)
def _local_tokenizer_copy(ref: str) -> str:
    """The tokenizer files of the remote dir ``ref`` in a fresh local dir (removed when the process exits)."""
    import atexit
    import tempfile

    fs = filesystem(ref)
    present = {os.path.basename(p.rstrip("/")) for p in fs.ls(ref, detail=False)}
    files = [f for f in TOKENIZER_FILES if f in present]
    if not any(f in files for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise DataError(f"{ref}: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json)")
    local = tempfile.mkdtemp(prefix="trajsft-tokenizer-")
    atexit.register(shutil.rmtree, local, True)
    for f in files:
        fs.get(f"{ref.rstrip('/')}/{f}", os.path.join(local, f))
    return local


# --------------------------------------------------------------------------------------
# chat cache
# --------------------------------------------------------------------------------------


def chat_format(chat_template: Optional[str], messages_field: str = "messages") -> dict:
    """``ChatLmDatasetFormat``: packed chats, loss on the assistant turns only, our template (the train_lm
    config's data format and the cache build's)."""
    fmt = dict(CHAT_FORMAT)
    fmt["messages_field"] = messages_field
    if chat_template is not None:
        # NB: the template must live in the *format*; ``data.chat_template`` is not used by the
        # chat cache processor in this Levanter version.
        fmt["chat_template"] = chat_template
    return fmt


def split_finished(split_dir: str) -> bool:
    """True if ``split_dir`` holds a finished Levanter cache (ledger says is_finished)."""
    ledger = os.path.join(split_dir, "shard_ledger.json")
    try:
        return bool(read_json(ledger).get("is_finished", False))
    except (FileNotFoundError, OSError, ValueError):
        return False


def _cache_complete(cache_dir: str, splits: Iterable[str]) -> bool:
    return all(split_finished(os.path.join(cache_dir, s)) for s in splits)


def _cleanup_stale_builds(parent: str, base: str) -> None:
    """Remove ``.<base>.building-<run id>-*`` dirs left by killed builds: the run id (pid and start time,
    :func:`trajsft.runtime.signals.run_id`) names no live process. A killed builder that is still a zombie
    (its parent died with it and init has not reaped it yet) is dead, and a pid reused by another
    process is not the builder."""
    from ..runtime.signals import process_of

    prefix = f".{base}.building-"
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        rid = "-".join(name[len(prefix):].split("-")[:2])
        proc = process_of(rid)
        if proc is None or proc.pid == os.getpid():
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def build_chat_cache(
    train_urls: Sequence[str],
    validation_urls: Sequence[str],
    cache_dir: str,
    tokenizer: str,
    chat_template: str,
    *,
    messages_field: str = "messages",
    seq_len: Optional[int] = None,
    workers: Optional[int] = None,
    tools: Optional[list[dict]] = None,
    progress: Optional[Counted] = None,
) -> dict:
    """Build Levanter chat caches ``<cache_dir>/train`` (and ``/validation``) from chat shards.

    Shards are ``.jsonl`` / ``.jsonl.gz`` files (anything fsspec opens; compression is inferred from
    the extension) with one ``{"messages": [...OpenAI chat...], ...}`` object per line; extra keys
    (``traj_id`` ...) are ignored. Tokenization is Levanter's ``ChatProcessor`` (the processor
    ``preprocessor_for_format`` gives for ``ChatLmDatasetFormat``) with
    ``tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)``, i.e. exactly what
    ``train_lm`` would build, so training loads this cache as is. Every chat must contain at least
    one assistant turn (Levanter raises otherwise) and the template needs ``{% generation %}`` tags. With
    ``tools`` (the teacher's) every chat renders with their block (``trajsft.data.chat_processor``, Levanter's
    processor passing ``tools``).

    The shards stream through that processor into Levanter's ``SerialCacheWriter`` in this process
    (``trajsft.data.chat_cache``): the rows and ledger metadata Levanter's own Ray cache builder
    (``build_lm_dataset_cache``) writes, 3.4x faster than it on the demo (docs/performance.md).
    ``workers`` forked processes run the processor (default: one per core once the shards reach
    ``chat_cache.POOL_MIN_BYTES``, else none; ``0``: none); the rows are the same. ``progress`` counts the chats
    written (a line on the terminal at a bounded rate).

    Kill safety: for local paths the cache is built in a hidden sibling directory
    ``.<name>.building-<pid>-<rand>`` and renamed to ``cache_dir`` only when every split is finished
    and the statistics were computed (stale build dirs of dead processes are removed on the next
    call). If ``cache_dir`` already holds a finished cache it is not rebuilt; only the stats are
    recomputed. For ``gs://`` (or other remote) paths there is no atomic rename: the cache is built
    in place, and safety relies on Levanter's own ledger: ``shard_ledger.json`` gets
    ``is_finished: true`` only at the end, training refuses (``run_training``) / Levanter never
    loads an unfinished cache; a rerun starts an unfinished split over (the writer opens its arrays
    with ``delete_existing``).
    tensorstore writes ``gs://`` through its ``gcs`` kvstore driver (JAX's ``get_tensorstore_spec``).

    Returns ``chat_cache_stats(cache_dir, seq_len)`` (also written to
    ``<cache_dir>/trajsft_cache_stats.json``).
    """
    train_urls = [str(u) for u in train_urls]
    validation_urls = [str(u) for u in (validation_urls or [])]
    if not train_urls:
        raise ValueError("build_chat_cache: no train_urls")
    splits = {"train": train_urls}
    if validation_urls:
        splits["validation"] = validation_urls

    remote = is_remote(cache_dir)
    final_dir = cache_dir if remote else os.path.abspath(cache_dir)

    def finish_stats(stats: dict) -> dict:
        stats["cache_dir"] = final_dir
        stats["tokenizer"] = tokenizer
        stats["source_urls"] = {k: list(v) for k, v in splits.items()}
        return stats

    if _cache_complete(final_dir, splits):
        stats = finish_stats(chat_cache_stats(final_dir, seq_len=seq_len))
        write_json(os.path.join(final_dir, _STATS_FILE), stats, indent=1, sort_keys=False, end="")
        return stats

    with _building(final_dir) as build_dir:
        from levanter.compat.hf_checkpoints import load_tokenizer

        from . import chat_cache
        from .chat_processor import ToolsChatProcessor

        tok = load_tokenizer(resolve_tokenizer(tokenizer))
        # the processor Levanter's builder would use for ChatLmDatasetFormat (same ledger metadata), with the tools
        processor = ToolsChatProcessor(tok, chat_template, tools, messages_field=messages_field)
        if workers is None:
            workers = chat_cache.pool_workers(sum(chat_cache.shard_bytes(u) for u in splits.values()))
        # the pool (large inputs only) is forked before any cache writer exists
        with chat_cache.tokenize_pool(processor, workers) as pool:
            for split, urls in splits.items():
                chat_cache.write_split(os.path.join(build_dir, split), urls, processor, pool=pool, progress=progress)
        if not _cache_complete(build_dir, splits):
            raise RuntimeError(f"cache build in {build_dir} did not finish")
        stats = finish_stats(chat_cache_stats(build_dir, seq_len=seq_len))
        write_json(os.path.join(build_dir, _STATS_FILE), stats, indent=1, sort_keys=False, end="")
    return stats


@contextlib.contextmanager
def _building(final_dir: str):
    """A build dir for the cache ``final_dir``: a hidden sibling renamed into place on success
    (removed on failure; stale ones of dead processes are removed first). Remote caches are built
    in place: Levanter's ledger says ``is_finished`` only at the end."""
    if is_remote(final_dir):
        yield final_dir
        return
    parent, base = os.path.split(final_dir.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    _cleanup_stale_builds(parent, base)
    from ..runtime.signals import own_run_id

    build_dir = os.path.join(parent, f".{base}.building-{own_run_id()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(build_dir)
    try:
        yield build_dir
        if os.path.lexists(final_dir):
            shutil.rmtree(final_dir)  # an unfinished / foreign leftover
        os.rename(build_dir, final_dir)
    except BaseException:
        _discard(build_dir)
        raise


def _discard(path: str, settle_s: float = 0.5, limit_s: float = 20.0) -> None:
    """Remove the build dir ``path`` of a failed or interrupted build, and keep removing it until it
    stays gone for ``settle_s``: an interrupt (SIGINT, a SnakemakeGone) can land while tensorstore
    still has writes of the last batch in flight on its own threads, and those recreate files under
    ``path`` while (or after) it is removed. Gives up after ``limit_s``; the next build's
    :func:`_cleanup_stale_builds` removes what is left then."""
    deadline = time.monotonic() + limit_s
    while True:
        shutil.rmtree(path, ignore_errors=True)
        gone_since = time.monotonic()
        while not os.path.lexists(path) and time.monotonic() - gone_since < settle_s:
            time.sleep(0.05)
        if not os.path.lexists(path) or time.monotonic() > deadline:
            return


def reorder_chat_cache(src_cache_dir: str, cache_dir: str, orders: Mapping[str, Sequence[int]],
                       seq_len: Optional[int] = None) -> dict:
    """A copy of the finished cache ``src_cache_dir`` holding, per split, the rows ``orders[split]``
    in that order (no tokenizing). Same kill safety as :func:`build_chat_cache`; an existing finished
    copy is kept. Returns ``chat_cache_stats(cache_dir, seq_len)`` (also written next to it)."""
    from . import chat_cache

    final_dir = cache_dir if is_remote(cache_dir) else os.path.abspath(cache_dir)
    if not _cache_complete(final_dir, orders):
        with _building(final_dir) as build_dir:
            for split, order in orders.items():
                chat_cache.copy_split(os.path.join(src_cache_dir, split), os.path.join(build_dir, split), order)
    stats = chat_cache_stats(final_dir, seq_len=seq_len)
    stats["source_cache"] = src_cache_dir
    write_json(os.path.join(final_dir, _STATS_FILE), stats, indent=1, sort_keys=False, end="")
    return stats


def _open_chat_split(split_dir: str):
    import numpy as np
    from levanter.store.cache import TreeCache

    exemplar = {"input_ids": np.zeros((0,), dtype=np.int32), "assistant_masks": np.zeros((0,), dtype=np.int32)}
    return TreeCache.load(split_dir, exemplar)


def packed_ranges(split_dir: str, seq_len: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` row ranges of the ``seq_len`` sequences ``train_lm`` packs from a chat
    cache split, from Levanter's own ``GreedyPrepackedDataset`` with the parameters
    ``MultiturnChatDataset`` uses (``max_segments_per_example=64``, ``slice_strategy="left"``:
    over-long chats are truncated to their first ``seq_len`` tokens and occupy one sequence alone).
    """
    from levanter.data.packing import GreedyPrepackedDataset

    cache = _open_chat_split(split_dir)
    packed = GreedyPrepackedDataset(
        cache.store.tree,
        int(seq_len),
        max_segments_per_example=MAX_SEGMENTS,
        slice_strategy="left",
    )
    return [(r.start, r.stop) for r in packed._pack_indices]


def _split_stats(split_dir: str, seq_len: Optional[int], chunk_tokens: int = 1 << 24) -> dict:
    import numpy as np

    cache = _open_chat_split(split_dir)
    ids = cache.store.tree["input_ids"]
    masks = cache.store.tree["assistant_masks"]
    n = int(ids.num_rows)
    offsets = np.asarray(ids.offsets[0 : n + 1].read().result(), dtype=np.int64).copy()
    offsets[0] = 0  # Levanter keeps the row count in offsets[0]
    lengths = np.diff(offsets)
    total = int(offsets[-1]) if n else 0

    asst = np.zeros(n, dtype=np.int64)
    asst_in_window = np.zeros(n, dtype=np.int64)
    row = 0
    while row < n:
        # a block of whole rows, ~chunk_tokens tokens (at least one row)
        end_row = int(np.searchsorted(offsets, offsets[row] + chunk_tokens, side="right")) - 1
        end_row = min(max(end_row, row + 1), n)
        base = int(offsets[row])
        data = np.asarray(masks.data[base : int(offsets[end_row])].read().result(), dtype=np.int64)
        csum = np.concatenate([[0], np.cumsum(data)])
        starts = offsets[row:end_row] - base
        ends = offsets[row + 1 : end_row + 1] - base
        asst[row:end_row] = csum[ends] - csum[starts]
        if seq_len:
            win_end = np.minimum(ends, starts + int(seq_len))
            asst_in_window[row:end_row] = csum[win_end] - csum[starts]
        row = end_row

    out = {
        "chats": n,
        "tokens": total,
        "assistant_tokens": int(asst.sum()),
        "assistant_fraction": float(asst.sum() / total) if total else 0.0,
        "lengths": [int(x) for x in lengths],
        "assistant_lengths": [int(x) for x in asst],
        "max_length": int(lengths.max()) if n else 0,
        "mean_length": float(lengths.mean()) if n else 0.0,
    }
    if seq_len:
        over = lengths > int(seq_len)
        ranges = packed_ranges(split_dir, int(seq_len))
        # non-pad tokens of the packed sequences Levanter yields (a sliced chat keeps seq_len tokens)
        non_pad = sum(min(int(offsets[b] - offsets[a]), int(seq_len)) for a, b in ranges)
        out.update(
            {
                "seq_len": int(seq_len),
                "packed_sequences": len(ranges),
                "packed_ranges": [[int(a), int(b)] for a, b in ranges],
                "packed_non_pad": non_pad / (len(ranges) * int(seq_len)) if ranges else 0.0,
                "chats_truncated": int(over.sum()),
                "tokens_truncated": int(np.maximum(lengths - int(seq_len), 0).sum()),
                "assistant_tokens_in_window": int(asst_in_window.sum()),
                # chats whose first seq_len tokens hold no assistant token: zero loss tokens
                "empty_windows": [int(i) for i in np.flatnonzero(asst_in_window == 0)],
            }
        )
    return out


LONG_CHATS = ("truncate", "drop")


def window_plan(split_stats: Mapping, seq_len: int, long_chats: str = "truncate") -> dict:
    """Which chats of one cache split train with ``seq_len``-token windows, and why others don't.

    Levanter keeps the first ``seq_len`` tokens of a longer chat (``slice_strategy="left"``).
    A chat with no assistant token inside that window would be trained with zero loss tokens
    (a batch of such chats makes the loss NaN): it is always dropped (``empty_window``).
    ``long_chats``: ``truncate`` keeps longer chats (truncated, counted); ``drop`` drops them.
    Returns ``{"keep": [index...], "dropped": [(index, reason)...], "counts": {...}}``.
    """
    if long_chats not in LONG_CHATS:
        raise ValueError(f"long_chats must be one of {', '.join(LONG_CHATS)}, not {long_chats!r}")
    n, s = int(split_stats["chats"]), int(seq_len)
    lengths = split_stats["lengths"]
    empty = set(split_stats["empty_windows"])
    dropped = []
    for i in range(n):
        if i in empty:
            dropped.append((i, "empty_window"))
        elif long_chats == "drop" and lengths[i] > s:
            dropped.append((i, "longer_than_seq_len"))
    gone = {i for i, _ in dropped}
    keep = [i for i in range(n) if i not in gone]
    counts = {"chats_in": n, "chats_out": len(keep)}
    for reason in ("empty_window", "longer_than_seq_len"):
        idx = [i for i, r in dropped if r == reason]
        counts[f"dropped_{reason}"] = {"chats": len(idx), "tokens": int(sum(lengths[i] for i in idx))}
    long_kept = [i for i in keep if lengths[i] > s]
    counts["truncated"] = {"chats": len(long_kept), "tokens_cut": int(sum(lengths[i] - s for i in long_kept))}
    return {"keep": keep, "dropped": dropped, "counts": counts}


def chat_cache_stats(cache_dir: str, seq_len: Optional[int] = None) -> dict:
    """Token statistics of a finished chat cache (``<cache_dir>/train`` and optional ``/validation``).

    Per split: ``chats``, ``tokens``, ``assistant_tokens`` (tokens inside the template's
    generation spans = the loss tokens before truncation; Levanter shifts the mask by one so
    each is predicted from the previous position), ``assistant_fraction``, per-chat ``lengths`` and
    ``assistant_lengths``, ``max_length``, ``mean_length``; with ``seq_len`` also
    ``packed_sequences`` (see :func:`packed_ranges`), ``chats_truncated``, ``tokens_truncated``,
    ``assistant_tokens_in_window`` (loss tokens that survive truncation) and ``empty_windows``
    (indices of chats with none; see ``window_plan``).
    Result: ``{"cache_dir", "train": {...}, "validation": {...} | None}``.
    """
    out: dict[str, Any] = {"cache_dir": cache_dir}
    for split in _SPLITS:
        d = os.path.join(cache_dir, split)
        if split_finished(d):
            out[split] = _split_stats(d, seq_len)
        elif split == "train":
            raise FileNotFoundError(f"no finished Levanter cache at {d}")
        else:
            out[split] = None
    return out
