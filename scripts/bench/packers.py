"""Levanter's next-fit vs the first-fit-decreasing cache order (trajsft.data.packing) vs the lower bound."""

from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import Optional, Sequence

import numpy as np

from .common import LengthProfile
from .packing import pack_with_levanter


# --------------------------------------------------------------------------------------
# packing: Levanter's next-fit vs first-fit-decreasing cache order (trajsft.data.packing) vs lower bound
# --------------------------------------------------------------------------------------

# (label, seq_len, median tokens) of the table; lengths only, drawn like make_chats
PACKING_PROFILES = (("32768, median 12k", 32768, 12000.0), ("32768, median 20k", 32768, 20000.0),
                    ("8192, median 12k", 8192, 12000.0))


def profile_lengths(n: int, seed: int, profile: LengthProfile = LengthProfile()) -> list[int]:
    """The stratified log-normal chat lengths of ``make_chats`` (tokens), without generating text."""
    rng = random.Random(seed)
    strata = list(range(n))
    rng.shuffle(strata)
    normal = NormalDist(math.log(profile.median_tokens), profile.sigma)
    out = []
    for i in range(n):
        u = min(max((strata[i] + rng.random()) / n, 1e-12), 1 - 1e-12)
        out.append(int(min(max(math.exp(normal.inv_cdf(u)), profile.min_tokens), profile.max_tokens)))
    return out


def _ranges(bins: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    out, pos = [], 0
    for b in bins:
        out.append((pos, pos + len(b)))
        pos += len(b)
    return out


def compare_packers(lengths: Sequence[int], seq_len: int, input_ids: Optional[Sequence[np.ndarray]] = None,
                    masks: Optional[Sequence[np.ndarray]] = None) -> dict:
    """Levanter's packer over the chats in the given (shard) order and over trajsft's FFD cache order.

    With ``input_ids``/``masks`` (a tokenized set) the figures are read back from the padded examples
    Levanter's ``GreedyPrepackedDataset`` yields; with lengths only, Levanter's ``pack_documents``
    (the function that dataset packs with) gives the sequences and non-pad = sum of sliced lengths.
    """
    from levanter.data.packing import pack_documents

    from trajsft.data import packing as P

    lengths = [int(x) for x in lengths]
    bins = P.first_fit_decreasing(lengths, seq_len)
    order = P.cache_order(bins)
    out = {"seq_len": int(seq_len), "chats": len(lengths), "lower_bound": P.lower_bound(lengths, seq_len)}
    for name, idx in (("levanter_next_fit", list(range(len(lengths)))), ("ffd", order)):
        if input_ids is not None:
            res = pack_with_levanter([input_ids[i] for i in idx], [masks[i] for i in idx], seq_len)
            packs, non_pad = [(r.start, r.stop) for r in res["packs"]], res["non_pad_tokens"]
            source = "packed examples (GreedyPrepackedDataset)"
        else:
            ordered = np.asarray([lengths[i] for i in idx], dtype=np.int64)
            packs = [(r.start, r.stop) for r in pack_documents(ordered, seq_len, max_segments_per_example=64,
                                                                  slice_too_long_examples=True)]
            non_pad = sum(min(int(ordered[a:b].sum()), seq_len) for a, b in packs)
            source = "levanter.data.packing.pack_documents"
        out[name] = {"sequences": len(packs), "non_pad": non_pad / (len(packs) * seq_len), "source": source}
        if name == "ffd":
            out[name]["levanter_makes_the_ffd_bins"] = packs == _ranges(bins)
    return out


def bench_packing_profiles(n: int, seed: int) -> list[dict]:
    out = []
    for label, seq_len, median in PACKING_PROFILES:
        lengths = profile_lengths(n, seed, LengthProfile(median_tokens=median))
        out.append(dict(compare_packers(lengths, seq_len), profile=label))
    return out
