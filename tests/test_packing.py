"""First-fit-decreasing packing order (trajsft.data.packing), checked against Levanter's own packer.

Pure unit tests on length lists, plus one on a real in-process chat cache (demo tokenizer):
the cache written in FFD order is packed by Levanter's ``GreedyPrepackedDataset`` into exactly the
FFD bins, and the non-pad share in the manifest is what the packed examples hold.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest

from trajsft.data import packing as P

DEMO_TOKENIZER = str(Path(__file__).resolve().parents[1] / "demo" / "tokenizer")


def _lognormal_lengths(n: int, seed: int, median: float = 12000, sigma: float = 0.68) -> list[int]:
    rng = random.Random(seed)
    return [int(min(131072, max(1500, rng.lognormvariate(math.log(median), sigma)))) for _ in range(n)]


def _check_bins(bins, lengths, seq_len):
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))  # every chat exactly once
    for b in bins:
        assert 1 <= len(b) <= P.MAX_SEGMENTS
        assert len(b) == 1 or sum(lengths[i] for i in b) <= seq_len  # over-long chats sit alone


def test_next_fit_is_levanters_rule_by_hand():
    # [10, 20] | [5] (5+40 > 32) | [40 -> sliced, alone] | [3] | [33 alone] | [1]
    assert P.next_fit([10, 20, 5, 40, 3, 33, 1], 32) == [[0, 1], [2], [3], [4], [5], [6]]
    assert [len(b) for b in P.next_fit([1] * 70, 1000)] == [64, 6]  # the 64-segment cap


def test_first_fit_decreasing_by_hand():
    # decreasing: 40(3) 33(5) 20(1) 10(0) 5(2) 3(4) 1(6); 40 and 33 fill bins alone; 20+10 -> 30, +1 -> 31; 5+3
    assert P.first_fit_decreasing([10, 20, 5, 40, 3, 33, 1], 32) == [[3], [5], [1, 0, 6], [2, 4]]
    assert P.lower_bound([10, 20, 5, 40, 3, 33, 1], 32) == math.ceil((10 + 20 + 5 + 32 + 3 + 32 + 1) / 32) == 4
    assert [len(b) for b in P.first_fit_decreasing([1] * 130, 1000)] == [64, 64, 2]
    assert P.lower_bound([1] * 130, 1000) == 3
    with pytest.raises(ValueError):
        P.first_fit_decreasing([1], 0)


@pytest.mark.parametrize("seed", range(6))
def test_next_fit_over_the_cache_order_makes_exactly_the_ffd_bins(seed):
    rng = random.Random(seed)
    seq_len = rng.choice([64, 1000, 4096])
    # a mix of tiny chats (the 64 cap), exact fits, and over-long chats
    lengths = [rng.choice([1, 2, seq_len, seq_len + 7, rng.randint(1, seq_len), rng.randint(1, seq_len // 3 + 1)])
               for _ in range(rng.randint(1, 600))]
    bins = P.first_fit_decreasing(lengths, seq_len)
    _check_bins(bins, lengths, seq_len)
    order = P.cache_order(bins)
    ordered = [lengths[i] for i in order]
    expect = []
    pos = 0
    for b in bins:
        expect.append(list(range(pos, pos + len(b))))
        pos += len(b)
    assert P.next_fit(ordered, seq_len) == expect
    # and Levanter's own pack_documents agrees with our next-fit
    from levanter.data.packing import pack_documents

    lev = pack_documents(np.asarray(ordered, dtype=np.int64), seq_len, max_segments_per_example=P.MAX_SEGMENTS,
                         slice_too_long_examples=True)
    assert [list(r) for r in lev] == expect
    assert P.lower_bound(lengths, seq_len) <= len(bins) <= len(P.next_fit(lengths, seq_len))
    assert P.first_fit_decreasing(lengths, seq_len) == bins  # deterministic


def test_ffd_reaches_99_percent_at_32k_on_the_benchmark_profile():
    lengths = _lognormal_lengths(5000, seed=0)
    s = P.summary(lengths, 32768)
    ffd, nf = s["first_fit_decreasing"], s["next_fit_in_shard_order"]
    assert ffd["non_pad"] >= 0.99, s
    assert ffd["sequences"] <= s["lower_bound"] * 1.01
    assert nf["sequences"] > 1.2 * ffd["sequences"]  # next-fit in random order wastes ~a fifth


def test_a_cache_written_in_ffd_order_is_packed_into_the_ffd_bins(tmp_path):
    """Real files: the in-process cache writer and the reorder copy, read back with Levanter's packer."""
    from levanter.data.packing import GreedyPrepackedDataset

    from trajsft.data import chat_cache
    from trajsft.data import cache as data_cache
    from trajsft.data.transform import gzip_jsonl

    rng = random.Random(3)
    chats = [{"messages": [{"role": "user", "content": " ".join(["word"] * rng.randint(1, 60))},
                           {"role": "assistant", "content": " ".join(["done"] * rng.randint(1, 60))}]}
             for _ in range(40)]
    shard = tmp_path / "train-00000.jsonl.gz"
    shard.write_bytes(gzip_jsonl(chats))
    from trajsft.data.template import load_template

    seq_len = 160
    first = data_cache.build_chat_cache([str(shard)], [], str(tmp_path / "cache"), DEMO_TOKENIZER, load_template(),
                                seq_len=seq_len)
    lengths = first["train"]["lengths"]
    assert len(lengths) == 40
    bins = P.first_fit_decreasing(lengths, seq_len)
    order = P.cache_order(bins)
    st = data_cache.reorder_chat_cache(str(tmp_path / "cache"), str(tmp_path / "packed"), {"train": order}, seq_len=seq_len)
    tr = st["train"]
    assert tr["lengths"] == [lengths[i] for i in order]
    pos, expect = 0, []
    for b in bins:
        expect.append([pos, pos + len(b)])
        pos += len(b)
    assert tr["packed_ranges"] == expect and tr["packed_sequences"] == len(bins)
    # the non-pad share in the stats is what the packed examples Levanter yields hold
    cache = data_cache._open_chat_split(str(tmp_path / "packed" / "train"))
    ds = GreedyPrepackedDataset(cache.store.tree, seq_len, max_segments_per_example=64, pad_with_zeros=True,
                                slice_strategy="left").as_sync_dataset()
    non_pad = sum(int((seg["input_ids"] >= 0).sum()) for data, seg in ds.get_batch(range(len(bins))))
    assert tr["packed_non_pad"] == pytest.approx(non_pad / (len(bins) * seq_len))
    # rows are copied, not re-tokenized: identical arrays, ledger metadata kept
    src = data_cache._open_chat_split(str(tmp_path / "cache" / "train"))
    a = src.store.get_batch_sync(order[:5])
    b = cache.store.get_batch_sync(list(range(5)))
    for x, y in zip(a, b):
        assert np.array_equal(x["input_ids"], y["input_ids"]) and np.array_equal(x["assistant_masks"], y["assistant_masks"])
    from levanter.store.cache import CacheLedger

    meta = CacheLedger.load(str(tmp_path / "packed" / "train")).metadata.preprocessor_metadata
    assert meta == CacheLedger.load(str(tmp_path / "cache" / "train")).metadata.preprocessor_metadata
    assert meta["chat_template"] == load_template() and meta["messages_field"] == "messages"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # published atomically
    # the rows equal Levanter's ChatProcessor output
    from levanter.compat.hf_checkpoints import load_tokenizer
    from levanter.data.text import ChatProcessor

    proc = ChatProcessor(load_tokenizer(DEMO_TOKENIZER), chat_template=load_template())
    direct = proc(chats[:3])
    for x, y in zip(direct, src.store.get_batch_sync([0, 1, 2])):
        assert np.array_equal(x["input_ids"], y["input_ids"]) and np.array_equal(x["assistant_masks"], y["assistant_masks"])
    assert list(chat_cache.iter_records([str(shard)])) == chats


def test_tensorstore_writes_gs_caches_through_its_gcs_driver():
    """A gs:// cache dir becomes tensorstore's gcs kvstore (the spec Levanter's JaggedArrayStore opens)."""
    import jax.experimental.array_serialization.serialization as ser

    kv = ser.get_tensorstore_spec("gs://marin-us-central1/trajsft/tokenized/x/cache-packed/train/input_ids/data",
                                  ocdbt=False)["kvstore"]
    assert kv["driver"] == "gcs" and kv["bucket"] == "marin-us-central1"
    assert kv["path"] == "trajsft/tokenized/x/cache-packed/train/input_ids/data"


def _chats(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": " ".join(["word"] * rng.randint(1, 60))},
                          {"role": "assistant", "content": " ".join(["done"] * rng.randint(1, 60))}],
             "traj_id": f"t{seed}-{i}"} for i in range(n)]


def test_the_worker_pool_writes_exactly_the_serial_cache(tmp_path, monkeypatch):
    """Large-input path (forked workers running Levanter's ChatProcessor, results written in order)
    against the in-process one on the same shards: identical token ids and masks, row by row, in
    both splits, and both equal Levanter's ChatProcessor on the chats in shard order."""
    from levanter.compat.hf_checkpoints import load_tokenizer
    from levanter.data.text import ChatProcessor
    from levanter.store.cache import CacheLedger

    from trajsft.data import cache as data_cache
    from trajsft.data import chat_cache
    from trajsft.data.template import load_template
    from trajsft.data.transform import gzip_jsonl

    train = [_chats(70, 1), _chats(1, 2), _chats(55, 3)]
    val = [_chats(9, 4)]
    urls = {}
    for split, shards in (("train", train), ("validation", val)):
        urls[split] = []
        for i, chats in enumerate(shards):
            p = tmp_path / f"{split}-{i:05d}.jsonl.gz"
            p.write_bytes(gzip_jsonl(chats))
            urls[split].append(str(p))
    monkeypatch.setattr(chat_cache, "POOL_TASK_BYTES", 2000)  # many small tasks, several in flight
    import psutil

    before = {c.pid for c in psutil.Process().children()}  # servers of session fixtures, in any test order
    from trajsft.terminal import Counted

    total = sum(len(c) for shards in (train, val) for c in shards)
    said: dict[str, list[str]] = {"serial": [], "pooled": []}  # the terminal's lines (each batch: every=0)
    serial = data_cache.build_chat_cache(urls["train"], urls["validation"], str(tmp_path / "serial"), DEMO_TOKENIZER,
                                 load_template(), seq_len=128, workers=0,
                                 progress=Counted("serial", total, "chats", every=0, out=said["serial"].append))
    pooled = data_cache.build_chat_cache(urls["train"], urls["validation"], str(tmp_path / "pooled"), DEMO_TOKENIZER,
                                 load_template(), seq_len=128, workers=2,
                                 progress=Counted("pooled", total, "chats", every=0, out=said["pooled"].append))
    for how, lines in said.items():  # every chat counted once, as written
        assert lines and lines[-1].startswith(f"{how}: {total:,}/{total:,} chats · "), lines
    proc = ChatProcessor(load_tokenizer(DEMO_TOKENIZER), chat_template=load_template())
    for split, shards in (("train", train), ("validation", val)):
        chats = [c for s in shards for c in s]
        assert serial[split]["lengths"] == pooled[split]["lengths"] and len(pooled[split]["lengths"]) == len(chats)
        a = data_cache._open_chat_split(str(tmp_path / "serial" / split)).store.get_batch_sync(list(range(len(chats))))
        b = data_cache._open_chat_split(str(tmp_path / "pooled" / split)).store.get_batch_sync(list(range(len(chats))))
        direct = proc(chats)
        for x, y, z in zip(a, b, direct):
            for k in ("input_ids", "assistant_masks"):
                assert np.array_equal(x[k], y[k]) and np.array_equal(y[k], z[k])
        assert (CacheLedger.load(str(tmp_path / "pooled" / split)).metadata
                == CacheLedger.load(str(tmp_path / "serial" / split)).metadata)
    assert {c.pid for c in psutil.Process().children()} <= before  # the workers are gone


def test_the_worker_pool_runs_in_other_processes_and_keeps_the_order():
    from trajsft.data import chat_cache

    def proc(batch):
        return [{"i": r["i"], "pid": os.getpid()} for r in batch]

    lines = [json.dumps({"i": i}) + "\n" for i in range(300)]
    with chat_cache.tokenize_pool(proc, 2) as pool:
        out = [r for res in chat_cache._pooled(pool, chat_cache._tasks(iter(lines), 7)) for r in res]
    assert [r["i"] for r in out] == list(range(300))
    pids = {r["pid"] for r in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_a_worker_error_reaches_the_build_and_nothing_is_published(tmp_path):
    """Levanter's ChatProcessor raises on a chat without an assistant turn; in a worker too."""
    from trajsft.data import cache as data_cache
    from trajsft.data.template import load_template
    from trajsft.data.transform import gzip_jsonl

    chats = _chats(20, 5) + [{"messages": [{"role": "user", "content": "hi"}]}]
    shard = tmp_path / "train-00000.jsonl.gz"
    shard.write_bytes(gzip_jsonl(chats))
    with pytest.raises(ValueError, match="did not contain an assistant message"):
        data_cache.build_chat_cache([str(shard)], [], str(tmp_path / "cache"), DEMO_TOKENIZER, load_template(), workers=2)
    assert not list(tmp_path.glob("*cache*"))


def test_only_large_inputs_use_the_pool(monkeypatch):
    from trajsft.data import chat_cache

    monkeypatch.setattr(chat_cache.os, "cpu_count", lambda: 8)
    assert chat_cache.pool_workers(chat_cache.POOL_MIN_BYTES - 1) == 0  # the demo's 36 KB: in this process
    assert chat_cache.pool_workers(chat_cache.POOL_MIN_BYTES) == 8
    assert chat_cache.pool_workers(10 * chat_cache.POOL_MIN_BYTES, workers=1) == 0  # one core: no pool
    # 2 cores (this machine, CI): the pool measured slower than one process, so none by default
    monkeypatch.setattr(chat_cache.os, "cpu_count", lambda: 2)
    assert chat_cache.pool_workers(10 * chat_cache.POOL_MIN_BYTES) == 0
    assert chat_cache.pool_workers(10 * chat_cache.POOL_MIN_BYTES, workers=2) == 2  # asked for: a pool
