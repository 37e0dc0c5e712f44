"""Tool outputs of the demo trajectories: shell observations, test runs, diffs."""

from __future__ import annotations

import random
import re

from .bugs import Bug
from .prompts import COMMON_TESTS, _hex


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
