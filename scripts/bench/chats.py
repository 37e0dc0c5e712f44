"""Synthetic agent trajectories in OpenAI chat format, shaped like demo/dataset, to a token-length profile."""

from __future__ import annotations

import json
import math
import random
import string
from statistics import NormalDist
from typing import Any, Sequence

from .common import LengthProfile, OVERHEAD_TOKENS_PER_TURN


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
