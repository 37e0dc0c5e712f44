"""Teacher rows -> validated OpenAI-format chats -> deterministic jsonl.gz shards.

Every row is either kept or skipped with a reason that is counted in the manifest; every
skipped row is listed (file, row, traj_id, reason, detail). A kept chat is the source
conversation after ``drop_roles`` and counted lossless repairs only, so every assistant
turn renders (and tokenizes) in training exactly as it renders inside the full source
conversation: turns after the last assistant turn are kept (they carry no loss; removing
them would make Qwen3's template add an empty think block to the last assistant turn).
With ``strict: true`` the shard step fails with a one-line message naming the first bad
row's file, row and field (all bad rows are still listed).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..errors import ConfigError, DataError
from ..plan.tools import required as required_args

ROLES = ("system", "user", "assistant", "tool")
META_FIELDS = ("traj_id", "instance_id", "resolved", "model")
# Shards are split by estimated tokens, not rows (agent trajectories range from 1k to 100k+ tokens).
# The student's tokenizer is not known at shard time (shards are shared by every student), so tokens
# are estimated from the UTF-8 JSON line: ~4 bytes per token for English, code and tool output.
SHARD_TOKENS = 1 << 25  # ~33.5M estimated tokens, ~128 MiB of JSON lines per shard
BYTES_PER_TOKEN = 4
MAX_DEPTH = 64  # JSON nesting deeper than this is not an agent trajectory (and would crash json / Jinja)
DETAIL_CHARS = 300

# Qwen3's added tokens (tokenizer.json "added_tokens"): text that contains one of them would be
# tokenized as that control token, i.e. content would forge chat structure (turns, tool calls,
# reasoning, end of text). Rows with such text are skipped as `control_token_in_content`.
CONTROL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
)
_CONTROL_RE = re.compile("|".join(re.escape(t) for t in CONTROL_TOKENS))
# assistant content that is exactly one leading think block: Qwen3's template itself reads it as
# reasoning (content.split('</think>')), so it becomes reasoning_content, rendered identically
_THINK_BLOCK_RE = re.compile(r"\A\s*<think>(?P<r>.*?)</think>(?P<c>.*)\Z", re.DOTALL)
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")

# every reason a row can be skipped for (docs/data-and-validation.md, "Row validation")
REASONS = (
    "invalid_json", "too_deeply_nested", "integer_too_long", "invalid_unicode", "not_a_message_list",
    "unknown_role", "non_string_content", "conflicting_reasoning", "control_token_in_content", "bad_tool_calls",
    "invalid_tool_arguments", "duplicate_tool_call_id", "tool_message_without_id", "dangling_tool_call_id",
    "tool_reply_without_call", "invalid_name", "empty_assistant_turn", "no_assistant_turn", "no_user_turn",
    "unknown_tool", "missing_tool_argument", "missing_traj_id", "invalid_metadata", "invalid_resolved",
    "duplicate_traj_id", "unresolved",
)


class BadRow(ValueError):
    """A row that cannot be used. ``reason`` is the counted category."""

    def __init__(self, reason: str, detail: str, field: str = "messages"):
        super().__init__(detail)
        self.reason, self.detail, self.field = reason, detail, field


# What a user fixes in the data or the config: a step's entry point turns these into one line and exit 1
USER_ERRORS = (ConfigError, DataError, BadRow)


@dataclass
class Source:
    """Where a row came from, for error messages."""

    file: str
    row: int


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, what: str, reason: str = "invalid_json") -> Any:
    """``json.loads`` whose every failure is a :class:`BadRow` (never RecursionError/ValueError)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise BadRow(reason, f"{what} is not valid JSON ({e.msg} at char {e.pos})") from None
    except RecursionError:
        raise BadRow("too_deeply_nested", f"{what} is nested too deeply to parse") from None
    except ValueError as e:  # > 4300-digit integers (int max str digits), NaN/Infinity
        if "digits" in str(e):
            raise BadRow("integer_too_long", f"{what} has an integer with too many digits ({e})") from None
        raise BadRow(reason, f"{what} is not valid JSON ({e})") from None


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """Iteratively check JSON nesting depth (no recursion, so it cannot itself overflow)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                raise BadRow("too_deeply_nested", f"{what} is nested deeper than {limit} levels")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))


def _control(text: str, where: str) -> None:
    m = _CONTROL_RE.search(text)
    if m:
        raise BadRow("control_token_in_content", f"{where} contains the control token {m.group(0)} at char {m.start()}")


def _content(value: Any, where: str, events: Counter, assistant: bool) -> tuple[str, str | None]:
    """(text, reasoning from thinking parts): None -> "", text-part lists joined, else bad."""
    if isinstance(value, str):
        return value, None
    if value is None:
        events["null_content"] += 1
        return "", None
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        texts, thoughts = [], []
        for j, p in enumerate(value):
            kind = p.get("type")
            if kind == "text" and isinstance(p.get("text"), str):
                texts.append(p["text"])
            elif assistant and kind in ("thinking", "reasoning"):
                t = p.get(kind, p.get("text"))
                if not isinstance(t, str):
                    raise BadRow("non_string_content", f"{where}.content[{j}] ({kind} part) has no text")
                if texts:
                    raise BadRow("non_string_content", f"{where}.content[{j}]: a {kind} part after a text part "
                                 "cannot be rendered in order")
                thoughts.append(t)
                events[f"reasoning_from:{kind}_part"] += 1
            else:
                raise BadRow("non_string_content", f"{where}.content[{j}] is a {kind!r} part, expected text"
                             + (" or thinking" if assistant else ""))
        if texts or not value:
            events["joined_text_parts"] += 1
        return "".join(texts), ("".join(thoughts) if thoughts else None)
    raise BadRow("non_string_content", f"{where}.content is {type(value).__name__}, expected a string")


def _reasoning(m: dict, content: str, from_parts: str | None, where: str, events: Counter) -> tuple[str, str | None]:
    """Every reasoning source as Qwen3's ``reasoning_content``; returns (content, reasoning)."""
    found: dict[str, str] = {}
    for key in REASONING_KEYS:
        v = m.get(key)
        if v is None:
            continue
        if not isinstance(v, str):
            raise BadRow("non_string_content", f"{where}.{key} is {type(v).__name__}, expected a string")
        found[key] = v
    if from_parts is not None:
        found["content parts"] = from_parts
    if "</think>" in content or "<think>" in content:
        blk = _THINK_BLOCK_RE.match(content)
        if blk and not _CONTROL_RE.search(blk["r"]) and not _CONTROL_RE.search(blk["c"]) and not found:
            # what the official template does with such content: split at </think>
            events["reasoning_from:think_tags"] += 1
            return blk["c"].lstrip("\n"), blk["r"].rstrip("\n").lstrip("\n")
        _control(content, f"{where}.content")
    if len(set(found.values())) > 1:
        raise BadRow("conflicting_reasoning", f"{where} has different reasoning in {', '.join(sorted(found))}")
    if not found:
        return content, None
    for key in found:
        if key not in ("reasoning_content", "content parts"):
            events[f"reasoning_from:{key}"] += 1
    return content, next(iter(found.values()))


def _arguments(args: Any, where: str) -> Any:
    if isinstance(args, str):
        parsed = parse_json(args, f"{where}.function.arguments", "invalid_tool_arguments")
    else:
        parsed = args
    if not isinstance(parsed, dict):
        raise BadRow("invalid_tool_arguments", f"{where}.function.arguments is a JSON {type(parsed).__name__}, "
                     "expected an object")
    check_depth(parsed, f"{where}.function.arguments")
    if isinstance(args, dict):
        # rendered with tojson: its text is what the model sees
        try:
            text = json.dumps(args, ensure_ascii=False, allow_nan=False)
        except ValueError:
            raise BadRow("invalid_tool_arguments", f"{where}.function.arguments cannot be written as JSON (NaN, Infinity or a huge integer)") from None
    else:
        text = args
    _control(text, f"{where}.function.arguments")
    return args


def _tool_calls(m: dict, where: str, events: Counter) -> list[dict]:
    calls = m.get("tool_calls")
    legacy = m.get("function_call")
    if legacy is not None:
        if calls:
            raise BadRow("bad_tool_calls", f"{where} has both tool_calls and a legacy function_call")
        events["function_call_to_tool_calls"] += 1
        calls = [{"type": "function", "function": legacy}]
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise BadRow("bad_tool_calls", f"{where}.tool_calls is {type(calls).__name__}, expected a list")
    if not calls:
        events["empty_tool_calls_dropped"] += 1
        return []
    out, ids = [], set()
    for j, call in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRow("bad_tool_calls", f"{w}.function.name missing")
        if call.get("type", "function") != "function":
            raise BadRow("bad_tool_calls", f"{w}.type is {call.get('type')!r}, expected 'function'")
        _control(fn["name"], f"{w}.function.name")
        if "arguments" not in fn:
            events["missing_arguments_as_empty_object"] += 1
        item: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments", "{}"), w)}}
        cid = call.get("id")
        if cid is not None:
            if not isinstance(cid, str):
                if not isinstance(cid, int) or isinstance(cid, bool):
                    raise BadRow("bad_tool_calls", f"{w}.id is {type(cid).__name__}, expected a string")
                events["id_to_string"] += 1
                cid = str(cid)
            if cid in ids:
                raise BadRow("duplicate_tool_call_id", f"{w}.id {cid!r} is used twice in one turn")
            ids.add(cid)
            item = {"id": cid, **item}
        out.append(item)
    return out


def _str_field(m: dict, key: str, where: str, events: Counter) -> str | None:
    v = m.get(key)
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        events["id_to_string"] += 1
        return str(v)
    raise BadRow("invalid_name" if key == "name" else "bad_tool_calls", f"{where}.{key} is {type(v).__name__}, expected a string")


def _check_tool_links(msgs: list[dict]) -> Counter:
    """Every tool reply answers, by id, a still open call of the assistant turn before it."""
    events: Counter = Counter()
    open_ids: set[str] | None = None  # None: no tool-calling assistant turn right before
    for i, m in enumerate(msgs):
        if m["role"] == "tool":
            if "tool_call_id" not in m:
                raise BadRow("tool_message_without_id", f"messages[{i}] is a tool message without tool_call_id")
            if open_ids is None:
                raise BadRow("tool_reply_without_call", f"messages[{i}] is a tool reply but the turn before it made no tool call")
            if m["tool_call_id"] not in open_ids:
                raise BadRow("dangling_tool_call_id", f"messages[{i}].tool_call_id {m['tool_call_id']!r:.60} answers "
                             "no open call of the preceding assistant turn")
            open_ids.discard(m["tool_call_id"])
            continue
        events["unanswered_tool_calls"] += len(open_ids or ())
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        open_ids = {c.get("id") for c in calls} if calls else None
    events["unanswered_tool_calls"] += len(open_ids or ())
    return +events


def _check_calls(msgs: list[dict], source_index: list[int], tools: list[dict]) -> None:
    """Every call names a function of the teacher's ``tools`` and its arguments hold that function's required keys
    (checked after every other check of the row: a row with a malformed call keeps that reason)."""
    required = required_args(tools)
    for m, i in zip(msgs, source_index):
        for j, call in enumerate(m.get("tool_calls") or ()):
            w, fn = f"messages[{i}].tool_calls[{j}].function", call["function"]
            if fn["name"] not in required:
                raise BadRow("unknown_tool", f"{w}.name {fn['name']!r:.60} is not one of the teacher's tools "
                             f"({', '.join(required)})")
            args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
            missing = [k for k in required[fn["name"]] if k not in args]
            if missing:
                raise BadRow("missing_tool_argument", f"{w}.arguments lack {fn['name']}'s required "
                             f"{', '.join(repr(k) for k in missing)}")


def normalize_messages(raw: Any, drop_roles: Iterable[str] = (), tools: list[dict] | None = None
                       ) -> tuple[list[dict], Counter]:
    """Validate one row's ``messages`` value; return clean messages and event counts. With ``tools`` (the
    teacher's), every call must name one of them with its required arguments."""
    events: Counter = Counter()
    if isinstance(raw, str):
        raw = parse_json(raw, "messages")
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise BadRow("not_a_message_list", "messages is not a list of message objects")
    check_depth(raw, "messages")
    drop = set(drop_roles)
    msgs: list[dict] = []
    source_index: list[int] = []  # each kept message's index in the row (errors name the row's own index)
    for i, m in enumerate(raw):
        role = m.get("role")
        where = f"messages[{i}]"
        if isinstance(role, str) and role in drop:
            events[f"dropped_role:{role}"] += 1
            continue
        if role not in ROLES:
            raise BadRow("unknown_role", f"{where}.role is {role!r:.40}, expected one of {', '.join(ROLES)}")
        text, thoughts = _content(m.get("content"), where, events, role == "assistant")
        out: dict[str, Any] = {"role": role}
        if role == "assistant":
            text, reasoning = _reasoning(m, text, thoughts, where, events)
            _control(text, f"{where}.content")
            out["content"] = text
            if reasoning is not None:
                _control(reasoning, f"{where}.reasoning_content")
                out["reasoning_content"] = reasoning
            calls = _tool_calls(m, where, events)
            if calls:
                out["tool_calls"] = calls
            if not text and not reasoning and not calls:
                raise BadRow("empty_assistant_turn", f"{where} is an assistant turn with no content and no tool calls")
        else:
            _control(text, f"{where}.content")
            out["content"] = text
            if m.get("tool_calls") or m.get("function_call"):
                raise BadRow("bad_tool_calls", f"{where} has tool calls but role {role!r}")
            if m.get("tool_calls") == []:
                events["empty_tool_calls_dropped"] += 1
        if role == "tool":
            cid = _str_field(m, "tool_call_id", where, events)
            if cid is not None:
                out["tool_call_id"] = cid
        name = _str_field(m, "name", where, events)
        if name is not None:
            out["name"] = name
        msgs.append(out)
        source_index.append(i)
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None:
        raise BadRow("no_assistant_turn", "messages has no assistant turn")
    if not any(m["role"] == "user" for m in msgs[:last]):
        raise BadRow("no_user_turn", "messages has no user turn before the assistant")
    events.update(_check_tool_links(msgs))
    if tools:
        _check_calls(msgs, source_index, tools)
    return msgs, events


def parse_resolved(value: Any) -> tuple[bool | None, bool]:
    """``resolved`` as a bool (or None when absent); (value, converted_from_string_or_int)."""
    if value is None or isinstance(value, bool):
        return value, False
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE, True
    if isinstance(value, int) and value in (0, 1):
        return bool(value), True
    raise BadRow("invalid_resolved", f"resolved is {value!r:.40}, expected a boolean", field="resolved")


def heldout(traj_id: str, fraction: float) -> bool:
    """Deterministic held-out membership by traj_id hash."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(traj_id.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


@dataclass
class Result:
    records: dict[str, list[dict]] = field(default_factory=lambda: {"train": [], "validation": []})
    kept: Counter = field(default_factory=Counter)
    rows_in: int = 0
    skipped: Counter = field(default_factory=Counter)
    events: Counter = field(default_factory=Counter)
    skipped_rows: list[dict] = field(default_factory=list)  # every skipped row
    first_error: str | None = None  # one line naming the first bad row (strict mode)

    @property
    def skipped_examples(self) -> list[dict]:
        return self.skipped_rows[:20]

    def strict_error(self) -> str | None:
        """With ``strict``: one line for the first bad row and the count of all of them."""
        bad = [r for r in self.skipped_rows if r["reason"] != "unresolved"]
        if not bad:
            return None
        more = f" (and {len(bad) - 1} more bad row(s))" if len(bad) > 1 else ""
        return f"{self.first_error}{more}"


def _meta(row: dict) -> dict:
    out = {}
    for k in ("instance_id", "model"):
        if row.get(k) is not None:
            if not isinstance(row[k], str):
                raise BadRow("invalid_metadata", f"{k} is {type(row[k]).__name__}, expected a string", field=k)
            out[k] = row[k]
    return out


def _traj_id_text(traj_id: Any) -> str | None:
    if isinstance(traj_id, str):
        return traj_id
    return None if traj_id is None else repr(traj_id)[:80]


def record_bytes(rec: dict) -> bytes:
    """One shard line. Raises BadRow for text that is not valid Unicode (lone surrogates)."""
    try:
        return json.dumps(rec, ensure_ascii=False, sort_keys=True, allow_nan=False).encode() + b"\n"
    except UnicodeEncodeError as e:
        raise BadRow("invalid_unicode", f"text holds a lone surrogate {e.object[e.start:e.end]!a}, not valid Unicode") from None
    except RecursionError:
        raise BadRow("too_deeply_nested", "a value is nested too deeply to serialise") from None
    except ValueError as e:  # NaN, Infinity, integers beyond Python's int <-> str digit limit
        raise BadRow("integer_too_long" if "digits" in str(e) else "invalid_json", f"a value cannot be written as JSON ({e})") from None


def transform_rows(rows: Iterable[tuple[Source, dict]], teacher: str, transform: dict,
                   sink: Callable[[str, dict], None] | None = None, tools: list[dict] | None = None) -> Result:
    """Validate ``rows`` (their calls against the teacher's ``tools``, if any); kept records go to
    ``sink(split, record)`` as they come (streaming), else into ``Result.records``. ``Result.kept`` counts them per
    split either way."""
    res = Result()
    seen: set[str] = set()
    for src, row in rows:
        res.rows_in += 1
        traj_id = row.get("traj_id")
        try:
            if not isinstance(traj_id, str) or not traj_id:
                raise BadRow("missing_traj_id", f"traj_id is {_traj_id_text(traj_id) or 'missing'}, expected a non-empty string",
                             field="traj_id")
            record_bytes({"traj_id": traj_id})
            if transform.get("dedup_traj_id", True) and traj_id in seen:
                raise BadRow("duplicate_traj_id", f"traj_id {traj_id!r} already seen", field="traj_id")
            resolved, converted = parse_resolved(row.get("resolved"))
            if transform.get("resolved_only") and resolved is not True:
                raise BadRow("unresolved", f"resolved is {resolved} (resolved_only filter)", field="resolved")
            msgs, events = normalize_messages(row.get("messages"), transform.get("drop_roles", ()), tools)
            rec = {"messages": msgs, "teacher": teacher, "traj_id": traj_id, **_meta(row)}
            if "resolved" in row:
                rec["resolved"] = resolved
            record_bytes(rec)
        except BadRow as e:
            tid = _traj_id_text(traj_id)
            detail = str(e)[:DETAIL_CHARS]
            if res.first_error is None and e.reason != "unresolved":
                where = f"{src.file} row {src.row}" + (f" (traj_id={tid!a})" if tid is not None else "")
                res.first_error = f"{where}: field {e.field}: {detail}"
            res.skipped[e.reason] += 1
            res.skipped_rows.append({"file": src.file, "row": src.row, "traj_id": tid, "reason": e.reason, "detail": detail})
            continue
        seen.add(traj_id)
        res.events.update(events)
        if converted:
            res.events["resolved_from_string"] += 1
        split = "validation" if heldout(traj_id, float(transform.get("heldout_fraction", 0.0))) else "train"
        res.kept[split] += 1
        if sink is None:
            res.records[split].append(rec)
        else:
            sink(split, rec)
    return res


def trajectory_stats(rec: dict) -> dict:
    msgs = rec["messages"]
    return {
        "traj_id": rec["traj_id"],
        "resolved": rec.get("resolved"),
        "turns": sum(1 for m in msgs if m["role"] == "assistant"),
        "messages": len(msgs),
        "tool_calls": sum(len(m.get("tool_calls", ())) for m in msgs),
        "chars": sum(len(m["content"]) + len(m.get("reasoning_content", "")) for m in msgs),
    }


def gzip_jsonl(records: list[dict]) -> bytes:
    """Deterministic gzip bytes (no mtime, no file name) of one JSON object per line."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        for rec in records:
            gz.write(record_bytes(rec))
    return buf.getvalue()


class ShardWriter:
    """Deterministic jsonl.gz shards of one split, cut at ``shard_tokens`` estimated tokens.

    ``add`` records in order; ``put(name, data)`` is called with each finished shard
    (``<split>-00000.jsonl.gz``, ...), so only one shard is ever held in memory (gzipped).
    A record bigger than a shard gets a shard of its own; ``close`` flushes the last one.
    """

    def __init__(self, split: str, put: Callable[[str, bytes], None], shard_tokens: int = SHARD_TOKENS):
        self.split, self.put, self.limit = split, put, int(shard_tokens) * BYTES_PER_TOKEN
        self.files: list[str] = []
        self._buf: io.BytesIO | None = None
        self._gz: gzip.GzipFile | None = None
        self._bytes = 0

    def add(self, rec: dict) -> None:
        line = record_bytes(rec)
        if self._gz is not None and self._bytes + len(line) > self.limit:
            self._flush()
        if self._gz is None:
            self._buf = io.BytesIO()
            self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._buf, mtime=0, compresslevel=6)
            self._bytes = 0
        self._gz.write(line)
        self._bytes += len(line)

    def _flush(self) -> None:
        self._gz.close()
        name = f"{self.split}-{len(self.files):05d}.jsonl.gz"
        self.put(name, self._buf.getvalue())
        self.files.append(name)
        self._buf = self._gz = None

    def close(self) -> list[str]:
        if self._gz is not None:
            self._flush()
        return self.files
