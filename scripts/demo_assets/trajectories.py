"""One agentic bug-fixing trajectory (OpenAI chat format) from a plan of steps."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from .bugs import Bug
from .prompts import COMMON_TESTS, SYSTEM_PROMPT, USER_TEMPLATE, _hex, _ident
from .tool_outputs import (
    _filler, _numbered, _obs, _sed_escape_pattern, _sed_escape_repl, _tail, _test_run, make_diff,
)


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
