"""Built-in models that prove the agent evaluation honest by construction, answered through the same chat route as
the student (so their replies must fit the same context and the same per-turn token cap):

- ``replay``: each task's episode is answered with its gold fix as ``bash`` tool calls (a ``sed`` per changed line,
  the smallest edit that says it), then the submit command: every task must come out resolved;
- ``submit``: the submit command at once: no task may come out resolved.

A model answers by the episode the request names (OpenAI's ``user`` field, which the harness sets to the task's id)
and by how many assistant turns the prompt holds."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Callable, Mapping

from ..tasks.record import Task

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
MODELS = ("replay", "submit")

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def _sed_escape(text: str, replacement: bool = False) -> str:
    special = "\\/&" if replacement else "\\/.*[]^$"
    return "".join("\\" + c if c in special else c for c in text)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _edit(line_no: int, now: str, want: str) -> str:
    """A sed substitution on line ``line_no`` turning ``now`` into ``want``: the differing middle of the two lines,
    widened until its first occurrence on the line is the one that differs."""
    p = 0
    while p < min(len(now), len(want)) and now[p] == want[p]:
        p += 1
    s = 0
    while s < min(len(now), len(want)) - p and now[-1 - s] == want[-1 - s]:
        s += 1
    lo, hi = p, len(now) - s
    while hi - lo < 1 or now.find(now[lo:hi]) != lo:  # too short to find, or found earlier on the line
        if lo > 0:
            lo -= 1
        elif hi < len(now):
            hi += 1
        else:
            break
    old, new = now[lo:hi], want[lo:len(want) - (len(now) - hi)]
    return f"{line_no}s/{_sed_escape(old)}/{_sed_escape(new, True)}/"


def gold_commands(task: Task) -> list[str]:
    """The gold fix of ``task`` (its bug patch undone) as bash commands: one ``sed -i`` per file, a substitution per
    changed line, in the bugged file's line numbers."""
    edits: dict[str, list[str]] = {}
    path, line = None, 0
    removed: list[str] = []
    added: list[tuple[int, str]] = []

    def flush():
        for (no, buggy), original in zip(added, removed):
            edits.setdefault(path, []).append(_edit(no, buggy, original))
        if len(added) != len(removed):
            raise ValueError(f"{task.instance_id}: a hunk that adds or removes lines has no line-for-line gold edit")
        added.clear()
        removed.clear()

    for text in task.patch.splitlines():
        if text.startswith("+++ "):
            path = text[4:].removeprefix("b/")
        elif (m := _HUNK.match(text)):
            flush()
            line = int(m.group(1))
        elif text.startswith("-") and not text.startswith("---"):
            removed.append(text[1:])
        elif text.startswith("+"):
            added.append((line, text[1:]))
            line += 1
        elif text.startswith(" "):
            flush()
            line += 1
    flush()
    return [" && ".join(f"sed -i {_quote('; '.join(subs))} {_quote(f)}" for f, subs in edits.items())]


def tool_call_text(command: str) -> str:
    """An assistant turn calling ``bash`` as Qwen3's template writes it (what the chat route parses back)."""
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def script(model: str, tasks: list[Task]) -> dict[str, list[str]]:
    """Each task's commands under ``model``, in order (the submit command last)."""
    if model not in MODELS:
        raise ValueError(f"unknown built-in model {model!r} ({', '.join(MODELS)})")
    return {t.instance_id: ([] if model == "submit" else gold_commands(t)) + [SUBMIT_COMMAND] for t in tasks}


def submitter(tokenizer, commands: Mapping[str, list[str]], end_token: str) -> Callable:
    """The chat route's ``submit`` for a scripted model: the episode's next command as a tool call (the turn a
    prompt opens is its n-th assistant turn), closed with the end-of-turn token; an episode it does not know, or one
    past its script, gets plain text (no tool call: mini-swe-agent's format error)."""
    end = tokenizer.convert_tokens_to_ids(end_token)

    async def submit(prompt, max_tokens, temperature, seed, n, user=None):
        script_ = commands.get(user or "")
        # the generation prompt opens the turn answered now
        turn = tokenizer.decode(prompt, skip_special_tokens=False).count("<|im_start|>assistant") - 1
        text = (tool_call_text(script_[turn]) if script_ is not None and 0 <= turn < len(script_)
                else f"(the scripted model has no turn {turn} for episode {user!r})")
        ids = tokenizer.encode(text, add_special_tokens=False) + [end]
        return [SimpleNamespace(tokens=ids) for _ in range(n)]

    return submit
