"""Validated shards -> datasets other trainers load: LLaMA-Factory (sharegpt) and TRL/HF (messages).

``messages`` rows are the shard chats unchanged (OpenAI format: ``reasoning_content``,
``tool_calls`` with ids, ``tool_call_id``, ``name``), so TRL renders them exactly as trajsft
trains. The source datasets carry no tool schema, so there is no ``tools`` column: a rendering
with a tool list would show the model a system block the teacher never saw.

LLaMA-Factory's sharegpt format is narrower. Each counted *event* below says what changed:

- representation, lossless (LLaMA-Factory 0.9.5's qwen3 template reads it back):
  ``reasoning_in_think_block`` (``reasoning_content`` as a leading ``<think>\\n...\\n</think>\\n\\n``),
  ``function_call_with_text`` (a tool-calling turn's reasoning/text before ``<tool_call>[...]</tool_call>``),
  ``parallel_tool_calls`` (a JSON list of calls), ``tool_replies_joined`` (consecutive tool
  replies as one observation, joined the way Qwen3 renders them);
- lossy (counted in ``lossy``): ``tool_call_ids_dropped``, ``tool_reply_ids_dropped`` (sharegpt
  links a reply to its call by position only), ``names_dropped:<role>``,
  ``arguments_reserialized`` (LLaMA-Factory re-dumps arguments with ``json.dumps``: a call whose
  argument text differs from that, e.g. ``{"a":1}`` vs ``{"a": 1}``, renders differently than
  the teacher wrote it), ``trailing_turns_dropped`` (sharegpt must end on an assistant turn),
  ``empty_system_prompt_dropped``;
- a chat sharegpt cannot hold at all is skipped with a reason (``SKIP_REASONS``), listed and
  counted; it is still in the ``messages`` export.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

# dataset_info.json "tags" (LLaMA-Factory's sharegpt defaults, spelled out)
LF_TAGS = {
    "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
    "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
}
LF_COLUMNS = {"messages": "conversations", "system": "system"}
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"  # LLaMA-Factory qwen3 thought_words
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # LLaMA-Factory tool_call_words
REPLY_SEP = "\n</tool_response>\n<tool_response>\n"  # how Qwen3 renders consecutive tool replies
SKIP_REASONS = ("system_not_first", "assistant_before_user", "user_after_user", "assistant_after_assistant")
LOSSY = ("tool_call_ids_dropped", "tool_reply_ids_dropped", "arguments_reserialized", "trailing_turns_dropped",
         "empty_system_prompt_dropped")  # plus names_dropped:<role>


class Unrepresentable(ValueError):
    """A chat the sharegpt format cannot hold; ``reason`` is the counted category."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def messages_row(rec: dict) -> dict:
    """A TRL / HF ``messages`` row: the shard record as it is."""
    return dict(rec)


def _call_object(call: dict, events: Counter) -> dict:
    args = call["function"]["arguments"]
    obj = json.loads(args) if isinstance(args, str) else args
    if isinstance(args, str) and json.dumps(obj, ensure_ascii=False) != args:
        events["arguments_reserialized"] += 1
    return {"name": call["function"]["name"], "arguments": obj}


def _assistant_value(m: dict, events: Counter) -> tuple[str, str]:
    """(tag, value) of one assistant turn."""
    prefix = ""
    if "reasoning_content" in m:
        prefix = THINK_OPEN + m["reasoning_content"] + THINK_CLOSE
        events["reasoning_in_think_block"] += 1
    calls = m.get("tool_calls")
    if not calls:
        return LF_TAGS["assistant_tag"], prefix + m["content"]
    events["tool_call_ids_dropped"] += sum(1 for c in calls if "id" in c)
    objs = [_call_object(c, events) for c in calls]
    if len(objs) > 1:
        events["parallel_tool_calls"] += 1
    payload = json.dumps(objs if len(objs) > 1 else objs[0], ensure_ascii=False)
    text = prefix + m["content"] + ("\n" if m["content"] else "")  # Qwen3: content, "\n", <tool_call>
    if not text:
        return LF_TAGS["function_tag"], payload  # the documented form: the call's JSON alone
    events["function_call_with_text"] += 1
    return LF_TAGS["function_tag"], text + CALL_OPEN + payload + CALL_CLOSE


def sharegpt_row(rec: dict) -> tuple[dict, Counter]:
    """One shard record as a LLaMA-Factory sharegpt row, with its counted events.

    Raises :class:`Unrepresentable` for a chat whose turn order sharegpt cannot hold
    (human/observation and gpt/function_call must alternate, starting with human).
    """
    events: Counter = Counter()
    msgs = rec["messages"]
    row: dict[str, Any] = {}
    if msgs and msgs[0]["role"] == "system":
        if msgs[0]["content"]:
            row["system"] = msgs[0]["content"]
        else:
            events["empty_system_prompt_dropped"] += 1
        msgs = msgs[1:]
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    if last < len(msgs) - 1:
        events["trailing_turns_dropped"] += len(msgs) - 1 - last
    conv: list[dict] = []
    for i, m in enumerate(msgs[: last + 1]):
        role = m["role"]
        if m.get("name") is not None:
            events[f"names_dropped:{role}"] += 1
        if role == "system":
            raise Unrepresentable("system_not_first", f"messages[{i}] is a system message after the first turn")
        if role == "tool":
            events["tool_reply_ids_dropped"] += 1
            if conv and conv[-1]["from"] == LF_TAGS["observation_tag"]:
                conv[-1]["value"] += REPLY_SEP + m["content"]
                events["tool_replies_joined"] += 1
                continue
            tag, value = LF_TAGS["observation_tag"], m["content"]
        elif role == "user":
            tag, value = LF_TAGS["user_tag"], m["content"]
        else:
            tag, value = _assistant_value(m, events)
        user_side = tag in (LF_TAGS["user_tag"], LF_TAGS["observation_tag"])
        if user_side != (len(conv) % 2 == 0):
            if not conv:
                raise Unrepresentable("assistant_before_user", f"messages[{i}] is an assistant turn before any user turn")
            reason = "user_after_user" if user_side else "assistant_after_assistant"
            raise Unrepresentable(reason, f"messages[{i}] ({role}) follows a {conv[-1]['from']} turn")
        conv.append({"from": tag, "value": value})
    row["conversations"] = conv
    return row, events


def messages_from_sharegpt(row: dict) -> list[dict]:
    """The OpenAI-format chat a sharegpt row holds (the inverse of :func:`sharegpt_row`)."""
    out: list[dict] = []
    if row.get("system") is not None:
        out.append({"role": "system", "content": row["system"]})
    for t in row["conversations"]:
        tag, value = t["from"], t["value"]
        if tag == LF_TAGS["user_tag"]:
            out.append({"role": "user", "content": value})
        elif tag == LF_TAGS["observation_tag"]:
            out.extend({"role": "tool", "content": v} for v in value.split(REPLY_SEP))
        elif tag == LF_TAGS["assistant_tag"]:
            out.append(_split_think(value))
        else:
            calls_text, text = value, ""
            if value.endswith(CALL_CLOSE):
                cut = value.index(CALL_OPEN)
                text, calls_text = value[:cut], value[cut + len(CALL_OPEN): -len(CALL_CLOSE)]
            calls = json.loads(calls_text)
            m = _split_think(text)
            m["content"] = m["content"][:-1] if m["content"] else ""  # the "\n" before <tool_call>
            m["tool_calls"] = [{"type": "function", "function": c} for c in (calls if isinstance(calls, list) else [calls])]
            out.append(m)
    return out


def _split_think(value: str) -> dict:
    m: dict[str, Any] = {"role": "assistant"}
    if value.startswith(THINK_OPEN) and THINK_CLOSE in value:
        end = value.index(THINK_CLOSE)
        m["reasoning_content"] = value[len(THINK_OPEN): end]
        value = value[end + len(THINK_CLOSE):]
    m["content"] = value
    return m


def sharegpt_view(messages: list[dict]) -> list[dict]:
    """What of a shard chat survives in sharegpt (the counted losses applied): the self-check."""
    msgs = list(messages)
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    out = []
    for m in msgs[: last + 1]:
        if m["role"] == "system" and not m["content"]:
            continue
        v: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if "reasoning_content" in m:
            v["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            v["tool_calls"] = [{"type": "function", "function": _call_object(c, Counter())} for c in m["tool_calls"]]
        out.append(v)
    return out


def dataset_info(entries: dict[str, str]) -> dict:
    """LLaMA-Factory's dataset_info.json: one sharegpt entry per dataset name -> file or dir."""
    return {name: {"file_name": path, "formatting": "sharegpt", "columns": dict(LF_COLUMNS), "tags": dict(LF_TAGS)}
            for name, path in entries.items()}


def jsonl(rows: list[dict]) -> bytes:
    """Deterministic jsonl bytes (UTF-8, one object per line, sorted keys)."""
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode()


# ---- the export step (rule `export`) ----------------------------------------------------
ROWS_PER_FILE = 2000
EXAMPLES = 20


def _read_split(location: str, files: list[str]) -> list[dict]:
    import gzip

    from .. import io

    return [json.loads(line) for f in files for line in gzip.decompress(io.read_bytes(f"{location}/{f}")).splitlines()]


def _shard_files(location: str) -> dict[str, list[str]]:
    """{split: [file names]} of a shard set (train-00000.jsonl.gz, ...)."""
    from .. import io
    from ..errors import DataError

    files: dict[str, list[str]] = {}
    for f in io.glob(f"{location.rstrip('/')}/*.jsonl.gz"):
        name = f.rsplit("/", 1)[-1]
        files.setdefault(name.split("-", 1)[0], []).append(name)
    if "train" not in files:
        raise DataError(f"{location}: no train-*.jsonl.gz shards (rerun the shard rule)")
    return {split: sorted(names) for split, names in sorted(files.items())}


def _write_chunks(dest: str, split: str, rows: list[dict]) -> list[str]:
    """``<split>-00000.jsonl``, ... of ``ROWS_PER_FILE`` rows each (at least one file per split)."""
    from .. import io

    names = []
    for i, a in enumerate(range(0, max(len(rows), 1), ROWS_PER_FILE)):
        fname = f"{split}-{i:05d}.jsonl"
        io.write_bytes(f"{dest}/{fname}", jsonl(rows[a:a + ROWS_PER_FILE]))
        names.append(fname)
    return names


def convert_split(records: list[dict]) -> tuple[list[dict], Counter, list[dict]]:
    """(sharegpt rows, events, skipped rows) of one split; every row is checked to read back to
    its shard chat less the counted losses."""
    rows, events, skipped = [], Counter(), []
    for rec in records:
        try:
            row, ev = sharegpt_row(rec)
        except Unrepresentable as e:
            skipped.append({"traj_id": rec["traj_id"], "reason": e.reason, "detail": e.detail})
            continue
        if messages_from_sharegpt(row) != sharegpt_view(rec["messages"]):
            raise RuntimeError(f"export: traj_id {rec['traj_id']!r}: the sharegpt row does not read back to its chat "
                               "(a bug in trajsft.data.export)")
        rows.append(row)
        events.update(ev)
    return rows, events, skipped


def export(plan, target: str) -> dict:
    """Write ``messages/<teacher>/`` and ``llamafactory/`` under the export's location."""
    import logging
    import shutil
    from pathlib import Path

    from .. import io
    from ..io import is_remote

    log = logging.getLogger("trajsft")
    art = plan.target(target)["export"]
    out = art.location
    if not is_remote(out) and Path(out).exists():
        shutil.rmtree(out)  # leftovers of a killed export of the same hash
    info: dict[str, str] = {}
    teachers, events, skipped, lf_files, msg_files = {}, Counter(), [], {}, {}
    for teacher, shards_name in sorted(art.spec["shards"].items()):
        shards = plan.get("shards", shards_name)
        files = _shard_files(shards.location)
        entry = {"shards": shards_name, "weight": art.spec["weights"][teacher], "messages_rows": {}, "llamafactory_rows": {},
                 "skipped": {}}
        for split, fnames in sorted(files.items()):
            recs = _read_split(shards.location, fnames)
            msg_files[f"{teacher}/{split}"] = [f"messages/{teacher}/{f}" for f in
                                              _write_chunks(f"{out}/messages/{teacher}", split, [messages_row(r) for r in recs])]
            rows, ev, sk = convert_split(recs)
            lf_dir = f"{teacher}/{split}"
            lf_files[lf_dir] = [f"llamafactory/{lf_dir}/{f}" for f in _write_chunks(f"{out}/llamafactory/{lf_dir}", split, rows)]
            info[teacher if split == "train" else f"{teacher}_{split}"] = lf_dir
            entry["messages_rows"][split], entry["llamafactory_rows"][split] = len(recs), len(rows)
            for s in sk:
                entry["skipped"][s["reason"]] = entry["skipped"].get(s["reason"], 0) + 1
                skipped.append({"teacher": teacher, "split": split, **s})
            events.update(ev)
        teachers[teacher] = entry
    io.write_bytes(f"{out}/llamafactory/dataset_info.json", json.dumps(dataset_info(info), indent=2).encode())
    io.write_bytes(f"{out}/llamafactory/skipped.jsonl", jsonl(skipped))
    lossy = {k: v for k, v in sorted(events.items()) if k in LOSSY or k.startswith("names_dropped:")}
    for k, v in lossy.items():
        log.warning("%s: llamafactory export: %d x %s", target, v, k)
    for s in skipped[:EXAMPLES]:
        log.warning("%s: llamafactory export skips %s (%s): %s", target, s["traj_id"], s["reason"], s["detail"])
    weights = {t: e["weight"] for t, e in teachers.items()}
    train_names = ",".join(sorted(weights))
    result = {
        "target": target,
        "teachers": teachers,
        "messages": {"dir": f"{out}/messages", "files": msg_files,
                     "rows": sum(sum(e["messages_rows"].values()) for e in teachers.values())},
        "llamafactory": {
            "dir": f"{out}/llamafactory", "dataset_info": "dataset_info.json", "datasets": sorted(info),
            "files": lf_files, "rows": sum(sum(e["llamafactory_rows"].values()) for e in teachers.values()),
            "skipped": dict(sorted(Counter(s["reason"] for s in skipped).items())), "skipped_total": len(skipped),
            "skipped_examples": skipped[:EXAMPLES], "skipped_list": "llamafactory/skipped.jsonl",
            "lossy": lossy, "events": {k: v for k, v in sorted(events.items()) if k not in lossy},
        },
        # the target's weights, as sampling probabilities of the other trainers' interleaving
        "mix": None if len(weights) == 1 else {
            "weights": weights,
            "llamafactory_args": {"dataset": train_names, "mix_strategy": "interleave_under",
                                  "interleave_probs": ",".join(f"{weights[t]:.6g}" for t in sorted(weights))},
        },
    }
    io.write_bytes(f"{out}/manifest.json", json.dumps(result, indent=2).encode())
    return result


def run_rule(snakemake) -> None:
    """The Snakemake ``script:`` job of rule `export`: user errors are one line, exit 1."""
    import logging
    import sys
    import time
    from pathlib import Path

    from .. import io, logs
    from .. import storage
    from ..observe import signals
    from ..io import write_json
    from ..plan.config import Plan
    from ..steps import USER_ERRORS

    log = logging.getLogger("trajsft")
    job = snakemake.params.step  # trajsft.plan.step.Step, resolved once by rules/common.smk
    plan, target = job.plan, job.name
    cfg = plan.cfg
    logs.setup(snakemake.log[0] if snakemake.log else None, cfg.get("log_level", "INFO"))
    signals.install_stop_handler()
    signals.watch_snakemake(log_path=snakemake.log[0] if snakemake.log else None)
    started = time.time()
    art = job.artifact
    try:
        result = storage.build(plan, art, lambda: export(plan, target))
    except USER_ERRORS as e:
        msg = f"trajsft export {target}: {e}"
        log.error(msg)
        print(msg, file=sys.stderr)
        sys.exit(1)
    skipped = result["llamafactory"]["skipped_examples"]
    # every row the sharegpt export could not hold, next to the manifest (like the shard rule's)
    io.write_bytes(str(Path(snakemake.output[0]).parent / "skipped.jsonl"),
                        io.read_bytes(f"{art.location}/llamafactory/skipped.jsonl"))
    write_json(snakemake.output[0], {"kind": art.kind, "name": art.name, "hash": art.hash, "location": art.location,
                                     "hash_inputs": art.inputs, "seconds": round(time.time() - started, 3), **result})
    log.info("export %s done in %.1fs (%d llamafactory skip(s): %s)", target, time.time() - started,
             result["llamafactory"]["skipped_total"], [s["reason"] for s in skipped])
