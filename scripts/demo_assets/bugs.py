"""The bug catalogue: one synthetic SWE-smith style bug per Rust repository."""

from __future__ import annotations

from dataclasses import dataclass


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
