"""Packing statistics: Levanter's packer on tokenized chats or on a list of lengths, and a reference greedy packer."""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

import numpy as np

from .common import MAX_SEGMENTS_PER_EXAMPLE
from .tokenization import _batches


# --------------------------------------------------------------------------------------
# packing
# --------------------------------------------------------------------------------------


def _memory_store(arrays: Sequence[np.ndarray]):
    """An in-memory (tensorstore memory://) JaggedArrayStore holding ``arrays``."""
    from levanter.store.jagged_array import JaggedArrayStore

    async def _open():
        # path=None -> memory:// kvstore (the sync open() cannot do this in this Levanter version)
        return await JaggedArrayStore.open_async(None, mode="w", dtype=np.int32)

    store = asyncio.run(_open())
    for chunk in _batches(arrays, 1024):
        store.extend([np.asarray(a, dtype=np.int32) for a in chunk])
    return store


def greedy_pack_reference(lengths: Sequence[int], seq_len: int,
                          max_segments: int = MAX_SEGMENTS_PER_EXAMPLE) -> list[range]:
    """Pure-Python re-implementation of ``levanter.data.packing.pack_documents`` (slicing on):
    next-fit in order; a pack is closed as soon as the next chat does not fit or it holds
    ``max_segments`` chats; a chat longer than ``seq_len`` gets a pack of its own."""
    packs, i, n = [], 0, len(lengths)
    while i < n:
        start, total = i, 0
        while i < n and i - start < max_segments and total + lengths[i] <= seq_len:
            total += lengths[i]
            i += 1
        if i == start:
            i += 1
        packs.append(range(start, i))
    return packs


def pack_with_levanter(input_ids: Sequence[np.ndarray], assistant_masks: Sequence[np.ndarray], seq_len: int,
                       read_batch: int = 64) -> dict:
    """Pack with Levanter's ``GreedyPrepackedDataset`` (train_lm's parameters) and measure the packed examples.

    Returns ``packs`` (list of ranges), ``non_pad_tokens`` / ``loss_tokens`` counted in the padded
    ``seq_len`` examples that Levanter's packer yields.
    """
    from levanter.data.packing import GreedyPrepackedDataset

    tree = {"input_ids": _memory_store(input_ids), "assistant_masks": _memory_store(assistant_masks)}
    packed = GreedyPrepackedDataset(tree, int(seq_len), max_segments_per_example=MAX_SEGMENTS_PER_EXAMPLE,
                                    pad_with_zeros=True, slice_strategy="left")
    packs = list(packed._pack_indices)
    sync = packed.as_sync_dataset()
    non_pad = loss = 0
    for lo in range(0, len(packs), read_batch):
        for data, seg in sync.get_batch(range(lo, min(lo + read_batch, len(packs)))):
            assert data["input_ids"].shape == (seq_len,)
            non_pad += int((seg["input_ids"] >= 0).sum())
            loss += int(np.asarray(data["assistant_masks"]).sum())
    return {"packs": packs, "non_pad_tokens": non_pad, "loss_tokens": loss}


def packing_stats(lengths: Sequence[int], assistant_lengths: Sequence[int], assistant_in_window: Sequence[int],
                  seq_len: int, packs: Sequence[range], non_pad_tokens: Optional[int] = None,
                  loss_tokens: Optional[int] = None) -> dict:
    """Packing / truncation figures from per-chat lengths and a packing (list of index ranges)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    kept = int(np.minimum(lengths, seq_len).sum())
    asst_total = int(np.sum(assistant_lengths))
    asst_kept = int(np.sum(assistant_in_window))
    n_packs = len(packs)
    if non_pad_tokens is None:
        non_pad_tokens = sum(min(int(lengths[r.start : r.stop].sum()), seq_len) for r in packs)
    if loss_tokens is None:
        loss_tokens = asst_kept
    return {
        "seq_len": int(seq_len),
        "chats": int(len(lengths)),
        "packed_sequences": n_packs,
        "training_tokens": n_packs * int(seq_len),
        "non_pad_tokens": int(non_pad_tokens),
        "packing_efficiency": float(non_pad_tokens / (n_packs * seq_len)) if n_packs else 0.0,
        "mean_chats_per_sequence": float(len(lengths) / n_packs) if n_packs else 0.0,
        "tokens_total": total,
        "tokens_truncated": total - kept,
        "truncated_token_share": float((total - kept) / total) if total else 0.0,
        "chats_truncated": int((lengths > seq_len).sum()),
        "truncated_chat_share": float((lengths > seq_len).mean()) if len(lengths) else 0.0,
        "assistant_tokens": asst_total,
        "assistant_tokens_kept": int(loss_tokens),
        "assistant_truncated_share": float(1 - loss_tokens / asst_total) if asst_total else 0.0,
        "loss_token_share_of_training_tokens": float(loss_tokens / (n_packs * seq_len)) if n_packs else 0.0,
    }


def packing_from_lengths(lengths: Sequence[int], seq_len: int, assistant_lengths: Optional[Sequence[int]] = None,
                         use_levanter: bool = True) -> dict:
    """Packing figures for a plain list of chat lengths (dummy tokens; assistant tokens at each chat's end)."""
    lengths = [int(x) for x in lengths]
    asst = [int(a) for a in (assistant_lengths if assistant_lengths is not None else [0] * len(lengths))]
    masks = [np.concatenate([np.zeros(n - a, np.int32), np.ones(a, np.int32)]) for n, a in zip(lengths, asst)]
    in_window = [int(m[:seq_len].sum()) for m in masks]
    if use_levanter:
        res = pack_with_levanter([np.ones(n, np.int32) for n in lengths], masks, seq_len)
        out = packing_stats(lengths, asst, in_window, seq_len, res["packs"], res["non_pad_tokens"], res["loss_tokens"])
        out["packer"] = "levanter"
    else:
        out = packing_stats(lengths, asst, in_window, seq_len, greedy_pack_reference(lengths, seq_len))
        out["packer"] = "reference"
    return out
