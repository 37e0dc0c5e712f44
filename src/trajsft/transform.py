"""Teacher rows -> validated OpenAI-format chats -> deterministic jsonl.gz shards.

Every row is either kept (possibly with trailing non-assistant turns trimmed and
configured roles dropped) or skipped with a reason that is counted in the manifest.
With ``strict: true`` the first bad row raises :class:`BadRow` with a one-line message
naming the file, row and field.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

ROLES = ("system", "user", "assistant", "tool")
META_FIELDS = ("traj_id", "instance_id", "resolved", "model")
SHARD_ROWS = 2000


class BadRow(ValueError):
    """A row that cannot be used. ``reason`` is the counted category."""

    def __init__(self, reason: str, detail: str, field: str = "messages"):
        super().__init__(detail)
        self.reason, self.detail, self.field = reason, detail, field


@dataclass
class Source:
    """Where a row came from, for error messages."""

    file: str
    row: int


def _text(value: Any, where: str) -> str:
    """Message content as a string: None -> "", text-part lists joined, anything else bad."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
    ):
        return "".join(p["text"] for p in value)
    raise BadRow("non_string_content", f"{where}.content is {type(value).__name__}, expected a string")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise BadRow("bad_tool_calls", f"{where}.tool_calls is {type(calls).__name__}, expected a list")
    out = []
    for j, call in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRow("bad_tool_calls", f"{w}.function.name missing")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                json.loads(args)
            except json.JSONDecodeError as e:
                raise BadRow("invalid_tool_arguments", f"{w}.function.arguments is not valid JSON ({e.msg})") from None
        elif not isinstance(args, dict):
            raise BadRow("invalid_tool_arguments", f"{w}.function.arguments is {type(args).__name__}")
        item = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if call.get("id") is not None:
            item = {"id": str(call["id"]), **item}
        out.append(item)
    return out


def normalize_messages(raw: Any, drop_roles: Iterable[str] = ()) -> tuple[list[dict], Counter]:
    """Validate one row's ``messages`` value; return clean messages and event counts."""
    events: Counter = Counter()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise BadRow("invalid_json", f"messages is not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise BadRow("not_a_message_list", "messages is not a list of message objects")
    drop = set(drop_roles)
    msgs: list[dict] = []
    for i, m in enumerate(raw):
        role = m.get("role")
        where = f"messages[{i}]"
        if role in drop:
            events[f"dropped_role:{role}"] += 1
            continue
        if role not in ROLES:
            raise BadRow("unknown_role", f"{where}.role is {role!r}, expected one of {', '.join(ROLES)}")
        out: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
        if role == "assistant":
            if m.get("reasoning_content"):
                out["reasoning_content"] = _text(m["reasoning_content"], where)
            if m.get("tool_calls"):
                out["tool_calls"] = _tool_calls(m["tool_calls"], where)
        elif m.get("tool_calls"):
            raise BadRow("bad_tool_calls", f"{where} has tool_calls but role {role!r}")
        if role == "tool":
            if m.get("tool_call_id") is not None:
                out["tool_call_id"] = str(m["tool_call_id"])
            if m.get("name") is not None:
                out["name"] = str(m["name"])
        elif m.get("name") is not None:
            out["name"] = str(m["name"])
        msgs.append(out)
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None:
        raise BadRow("no_assistant_turn", "messages has no assistant turn")
    if last < len(msgs) - 1:
        # turns after the last assistant turn carry no loss and would end the chat mid-exchange
        events["trimmed_trailing_turns"] += len(msgs) - 1 - last
        msgs = msgs[: last + 1]
    if not any(m["role"] == "user" for m in msgs[:last]):
        raise BadRow("no_user_turn", "messages has no user turn before the assistant")
    return msgs, events


def heldout(traj_id: str, fraction: float) -> bool:
    """Deterministic held-out membership by traj_id hash."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(traj_id.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


@dataclass
class Result:
    records: dict[str, list[dict]] = field(default_factory=lambda: {"train": [], "validation": []})
    rows_in: int = 0
    skipped: Counter = field(default_factory=Counter)
    events: Counter = field(default_factory=Counter)
    skipped_examples: list[dict] = field(default_factory=list)


def transform_rows(
    rows: Iterable[tuple[Source, dict]], teacher: str, transform: dict, max_examples: int = 20
) -> Result:
    res = Result()
    seen: set[str] = set()
    for src, row in rows:
        res.rows_in += 1
        traj_id = row.get("traj_id")
        try:
            if not isinstance(traj_id, str) or not traj_id:
                raise BadRow("missing_traj_id", "traj_id is missing or empty", field="traj_id")
            if transform.get("dedup_traj_id", True) and traj_id in seen:
                raise BadRow("duplicate_traj_id", f"traj_id {traj_id!r} already seen", field="traj_id")
            if transform.get("resolved_only") and row.get("resolved") is not True:
                raise BadRow("unresolved", "resolved is not true (resolved_only filter)", field="resolved")
            msgs, events = normalize_messages(row.get("messages"), transform.get("drop_roles", ()))
        except BadRow as e:
            where = f"{src.file} row {src.row}" + (f" (traj_id={traj_id})" if isinstance(traj_id, str) else "")
            if transform.get("strict") and e.reason != "unresolved":
                raise BadRow(e.reason, f"{where}: field {e.field}: {e}", e.field) from None
            res.skipped[e.reason] += 1
            if len(res.skipped_examples) < max_examples:
                res.skipped_examples.append({"file": src.file, "row": src.row, "traj_id": traj_id, "reason": e.reason, "detail": str(e)})
            continue
        seen.add(traj_id)
        res.events.update(events)
        rec = {"messages": msgs, "teacher": teacher}
        for k in META_FIELDS:
            if k in row:
                rec[k] = row[k]
        split = "validation" if heldout(traj_id, float(transform.get("heldout_fraction", 0.0))) else "train"
        res.records[split].append(rec)
    return res


def trajectory_stats(rec: dict) -> dict:
    msgs = rec["messages"]
    return {
        "traj_id": rec["traj_id"],
        "resolved": rec.get("resolved"),
        "turns": sum(1 for m in msgs if m["role"] == "assistant"),
        "messages": len(msgs),
        "tool_calls": sum(len(m.get("tool_calls", ())) for m in msgs),
        "chars": sum(len(m["content"]) for m in msgs),
    }


def gzip_jsonl(records: list[dict]) -> bytes:
    """Deterministic gzip bytes (no mtime, no file name) of one JSON object per line."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        for rec in records:
            gz.write(json.dumps(rec, ensure_ascii=False, sort_keys=True).encode() + b"\n")
    return buf.getvalue()


def shard_names(split: str, n_records: int, rows_per_shard: int = SHARD_ROWS) -> Iterator[tuple[str, int, int]]:
    n = max(1, -(-n_records // rows_per_shard))
    for i in range(n):
        yield f"{split}-{i:05d}-of-{n:05d}.jsonl.gz", i * rows_per_shard, min(n_records, (i + 1) * rows_per_shard)
