"""The chat route's own work, no jax: an OpenAI chat request checked and rendered with the template trajsft trains
with (tools included), and the student's output parsed back into an OpenAI assistant message.

Levanter's engine generates; its own chat route drops ``tools``, falls back to plain text when the template fails
and returns no ``tool_calls`` (``levanter.inference.openai``), so this route is ours: a request that does not
render is an HTTP 400 naming the field, and Qwen3's ``<tool_call>`` JSON in the output comes back as OpenAI
``tool_calls`` (output that does not parse comes back as text, never as a server error).
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any, Mapping, Optional, Sequence

from ..data.template import load_template
from ..data.turns import parse_output
from ..errors import one_line

ROLES = ("system", "user", "assistant", "tool")


class BadRequest(ValueError):
    """A request the route cannot serve: one line, sent back as HTTP 400 (OpenAI's error object: ``param`` the
    field, ``code`` OpenAI's code where it has one)."""

    def __init__(self, message: str, *, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.param, self.code = param, code


def context_length_exceeded(prompt_tokens: int, max_seq_len: int) -> BadRequest:
    """OpenAI's answer to a prompt over the model's context, word for word (litellm reads "maximum context length"
    and raises ContextWindowExceededError, so an agent stops instead of retrying): the student's context is its
    training seq_len, and a reply needs at least one token of it."""
    return BadRequest(f"This model's maximum context length is {max_seq_len} tokens. However, your messages resulted "
                      f"in {prompt_tokens} tokens. Please reduce the length of the messages.", param="messages",
                      code="context_length_exceeded")


def _text(content: Any, where: str) -> Optional[str]:
    """A message's content: a string, null, or OpenAI's list of text parts (joined)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.content[{i}]: only text parts are served ({{\"type\": \"text\", \"text\": ...}})",
                                 param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{where}.content is {type(content).__name__}, expected a string or a list of text parts",
                     param="messages")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls is {type(calls).__name__}, expected a list", param="messages")
    out = []
    for j, call in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"{w}.function.name is missing", param="messages")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, Mapping)):
            raise BadRequest(f"{w}.function.arguments is {type(args).__name__}, expected a JSON string or an object",
                             param="messages")
        item = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if call.get("id") is not None:
            item = {"id": str(call["id"]), **item}
        out.append(item)
    return out


def messages(body: Mapping) -> list[dict]:
    """The request's messages as the template reads them (as trajsft's shards hold a chat: tool call arguments
    as given, a JSON string rendered as is, an object with ``tojson``)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: a non-empty list of chat messages is required", param="messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise BadRequest(f"{where} is {type(m).__name__}, expected an object", param="messages")
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name of the system turn
            role = "system"
        if role not in ROLES:
            raise BadRequest(f"{where}.role is {role!r}, expected one of {', '.join(ROLES)}", param="messages")
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where) or ""}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        out.append(msg)
    return out


def tools(body: Mapping) -> Optional[list[dict]]:
    """The request's tools (OpenAI function tools), as the template lists them; None: no tools."""
    given = body.get("tools")
    if given is None or given == []:
        return None
    if not isinstance(given, list):
        raise BadRequest(f"tools is {type(given).__name__}, expected a list", param="tools")
    for i, t in enumerate(given):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str):
            raise BadRequest(f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                             param="tools")
    return list(given)


def _names(tool_list: Optional[Sequence[Mapping]]) -> str:
    return ", ".join(str((t.get("function") or {}).get("name")) for t in tool_list or ()) or "none"


def tools_mismatch(requested: Optional[list[dict]], trained: Sequence[Optional[list]]) -> Optional[str]:
    """The log line of a request whose tools are not a set the student trained with (``trained``: each teacher's
    tools, None for none), else None. Compared as the template renders them (JSON text, key order included); the
    request is served as asked either way: nothing is added or removed."""
    text = lambda ts: json.dumps(ts or None, ensure_ascii=False)  # noqa: E731
    if not trained or any(text(requested) == text(t) for t in trained):
        return None
    kinds = " / ".join(dict.fromkeys(_names(t) for t in trained))
    same = " (the same names: their schemas or key order differ)" if _names(requested) in kinds.split(" / ") else ""
    return (f"chat completion: the request's tools ({_names(requested)}) are not the ones the student trained with "
            f"({kinds}){same}: served as asked, so the prompt is not one it trained on")


def render(tokenizer, msgs: list[dict], tool_list: Optional[list[dict]]) -> list[int]:
    """The prompt's token ids: the chat rendered with trajsft's template, tools included, and the assistant's
    turn opened (as every trained assistant turn starts)."""
    try:
        ids = tokenizer.apply_chat_template(msgs, tools=tool_list, chat_template=load_template(),
                                            add_generation_prompt=True, tokenize=True)
    except Exception as e:  # noqa: BLE001 - jinja's errors: a request the template cannot render
        raise BadRequest(f"messages do not render with the chat template: {' '.join(str(e).split())[:300]}",
                         param="messages") from None
    if isinstance(ids, Mapping):  # a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _shown(v: Any) -> str:
    return one_line(json.dumps(v, ensure_ascii=False) if not isinstance(v, float) else repr(v), 60)


def generation_settings(body: Mapping, default_max_tokens: int) -> dict:
    """max_tokens, temperature, seed, n and stop strings of a request. Every field the route reads is checked
    (bad values: one line naming the field); fields it does not read (top_p, tool_choice, ...) are ignored."""
    def number(key, default, kind, lo, hi=None):
        v = body.get(key)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (kind is int and int(v) != v) or v < lo or (hi is not None and v > hi):
            want = f"{'an integer' if kind is int else 'a number'} >= {lo}" + (f" and <= {hi}" if hi is not None else "")
            raise BadRequest(f"{key} is {_shown(v)}, expected {want}", param=key)
        return kind(v)

    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"stop is {_shown(stop)}, expected a string or a list of non-empty strings", param="stop")
    stream = body.get("stream")
    if stream not in (None, False):
        raise BadRequest("stream: streamed responses are not served; send stream: false", param="stream")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63):
        raise BadRequest(f"seed is {_shown(seed)}, expected a 64-bit integer", param="seed")
    return {"max_tokens": number("max_completion_tokens", None, int, 1)
            if body.get("max_completion_tokens") is not None else number("max_tokens", default_max_tokens, int, 1),
            "temperature": number("temperature", 0.7, float, 0, 2), "n": number("n", 1, int, 1), "seed": seed,
            "stop": stops}


def assistant_message(text: str, *, ended: bool, stops: list[str]) -> tuple[dict, str]:
    """The OpenAI assistant message of the student's output, and its finish_reason.

    ``ended``: the student closed its turn (``<|im_end|>``). Every ``<tool_call>`` block that holds a JSON object
    with a ``name`` becomes a ``tool_calls`` entry (its ``arguments`` a JSON string) and leaves the content; if any
    block does not parse, or a block is left open, the whole output is the content and there are no tool calls
    (:func:`trajsft.data.turns.parse_output`)."""
    for s in stops:  # the client's stop strings: the output ends before the first one
        cut = text.find(s)
        if cut >= 0:
            text, ended = text[:cut], True
    parsed = parse_output(text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, "stop" if ended else "length"
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                           else json.dumps(c.arguments, ensure_ascii=False)}} for c in parsed.calls]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, "tool_calls"
