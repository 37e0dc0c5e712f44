#!/usr/bin/env python
"""Generate the committed demo assets: a tiny teacher-trajectory dataset and a tokenizer.

Writes (relative to the repository root unless ``--out`` is given):

* ``demo/dataset/`` -- a Hugging Face dataset repo layout::

      README.md                          dataset card (YAML front matter: default config)
      data/train-00000-of-00002.parquet
      data/train-00001-of-00002.parquet
      EXPECTED.json                      ground truth about the deliberately bad rows

  with the columns of the real ``AlienKevin/SWE-smith-rs-*-trajectories`` datasets:
  ``messages`` (JSON string of an OpenAI chat list), ``instance_id``, ``resolved``,
  ``model``, ``traj_id``, ``patch``.  Rows are synthetic agentic bug-fixing trajectories on
  Rust repositories (a bash tool, SWE-smith style instance ids), plus a handful of
  malformed rows described in ``EXPECTED.json``.

* ``demo/tokenizer/`` -- a small byte-level BPE tokenizer trained on the demo text, saved as
  a transformers ``PreTrainedTokenizerFast`` with Qwen3's special/added tokens and the
  project's chat template (``src/trajsft/data/templates/qwen3_chat_template.jinja``).

Everything is derived from a fixed seed: running the script twice gives byte-identical
files.
"""

from __future__ import annotations

import os
import sys

# Running ``python scripts/make_demo_assets.py`` puts scripts/ first on sys.path, where a
# sibling ``tokenize.py`` would shadow the stdlib module (imported by inspect/dataclasses).
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import hashlib
import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jinja2  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))

from trajsft.data.template import load_template, strip_generation_tags  # noqa: E402

SEED = 20250601
N_ROWS = 60
N_SHARDS = 2
MODEL_NAME = "claude-sonnet-4-5-20250929"
VOCAB_SIZE = 2000  # BPE vocab incl. byte alphabet and the 3 special tokens; +6 added tokens

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen2/Qwen3 pre-tokenizer split pattern.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# --------------------------------------------------------------------------------------
# Bug catalogue: one synthetic SWE-smith style bug per Rust repository.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bug:
    repo: str  # owner__name (SWE-smith naming)
    hunk_ctx: str  # what `git diff` shows after the @@ hunk range (enclosing item)
    commit: str  # 8 hex chars, part of the instance id
    crate: str
    path: str
    start_line: int  # file line number of lines[0]
    lines: tuple[str, ...]  # the correct source of the function
    bug_idx: int  # index into ``lines`` of the line the bug lives on
    correct_sub: str  # substring of the correct line ...
    buggy_sub: str  # ... replaced by this in the buggy version
    wrong_sub: str  # an incorrect "fix" some unresolved trajectories apply
    mod_type: str
    symbol: str  # what the agent greps for
    test_name: str
    test_filter: str
    panic: str  # failing assertion message
    title: str
    body: str
    files: tuple[str, ...]  # a few other files of the repo (for ls/find output)
    deps: tuple[str, ...]  # dependency crates (for cargo build output)

    @property
    def bug_line_no(self) -> int:
        return self.start_line + self.bug_idx

    @property
    def correct_line(self) -> str:
        return self.lines[self.bug_idx]

    @property
    def buggy_line(self) -> str:
        line = self.lines[self.bug_idx]
        assert line.count(self.correct_sub) == 1, (self.repo, line)
        return line.replace(self.correct_sub, self.buggy_sub)

    @property
    def wrong_line(self) -> str:
        return self.lines[self.bug_idx].replace(self.correct_sub, self.wrong_sub)

    def buggy_lines(self) -> list[str]:
        out = list(self.lines)
        out[self.bug_idx] = self.buggy_line
        return out


BUGS: tuple[Bug, ...] = (
    Bug(
        repo="tokio-rs__bytes",
        hunk_ctx='impl BytesMut {',
        commit="f9bc8ba4",
        crate="bytes",
        path="src/bytes_mut.rs",
        start_line=283,
        lines=(
            "    pub fn split_off(&mut self, at: usize) -> BytesMut {",
            "        assert!(",
            "            at <= self.capacity(),",
            '            "split_off out of bounds: {:?} <= {:?}",',
            "            at,",
            "            self.capacity(),",
            "        );",
            "        unsafe {",
            "            let mut other = self.shallow_clone();",
            "            other.advance_unchecked(at);",
            "            self.cap = at;",
            "            self.len = cmp::min(self.len, at);",
            "            other",
            "        }",
            "    }",
        ),
        bug_idx=2,
        correct_sub="at <= self",
        buggy_sub="at < self",
        wrong_sub="at <= self.len() + self",
        mod_type="func_pm_op_change",
        symbol="fn split_off",
        test_name="split_off_at_capacity",
        test_filter="--test test_bytes split_off",
        panic="split_off out of bounds: 64 <= 64",
        title="`BytesMut::split_off` panics when `at == capacity()`",
        body=(
            "Calling `split_off(buf.capacity())` on a `BytesMut` panics with `split_off out of "
            "bounds`, although the documentation says `at` may be equal to the capacity and "
            "the returned buffer should simply be empty.\n\n```rust\nlet mut buf = "
            "BytesMut::with_capacity(64);\nlet tail = buf.split_off(64); // panics\n"
            "assert!(tail.is_empty());\n```"
        ),
        files=("src/lib.rs", "src/bytes.rs", "src/buf/buf_impl.rs", "src/buf/buf_mut.rs", "tests/test_bytes.rs"),
        deps=("serde", "loom", "portable-atomic"),
    ),
    Bug(
        repo="rust-lang__regex",
        hunk_ctx='impl Span {',
        commit="1a9a5c0a",
        crate="regex-automata",
        path="regex-automata/src/util/search.rs",
        start_line=1012,
        lines=(
            "    /// Returns this span's length.",
            "    #[inline]",
            "    pub fn len(&self) -> usize {",
            "        self.end.saturating_sub(self.start)",
            "    }",
            "",
            "    /// Returns true when this span is empty. That is, when `start >= end`.",
            "    #[inline]",
            "    pub fn is_empty(&self) -> bool {",
            "        self.start >= self.end",
            "    }",
            "",
            "    /// Returns true when the given offset is contained within this span.",
            "    #[inline]",
            "    pub fn contains(&self, offset: usize) -> bool {",
            "        !self.is_empty() && self.start <= offset && offset < self.end",
            "    }",
        ),
        bug_idx=9,
        correct_sub="self.start >= self.end",
        buggy_sub="self.start > self.end",
        wrong_sub="self.len() == 1",
        mod_type="func_pm_op_change",
        symbol="fn is_empty",
        test_name="util::search::tests::span_is_empty",
        test_filter="-p regex-automata span",
        panic="assertion failed: Span::from(5..5).is_empty()",
        title="`Span::is_empty` is false for spans with `start == end`",
        body=(
            "`regex_automata::Span { start: 5, end: 5 }.is_empty()` returns `false`. Because "
            "of this, empty matches (e.g. from `a*` on `\"bbb\"`) are treated as non-empty "
            "and `find_iter` reports overlapping matches."
        ),
        files=("regex-automata/src/lib.rs", "regex-automata/src/meta/regex.rs", "regex-syntax/src/lib.rs", "src/lib.rs", "src/regex/string.rs"),
        deps=("memchr", "aho-corasick", "regex-syntax"),
    ),
    Bug(
        repo="serde-rs__json",
        hunk_ctx="impl<'a> SliceRead<'a> {",
        commit="4bc1eaa0",
        crate="serde_json",
        path="src/read.rs",
        start_line=412,
        lines=(
            "    fn position_of_index(&self, i: usize) -> Position {",
            "        let start_of_line = match memchr::memrchr(b'\\n', &self.slice[..i]) {",
            "            Some(position) => position + 1,",
            "            None => 0,",
            "        };",
            "        Position {",
            "            line: 1 + memchr::memchr_iter(b'\\n', &self.slice[..start_of_line]).count(),",
            "            column: i - start_of_line,",
            "        }",
            "    }",
        ),
        bug_idx=2,
        correct_sub="position + 1,",
        buggy_sub="position,",
        wrong_sub="position + 2,",
        mod_type="func_pm_op_change",
        symbol="fn position_of_index",
        test_name="test_error_position_multiline",
        test_filter="--test test error_position",
        panic="assertion `left == right` failed\n  left: 10\n right: 9",
        title="Error column is off by one on every line after the first",
        body=(
            "For input spanning several lines the reported error column is one too large:\n\n"
            "```rust\nlet err = serde_json::from_str::<Value>(\"{\\n  \\\"a\\\": tru}\").unwrap_err();\n"
            "assert_eq!(err.column(), 9); // got 10\n```\n\nThe line number is correct."
        ),
        files=("src/lib.rs", "src/de.rs", "src/ser.rs", "src/error.rs", "src/value/mod.rs"),
        deps=("serde", "itoa", "ryu", "memchr"),
    ),
    Bug(
        repo="clap-rs__clap",
        hunk_ctx='const FALSE_LITERALS: [&str; 6] = ["n", "no", "f", "false", "off", "0"];',
        commit="7b3a6e3f",
        crate="clap_builder",
        path="clap_builder/src/util/str_to_bool.rs",
        start_line=12,
        lines=(
            "pub(crate) fn str_to_bool(val: impl AsRef<OsStr>) -> Option<bool> {",
            "    let pat: &str = &val.as_ref().to_str()?.to_lowercase();",
            "    if TRUE_LITERALS.contains(&pat) {",
            "        Some(true)",
            "    } else if FALSE_LITERALS.contains(&pat) {",
            "        Some(false)",
            "    } else {",
            "        None",
            "    }",
            "}",
        ),
        bug_idx=2,
        correct_sub="if TRUE_LITERALS",
        buggy_sub="if !TRUE_LITERALS",
        wrong_sub="if FALSE_LITERALS",
        mod_type="func_pm_ctrl_invert_if",
        symbol="fn str_to_bool",
        test_name="builder::action::bool_flag_env_true",
        test_filter="-p clap_builder str_to_bool",
        panic="assertion `left == right` failed\n  left: Some(false)\n right: Some(true)",
        title="Boolean env values are inverted: `MY_FLAG=true` parses as `false`",
        body=(
            "With `Arg::new(\"flag\").env(\"MY_FLAG\").action(ArgAction::SetTrue)`, running the "
            "program with `MY_FLAG=true` yields `false`, and `MY_FLAG=off` yields `true`. "
            "`str_to_bool` seems to be the culprit."
        ),
        files=("clap_builder/src/lib.rs", "clap_builder/src/builder/arg.rs", "clap_builder/src/parser/parser.rs", "clap_lex/src/lib.rs", "src/lib.rs"),
        deps=("anstyle", "clap_lex", "strsim", "anstream"),
    ),
    Bug(
        repo="uuid-rs__uuid",
        hunk_ctx='const fn parse_simple(s: &[u8]) -> Result<[u8; 16], ()> {',
        commit="2fd9b614",
        crate="uuid",
        path="src/parser.rs",
        start_line=118,
        lines=(
            "const fn parse_simple(s: &[u8]) -> Result<[u8; 16], ()> {",
            "    if s.len() != 32 {",
            "        return Err(());",
            "    }",
            "",
            "    let mut buf: [u8; 16] = [0; 16];",
            "    let mut i = 0;",
            "",
            "    while i < 16 {",
            "        let h1 = HEX_TABLE[s[i * 2] as usize];",
            "        let h2 = HEX_TABLE[s[i * 2 + 1] as usize];",
            "",
            "        if h1 | h2 == 0xff {",
            "            return Err(());",
            "        }",
            "",
            "        buf[i] = SHL4_TABLE[h1 as usize] | h2;",
            "        i += 1;",
            "    }",
            "",
            "    Ok(buf)",
            "}",
        ),
        bug_idx=12,
        correct_sub="h1 | h2",
        buggy_sub="h1 & h2",
        wrong_sub="h1 == 0xff && h2",
        mod_type="func_pm_flip_operators",
        symbol="fn parse_simple",
        test_name="parser::tests::test_parse_invalid_simple",
        test_filter="parse_invalid",
        panic="expected an error for \"67e5504410b1426f9247bb680e5fe0cg\"",
        title="`Uuid::parse_str` accepts simple-format strings with a bad hex digit",
        body=(
            "`Uuid::parse_str(\"67e5504410b1426f9247bb680e5fe0cg\")` returns `Ok(..)` even "
            "though `g` is not a hex digit. The hyphenated format rejects the same input."
        ),
        files=("src/lib.rs", "src/builder.rs", "src/fmt.rs", "src/error.rs", "src/v4.rs"),
        deps=("getrandom", "serde", "wasm-bindgen"),
    ),
    Bug(
        repo="chronotope__chrono",
        hunk_ctx='impl NaiveDate {',
        commit="c7f1d5e2",
        crate="chrono",
        path="src/naive/date/mod.rs",
        start_line=1496,
        lines=(
            "    /// Returns `true` if this is a leap year.",
            "    ///",
            "    /// ```",
            "    /// # use chrono::NaiveDate;",
            "    /// assert_eq!(NaiveDate::from_ymd_opt(2000, 1, 1).unwrap().leap_year(), true);",
            "    /// assert_eq!(NaiveDate::from_ymd_opt(1900, 1, 1).unwrap().leap_year(), false);",
            "    /// ```",
            "    pub const fn leap_year(&self) -> bool {",
            "        let year = self.year();",
            "        year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)",
            "    }",
        ),
        bug_idx=9,
        correct_sub="year % 100 != 0",
        buggy_sub="year % 100 == 0",
        wrong_sub="year % 400 != 0",
        mod_type="func_pm_op_change",
        symbol="fn leap_year",
        test_name="naive::date::tests::test_leap_year",
        test_filter="--lib leap_year",
        panic="assertion `left == right` failed\n  left: false\n right: true",
        title="`NaiveDate::leap_year()` is wrong for 2024 and 1900",
        body=(
            "`NaiveDate::from_ymd_opt(2024, 3, 1).unwrap().leap_year()` returns `false` and "
            "the same call for 1900 returns `true` — the opposite of the Gregorian rules."
        ),
        files=("src/lib.rs", "src/naive/mod.rs", "src/naive/datetime/mod.rs", "src/format/parse.rs", "src/offset/mod.rs"),
        deps=("num-traits", "serde", "iana-time-zone"),
    ),
    Bug(
        repo="rust-itertools__itertools",
        hunk_ctx='pub trait Itertools: Iterator {',
        commit="d5d99e9c",
        crate="itertools",
        path="src/lib.rs",
        start_line=2132,
        lines=(
            "    fn all_equal(&mut self) -> bool",
            "    where",
            "        Self: Sized,",
            "        Self::Item: PartialEq,",
            "    {",
            "        match self.next() {",
            "            None => true,",
            "            Some(a) => self.all(|x| a == x),",
            "        }",
            "    }",
        ),
        bug_idx=6,
        correct_sub="None => true",
        buggy_sub="None => false",
        wrong_sub="None => self.count() == 0",
        mod_type="func_pm_remove_cond",
        symbol="fn all_equal",
        test_name="all_equal_empty",
        test_filter="--test quick all_equal",
        panic="assertion failed: std::iter::empty::<u8>().all_equal()",
        title="`Itertools::all_equal` returns `false` for an empty iterator",
        body=(
            "The docs state that an empty iterator counts as all-equal, but "
            "`std::iter::empty::<u8>().all_equal()` is `false`. This breaks callers that "
            "check `v.iter().all_equal()` before indexing."
        ),
        files=("src/adaptors/mod.rs", "src/free.rs", "src/groupbylazy.rs", "tests/quick.rs", "tests/test_std.rs"),
        deps=("either", "quickcheck", "rand"),
    ),
    Bug(
        repo="BurntSushi__ripgrep",
        hunk_ctx="pub(crate) fn file_name_ext<'a>(name: &Cow<'a, [u8]>) -> Option<Cow<'a, [u8]>> {",
        commit="e2362d4d",
        crate="globset",
        path="crates/globset/src/pathutil.rs",
        start_line=34,
        lines=(
            "pub(crate) fn file_name_ext<'a>(name: &Cow<'a, [u8]>) -> Option<Cow<'a, [u8]>> {",
            "    if name.is_empty() {",
            "        return None;",
            "    }",
            "    let last_dot_at = match name.rfind_byte(b'.') {",
            "        None => return None,",
            "        Some(i) => i,",
            "    };",
            "    Some(match *name {",
            "        Cow::Borrowed(name) => Cow::Borrowed(&name[last_dot_at..]),",
            "        Cow::Owned(ref name) => {",
            "            let mut name = name.clone();",
            "            name.drain(..last_dot_at);",
            "            Cow::Owned(name)",
            "        }",
            "    })",
            "}",
        ),
        bug_idx=9,
        correct_sub="[last_dot_at..]",
        buggy_sub="[last_dot_at + 1..]",
        wrong_sub="[last_dot_at.saturating_sub(1)..]",
        mod_type="func_pm_op_change",
        symbol="fn file_name_ext",
        test_name="pathutil::tests::ext_borrowed",
        test_filter="-p globset ext",
        panic='assertion `left == right` failed\n  left: Some(b"rs")\n right: Some(b".rs")',
        title="Extension globs (`*.rs`) no longer match borrowed paths",
        body=(
            "A `GlobSet` built from `*.rs` does not match `foo/bar.rs` when the path is passed "
            "as `&Path`, but it does match an owned `PathBuf`. `rg -g '*.rs' foo` therefore "
            "searches nothing."
        ),
        files=("crates/globset/src/lib.rs", "crates/globset/src/glob.rs", "crates/ignore/src/walk.rs", "crates/core/main.rs", "crates/searcher/src/lib.rs"),
        deps=("aho-corasick", "bstr", "regex-automata", "log"),
    ),
    Bug(
        repo="hyperium__http",
        hunk_ctx='impl StatusCode {',
        commit="0a2e8b2f",
        crate="http",
        path="src/status.rs",
        start_line=188,
        lines=(
            "    /// Check if status is within 200-299.",
            "    #[inline]",
            "    pub fn is_success(&self) -> bool {",
            "        200 <= self.0.get() && self.0.get() < 300",
            "    }",
            "",
            "    /// Check if status is within 300-399.",
            "    #[inline]",
            "    pub fn is_redirection(&self) -> bool {",
            "        300 <= self.0.get() && self.0.get() < 400",
            "    }",
        ),
        bug_idx=3,
        correct_sub="self.0.get() < 300",
        buggy_sub="self.0.get() <= 300",
        wrong_sub="self.0.get() < 299",
        mod_type="func_pm_op_change",
        symbol="fn is_success",
        test_name="status::tests::is_success_boundaries",
        test_filter="status",
        panic="assertion failed: !StatusCode::MULTIPLE_CHOICES.is_success()",
        title="`StatusCode::MULTIPLE_CHOICES.is_success()` returns true",
        body=(
            "`StatusCode::from_u16(300).unwrap().is_success()` is `true`, and the status is "
            "also a redirection, so it is classified twice. 2xx should be 200..=299 only."
        ),
        files=("src/lib.rs", "src/header/map.rs", "src/method.rs", "src/uri/mod.rs", "src/request.rs"),
        deps=("bytes", "fnv", "itoa"),
    ),
    Bug(
        repo="bitflags__bitflags",
        hunk_ctx="pub trait Flags: Sized + 'static {",
        commit="9c4b93c9",
        crate="bitflags",
        path="src/traits.rs",
        start_line=205,
        lines=(
            "    /// Whether any set bits in a source flags value are also set in a target flags value.",
            "    fn intersects(&self, other: Self) -> bool",
            "    where",
            "        Self: Sized,",
            "    {",
            "        self.bits() & other.bits() != Self::Bits::EMPTY",
            "    }",
            "",
            "    /// Whether all set bits in a source flags value are also set in a target flags value.",
            "    fn contains(&self, other: Self) -> bool",
            "    where",
            "        Self: Sized,",
            "    {",
            "        self.bits() & other.bits() == other.bits()",
            "    }",
        ),
        bug_idx=5,
        correct_sub="!= Self::Bits::EMPTY",
        buggy_sub="== Self::Bits::EMPTY",
        wrong_sub="!= other.bits()",
        mod_type="func_pm_flip_operators",
        symbol="fn intersects",
        test_name="tests::intersects::cases",
        test_filter="intersects",
        panic="TestFlags::A.intersects(TestFlags::ABC) returned false",
        title="`Flags::intersects` returns the opposite result",
        body=(
            "`TestFlags::A.intersects(TestFlags::ABC)` is `false`, while "
            "`TestFlags::A.intersects(TestFlags::B)` is `true`. Looks like the comparison in "
            "the trait default is inverted."
        ),
        files=("src/lib.rs", "src/public.rs", "src/internal.rs", "src/iter.rs", "src/parser.rs"),
        deps=("serde", "arbitrary", "bytemuck"),
    ),
)

SYSTEM_PROMPT = (
    "You are a helpful assistant that can interact with a computer shell to solve programming "
    "tasks. Use the `bash` tool to run one command at a time; every command runs in a fresh "
    "subshell in the repository root. When you are done, run "
    "`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached`."
)

USER_TEMPLATE = (
    "<pr_description>\nConsider the following PR description:\n{title}\n\n{body}\n"
    "</pr_description>\n\n<instructions>\nThe repository `{repo_dir}` is checked out in the "
    "current directory. Make the minimal change to non-test source files so that the issue "
    "in the PR description is fixed. {extra}\n</instructions>"
)
USER_EXTRA = (
    "Do not modify the tests.",
    "Verify the fix with `cargo test` before submitting.",
    "Keep the public API unchanged.",
    "Edge cases matter; think about them before editing.",
)

COMMON_TESTS = (
    "basic", "clone", "debug_fmt", "default", "empty", "eq", "extend", "from_iter", "hash",
    "into_iter", "len", "ord", "roundtrip", "serde_roundtrip", "slice", "split", "truncate",
    "with_capacity", "zero", "reserve", "compare", "display", "parse", "iter_rev",
)


def _ident(rng: random.Random, n: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789") -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _hex(rng: random.Random, n: int) -> str:
    return _ident(rng, n, "0123456789abcdef")


# --------------------------------------------------------------------------------------
# Tool outputs
# --------------------------------------------------------------------------------------


def _obs(output: str, returncode: int = 0) -> str:
    return f"<returncode>{returncode}</returncode>\n<output>\n{output}</output>"


def _numbered(bug: Bug, lines: list[str], first: int, last: int) -> str:
    out = []
    for i in range(first, last + 1):
        out.append(f"{bug.start_line + i:6d}\t{lines[i]}\n")
    return "".join(out)


def _compile_lines(rng: random.Random, bug: Bug, n_extra: int) -> list[str]:
    lines = []
    deps = list(bug.deps)
    extra = ["cfg-if", "libc", "proc-macro2", "quote", "syn", "unicode-ident", "once_cell",
             "autocfg", "serde_derive", "rand_core", "ppv-lite86", "getrandom", "rand_chacha",
             "rand", "lazy_static", "either", "itoa", "ryu", "memchr", "bitflags"]
    rng.shuffle(extra)
    for name in (extra[:n_extra] + deps):
        lines.append(f"   Compiling {name} v{rng.randint(0, 2)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}\n")
    lines.append(f"   Compiling {bug.crate} v{rng.randint(0, 4)}.{rng.randint(1, 12)}.0 (/testbed)\n")
    return lines


def _test_run(rng: random.Random, bug: Bug, *, passing: bool, n_tests: int, n_compile: int) -> tuple[str, int]:
    lines = _compile_lines(rng, bug, n_compile)
    secs = rng.randint(2, 59)
    lines.append(f"    Finished `test` profile [unoptimized + debuginfo] target(s) in {secs}.{rng.randint(10, 99)}s\n")
    lines.append(f"     Running unittests src/lib.rs (target/debug/deps/{bug.crate.replace('-', '_')}-{_hex(rng, 16)})\n\n")
    names = [bug.test_name]
    pool = list(COMMON_TESTS)
    rng.shuffle(pool)
    mod = bug.test_name.rsplit("::", 1)[0] + "::" if "::" in bug.test_name else ""
    names += [f"{mod}{t}" for t in pool[: max(0, n_tests - 1)]]
    names.sort()
    lines.append(f"running {len(names)} test{'s' if len(names) != 1 else ''}\n")
    for t in names:
        ok = passing or t != bug.test_name
        lines.append(f"test {t} ... {'ok' if ok else 'FAILED'}\n")
    lines.append("\n")
    if not passing:
        lines.append("failures:\n\n")
        lines.append(f"---- {bug.test_name} stdout ----\n")
        lines.append(f"\nthread '{bug.test_name}' panicked at {bug.path}:{bug.bug_line_no + rng.randint(0, 2)}:9:\n")
        lines.append(bug.panic + "\n")
        lines.append("note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\n")
        lines.append(f"failures:\n    {bug.test_name}\n\n")
        lines.append(f"test result: FAILED. {len(names) - 1} passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.{rng.randint(10, 99)}s\n\n")
        lines.append("error: test failed, to rerun pass `--lib`\n")
        return "".join(lines), 101
    lines.append(f"test result: ok. {len(names)} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.{rng.randint(10, 99)}s\n")
    return "".join(lines), 0


_FILLER_NAMES = ("as_slice", "capacity", "clear", "is_unique", "reserve_inner", "as_ptr", "get_ref",
                 "into_inner", "remaining", "try_reclaim", "with_limit", "to_vec", "shrink_to_fit")
_FILLER_BODIES = {
    "usize": ("self.inner.len()", "self.cap.saturating_sub(self.len)", "self.len"),
    "bool": ("self.len == 0", "self.inner.is_empty()", "self.cap != 0"),
    "&[u8]": ("&self.buf[..self.len]", "self.inner.as_ref()"),
    "Self": ("Self::default()", "Self { inner: self.inner.clone() }"),
    "()": ("self.inner.clear();", "self.len = 0;"),
}


def _filler(rng: random.Random, n_lines: int) -> list[str]:
    """Plausible surrounding Rust source: whole small methods, at least ``n_lines`` lines."""
    out: list[str] = []
    while len(out) < n_lines:
        name = rng.choice(_FILLER_NAMES)
        ret = rng.choice(sorted(_FILLER_BODIES))
        sig = f"    pub fn {name}(&mut self) {{" if ret == "()" else f"    pub fn {name}(&self) -> {ret} {{"
        out += [
            f"    /// Returns the {name.replace('_', ' ')} of this value." if ret != "()" else f"    /// Resets this value ({name.replace('_', ' ')}).",
            "    #[inline]",
            sig,
            f"        {rng.choice(_FILLER_BODIES[ret])}",
            "    }",
            "",
        ]
    return out


def _tail(text: str, n: int) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[-n:])


def make_diff(rng: random.Random, bug: Bug, new_line: str) -> str:
    """Unified diff turning the buggy function into one whose bug line is ``new_line``."""
    buggy = bug.buggy_lines()
    lo = max(0, bug.bug_idx - 3)
    hi = min(len(buggy), bug.bug_idx + 4)
    n = hi - lo
    start = bug.start_line + lo
    out = [
        f"diff --git a/{bug.path} b/{bug.path}\n",
        f"index {_hex(rng, 7)}..{_hex(rng, 7)} 100644\n",
        f"--- a/{bug.path}\n",
        f"+++ b/{bug.path}\n",
        f"@@ -{start},{n} +{start},{n} @@ {bug.hunk_ctx}\n",
    ]
    for i in range(lo, hi):
        if i == bug.bug_idx:
            out.append(f"-{buggy[i]}\n")
            out.append(f"+{new_line}\n")
        else:
            out.append(f" {buggy[i]}\n")
    return "".join(out)


def _sed_escape_pattern(s: str) -> str:
    return re.sub(r"([.\[\]*^$/\\&])", r"\\\1", s)


def _sed_escape_repl(s: str) -> str:
    return re.sub(r"([/\\&])", r"\\\1", s)


# --------------------------------------------------------------------------------------
# Trajectories
# --------------------------------------------------------------------------------------

THOUGHTS = {
    "explore": (
        "Let me start by looking at the repository layout to find where `{symbol}` lives.",
        "First I'll get an overview of the crate structure.",
        "I'll explore the repository to locate the relevant code.",
    ),
    "grep": (
        "Let me search for the definition of `{short}`.",
        "I'll grep for `{short}` to find the implementation.",
    ),
    "view": (
        "Let me look at the implementation around line {line}.",
        "Now let me view the function body in `{path}`.",
    ),
    "repro": (
        "Before changing anything, let me reproduce the failure with the existing tests.",
        "Let me run the relevant tests to confirm the bug.",
    ),
    "edit": (
        "I see the problem: `{buggy}` should be `{fixed}`. Let me fix that line.",
        "The condition on line {line} is wrong. I'll correct it with `sed`.",
    ),
    "edit_wrong": (
        "I think the issue is the expression on line {line}. Let me change it.",
        "Let me adjust the check on line {line} so it handles this case.",
    ),
    "check_line": ("Let me verify the edit.", "Double-checking the modified line."),
    "verify": (
        "Now let me run the tests again to confirm the fix.",
        "Let me re-run the tests.",
    ),
    "full_suite": (
        "The targeted test passes. Let me run the whole test suite to check for regressions.",
        "Let me run the full test suite to make sure nothing else broke.",
    ),
    "diff": ("Let me review the diff.", "Here is what I changed so far:"),
    "context": (
        "Let me check how `{short}` is used elsewhere.",
        "I want to see the callers before editing.",
    ),
    "submit": (
        "The fix is complete and the tests pass. Submitting.",
        "Everything looks good. Let me submit the change.",
    ),
    "submit_wrong": (
        "I've made the change; submitting it.",
        "I'll submit what I have.",
    ),
}

REASONING = (
    "The issue mentions {short}; the bug is probably a boundary condition.",
    "I should find the function first, then check the comparison operators.",
    "Running the tests will tell me whether the fix works.",
    "Line {line} looks suspicious; the documented behaviour disagrees with it.",
    "A one-character change should be enough here.",
    "Let me make sure the change does not break other callers.",
)


@dataclass
class Plan:
    bug: Bug
    resolved: bool
    n_turns: int  # tool-call turns (0 = answer directly)
    long: bool
    style: str  # plain | reasoning_content | think_inline | empty_content
    parallel: bool
    extra: str


@dataclass
class Traj:
    messages: list[dict]
    patch: str
    resolved: bool


def _pick(rng: random.Random, key: str, **kw) -> str:
    return rng.choice(THOUGHTS[key]).format(**kw)


def build_trajectory(rng: random.Random, plan: Plan) -> Traj:
    bug = plan.bug
    short = bug.symbol.split()[-1]
    fixed_line = bug.correct_line if plan.resolved else bug.wrong_line
    patch = make_diff(rng, bug, fixed_line)
    fmt = dict(symbol=bug.symbol, short=short, line=bug.bug_line_no, path=bug.path,
               buggy=bug.buggy_sub, fixed=bug.correct_sub)
    user = USER_TEMPLATE.format(title=bug.title, body=bug.body, repo_dir=bug.repo.split("__")[1], extra=plan.extra)
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]

    # ---- choose the steps --------------------------------------------------------
    core = ["view", "edit", "verify", "submit"]
    if plan.n_turns < len(core):
        core = ["edit", "submit"] if plan.n_turns <= 2 else ["view", "edit", "submit"]
    optional = ["explore", "grep", "repro", "check_line", "diff", "context", "full_suite"]
    steps: list[str] = []
    if plan.n_turns > 0:
        n_opt = max(0, plan.n_turns - len(core))
        picked = set(rng.sample(optional, min(n_opt, len(optional))))
        chosen = [s for s in optional if s in picked]
        if plan.long and "full_suite" not in chosen:
            chosen.append("full_suite")
        # fill any remaining turns with extra exploration / test runs
        while len(chosen) + len(core) < plan.n_turns:
            chosen.append(rng.choice(["context", "view_more", "full_suite", "repro"]))
        order = {"explore": 0, "grep": 1, "context": 2, "view": 3, "view_more": 3, "repro": 4, "edit": 5,
                 "check_line": 6, "verify": 7, "full_suite": 8, "diff": 9, "submit": 10}
        steps = sorted(core + chosen, key=lambda s: order[s])

    view_lo = max(0, bug.bug_idx - 4)
    view_hi = min(len(bug.lines) - 1, bug.bug_idx + 4)
    cur_lines = bug.buggy_lines()

    def tool_call(cmd: str) -> dict:
        return {
            "id": "call_" + _ident(rng, 24, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": cmd})},
        }

    def add_turn(thought_key: str, cmds: list[tuple[str, str, int]]) -> None:
        thought = _pick(rng, thought_key, **fmt)
        calls = [tool_call(c) for c, _, _ in cmds]
        msg: dict = {"role": "assistant", "content": thought, "tool_calls": calls}
        reasoning = rng.choice(REASONING).format(**fmt)
        if plan.style == "reasoning_content":
            msg["reasoning_content"] = reasoning
        elif plan.style == "think_inline":
            msg["content"] = f"<think>\n{reasoning}\n</think>\n\n{thought}"
        elif plan.style == "empty_content":
            msg["content"] = ""
        messages.append(msg)
        for call, (_, out, rc) in zip(calls, cmds):
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": "bash", "content": _obs(out, rc)})

    rs_files = sorted(set(bug.files + (bug.path,)))
    edited = False
    for step in steps:
        if step == "explore":
            if rng.random() < 0.5:
                out = "".join(f"./{f}\n" for f in rs_files if f.endswith(".rs"))
                cmd = "find . -name '*.rs' -not -path './target/*' | sort | head -40"
            else:
                out = "Cargo.lock\nCargo.toml\nLICENSE-MIT\nREADME.md\nbenches\nsrc\ntests\n"
                cmd = "ls"
            cmds = [(cmd, out, 0)]
            if plan.parallel:
                cmds.append(("cat Cargo.toml | head -12", f'[package]\nname = "{bug.crate}"\nversion = "{rng.randint(0, 4)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"\nedition = "2021"\nrust-version = "1.{rng.randint(56, 74)}"\nlicense = "MIT OR Apache-2.0"\n', 0))
            add_turn("explore", cmds)
        elif step == "grep":
            d = bug.path.rsplit("/", 1)[0]
            out = f"{bug.path}:{bug.start_line + next(i for i, l in enumerate(bug.lines) if bug.symbol in l)}:{next(l for l in bug.lines if bug.symbol in l)}\n"
            add_turn("grep", [(f'grep -rn "{bug.symbol}" {d}', out, 0)])
        elif step == "context":
            f1, f2 = rng.sample(bug.files, 2)
            n1, n2 = rng.randint(10, 900), rng.randint(10, 900)
            out = (f"{f1}:{n1}:        let r = x.{short}(y);\n{f2}:{n2}:    assert!(v.{short}());\n")
            add_turn("context", [(f'grep -rn "\\.{short}(" --include=*.rs . | grep -v "^./target" | head', out, 0)])
        elif step in ("view", "view_more"):
            a = bug.start_line + view_lo
            b = bug.start_line + view_hi
            if step == "view_more":
                a, b = max(1, a - 20), b + 20
                n_pre = bug.start_line - a
                n_post = b - bug.start_line - len(cur_lines) + 1
                pre = _filler(rng, n_pre)[-n_pre:]
                post = ([""] + _filler(rng, n_post))[:n_post]
                out = (
                    "".join(f"{a + i:6d}\t{line}\n" for i, line in enumerate(pre))
                    + _numbered(bug, cur_lines, 0, len(cur_lines) - 1)
                    + "".join(f"{bug.start_line + len(cur_lines) + i:6d}\t{line}\n" for i, line in enumerate(post))
                )
            else:
                out = _numbered(bug, cur_lines, view_lo, view_hi)
            add_turn("view", [(f"nl -ba {bug.path} | sed -n '{a},{b}p'", out, 0)])
        elif step == "repro":
            out, _ = _test_run(rng, bug, passing=edited and plan.resolved, n_tests=rng.randint(1, 3), n_compile=0)
            n = rng.choice([6, 8, 12])
            # the pipe makes the exit status tail's, i.e. 0
            add_turn("repro", [(f"cargo test {bug.test_filter} 2>&1 | tail -n {n}", _tail(out, n), 0)])
        elif step == "edit":
            new_line = fixed_line
            old_sub = bug.buggy_sub
            new_sub = bug.correct_sub if plan.resolved else bug.wrong_sub
            cmd = f"sed -i '{bug.bug_line_no}s/{_sed_escape_pattern(old_sub)}/{_sed_escape_repl(new_sub)}/' {bug.path}"
            cur_lines[bug.bug_idx] = new_line
            edited = True
            add_turn("edit" if plan.resolved else "edit_wrong", [(cmd, "", 0)])
        elif step == "check_line":
            add_turn("check_line", [(f"sed -n '{bug.bug_line_no}p' {bug.path}", cur_lines[bug.bug_idx] + "\n", 0)])
        elif step == "verify":
            out, rc = _test_run(rng, bug, passing=plan.resolved, n_tests=rng.randint(1, 3), n_compile=0)
            if rng.random() < 0.6:
                n = rng.choice([3, 4, 6])
                add_turn("verify", [(f"cargo test {bug.test_filter} 2>&1 | tail -n {n}", _tail(out, n), 0)])
            else:
                add_turn("verify", [(f"cargo test {bug.test_filter}", out, rc)])
        elif step == "full_suite":
            out, rc = _test_run(rng, bug, passing=plan.resolved, n_tests=rng.randint(8, 14) if plan.long else rng.randint(3, 6),
                                n_compile=rng.randint(6, 16) if plan.long else 0)
            if plan.long:
                n_tests = rng.randint(40, 70)
                # A big workspace test run: many test binaries, lots of output.
                extra_lines = []
                for k in range(n_tests):
                    mod = rng.choice(["tests", "api", "regression", "fuzz_cases", "props", "misc"])
                    name = f"{mod}::{rng.choice(COMMON_TESTS)}_{_ident(rng, rng.randint(3, 8), 'abcdefghijklmnopqrstuvwxyz')}"
                    extra_lines.append(f"test {name} ... ok\n")
                out += f"\n     Running tests/{rng.choice(['api', 'integration', 'regression'])}.rs (target/debug/deps/{bug.crate.replace('-', '_')}-{_hex(rng, 16)})\n\nrunning {n_tests} tests\n" + "".join(extra_lines)
                out += f"\ntest result: ok. {n_tests} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.{rng.randint(10, 99)}s\n"
            if plan.long:
                add_turn("full_suite", [("cargo test 2>&1", out, rc)])
            else:
                add_turn("full_suite", [("cargo test 2>&1 | tail -n 6", _tail(out, 6), 0)])
        elif step == "diff":
            add_turn("diff", [("git diff", patch if edited else "", 0)])
        elif step == "submit":
            add_turn(
                "submit" if plan.resolved else "submit_wrong",
                [("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached",
                  "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n" + (patch if edited else ""), 0)],
            )

    # ---- final assistant message ---------------------------------------------------
    if plan.n_turns == 0:
        final = (
            f"The bug is in `{bug.path}` line {bug.bug_line_no}: `{bug.buggy_sub}` should be "
            f"`{bug.correct_sub if plan.resolved else bug.wrong_sub}`.\n\n```diff\n{patch}```"
        )
    elif plan.resolved:
        final = rng.choice((
            f"I fixed the issue in `{bug.path}`: the expression `{bug.buggy_sub}` was replaced by "
            f"`{bug.correct_sub}`, and `cargo test` passes.",
            f"Done. The root cause was `{bug.buggy_sub}` in `{short}`; it now reads `{bug.correct_sub}`.",
            f"Summary:\n- Root cause: wrong condition in `{short}` ({bug.path}:{bug.bug_line_no}).\n"
            f"- Fix: `{bug.buggy_sub}` -> `{bug.correct_sub}`.\n- Tests: all passing.",
        ))
    else:
        final = rng.choice((
            f"I changed `{bug.buggy_sub}` to `{bug.wrong_sub}` in `{short}`. The targeted test still "
            f"fails, so this may need more work.",
            f"I submitted a change to `{bug.path}`, but I could not get `{bug.test_name}` to pass.",
        ))
    final_msg: dict = {"role": "assistant", "content": final}
    if plan.style == "reasoning_content":
        final_msg["reasoning_content"] = "All steps are done; I should summarise the change."
    elif plan.style == "think_inline":
        final_msg["content"] = f"<think>\nAll steps are done; I should summarise the change.\n</think>\n\n{final}"
    messages.append(final_msg)
    return Traj(messages=messages, patch=patch, resolved=plan.resolved)


# --------------------------------------------------------------------------------------
# Dataset assembly (incl. malformed rows)
# --------------------------------------------------------------------------------------

DEFECTS = (
    ("invalid_json", "`messages` is not valid JSON (the string is truncated)"),
    ("unknown_role", "a message has role 'narrator', which is not system/user/assistant/tool/exit"),
    ("no_assistant_turn", "the conversation has no assistant message (system + user only; report this, not ends_with_user_turn)"),
    ("invalid_tool_call_arguments", "an assistant tool_calls[].function.arguments string is not valid JSON"),
    ("non_string_content", "a tool message has list-valued content instead of a string"),
    ("ends_with_user_turn", "a user message follows the last assistant turn"),
)


def _instance_id(rng: random.Random, bug: Bug) -> str:
    return f"{bug.repo}.{bug.commit}.{bug.mod_type}__{_ident(rng, 8)}"


def build_rows(rng: random.Random) -> tuple[list[dict], dict]:
    # Per-bug instance ids (several trajectories may share one instance).
    instances: list[tuple[Bug, str]] = []
    for bug in BUGS:
        for _ in range(2):
            instances.append((bug, _instance_id(rng, bug)))

    # Row plans.
    long_rows = set(rng.sample(range(N_ROWS), 6))
    direct_rows = set(rng.sample(sorted(set(range(N_ROWS)) - long_rows), 3))
    rest = sorted(set(range(N_ROWS)) - long_rows - direct_rows)
    # 6 defect rows, 3 reasoning_content rows, 1 inline-<think> row, 1 empty-content row,
    # 8 rows with a trailing `exit` message -- all distinct
    specials = rng.sample(rest, 6 + 3 + 1 + 1 + 8)
    defect_rows = specials[:6]
    reasoning_rows = set(specials[6:9])
    think_rows = {specials[9]}
    empty_content_row = specials[10]
    exit_rows = set(specials[11:19])
    # duplicate traj_id pair: first occurrence in shard 0, second in shard 1
    per_shard = N_ROWS // N_SHARDS
    dup_first = rng.choice([i for i in range(per_shard) if i not in specials and i not in long_rows and i not in direct_rows])
    dup_second = rng.choice([i for i in range(per_shard, N_ROWS) if i not in specials and i not in long_rows and i not in direct_rows])

    rows: list[dict] = []
    malformed: list[dict] = []
    edge_cases: dict[str, list[str]] = {
        "empty_assistant_content_with_tool_calls": [],
        "trailing_exit_message": [],
        "reasoning_content_field": [],
        "think_block_in_content": [],
        "parallel_tool_calls": [],
        "direct_answer_no_tool_calls": [],
        "long_tool_outputs": [],
    }
    for i in range(N_ROWS):
        bug, iid = instances[rng.randrange(len(instances))]
        if i == dup_second:
            iid = rows[dup_first]["instance_id"]
            bug = next(b for b in BUGS if iid.startswith(b.repo + "."))
        if i in direct_rows:
            n_turns = 0
        elif i in long_rows:
            n_turns = rng.randint(9, 12)
        else:
            n_turns = rng.choice([2, 2, 3, 3, 3, 4, 4, 5, 6])
        style = "plain"
        if i in reasoning_rows:
            style = "reasoning_content"
        elif i in think_rows:
            style = "think_inline"
        elif i == empty_content_row:
            style = "empty_content"
        plan = Plan(
            bug=bug,
            resolved=rng.random() < 0.7 and i not in direct_rows,
            n_turns=n_turns,
            long=i in long_rows,
            style=style,
            parallel=rng.random() < 0.3,
            extra=rng.choice(USER_EXTRA),
        )
        traj = build_trajectory(rng, plan)
        traj_id = f"{iid}.{_ident(rng, 8)}"
        if i == dup_second:
            traj_id = rows[dup_first]["traj_id"]
        msgs = traj.messages
        if i in exit_rows:
            msgs.append({
                "role": "exit",
                "content": "Submitted",
                "extra": {"exit_status": "Submitted", "submission": traj.patch},
            })
        messages_json: str | None = None

        # ---- valid edge cases bookkeeping --------------------------------------
        if style == "empty_content":
            edge_cases["empty_assistant_content_with_tool_calls"].append(traj_id)
        if style == "reasoning_content":
            edge_cases["reasoning_content_field"].append(traj_id)
        if style == "think_inline":
            edge_cases["think_block_in_content"].append(traj_id)
        if i in exit_rows:
            edge_cases["trailing_exit_message"].append(traj_id)
        if any(m["role"] == "assistant" and len(m.get("tool_calls") or []) > 1 for m in msgs):
            edge_cases["parallel_tool_calls"].append(traj_id)
        if i in direct_rows:
            edge_cases["direct_answer_no_tool_calls"].append(traj_id)
        if i in long_rows:
            edge_cases["long_tool_outputs"].append(traj_id)

        # ---- corruptions -------------------------------------------------------
        defect = None
        if i in defect_rows:
            defect = DEFECTS[defect_rows.index(i)][0]
            if defect == "invalid_json":
                full = json.dumps(msgs)
                messages_json = full[: len(full) - rng.randint(40, 200)]
            elif defect == "unknown_role":
                # between a tool response and the next assistant turn, so tool-call/response
                # adjacency stays intact and the unknown role is the only defect
                at = next(k for k in range(3, len(msgs)) if msgs[k - 1]["role"] == "tool" and msgs[k]["role"] == "assistant")
                msgs.insert(at, {"role": "narrator", "content": "The agent pauses to consider the failing test."})
            elif defect == "no_assistant_turn":
                del msgs[2:]
            elif defect == "invalid_tool_call_arguments":
                call_msgs = [m for m in msgs if m["role"] == "assistant" and m.get("tool_calls")]
                target = call_msgs[len(call_msgs) // 2]["tool_calls"][0]["function"]
                cmd = json.loads(target["arguments"])["command"]
                target["arguments"] = repr({"command": cmd})  # python dict repr: single quotes
            elif defect == "non_string_content":
                tool_msgs = [m for m in msgs if m["role"] == "tool"]
                target = tool_msgs[0]
                target["content"] = [{"type": "text", "text": target["content"]}]
            elif defect == "ends_with_user_turn":
                msgs.append({"role": "user", "content": "Thanks. Could you also add a regression test for this?"})
        if messages_json is None:
            messages_json = json.dumps(msgs)
        row = {
            "messages": messages_json,
            "instance_id": iid,
            "resolved": bool(traj.resolved),
            "model": MODEL_NAME,
            "traj_id": traj_id,
            "patch": traj.patch,
        }
        rows.append(row)
        if defect is not None:
            malformed.append({
                "row": i,
                "shard": i // per_shard,
                "traj_id": traj_id,
                "defect": defect,
                "description": dict(DEFECTS)[defect],
            })
    malformed.append({
        "row": dup_second,
        "shard": dup_second // per_shard,
        "traj_id": rows[dup_second]["traj_id"],
        "defect": "duplicate_traj_id",
        "description": (
            f"traj_id also used by row {dup_first} (shard {dup_first // per_shard}); both rows are "
            "otherwise valid and differ in content; the first occurrence is kept"
        ),
        "first_occurrence_row": dup_first,
    })
    malformed.sort(key=lambda m: m["row"])
    # Sanity checks of the corruptions.
    for m in malformed:
        raw = rows[m["row"]]["messages"]
        if m["defect"] == "invalid_json":
            try:
                json.loads(raw)
            except json.JSONDecodeError:
                pass
            else:  # pragma: no cover
                raise AssertionError("invalid_json row parses")
    assert rows[dup_first]["traj_id"] == rows[dup_second]["traj_id"]
    assert rows[dup_first]["messages"] != rows[dup_second]["messages"]
    assert len({r["traj_id"] for r in rows}) == N_ROWS - 1

    skipped_rows = {m["row"] for m in malformed}
    valid_rows = [r for k, r in enumerate(rows) if k not in skipped_rows]
    expected = {
        "description": (
            "Ground truth for demo/dataset. Row numbers are 0-based over the concatenation of "
            "the shards in file-name order. Each malformed row has exactly one defect; a "
            "validator should skip exactly these rows (for duplicate_traj_id: keep the first "
            "occurrence, skip the later one). Rows listed under valid_edge_cases are valid."
        ),
        "seed": SEED,
        "total_rows": N_ROWS,
        "rows_per_shard": {f"data/train-{s:05d}-of-{N_SHARDS:05d}.parquet": per_shard for s in range(N_SHARDS)},
        "columns": ["messages", "instance_id", "resolved", "model", "traj_id", "patch"],
        "malformed": malformed,
        "defect_counts": {d: sum(1 for m in malformed if m["defect"] == d) for d, _ in DEFECTS + (("duplicate_traj_id", ""),)},
        "expected_skipped": len(malformed),
        "expected_valid": len(valid_rows),
        "expected_valid_resolved": sum(1 for r in valid_rows if r["resolved"]),
        "expected_valid_unresolved": sum(1 for r in valid_rows if not r["resolved"]),
        "valid_edge_cases": edge_cases,
        "roles_to_drop": ["exit"],
    }
    return rows, expected


# --------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------

SCHEMA = pa.schema([
    ("messages", pa.string()),
    ("instance_id", pa.string()),
    ("resolved", pa.bool_()),
    ("model", pa.string()),
    ("traj_id", pa.string()),
    ("patch", pa.string()),
])
HF_FEATURES = {
    name: {"dtype": "bool" if name == "resolved" else "string", "_type": "Value"}
    for name in SCHEMA.names
}


def write_dataset(rows: list[dict], expected: dict, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    (out_dir / "data").mkdir(parents=True)
    schema = SCHEMA.with_metadata({"huggingface": json.dumps({"info": {"features": HF_FEATURES}})})
    per_shard = len(rows) // N_SHARDS
    num_bytes = 0
    download = 0
    for s in range(N_SHARDS):
        chunk = rows[s * per_shard : (s + 1) * per_shard] if s < N_SHARDS - 1 else rows[s * per_shard :]
        table = pa.Table.from_pylist(chunk, schema=schema)
        num_bytes += table.nbytes
        path = out_dir / "data" / f"train-{s:05d}-of-{N_SHARDS:05d}.parquet"
        pq.write_table(table, path, compression="snappy", row_group_size=1000)
        download += path.stat().st_size
    features_yaml = "".join(
        f"  - name: {name}\n    dtype: {'bool' if name == 'resolved' else 'string'}\n" for name in SCHEMA.names
    )
    card = (
        "---\n"
        "configs:\n"
        "- config_name: default\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path: data/train-*\n"
        "dataset_info:\n"
        "  features:\n"
        f"{features_yaml}"
        "  splits:\n"
        "  - name: train\n"
        f"    num_bytes: {num_bytes}\n"
        f"    num_examples: {len(rows)}\n"
        f"  download_size: {download}\n"
        f"  dataset_size: {num_bytes}\n"
        "license: mit\n"
        "tags:\n"
        "- code\n"
        "- agents\n"
        "- synthetic\n"
        "---\n\n"
        "# Demo SWE-smith-rs trajectories (synthetic)\n\n"
        "A tiny synthetic stand-in for the `AlienKevin/SWE-smith-rs-*-trajectories` teacher\n"
        "datasets, generated by `scripts/make_demo_assets.py` (fixed seed). Each row is an\n"
        "agentic bug-fixing trajectory on a Rust repository with a single `bash` tool.\n\n"
        "| column | type | meaning |\n|---|---|---|\n"
        "| `messages` | string | JSON-encoded OpenAI chat list (system, user, assistant with `tool_calls`, tool, optional trailing `exit`) |\n"
        "| `instance_id` | string | SWE-smith task instance (`owner__repo.commit.mod_type__hash`) |\n"
        "| `resolved` | bool | whether the submitted patch fixed the task |\n"
        "| `model` | string | teacher model |\n"
        "| `traj_id` | string | unique trajectory id (`instance_id.suffix`) |\n"
        "| `patch` | string | submitted unified diff |\n\n"
        "Some rows are deliberately malformed to exercise validation; see `EXPECTED.json`.\n"
    )
    (out_dir / "README.md").write_text(card, encoding="utf-8")
    (out_dir / "EXPECTED.json").write_text(json.dumps(expected, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _render_env() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env


def training_corpus(rows: list[dict]) -> list[str]:
    """Rendered chats (official template text) of every row that renders."""
    tmpl = _render_env().from_string(strip_generation_tags(load_template()))
    texts = []
    for row in rows:
        try:
            msgs = json.loads(row["messages"])
            msgs = [m for m in msgs if m.get("role") != "exit"]
            texts.append(tmpl.render(messages=msgs, add_generation_prompt=False))
        except Exception:
            texts.append(row["messages"])
        texts.append(row["patch"])
    return texts


def build_tokenizer(corpus: list[str], out_dir: Path) -> int:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Strip the added tokens from the training text so BPE does not spend merges on them.
    pattern = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))
    tok.train_from_iterator([pattern.sub("\n", t) for t in corpus], trainer=trainer, length=len(corpus))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=131072,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
        add_prefix_space=False,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=load_template(),
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    # Keep the template inside tokenizer_config.json (not a separate chat_template.jinja) so
    # that older transformers versions pick it up too.
    fast.save_pretrained(str(out_dir), save_jinja_files=False)
    return len(fast)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "demo", help="output directory (default: <repo>/demo)")
    args = ap.parse_args(argv)
    rng = random.Random(SEED)
    rows, expected = build_rows(rng)
    write_dataset(rows, expected, args.out / "dataset")
    vocab = build_tokenizer(training_corpus(rows), args.out / "tokenizer")
    digest = hashlib.sha256()
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            digest.update(p.relative_to(args.out).as_posix().encode() + b"\0" + p.read_bytes())
    print(f"wrote {args.out}: {len(rows)} rows, {expected['expected_skipped']} malformed, vocab {vocab}, sha256 {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
