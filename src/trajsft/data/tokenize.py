"""Step ``tokenize``: the shards of a target into a Levanter chat cache in packing order, with its statistics."""

from __future__ import annotations

import logging
import os

from ..errors import DataError
from ..io import is_remote, join
from ..plan.config import Artifact
from ..plan import tools
from ..plan.step_configs import TokenizeConfig
from ..terminal import Counted
from . import cache as data_cache, template

log = logging.getLogger("trajsft")


# share of chats / tokens beyond these lengths is reported for every teacher
LENGTH_THRESHOLDS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def cache_dir(location: str) -> str:
    """``<location>/cache``, a local location made absolute (train_lm runs in the run dir)."""
    return join(location if is_remote(location) else os.path.abspath(location), "cache")


def length_shares(lengths: list[int]) -> dict:
    total = sum(lengths) or 1
    out = {}
    for t in LENGTH_THRESHOLDS:
        over = [n for n in lengths if n > t]
        out[str(t)] = {"chats": len(over) / max(1, len(lengths)), "tokens_beyond": sum(n - t for n in over) / total}
    return out


def tools_block_tokens(cfg: TokenizeConfig) -> int:
    """Tokens the teacher's tools block adds to every chat (0: no tools), with the student's tokenizer."""
    if not cfg.tools:
        return 0
    from levanter.compat.hf_checkpoints import load_tokenizer

    from .chat_processor import tools_block_tokens as count

    return count(load_tokenizer(data_cache.resolve_tokenizer(cfg.tokenizer)), template.load_template(), cfg.tools)


def _traj_ids(urls: list[str]) -> list:
    from .chat_cache import iter_records

    return [r.get("traj_id") for r in iter_records(urls)]


def tokenize(cfg: TokenizeConfig) -> dict:
    """Levanter chat cache of a shard set, in packing order, keeping only chats that train on ``seq_len`` windows.

    1. ``cache/``: every chat of the shards, in shard order (``trajsft.data.cache.build_chat_cache``, in this
       process).
    2. Chats with no assistant token in their first ``seq_len`` tokens, and with ``long_chats:
       drop`` chats longer than ``seq_len``, are dropped (``window`` counts every choice, ``dropped``
       lists every dropped chat).
    3. ``cache-packed/``: the kept chats copied (not tokenized again) in first-fit-decreasing bin
       order (``trajsft.data.packing``), so Levanter's next-fit packer makes the FFD sequences; the
       sequences Levanter makes of it are read back and must be exactly those bins. This is the
       manifest's ``cache_dir``, the cache training reads; ``packing`` has the figures.
    """
    from . import packing

    seq_len, policy = cfg.seq_len, cfg.long_chats
    urls = {s: [join(cfg.shards_location, f) for f in files] for s, files in cfg.shard_files.items()}
    loc = cfg.location if is_remote(cfg.location) else os.path.abspath(cfg.location)

    stats = data_cache.build_chat_cache(urls["train"], urls.get("validation", []), join(loc, "cache"),
                                        tokenizer=cfg.tokenizer, chat_template=template.load_template(),
                                        seq_len=seq_len, tools=cfg.tools,
                                        progress=Counted(f"trajsft tokenize {cfg.name}", cfg.chats, "chats"))
    window, dropped, orders, bins, report = {"seq_len": seq_len, "long_chats": policy}, [], {}, {}, {}
    for split in ("train", "validation"):
        if not stats.get(split):
            continue
        st = stats[split]
        wp = data_cache.window_plan(st, seq_len, policy)
        window[split] = wp["counts"]
        if wp["dropped"]:
            ids = _traj_ids(urls[split])
            if len(ids) != st["chats"]:
                raise RuntimeError(f"{split}: {len(ids)} shard records but {st['chats']} cached chats")
            dropped += [{"split": split, "traj_id": ids[i], "reason": r, "tokens": st["lengths"][i]} for i, r in wp["dropped"]]
        keep = wp["keep"]
        if not keep:
            continue
        kept_lengths = [st["lengths"][i] for i in keep]
        split_bins = packing.first_fit_decreasing(kept_lengths, seq_len)
        orders[split] = [keep[j] for j in packing.cache_order(split_bins)]
        bins[split] = split_bins
        report[split] = packing.summary(kept_lengths, seq_len)
    for d in dropped:
        log.warning("%s: dropped %s chat %s (%s, %d tokens; seq_len %d)", cfg.teacher, d["split"], d["traj_id"],
                    d["reason"], d["tokens"], seq_len)
    if "train" not in orders:
        c = window["train"]
        raise DataError(f"{cfg.teacher}: no training chat is left at seq_len {seq_len}: "
                        f"{c['dropped_empty_window']['chats']} have no assistant token within the first {seq_len} tokens, "
                        f"{c['dropped_longer_than_seq_len']['chats']} are longer (long_chats: {policy})")
    if "validation" in window and "validation" not in orders:
        log.warning("%s: every validation chat was dropped: no eval loss", cfg.teacher)
    final_dir = join(loc, "cache-packed")
    first = stats
    stats = data_cache.reorder_chat_cache(join(loc, "cache"), final_dir, orders, seq_len=seq_len)
    for split, order in orders.items():
        st = stats[split]
        if st["lengths"] != [first[split]["lengths"][i] for i in order]:
            raise RuntimeError(f"{split}: the packed cache does not hold the kept chats in packing order")
        expect, pos = [], 0
        for b in bins[split]:
            expect.append([pos, pos + len(b)])
            pos += len(b)
        if st["packed_ranges"] != expect:
            raise RuntimeError(f"{split}: Levanter packed {st['packed_sequences']} sequences, not the "
                               f"{len(expect)} first-fit-decreasing bins the cache order was written for")
        report[split]["levanter_packed"] = {"sequences": st["packed_sequences"], "non_pad": st["packed_non_pad"]}
        st["longer_than"] = length_shares(st["lengths"])
        del st["packed_ranges"]
    tr = stats["train"]
    log.info("%s: %d chats, %d tokens, assistant fraction %.3f; %d packed sequences of %d tokens (%.2f%% non-pad; "
             "next-fit in shard order: %d, lower bound %d)", cfg.teacher, tr["chats"], tr["tokens"],
             tr["assistant_fraction"], tr["packed_sequences"], seq_len, 100 * tr["packed_non_pad"],
             report["train"]["next_fit_in_shard_order"]["sequences"], report["train"]["lower_bound"])
    return {"teacher": cfg.teacher, "cache_dir": final_dir, "tokenizer": cfg.tokenizer,
            "tools": tools.names(cfg.tools), "tools_block_tokens": tools_block_tokens(cfg),
            "template_sha256": template.template_sha256(), "window": window, "dropped": dropped,
            "packing": report, "stats": stats}


def tokenized_cache_dir(tokenized: Artifact) -> str:
    """The cache training reads: the tokenized manifest's ``cache_dir`` (``cache`` or
    ``cache-packed``; older manifests: ``cache-windowed``), else ``<location>/cache``."""
    try:
        return tokenized.read_manifest()["cache_dir"]
    except (DataError, KeyError):
        return cache_dir(tokenized.location)
