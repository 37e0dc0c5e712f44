"""An assistant turn as text and as actions: Qwen3's ``<tool_call>`` JSON blocks in a model's output parsed into
tool calls (what ``trajsft serve`` returns as OpenAI ``tool_calls``, what the next-action scores compare), and an
assistant message of a chat read the same way. No jax, no tokenizer."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
OPEN_TAG = "<tool_call>"


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Any  # the arguments as the turn gives them: an object, or a string that is not a JSON object


@dataclass(frozen=True)
class Parsed:
    """A turn's text without its tool calls, its calls, and whether it parsed (every block JSON with a name, none
    left open); a turn that does not parse is all text and no calls."""

    content: str
    calls: tuple[Call, ...]
    parsed: bool


def _arguments(args: Any) -> Any:
    """A JSON string of an object as the object (the same action whichever way a turn writes it)."""
    if isinstance(args, str):
        try:
            obj = json.loads(args)
        except ValueError:
            return args
        return obj if isinstance(obj, dict) else args
    return args


def parse_output(text: str) -> Parsed:
    """A model's output: its ``<tool_call>`` blocks as calls. Any block that is not a JSON object with a string
    ``name`` (and object or string ``arguments``), or a block left open, makes the whole output text."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            obj = json.loads(block)
        except ValueError:
            return Parsed(text, (), False)
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(args, (dict, str)):
            return Parsed(text, (), False)
        calls.append(Call(obj["name"], _arguments(args)))
    rest = TOOL_CALL.sub("", text)
    if OPEN_TAG in rest:
        return Parsed(text, (), False)
    return Parsed(rest.strip() if calls else text, tuple(calls), True)


def parse_message(message: Mapping) -> Parsed:
    """An assistant message of a chat (OpenAI form, as the shards hold it)."""
    calls = tuple(Call(c["function"]["name"], _arguments(c["function"].get("arguments", {})))
                  for c in message.get("tool_calls") or [])
    return Parsed(message.get("content") or "", calls, True)


def command(call: Optional[Call]) -> Optional[str]:
    """The shell command of a call whose arguments hold one (``command`` or ``cmd``), else None."""
    if call is None or not isinstance(call.arguments, dict):
        return None
    for key in ("command", "cmd"):
        if isinstance(call.arguments.get(key), str):
            return call.arguments[key]
    return None
