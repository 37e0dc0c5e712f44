"""Levanter glue for trajsft: chat caches, ``train_lm`` configs and resumable training runs.

Everything here takes and returns plain data (str / int / float / list / dict) so Snakemake rules
can call it directly.  Levanter / JAX / Ray are imported lazily, inside the functions that need
them, so importing this module (e.g. while Snakemake parses the Snakefile) stays cheap.

Public API
----------
``build_chat_cache(train_urls, validation_urls, cache_dir, tokenizer, chat_template, ...) -> dict``
    Tokenize ``.jsonl(.gz)`` chat shards into Levanter's chat cache with Levanter's own cache
    builder (``levanter.data.text.build_lm_dataset_cache`` + ``ChatLmDatasetFormat``), so
    ``train_lm`` later loads the identical cache. Returns token statistics read back from the cache.
``chat_cache_stats(cache_dir, seq_len=None) -> dict``
    The same statistics for an existing cache (no rebuild).
``count_packed_sequences(split_dir, seq_len) -> int``
    Number of ``seq_len`` training sequences Levanter's packer makes out of one cache split.
``steps_for_epochs(packed_sequences, train_batch_size, epochs) -> int``
``levanter_config(...) -> dict``
    The full ``levanter.main.train_lm`` config as a plain dict (dump it with ``write_config``).
``write_config(config, path) -> str``
``latest_checkpoint(checkpoint_dir) -> dict | None``
``read_metrics(log_path) -> dict``
``run_training(config_dict, run_dir, log_path, env=None, ...) -> dict``
    Runs ``train_lm`` in a killable subprocess, skips relaunching finished runs, guarantees a
    final trainer checkpoint and a final HF export, and parses loss values back from the log.
``export_hf(config_dict, checkpoint_path, output_dir, ...) -> str``
    Converts a trainer checkpoint into an HF (safetensors) export with Levanter's converter.

Step numbering (Levanter convention, important when reading paths):
after ``N`` optimizer steps the trainer state has ``step == N`` but hooks see the 0-based
index of the last completed step, ``N - 1``; checkpoints and HF exports are written to
``.../step-{N-1}`` and ``metadata.json`` says ``"step": N-1``.  Resuming from ``step-K``
restores ``state.step == K + 1`` and Levanter logs "Resuming training from step K+1".
Metrics (``train/loss``) are logged with the 0-based step index.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from typing import Any, Iterable, Mapping, Optional, Sequence

from .errors import SingleProcessOnPod, TrainingFailed
from .plan.specs import MODEL_DIMS

__all__ = [
    "CHAT_FORMAT",
    "MODEL_PRESETS",
    "build_chat_cache",
    "chat_cache_stats",
    "count_packed_sequences",
    "steps_for_epochs",
    "levanter_config",
    "write_config",
    "latest_checkpoint",
    "hf_export_complete",
    "read_metrics",
    "run_training",
    "export_hf",
    "levanter_env",
]

# Levanter's chat format: pack several chats per sequence, loss only on assistant tokens
# (the template's {% generation %} ... {% endgeneration %} spans).
CHAT_FORMAT: dict = {"type": "chat", "pack": True, "mask_user_turns": True}

# levanter.data.text.dataset_for_format packs at most this many chats into one sequence
_MAX_SEGMENTS_PER_EXAMPLE = 64
_SPLITS = ("train", "validation")
_STATS_FILE = "trajsft_cache_stats.json"
_RESULT_FILE = "training_result.json"
_CONFIG_FILE = "levanter_config.yaml"
_LAUNCH_MARK = "[trajsft.levanter_run] launch"
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# Qwen3 architectures expressed in Levanter's ``model`` (type: qwen3) fields: the students' dimensions
# (``tiny``: CPU demo / tests, random init, ~100k parameters with a small vocab; ``qwen3-8b``: Qwen/Qwen3-8B's
# config.json) live in the plan's specs, which hash them; these fields are the same for every student.
QWEN3_FIXED: dict = {"layer_norm_epsilon": 1e-6, "tie_word_embeddings": False, "use_bias": False}
MODEL_PRESETS: dict[str, dict] = {name: {**dims, **QWEN3_FIXED} for name, dims in MODEL_DIMS.items()}
_PRESET_HF_DEFAULT = {"qwen3-8b": "Qwen/Qwen3-8B"}


# --------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------


def _default_ray_tmpdir() -> str:
    # Ray puts unix sockets under its temp dir; paths must stay < ~107 chars.
    return os.environ.get("RAY_TMPDIR") or f"/tmp/ray-{os.getuid()}"


def levanter_env(run_dir: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> dict:
    """Environment for a Levanter subprocess: ``os.environ`` + safe defaults + ``env`` overrides.

    Defaults (only if not already set): ``RAY_AUTH_MODE=disabled`` (Ray 2.60 otherwise enables token
    auth for a fresh local cluster and writes ``~/.ray/auth_token``), ``RAY_TMPDIR`` (short path),
    ``TOKENIZERS_PARALLELISM=false``, ``WANDB_SILENT=true``. ``WANDB_DIR`` is forced to ``run_dir``
    (Levanter's WandbConfig has no ``dir`` field; W&B reads this env var) unless ``env`` sets it.
    """
    out = dict(os.environ)
    out.setdefault("RAY_AUTH_MODE", "disabled")
    out.setdefault("RAY_TMPDIR", _default_ray_tmpdir())
    out.setdefault("TOKENIZERS_PARALLELISM", "false")
    out.setdefault("WANDB_SILENT", "true")
    if run_dir is not None:
        out["WANDB_DIR"] = os.path.abspath(run_dir)
    if env:
        out.update({k: str(v) for k, v in env.items()})
    return out


def _is_remote(path: str) -> bool:
    return "://" in str(path)


# what a tokenizer needs from a model repo (no weights)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja", "tokenizer.model", "config.json",
                   "generation_config.json"]


def resolve_tokenizer(ref: str) -> str:
    """A pinned Hub tokenizer ``repo@revision`` as a local snapshot of that revision (tokenizer files only).

    Levanter's data config loads its tokenizer with ``AutoTokenizer.from_pretrained(name)`` and no
    revision; its ``initialize_from_hf`` does understand ``repo@revision``. This thin layer gives the
    tokenizer the same pin. Local dirs, gs:// paths and unpinned names pass through unchanged."""
    if "@" not in ref or _is_remote(ref) or os.path.exists(ref):
        return ref
    repo, revision = ref.rsplit("@", 1)
    from huggingface_hub import snapshot_download

    return snapshot_download(repo, revision=revision, allow_patterns=TOKENIZER_FILES)


def resolve_hub_refs(cfg: dict) -> dict:
    """``cfg`` with pinned Hub tokenizer refs replaced by local snapshots (for one launch)."""
    for section in ("data", "model"):
        ref = (cfg.get(section) or {}).get("tokenizer")
        if isinstance(ref, str):
            cfg[section]["tokenizer"] = resolve_tokenizer(ref)
    return cfg


def _fs(path: str):
    import fsspec

    return fsspec.core.url_to_fs(str(path))[0]


def _exists(path: str) -> bool:
    if _is_remote(path):
        return _fs(path).exists(path)
    return os.path.exists(path)


def _read_json(path: str):
    if _is_remote(path):
        with _fs(path).open(path, "r") as f:
            return json.load(f)
    with open(path) as f:
        return json.load(f)


def _write_json_atomic(path: str, obj) -> None:
    if _is_remote(path):
        with _fs(path).open(path, "w") as f:
            json.dump(obj, f, indent=1)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# chat cache
# --------------------------------------------------------------------------------------


def _chat_format(chat_template: Optional[str], messages_field: str = "messages") -> dict:
    fmt = dict(CHAT_FORMAT)
    fmt["messages_field"] = messages_field
    if chat_template is not None:
        # NB: the template must live in the *format*; ``data.chat_template`` is not used by the
        # chat cache processor in this Levanter version.
        fmt["chat_template"] = chat_template
    return fmt


def _split_finished(split_dir: str) -> bool:
    """True if ``split_dir`` holds a finished Levanter cache (ledger says is_finished)."""
    ledger = os.path.join(split_dir, "shard_ledger.json")
    try:
        return bool(_read_json(ledger).get("is_finished", False))
    except (FileNotFoundError, OSError, ValueError):
        return False


def _cache_complete(cache_dir: str, splits: Iterable[str]) -> bool:
    return all(_split_finished(os.path.join(cache_dir, s)) for s in splits)


# Levanter's cache builder concatenates shard groups with a Ray task declared
# ``num_cpus=4, memory=6GiB`` (levanter.store.cache._copy_cache_data) while its long-lived actors
# keep holding CPU (0.1 per _TreeStoreCacheBuilder, 0.5 per _MetadataCopier). If fewer than 4 CPUs
# are *free* the copy is never scheduled and the build hangs forever (as soon as a split has more
# than one shard). So the local Ray advertises at least 8 logical CPUs.
_MIN_RAY_CPUS = 8

# how a chat cache is built: "inprocess" (default: ChatProcessor + SerialCacheWriter in this process,
# trajsft.chat_cache) or "ray" (Levanter's own Ray cache builder). Same cache either way.
CACHE_ENGINES = ("inprocess", "ray")


@contextlib.contextmanager
def _ray_session(num_cpus: Optional[int], ray_tmpdir: Optional[str]):
    """Use a running Ray if there is one, otherwise start (and later stop) a local one."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < 5:
            raise RuntimeError(
                f"the running Ray cluster advertises {cpus} CPUs; Levanter's cache builder needs 4 free "
                f"CPUs next to its actors (it would hang). Start Ray with num_cpus>={_MIN_RAY_CPUS}."
            )
        yield
        return
    tmp = ray_tmpdir or _default_ray_tmpdir()
    os.makedirs(tmp, exist_ok=True)
    ray.init(
        address="local",
        namespace="levanter",
        # logical CPUs are only a scheduling resource; oversubscribing a 2-core box is fine
        num_cpus=max(int(num_cpus or os.cpu_count() or 1), _MIN_RAY_CPUS),
        include_dashboard=False,
        _temp_dir=tmp,
    )
    try:
        yield
    finally:
        ray.shutdown()


def _cleanup_stale_builds(parent: str, base: str) -> None:
    """Remove ``.<base>.building-<pid>-*`` dirs left by killed builds (owner pid gone)."""
    prefix = f".{base}.building-"
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix) :].split("-", 1)[0])
        except ValueError:
            continue
        alive = True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if not alive or pid == os.getpid():
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
    num_cpus: Optional[int] = None,
    ray_tmpdir: Optional[str] = None,
    engine: str = "inprocess",
) -> dict:
    """Build Levanter chat caches ``<cache_dir>/train`` (and ``/validation``) from chat shards.

    Shards are ``.jsonl`` / ``.jsonl.gz`` files (anything fsspec opens; compression is inferred from
    the extension) with one ``{"messages": [...OpenAI chat...], ...}`` object per line; extra keys
    (``traj_id`` ...) are ignored. Tokenization is Levanter's ``ChatProcessor`` (the processor
    ``preprocessor_for_format`` gives for ``ChatLmDatasetFormat``) with
    ``tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)``, i.e. exactly what
    ``train_lm`` would build, so training loads this cache as is. Every chat must contain at least
    one assistant turn (Levanter raises otherwise) and the template needs ``{% generation %}`` tags.

    ``engine="inprocess"`` (default) streams the shards through that processor into Levanter's
    ``SerialCacheWriter`` in this process (``trajsft.chat_cache``); ``engine="ray"`` runs
    Levanter's own Ray cache builder (``build_lm_dataset_cache``). Both write the same rows in
    shard order with the same ledger metadata.

    Kill safety: for local paths the cache is built in a hidden sibling directory
    ``.<name>.building-<pid>-<rand>`` and renamed to ``cache_dir`` only when every split is finished
    and the statistics were computed (stale build dirs of dead processes are removed on the next
    call). If ``cache_dir`` already holds a finished cache it is not rebuilt; only the stats are
    recomputed. For ``gs://`` (or other remote) paths there is no atomic rename: the cache is built
    in place, and safety relies on Levanter's own ledger: ``shard_ledger.json`` gets
    ``is_finished: true`` only at the end, training refuses (``run_training``) / Levanter never
    loads an unfinished cache; a rerun starts an unfinished split over (in-process: the writer opens
    its arrays with ``delete_existing``) or resumes it from the finished shard groups (Ray).
    tensorstore writes ``gs://`` through its ``gcs`` kvstore driver (JAX's ``get_tensorstore_spec``).

    Ray (``engine="ray"`` only): a local Ray is started if none is running (``RAY_AUTH_MODE=disabled``, temp dir
    ``ray_tmpdir`` / ``$RAY_TMPDIR`` / ``/tmp/ray-<uid>``, at least 8 logical CPUs because
    Levanter's shard-merge task asks for 4 free CPUs next to its actors and would otherwise never
    be scheduled) and shut down
    afterwards. A Ray started by the caller is reused.

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

    remote = _is_remote(cache_dir)
    final_dir = cache_dir if remote else os.path.abspath(cache_dir)

    def finish_stats(stats: dict) -> dict:
        stats["cache_dir"] = final_dir
        stats["tokenizer"] = tokenizer
        stats["source_urls"] = {k: list(v) for k, v in splits.items()}
        stats["engine"] = engine
        return stats

    if engine not in CACHE_ENGINES:
        raise ValueError(f"engine must be one of {', '.join(CACHE_ENGINES)}, not {engine!r}")
    if _cache_complete(final_dir, splits):
        stats = finish_stats(chat_cache_stats(final_dir, seq_len=seq_len))
        _write_json_atomic(os.path.join(final_dir, _STATS_FILE), stats)
        return stats

    with _building(final_dir) as build_dir:
        from levanter.compat.hf_checkpoints import load_tokenizer
        from levanter.data.text import ChatLmDatasetFormat, preprocessor_for_format

        tok = load_tokenizer(resolve_tokenizer(tokenizer))
        fmt = ChatLmDatasetFormat(
            messages_field=messages_field, chat_template=chat_template, pack=True, mask_user_turns=True
        )
        if engine == "inprocess":
            from . import chat_cache

            # the processor Levanter's builder would use (same ledger metadata)
            processor = preprocessor_for_format(fmt, tok, enforce_bos=True, enforce_eos=True)
            for split, urls in splits.items():
                chat_cache.write_split(os.path.join(build_dir, split), urls, processor)
        else:
            _build_on_ray(build_dir, splits, fmt, tok, num_cpus, ray_tmpdir)
        if not _cache_complete(build_dir, splits):
            raise RuntimeError(f"cache build in {build_dir} did not finish")
        stats = finish_stats(chat_cache_stats(build_dir, seq_len=seq_len))
        _write_json_atomic(os.path.join(build_dir, _STATS_FILE), stats)
    return stats


def _build_on_ray(build_dir: str, splits: Mapping[str, Sequence[str]], fmt, tok, num_cpus, ray_tmpdir) -> None:
    from levanter.data.sharded_datasource import UrlDataSource
    from levanter.data.text import build_lm_dataset_cache
    from levanter.store.cache import CacheOptions

    with _ray_session(num_cpus, ray_tmpdir):
        caches = {}
        for split, urls in splits.items():
            caches[split] = build_lm_dataset_cache(
                os.path.join(build_dir, split), UrlDataSource(list(urls)), fmt, tok, CacheOptions.default(), True,
                monitors=False,
            )
        for split, cache in caches.items():
            if cache is None:
                raise RuntimeError(f"Levanter built no cache for split {split!r}")
            cache.await_finished(None, await_cleanup=True)


@contextlib.contextmanager
def _building(final_dir: str):
    """A build dir for the cache ``final_dir``: a hidden sibling renamed into place on success
    (removed on failure; stale ones of dead processes are removed first). Remote caches are built
    in place: Levanter's ledger says ``is_finished`` only at the end."""
    if _is_remote(final_dir):
        yield final_dir
        return
    parent, base = os.path.split(final_dir.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    _cleanup_stale_builds(parent, base)
    build_dir = os.path.join(parent, f".{base}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(build_dir)
    try:
        yield build_dir
        if os.path.lexists(final_dir):
            shutil.rmtree(final_dir)  # an unfinished / foreign leftover
        os.rename(build_dir, final_dir)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise


def reorder_chat_cache(src_cache_dir: str, cache_dir: str, orders: Mapping[str, Sequence[int]],
                       seq_len: Optional[int] = None) -> dict:
    """A copy of the finished cache ``src_cache_dir`` holding, per split, the rows ``orders[split]``
    in that order (no tokenizing). Same kill safety as :func:`build_chat_cache`; an existing finished
    copy is kept. Returns ``chat_cache_stats(cache_dir, seq_len)`` (also written next to it)."""
    from . import chat_cache

    final_dir = cache_dir if _is_remote(cache_dir) else os.path.abspath(cache_dir)
    if not _cache_complete(final_dir, orders):
        with _building(final_dir) as build_dir:
            for split, order in orders.items():
                chat_cache.copy_split(os.path.join(src_cache_dir, split), os.path.join(build_dir, split), order)
    stats = chat_cache_stats(final_dir, seq_len=seq_len)
    stats["source_cache"] = src_cache_dir
    _write_json_atomic(os.path.join(final_dir, _STATS_FILE), stats)
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
        max_segments_per_example=_MAX_SEGMENTS_PER_EXAMPLE,
        slice_strategy="left",
    )
    return [(r.start, r.stop) for r in packed._pack_indices]


def count_packed_sequences(split_dir: str, seq_len: int) -> int:
    """How many ``seq_len`` sequences ``train_lm`` makes from a chat cache split (:func:`packed_ranges`)."""
    return len(packed_ranges(split_dir, seq_len))


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
    ``packed_sequences`` (see ``count_packed_sequences``), ``chats_truncated``, ``tokens_truncated``,
    ``assistant_tokens_in_window`` (loss tokens that survive truncation) and ``empty_windows``
    (indices of chats with none; see ``window_plan``).
    Result: ``{"cache_dir", "train": {...}, "validation": {...} | None}``.
    """
    out: dict[str, Any] = {"cache_dir": cache_dir}
    for split in _SPLITS:
        d = os.path.join(cache_dir, split)
        if _split_finished(d):
            out[split] = _split_stats(d, seq_len)
        elif split == "train":
            raise FileNotFoundError(f"no finished Levanter cache at {d}")
        else:
            out[split] = None
    return out


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------


def steps_for_epochs(packed_sequences: int, train_batch_size: int, epochs: float) -> int:
    """``ceil(epochs * packed_sequences / train_batch_size)`` (>= 1).

    An "example" is one packed ``seq_len`` sequence (what the data loader batches), so this is the
    exact number of optimizer steps for ``epochs`` passes. With ``epochs == 1`` the last batch is
    partial; Levanter pads it with zero-loss examples.
    """
    if packed_sequences <= 0:
        raise ValueError("packed_sequences must be > 0")
    return max(1, math.ceil(float(epochs) * packed_sequences / int(train_batch_size)))


def _normalize_sources(sources) -> dict[str, dict]:
    if isinstance(sources, str):
        return {"data": {"cache_dir": sources}}
    if isinstance(sources, Mapping):
        out = {}
        for name, spec in sources.items():
            if isinstance(spec, str):
                spec = {"cache_dir": spec}
            out[str(name)] = dict(spec)
        return out
    raise TypeError("sources must be a cache dir or a mapping name -> {cache_dir, weight, ...}")


def levanter_config(
    *,
    run_id: str,
    run_dir: str,
    tokenizer: str,
    chat_template: str,
    sources,
    seq_len: int,
    train_batch_size: int,
    epochs: float = 1.0,
    num_train_steps: Optional[int] = None,
    model: str | Mapping = "tiny",
    initialize_from_hf: Optional[str] = None,
    use_hf_model_config: bool = False,
    reference_checkpoint: Optional[str] = None,
    rope_theta: float = 1_000_000.0,
    learning_rate: float = 1e-5,
    lr_schedule: str = "cosine",
    warmup: float = 0.03,
    decay: Optional[float] = None,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.0,
    max_grad_norm: Optional[float] = 1.0,
    beta1: float = 0.9,
    beta2: float = 0.95,
    epsilon: float = 1e-8,
    seed: int = 0,
    accelerator: str = "cpu",
    mp: Optional[str] = None,
    per_device_parallelism: int = -1,
    per_device_eval_parallelism: int = -1,
    checkpoint_dir: Optional[str] = None,
    hf_dir: Optional[str] = None,
    save_interval: str = "30m",
    keep_every: Optional[int] = None,
    hf_save_steps: Optional[int] = None,
    hf_save_dtype: Optional[str] = None,
    steps_per_eval: Optional[int] = None,
    max_eval_batches: Optional[int] = None,
    wandb_mode: str = "offline",
    wandb_project: str = "trajsft",
    wandb_entity: Optional[str] = None,
    wandb_tags: Sequence[str] = (),
    shuffle: bool = True,
    mixture_block_size: int = 2048,
    watch_interval: int = 10,
    jax_compilation_cache_dir: Optional[str] = None,
) -> dict:
    """The full ``levanter.main.train_lm`` config as a plain dict (YAML-dumpable).

    Data
        ``sources`` maps a teacher name to ``{"cache_dir": <prebuilt cache>, "weight": float,
        "packed_sequences": int, "train_urls": [...], "validation_urls": [...]}`` (only
        ``cache_dir`` is required; a bare string is a single cache dir). One source gives a
        ``UrlSingleDatasetLMConfig``-style ``data`` section; several give an
        ``LMMixtureDatasetConfig`` (one ``configs`` entry per teacher, each with its own
        ``cache_dir``, ``train_weights`` from ``weight`` (default 1.0), stop strategy ``restart``).
        Every source uses ``format: {type: chat, pack: true, mask_user_turns: true,
        chat_template: <ours>}``; the template must be in the *format* (``data.chat_template`` is
        also set but this Levanter version ignores it for chat caches). The URL lists are optional:
        the prebuilt cache is loaded when present; with URLs Levanter could rebuild a missing one.

    Steps / epochs
        If ``num_train_steps`` is None it is ``steps_for_epochs(sum(packed_sequences), B, epochs)``
        (``packed_sequences`` per source from ``build_chat_cache(..., seq_len=...)`` stats), i.e. one
        training example = one packed sequence. For a single source that needs more than one pass,
        top-level ``epoch`` is set to the number of passes so Levanter cycles the data
        (``EpochDataset``); without it the loader stops at the end of the data. Mixtures are
        infinite (``restart``), so ``epoch`` stays 0 (Levanter rejects epochs for mixtures) and
        "epochs" means passes over the *total* packed data, split between teachers by weight.

    Model (``type: qwen3``)
        ``model`` is a preset name from ``MODEL_PRESETS`` (``"tiny"`` random init for CPU,
        ``"qwen3-8b"``) or a dict of Levanter Qwen3 fields. ``seq_len`` and ``rope`` (theta) are
        always ours. ``initialize_from_hf`` (HF repo / local dir / gs:// path; defaults to
        ``Qwen/Qwen3-8B`` for the ``qwen3-8b`` preset) loads pretrained weights;
        ``reference_checkpoint`` defaults to it (for the tiny model to ``<run_dir>/hf_reference``,
        which ``run_training`` fills with a minimal config.json: Levanter's HF export copies
        ``architectures`` from the reference and would otherwise try the Hub). ``model.tokenizer``
        is set to our tokenizer so Levanter never loads one from the reference.
        ``use_hf_model_config`` is off by default on purpose: when on, Levanter replaces the
        *whole* model config by the HF one, including ``seq_len := max_position_embeddings``
        (40960 for Qwen3-8B) and our gradient-checkpointing / attention settings.

    Checkpoints / exports
        Trainer checkpoints go to ``checkpoint_dir`` (default ``<run_dir>/checkpoints``) and HF
        exports to ``hf_dir`` (default ``<run_dir>/hf``), both ``/step-<k>`` without the run id
        appended. ``save_interval`` writes temporary (rotating) checkpoints; ``keep`` keeps a
        permanent checkpoint every ``keep_every`` steps and ALWAYS at the final step (Levanter does
        not force a checkpoint at the end: its end-of-training forced hooks call the checkpointer
        without ``force``; the keep policy ``[{every: keep_every, until: N-2}, {every: N-1}]`` makes
        the final step a scheduled one). The HF export hook runs every ``hf_save_steps`` (default:
        only at the end; the forced end-of-training hooks always export the final step).

    Tracking
        ``trainer.tracker`` is ``[wandb, json_logger]``: W&B (``wandb_mode`` offline/online/disabled,
        ``id = name = run_id``, ``resume: allow``; its directory comes from ``WANDB_DIR`` which
        ``run_training`` points at ``run_dir``) plus Levanter's ``json_logger`` tracker, which writes
        every metric as a JSON line to the log, where ``read_metrics`` reads the losses back.

    ``watch_interval`` is Levanter's grad/param-norm logging period (0 = off, saves one compile).
    ``jax_compilation_cache_dir`` enables JAX's persistent compilation cache (relaunches skip
    recompiling).

    ``accelerator="cpu"`` sets ``require_accelerator: false`` and f32; "tpu"/"gpu" use
    ``mp: p=f32,c=bfloat16``. ``per_device_parallelism=-1`` means the whole batch at once (no
    gradient accumulation); set it to get micro-batching. Eval runs every ``steps_per_eval`` steps
    (default ~10 evals per run) when a validation split is configured (and at the end).
    """
    if not _RUN_ID_RE.match(run_id):
        raise ValueError(f"run_id {run_id!r} must match {_RUN_ID_RE.pattern} (used as W&B id and dir name)")
    srcs = _normalize_sources(sources)
    if not srcs:
        raise ValueError("no data sources")
    run_dir = run_dir if _is_remote(run_dir) else os.path.abspath(run_dir)
    fmt = _chat_format(chat_template)
    B = int(train_batch_size)

    # ---- steps
    packed = {n: s.get("packed_sequences") for n, s in srcs.items()}
    if num_train_steps is None:
        missing = [n for n, p in packed.items() if not p]
        if missing:
            raise ValueError(
                f"num_train_steps not given and packed_sequences unknown for {missing}; pass "
                "build_chat_cache(..., seq_len=...)['train']['packed_sequences'] in sources"
            )
        num_train_steps = steps_for_epochs(sum(int(p) for p in packed.values()), B, epochs)
    N = int(num_train_steps)
    if N < 2:
        raise ValueError("num_train_steps must be >= 2 (Levanter never checkpoints step 0)")

    # ---- data
    def source_entry(name: str, spec: dict) -> dict:
        if not spec.get("cache_dir"):
            raise ValueError(f"source {name!r} has no cache_dir")
        return {
            "cache_dir": spec["cache_dir"],
            "format": dict(fmt),
            "train_urls": list(spec.get("train_urls") or []),
            "validation_urls": list(spec.get("validation_urls") or []),
            "tags": [name],
        }

    epoch = 0
    if len(srcs) == 1:
        (name, spec), = srcs.items()
        data = {
            "tokenizer": tokenizer,
            "chat_template": chat_template,
            **source_entry(name, spec),
            "shuffle": bool(shuffle),
            "permutation_type": "feistel",
        }
        p = packed[name]
        if p:
            # smallest number of passes e whose ceil(e * P / B) batches (last one padded) cover N steps
            passes = (N - 1) * B // int(p) + 1
            epoch = passes if passes > 1 else 0
    else:
        data = {
            "tokenizer": tokenizer,
            "chat_template": chat_template,
            "cache_dir": None,
            "configs": {n: source_entry(n, s) for n, s in srcs.items()},
            "train_weights": {n: float(s.get("weight", 1.0)) for n, s in srcs.items()},
            "stop_strategy": "restart",
            "mixture_block_size": int(mixture_block_size),
            "shuffle": bool(shuffle),
            "permutation_type": "feistel",
        }

    # ---- model
    if isinstance(model, str):
        if model not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {model!r}; known: {sorted(MODEL_PRESETS)}")
        if initialize_from_hf is None:
            initialize_from_hf = _PRESET_HF_DEFAULT.get(model)
        model_fields = dict(MODEL_PRESETS[model])
    else:
        model_fields = dict(model)
        model_fields.pop("type", None)
    if reference_checkpoint is None:
        reference_checkpoint = initialize_from_hf or os.path.join(run_dir, "hf_reference")
    model_cfg = {
        "type": "qwen3",
        "seq_len": int(seq_len),
        **model_fields,
        "rope": {"type": "default", "theta": float(rope_theta)},
        "reference_checkpoint": reference_checkpoint,
        "tokenizer": tokenizer,
    }

    # ---- trainer
    accelerator = accelerator.lower()
    if accelerator not in ("cpu", "tpu", "gpu"):
        raise ValueError("accelerator must be cpu, tpu or gpu")
    if mp is None:
        mp = "f32" if accelerator == "cpu" else "p=f32,c=bfloat16"
    ckpt_dir = checkpoint_dir or os.path.join(run_dir, "checkpoints")
    hf_dir = hf_dir or os.path.join(run_dir, "hf")
    last = N - 1  # 0-based index of the final step (what hooks / checkpoint names use)
    if keep_every and 0 < keep_every < last and last - 1 >= 1:
        keep = [{"every": int(keep_every), "until": last - 1}, {"every": last, "until": None}]
    else:
        keep = [{"every": last, "until": None}]
    if steps_per_eval is None:
        steps_per_eval = max(1, N // 10)

    trainer = {
        "id": run_id,
        "seed": int(seed),
        "mp": mp,
        "train_batch_size": B,
        "per_device_parallelism": int(per_device_parallelism),
        "per_device_eval_parallelism": int(per_device_eval_parallelism),
        "num_train_steps": N,
        "steps_per_eval": int(steps_per_eval),
        "max_eval_batches": max_eval_batches,
        "require_accelerator": accelerator != "cpu",
        "log_dir": os.path.join(run_dir, "logs"),
        "log_jaxprs": False,
        "log_xla_hlo": False,
        "tracker": [
            {
                "type": "wandb",
                "mode": wandb_mode,
                "project": wandb_project,
                "entity": wandb_entity,
                "id": run_id,
                "name": run_id,
                "tags": list(wandb_tags),
                "resume": "allow",
                "save_code": False,
            },
            {"type": "json_logger"},
        ],
        "checkpointer": {
            "base_path": ckpt_dir,
            "save_interval": save_interval,
            "keep": keep,
            "append_run_id_to_base_path": False,
        },
        # caches are prebuilt: don't start a Ray cluster inside training
        "ray": {"auto_start_cluster": False},
    }
    if jax_compilation_cache_dir:
        trainer["jax_compilation_cache_dir"] = jax_compilation_cache_dir
    if int(watch_interval) != 10:
        # grad/param norm logging (a JIT hook): every step where it fires uses a second compiled
        # variant of the train step; 0 disables it (one compile only; useful on CPU)
        trainer["watch"] = {"interval": int(watch_interval)}

    optimizer = {
        "type": "adam",
        "learning_rate": float(learning_rate),
        "lr_schedule": lr_schedule,
        "warmup": float(warmup),
        "decay": None if decay is None else float(decay),
        "min_lr_ratio": float(min_lr_ratio),
        "weight_decay": float(weight_decay),
        "max_grad_norm": None if max_grad_norm is None else float(max_grad_norm),
        "beta1": float(beta1),
        "beta2": float(beta2),
        "epsilon": float(epsilon),
    }

    cfg: dict[str, Any] = {
        "data": data,
        "model": model_cfg,
        "trainer": trainer,
        "optimizer": optimizer,
        "epoch": int(epoch),
        "hf_save_path": hf_dir,
        "hf_save_steps": int(hf_save_steps or N),
    }
    if hf_save_dtype:
        cfg["hf_save_dtype"] = hf_save_dtype
    if initialize_from_hf:
        cfg["initialize_from_hf"] = initialize_from_hf
        cfg["use_hf_model_config"] = bool(use_hf_model_config)
    return cfg


def write_config(config: Mapping, path: str) -> str:
    """Dump a config dict as YAML (atomically) for ``--config_path``; returns ``path``."""
    import yaml

    text = yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=False, width=10_000)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _plain(x):
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# --------------------------------------------------------------------------------------
# checkpoints, exports, metrics
# --------------------------------------------------------------------------------------


def latest_checkpoint(checkpoint_dir: str) -> Optional[dict]:
    """The checkpoint Levanter resumes from (``levanter.checkpoint.discover_latest_checkpoint``: a
    subdir with ``metadata.json``, newest by (timestamp, step)), with what callers need from its
    metadata: ``{"path", "step" (metadata step = 0-based index of the last completed step),
    "completed_steps" (step + 1 = trainer state step), "is_temporary", "timestamp"}``, or None."""
    if not _exists(checkpoint_dir):
        return None
    from levanter.checkpoint import discover_latest_checkpoint

    d = discover_latest_checkpoint(checkpoint_dir)
    if d is None:
        return None
    meta = _read_json(os.path.join(d, "metadata.json"))
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
    if _is_remote(path):
        fs = _fs(path)
        if not fs.exists(os.path.join(path, "config.json")):
            return False
        idx = os.path.join(path, "model.safetensors.index.json")
        if fs.exists(idx):
            files = set(_read_json(idx)["weight_map"].values())
            return all(fs.exists(os.path.join(path, f)) for f in files)
        return fs.exists(os.path.join(path, "model.safetensors"))
    if not os.path.isfile(os.path.join(path, "config.json")):
        return False
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(idx):
        files = sorted(set(_read_json(idx)["weight_map"].values()))
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


_JSON_LOGGER_RE = re.compile(r"levanter\.json_logger .*?:: (\{.*\})\s*$")
_RESUME_RE = re.compile(r"Resuming training from step (\d+)")


def read_metrics(log_path: str) -> dict:
    """Parse the metrics Levanter's ``json_logger`` tracker wrote into a log.

    Returns ``{"steps": {step: {metric: value}}, "summary": {...}, "launches": [{"kind": "train_lm" |
    "export", "resumed_from_step": int|None, "first_step": int|None, "last_step": int|None}]}``. Step keys are Levanter's 0-based
    step indices. Later lines win, so steps replayed after a resume (and the duplicate line of the
    forced end-of-training hooks) are deduplicated. Launch boundaries are the marker lines
    ``run_training`` writes.
    """
    steps: dict[int, dict] = {}
    summary: dict = {}
    launches: list[dict] = []
    cur: Optional[dict] = None
    if not os.path.exists(log_path):
        return {"steps": steps, "summary": summary, "launches": launches}
    with open(log_path, errors="replace") as f:
        for line in f:
            if line.startswith(_LAUNCH_MARK):
                kind = line[len(_LAUNCH_MARK) :].split()[0] if line[len(_LAUNCH_MARK) :].strip() else ""
                cur = {"kind": kind, "resumed_from_step": None, "first_step": None, "last_step": None}
                launches.append(cur)
                continue
            m = _RESUME_RE.search(line)
            if m and cur is not None:
                cur["resumed_from_step"] = int(m.group(1))
                continue
            m = _JSON_LOGGER_RE.search(line)
            if not m:
                continue
            try:
                rec = json.loads(m.group(1))
            except ValueError:
                continue
            ev = rec.get("event")
            if ev == "log" and rec.get("step") is not None:
                s = int(rec["step"])
                steps.setdefault(s, {}).update(rec.get("metrics") or {})
                if cur is not None and "train/loss" in (rec.get("metrics") or {}):
                    if cur["first_step"] is None:
                        cur["first_step"] = s
                    cur["last_step"] = s
            elif ev in ("summary", "finish"):
                summary.update(rec.get("metrics") or rec.get("summary") or {})
    return {"steps": steps, "summary": summary, "launches": launches}


def _loss_history(metrics: dict) -> list:
    return [[s, float(m["train/loss"])] for s, m in sorted(metrics["steps"].items()) if "train/loss" in m]


def _eval_losses(metrics: dict) -> dict:
    out = {}
    for s, m in sorted(metrics["steps"].items()):
        for k, v in m.items():
            if k.startswith("eval/") and k.endswith("/loss"):
                out[k] = [s, float(v)]
    return out


# --------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------

# First thing every child does: ask the kernel to SIGKILL it when the launching thread dies
# (PR_SET_PDEATHSIG), so a SIGKILLed Snakemake / driver never leaves an orphan trainer writing
# checkpoints next to its own relaunch; exit if the parent is already gone. Done in the child
# itself (not via preexec_fn, which is unsafe in multi-threaded parents such as Snakemake).
_CHILD_PRELUDE = (
    "import os, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    try:\n"
    "        import ctypes, signal\n"
    "        ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL)\n"
    "    except Exception:\n"
    "        pass\n"
    "    _pp = int(os.environ.get('TRAJSFT_PARENT_PID', '0') or 0)\n"
    "    if _pp and os.getppid() != _pp:\n"
    "        sys.exit(99)\n"
)
# Same entry point as ``python -m levanter.main.train_lm`` (its ``__main__`` block is exactly
# ``levanter.config.main(main)()``), but imported as a module so train_lm's logger is
# "levanter.main.train_lm" (INFO, e.g. "Resuming training from step N") instead of "__main__",
# whose INFO lines Levanter's logging setup drops; and with the end-of-training hooks run once
# (see trajsft.train_lm_main).
_TRAIN_LAUNCHER = _CHILD_PRELUDE + "from trajsft.train_lm_main import main\nmain()\n"
_EXPORT_LAUNCHER = _CHILD_PRELUDE + "from trajsft.levanter_run import _export_main\n_export_main(sys.argv[1])\n"


def _run_subprocess(cmd: list[str], log_path: str, env: dict, cwd: str, header: str, timeout=None) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "a", buffering=1) as log:
        log.write(f"{header}\n")
        log.flush()
        env = dict(env, TRAJSFT_PARENT_PID=str(os.getpid()))
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
        try:
            return proc.wait(timeout=timeout)
        except BaseException:
            # our caller is going away (KeyboardInterrupt / SIGTERM->exception / timeout): don't
            # leave a trainer writing checkpoints behind
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise



def _exit_reason(rc: Optional[int]) -> str:
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in {int(x) for x in signal.Signals} else "?"
        hint = "; out of memory?" if -rc == signal.SIGKILL else ""
        return f"train_lm was killed by signal {-rc} ({name}{hint})"
    return f"train_lm exited with code {rc}"


@contextlib.contextmanager
def _run_lock(run_dir: str):
    import fcntl

    path = os.path.join(run_dir, ".trajsft_training.lock")
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrainingFailed(f"another run_training holds {path}: a training of this run is still running") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ensure_reference_checkpoint(cfg: dict) -> None:
    """For random-init models Levanter's HF export still needs ``reference_checkpoint`` (it copies
    ``architectures`` from its config.json, going to the Hub if it is not a local dir). Create a
    minimal local one if the configured local path has none."""
    if cfg.get("initialize_from_hf"):
        return
    ref = cfg["model"].get("reference_checkpoint")
    if not ref or _is_remote(ref):
        return
    if not (os.path.isabs(ref) or ref.startswith(".")):
        # looks like a hub repo id; leave it alone
        if not os.path.exists(ref):
            return
    cfg_path = os.path.join(ref, "config.json")
    if os.path.exists(cfg_path):
        return
    _write_json_atomic(cfg_path, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})


def _check_caches(cfg: dict) -> None:
    data = cfg["data"]
    entries = list(data["configs"].values()) if "configs" in data else [data]
    for e in entries:
        d = os.path.join(e["cache_dir"], "train")
        if not _split_finished(d) and not e.get("train_urls"):
            raise FileNotFoundError(
                f"no finished Levanter cache at {d} (and no train_urls to build one); run build_chat_cache first"
            )


def _chat_template_of(cfg: dict) -> Optional[str]:
    data = cfg["data"]
    if data.get("chat_template"):
        return data["chat_template"]
    fmts = [e.get("format", {}) for e in (data["configs"].values() if "configs" in data else [data])]
    for f in fmts:
        if f.get("chat_template"):
            return f["chat_template"]
    return None


def _write_chat_template(export_dir: str, template: str) -> None:
    """Make the export's tokenizer carry the template we trained with (Levanter saves the base
    tokenizer's own template)."""
    with open(os.path.join(export_dir, "chat_template.jinja"), "w") as f:
        f.write(template)
    tc = os.path.join(export_dir, "tokenizer_config.json")
    if os.path.exists(tc):
        conf = _read_json(tc)
        if "chat_template" in conf:  # older layout: template inline; keep both consistent
            conf["chat_template"] = template
            _write_json_atomic(tc, conf)


def export_hf(
    config_dict: Mapping,
    checkpoint_path: str,
    output_dir: str,
    *,
    env: Optional[Mapping[str, str]] = None,
    log_path: Optional[str] = None,
    cwd: Optional[str] = None,
) -> str:
    """Export a trainer checkpoint to an HF checkpoint with Levanter's converter
    (``HFCheckpointConverter.save_pretrained``, as the in-training hook does), in a subprocess.

    The model / tokenizer / reference / dtype come from the same train_lm config, so the export
    matches what the ``hf_save_path`` hook would have written. Written to a temporary sibling and
    renamed into place (local paths)."""
    cfg = resolve_hub_refs(_plain(config_dict))
    work = cwd or os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(work, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    spec_path = os.path.join(work, f".export-{tag}.json")
    cfg_path = write_config(cfg, os.path.join(work, f".export-{tag}.yaml"))
    remote = _is_remote(output_dir)
    tmp_out = output_dir if remote else os.path.join(
        os.path.dirname(os.path.abspath(output_dir)), f".{os.path.basename(output_dir)}.exporting-{os.getpid()}"
    )
    with open(spec_path, "w") as f:
        json.dump({"config_path": cfg_path, "checkpoint_path": checkpoint_path, "output_dir": tmp_out}, f)
    try:
        cmd = [sys.executable, "-c", _EXPORT_LAUNCHER, spec_path]
        rc = _run_subprocess(
            cmd,
            log_path or os.path.join(work, "export_hf.log"),
            levanter_env(None, env),
            work,
            f"{_LAUNCH_MARK} export {checkpoint_path} -> {output_dir} at {_dt.datetime.now().isoformat()}",
        )
        if rc != 0:
            why = _exit_reason(rc).replace("train_lm", "the HF export", 1)
            raise TrainingFailed(f"HF export of {checkpoint_path} failed: {why}; see {log_path}")
        if not remote:
            if os.path.lexists(output_dir):
                shutil.rmtree(output_dir)
            os.rename(tmp_out, output_dir)
        return output_dir
    finally:
        for p in (spec_path, cfg_path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
        if not remote and os.path.exists(tmp_out):
            shutil.rmtree(tmp_out, ignore_errors=True)


def _export_main(spec_path: str) -> None:
    """Subprocess entry point of ``export_hf``: mirrors train_lm's converter / model / vocab setup,
    loads ``model`` from the trainer checkpoint and calls ``converter.save_pretrained``."""
    import draccus
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning

    import levanter.config  # noqa: F401  (registers draccus codecs, e.g. timedelta)
    import levanter.utils.logging
    from levanter.checkpoint import load_checkpoint
    from levanter.main.train_lm import TrainLmConfig
    from levanter.utils.jax_utils import is_inexact_arrayish

    with open(spec_path) as f:
        spec = json.load(f)
    config: TrainLmConfig = draccus.parse(config_class=TrainLmConfig, config_path=spec["config_path"], args=[])
    levanter.utils.logging.init_logging(os.path.join(os.getcwd(), "logs"), "export_hf")
    tokenizer = config.data.the_tokenizer
    converter = config.model.hf_checkpoint_converter()
    if config.initialize_from_hf:
        if isinstance(config.initialize_from_hf, str):
            converter = converter.replaced(reference_checkpoint=config.initialize_from_hf, tokenizer=tokenizer)
        else:
            converter = converter.replaced(tokenizer=tokenizer)
        if config.use_hf_model_config:
            config.model = converter.config_from_hf_config(converter.default_hf_config)
    else:
        converter = converter.replaced(tokenizer=tokenizer)

    trainer = config.trainer
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.parameter_axis_mapping):
        Vocab = round_axis_for_partitioning(Axis("vocab", len(tokenizer)), trainer.parameter_axis_mapping)
        model = eqx.filter_eval_shape(config.model.build, Vocab, key=jax.random.PRNGKey(0))
        trainable, non_trainable = eqx.partition(model, is_inexact_arrayish)
        trainable = load_checkpoint(
            trainable,
            spec["checkpoint_path"],
            subpath="model",
            discover_latest=False,
            axis_mapping=trainer.parameter_axis_mapping,
            mesh=trainer.device_mesh,
        )
        model = eqx.combine(trainable, non_trainable)
        dtype = jnp.dtype(config.hf_save_dtype) if config.hf_save_dtype else None
        converter.save_pretrained(model, spec["output_dir"], upload_to_hf=False, dtype=dtype)


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A train_lm config made ready to launch in ``run_dir``, and where its outputs go."""

    cfg: dict
    run_dir: str
    num_steps: int
    checkpoint_dir: str
    hf_base: str

    @property
    def final_hf(self) -> str:
        return os.path.join(self.hf_base, f"step-{self.num_steps - 1}")

    @property
    def levanter_log(self) -> str:
        """Levanter's own log file (it appends ".log" twice), appended across launches."""
        tr = self.cfg["trainer"]
        return os.path.join(tr["log_dir"], f"{tr['id']}.log.log")

    def complete(self) -> Optional[dict]:
        """The final trainer checkpoint if the run already covers ``num_steps`` (else None)."""
        ckpt = latest_checkpoint(self.checkpoint_dir)
        return ckpt if ckpt is not None and ckpt["completed_steps"] >= self.num_steps else None


def prepare_run(config_dict: Mapping, run_dir: str, log_dir: Optional[str] = None) -> PreparedRun:
    """Normalise a train_lm config for a launch whose local files (logs, W&B, generated tiny-model
    reference) live in ``run_dir``; checkpoints and HF exports go where the config says."""
    cfg = copy.deepcopy(_plain(config_dict))
    tr = cfg["trainer"]
    run_dir = os.path.abspath(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    # Levanter's log file is a plain logging.FileHandler: it must be local (a gs:// log_dir would
    # silently become a local directory called "gs:"). Same for the generated tiny-model reference.
    if log_dir:
        tr["log_dir"] = os.path.abspath(log_dir)
    elif not tr.get("log_dir") or _is_remote(str(tr["log_dir"])):
        tr["log_dir"] = os.path.join(run_dir, "logs")
    ref = cfg["model"].get("reference_checkpoint") or ""
    if not cfg.get("initialize_from_hf") and _is_remote(ref) and ref.rstrip("/").endswith("/hf_reference"):
        cfg["model"]["reference_checkpoint"] = os.path.join(run_dir, "hf_reference")
    ckpt_dir = tr["checkpointer"]["base_path"]
    hf_base = cfg.get("hf_save_path")
    if not hf_base:
        raise ValueError("config has no hf_save_path")
    if tr["checkpointer"].get("append_run_id_to_base_path", True):
        ckpt_dir = os.path.join(ckpt_dir, tr["id"])
        hf_base = os.path.join(hf_base, tr["id"])
    return PreparedRun(cfg, run_dir, int(tr["num_train_steps"]), ckpt_dir, hf_base)


def collect_result(run: PreparedRun, log_path: str, ckpt: dict, *, launched: bool, returncode: Optional[int],
                   config_path: str) -> dict:
    """``training_result.json`` of a run from its launch log and Levanter's own log."""
    metrics = read_metrics(log_path)
    # Levanter's own log file is appended across launches and has every metric line even if
    # log_path was rotated; prefer its steps.
    lev_metrics = read_metrics(run.levanter_log)
    if len(lev_metrics["steps"]) >= len(metrics["steps"]):
        metrics["steps"] = lev_metrics["steps"]
    history = _loss_history(metrics)
    final_loss = None
    for s, loss in history:
        if s == run.num_steps - 1:
            final_loss = loss
    resumed_from = None
    if launched:
        train_launches = [x for x in metrics["launches"] if x["kind"] == "train_lm"]
        launch = train_launches[-1] if train_launches else {}
        resumed_from = launch.get("resumed_from_step")
        if resumed_from is None:
            resumed_from = launch.get("first_step") or 0
    return {
        "run_id": run.cfg["trainer"]["id"],
        "steps": int(ckpt["completed_steps"]),
        "final_loss": final_loss,
        "checkpoint_dir": ckpt["path"],
        "hf_export": run.final_hf,
        "resumed_from_step": resumed_from,
        "launched": launched,
        "returncode": returncode,
        "eval_loss": _eval_losses(metrics),
        "loss_history": history,
        "config_path": config_path,
        "log_path": log_path,
    }



def refuse_single_process_on_pod(env: Optional[Mapping[str, str]] = None) -> None:
    """Fail fast where a single train_lm would hang: on a host of a multi-host slice, jax.distributed
    auto-detects every host of the slice and waits for processes nobody started."""
    env = os.environ if env is None else env
    hosts = [h for h in (env.get("TPU_WORKER_HOSTNAMES") or "").split(",") if h.strip()]
    if len(hosts) > 1:
        raise SingleProcessOnPod(
            f"this is worker {env.get('TPU_WORKER_ID', '?')} of the {len(hosts)}-host TPU slice "
            f"{env.get('TPU_NAME', '?')} ({env.get('TPU_ACCELERATOR_TYPE', '?')}): one training process alone would wait "
            "for the other hosts and time out; training runs one process per host through the trajsft.remote_train "
            "driver (Levanter's run_on_pod), which must not be pinned to a TPU-<type>-head resource"
        )


def run_training(
    config_dict: Mapping,
    run_dir: str,
    log_path: str,
    env: Optional[Mapping[str, str]] = None,
    *,
    timeout: Optional[float] = None,
    export_chat_template: bool = True,
) -> dict:
    """Run (or resume, or just verify) a Levanter ``train_lm`` run.

    1. Writes the config to ``<run_dir>/levanter_config.yaml`` and checks the data caches exist.
    2. If the latest checkpoint (see ``latest_checkpoint``) already covers ``num_train_steps``
       the run is complete and NOT relaunched (Levanter would exit 1: "No training steps were
       executed"). Otherwise launches ``train_lm`` (same code as ``python -m
       levanter.main.train_lm --config_path <yaml>``) in a subprocess, stdout+stderr appended to
       ``log_path``; killing it (even SIGKILL) is safe: relaunching resumes from the latest
       checkpoint (same ``trainer.id`` + checkpoint path), data position included. The child sets
       PR_SET_PDEATHSIG so it dies with the launching process; if run_training itself is
       interrupted (KeyboardInterrupt / timeout) it terminates the child. ``run_dir`` must be
       local (logs, lock file, W&B dir); checkpoints / HF exports may be on gs://.
    3. Afterwards it requires a trainer checkpoint at the final step (guaranteed by the keep
       policy of ``levanter_config``) and ensures a complete HF export at ``<hf_dir>/step-{N-1}``;
       if it is missing / incomplete (e.g. killed during the export) it is re-exported from the
       final checkpoint (``export_hf``). With ``export_chat_template`` the export's tokenizer gets
       the training chat template.
    4. Parses losses from ``log_path`` (json_logger lines), writes
       ``<run_dir>/training_result.json`` and returns it:

       ``{"steps": N (completed optimizer steps), "final_loss": train/loss of the last step,
       "checkpoint_dir": final trainer checkpoint, "hf_export": final HF export dir,
       "resumed_from_step": completed steps this launch started from (0 = fresh start, None = not
       launched), "launched": bool, "returncode": int|None, "eval_loss": {...}, "loss_history":
       [[step, loss], ...], "config_path", "log_path"}``
    """
    refuse_single_process_on_pod()
    run = prepare_run(config_dict, run_dir)
    cfg, tr, N = run.cfg, run.cfg["trainer"], run.num_steps
    run_dir, ckpt_dir, final_hf = run.run_dir, run.checkpoint_dir, run.final_hf
    log_path = os.path.abspath(log_path)

    with _run_lock(run_dir):
        config_path = write_config(resolve_hub_refs(cfg), os.path.join(run_dir, _CONFIG_FILE))
        _ensure_reference_checkpoint(cfg)

        ckpt = latest_checkpoint(ckpt_dir)
        launched = False
        rc: Optional[int] = None
        if ckpt is None or ckpt["completed_steps"] < N:
            _check_caches(cfg)
            launched = True
            header = (
                f"{_LAUNCH_MARK} train_lm id={tr['id']} at {_dt.datetime.now().isoformat()} "
                f"(latest checkpoint: {ckpt['path'] if ckpt else None})"
            )
            rc = _run_subprocess(
                [sys.executable, "-c", _TRAIN_LAUNCHER, "--config_path", config_path],
                log_path,
                levanter_env(run_dir, env),
                run_dir,
                header,
                timeout=timeout,
            )
            ckpt = latest_checkpoint(ckpt_dir)
            if ckpt is None or ckpt["completed_steps"] < N:
                got = ckpt["completed_steps"] if ckpt else 0
                why = (
                    _exit_reason(rc)
                    if rc != 0
                    else "train_lm exited 0 before num_train_steps (data exhausted? check epochs / num_train_steps)"
                )
                raise TrainingFailed(f"{why}; latest checkpoint covers {got}/{N} steps. See {log_path}")
            # rc != 0 with a final checkpoint: crashed after the last step (e.g. in the HF export or
            # tracker shutdown); we repair the export below.

        if not hf_export_complete(final_hf):
            export_hf(cfg, ckpt["path"], final_hf, env=env, log_path=log_path, cwd=run_dir)
        if export_chat_template and not _is_remote(final_hf):
            tmpl = _chat_template_of(cfg)
            if tmpl:
                _write_chat_template(final_hf, tmpl)

        result = collect_result(run, log_path, ckpt, launched=launched, returncode=rc, config_path=config_path)
        _write_json_atomic(os.path.join(run_dir, _RESULT_FILE), result)
        return result
