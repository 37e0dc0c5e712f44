"""The tools a teacher was given (config ``tools:``, over every teacher's own): OpenAI function tools, or the name
of a bundled preset.

The teachers' API requests carried the tools' schemas; the HF rows keep the calls, not the schemas. Training renders
every chat with its teacher's tools (the chat template's ``# Tools`` block, before the first message), so that a
harness serving the student with the same tools (mini-swe-agent: ``tools=[bash]``) shows it the prompt it trained on.

The template writes each tool with ``tojson``, which keeps the keys in the order given: a tool list is kept as its
JSON text (:func:`resolve` returns it), key order included, and that text is what is hashed.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ..errors import ConfigError

# mini-swe-agent 2.4.6's BASH_TOOL (src/minisweagent/models/utils/actions_toolcall.py), key order included: the
# schema every SWE-smith-rs teacher's request carried in tool-calling mode
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The bash command to execute",
                }
            },
            "required": ["command"],
        },
    },
}

PRESETS: dict[str, list[dict]] = {"bash": [BASH]}


def _check(tools: Any, where: str) -> list[dict]:
    if not isinstance(tools, list):
        raise ConfigError(f"config: {where}: tools is {type(tools).__name__}: give a list of OpenAI function tools "
                          f"or a preset name ({', '.join(PRESETS)})")
    names = set()
    for i, tool in enumerate(tools):
        w = f"{where}: tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ConfigError(f"config: {w} is not a function tool: expected "
                              '{"type": "function", "function": {"name": ..., "parameters": {...}}}')
        fn = tool["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConfigError(f"config: {w}.function.name is missing")
        if fn["name"] in names:
            raise ConfigError(f"config: {w}.function.name {fn['name']!r} is given twice")
        names.add(fn["name"])
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise ConfigError(f"config: {w}.function.parameters is not an object schema (a function's arguments are "
                              'a JSON object: {"type": "object", "properties": {...}})')
        required = (params or {}).get("required", [])
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise ConfigError(f"config: {w}.function.parameters.required is not a list of names")
    return tools


def resolve(value: Any, where: str) -> Optional[str]:
    """The tools of ``value`` (a preset name or a list of function tools) as their JSON text, in the order given;
    None for no tools (``[]`` or null: the chats render with no tools block, as before tools were a setting).
    ``where`` names the teacher in the one-line error."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in PRESETS:
            raise ConfigError(f"config: {where}: tools: no preset {value!r} (presets: {', '.join(PRESETS)}; or give a "
                              "list of OpenAI function tools)")
        value = PRESETS[value]
    tools = _check(value, where)
    return json.dumps(tools, ensure_ascii=False) if tools else None


def load(text: Optional[str]) -> Optional[list[dict]]:
    """The tool list of :func:`resolve`'s text (None: no tools)."""
    return json.loads(text) if text else None


def names(tools: Optional[list[dict]]) -> list[str]:
    return [t["function"]["name"] for t in tools or []]


def required(tools: Optional[list[dict]]) -> dict[str, list[str]]:
    """Each function's required argument names."""
    return {t["function"]["name"]: list((t["function"].get("parameters") or {}).get("required", []))
            for t in tools or []}
