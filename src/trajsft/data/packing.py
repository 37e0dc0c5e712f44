"""Which chats share a ``seq_len`` training sequence: first-fit-decreasing bins, written in cache order.

Levanter packs a chat cache next-fit in cache order (``levanter.data.packing.GreedyPrepackedDataset``
with ``train_lm``'s parameters: at most 64 chats per sequence, a chat longer than ``seq_len`` keeps
its first ``seq_len`` tokens and fills a sequence alone). Next-fit wastes about a fifth of every
sequence on agent trajectories at 32k. The tokenize step therefore writes the cache in the order of
first-fit-decreasing (FFD) bins: Levanter's next-fit over that order closes each sequence exactly at
a bin boundary (:func:`cache_order` explains why), so training packs the FFD bins without any change
to Levanter. All functions are pure and deterministic (ties broken by index).
"""

from __future__ import annotations

import math
from typing import Sequence

MAX_SEGMENTS = 64  # levanter.data.text.dataset_for_format: max_segments_per_example when pack=True


def _size(length: int, seq_len: int) -> int:
    return min(int(length), int(seq_len))  # Levanter slices longer chats to their first seq_len tokens


def next_fit(lengths: Sequence[int], seq_len: int, max_segments: int = MAX_SEGMENTS) -> list[list[int]]:
    """Levanter's packing rule (``pack_documents`` with slicing): next-fit in the given order; a
    sequence closes when the next chat does not fit or it holds ``max_segments`` chats; a chat
    longer than ``seq_len`` is a sequence of its own."""
    bins: list[list[int]] = []
    i, n = 0, len(lengths)
    while i < n:
        start, total = i, 0
        while i < n and i - start < max_segments and total + int(lengths[i]) <= seq_len:
            total += int(lengths[i])
            i += 1
        if i == start:
            i += 1
        bins.append(list(range(start, i)))
    return bins


def first_fit_decreasing(lengths: Sequence[int], seq_len: int, max_segments: int = MAX_SEGMENTS) -> list[list[int]]:
    """FFD bins (lists of chat indices) of capacity ``seq_len`` and at most ``max_segments`` chats.

    Chats are taken longest first (ties by index); each goes into the first bin with room, found
    in O(log bins) with a max segment tree over the bins' free space. Over-long chats count as
    ``seq_len`` (Levanter slices them) and fill a bin alone.
    """
    seq_len = int(seq_len)
    if seq_len <= 0:
        raise ValueError("seq_len must be positive")
    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-_size(lengths[i], seq_len), i))
    size = 1
    while size < max(1, n):
        size *= 2
    tree = [-1] * (2 * size)  # free space of bin j at leaf size + j; -1 = not opened / closed
    bins: list[list[int]] = []
    used: list[int] = []

    def set_free(j: int, free: int) -> None:
        k = size + j
        tree[k] = free
        k //= 2
        while k:
            tree[k] = max(tree[2 * k], tree[2 * k + 1])
            k //= 2

    for i in order:
        s = _size(lengths[i], seq_len)
        if tree[1] >= s:
            k = 1
            while k < size:  # leftmost leaf with free >= s
                k = 2 * k if tree[2 * k] >= s else 2 * k + 1
            j = k - size
        else:
            j = len(bins)
            bins.append([])
            used.append(0)
        bins[j].append(i)
        used[j] += s
        free = seq_len - used[j]
        # a full bin stays closed for Levanter's next-fit too: nothing can follow a full sequence
        set_free(j, free if len(bins[j]) < max_segments and free > 0 else -1)
    return bins


def cache_order(bins: Sequence[Sequence[int]]) -> list[int]:
    """The chat order that makes Levanter's next-fit reproduce ``bins`` (FFD bins).

    Bins are concatenated in creation order, each bin's chats in placement (decreasing) order.
    Next-fit never merges two consecutive bins: the first chat of a later bin did not fit in any
    earlier bin when it was placed (first fit), and earlier bins only fill up afterwards; a
    64-chat bin is closed by the segment cap. Within a bin the chats fit by construction.
    """
    return [i for b in bins for i in b]


def lower_bound(lengths: Sequence[int], seq_len: int, max_segments: int = MAX_SEGMENTS) -> int:
    """No packing needs fewer sequences: total (sliced) tokens / seq_len, chats / max_segments."""
    if not lengths:
        return 0
    total = sum(_size(n, seq_len) for n in lengths)
    return max(math.ceil(total / seq_len), math.ceil(len(lengths) / max_segments))


def efficiency(lengths: Sequence[int], bins: Sequence[Sequence[int]], seq_len: int) -> float:
    """Share of non-pad tokens in the ``len(bins)`` padded ``seq_len`` sequences."""
    if not bins:
        return 0.0
    non_pad = sum(min(sum(int(lengths[i]) for i in b), seq_len) for b in bins)
    return non_pad / (len(bins) * seq_len)


def summary(lengths: Sequence[int], seq_len: int) -> dict:
    """FFD vs next-fit (in the given order) vs the lower bound, for the manifest and the benchmark."""
    nf = next_fit(lengths, seq_len)
    ffd = first_fit_decreasing(lengths, seq_len)
    return {
        "seq_len": int(seq_len),
        "chats": len(lengths),
        "lower_bound": lower_bound(lengths, seq_len),
        "next_fit_in_shard_order": {"sequences": len(nf), "non_pad": efficiency(lengths, nf, seq_len)},
        "first_fit_decreasing": {"sequences": len(ffd), "non_pad": efficiency(lengths, ffd, seq_len)},
    }
