"""The task prompts of the demo trajectories and small random helpers."""

from __future__ import annotations

import random


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
