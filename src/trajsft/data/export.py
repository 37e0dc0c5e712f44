"""Validated shards -> datasets other trainers load: LLaMA-Factory (sharegpt) and TRL/HF (messages).

Each export says how to train it, so that the other trainer sees exactly what trajsft trains on
(the official Qwen3 template's rendering of the full source conversation):

- ``messages/<teacher>/``: the shard chats unchanged (OpenAI format: ``reasoning_content``,
  ``tool_calls`` with ids, ``tool_call_id``, ``name``; object arguments as the text the template
  renders of them, :func:`messages_row`), plus ``messages/chat_template.jinja`` (the
  template trajsft trains with: Qwen3's official one with ``{% generation %}`` markers, which TRL's
  ``assistant_only_loss`` needs) and ``messages/sft_config.json`` (TRL ``SFTConfig`` arguments).
  With the teacher's tools (config ``tools:``) every row has a ``tools`` column: the tool list, which TRL passes to
  the template as trajsft's tokenize step does (the ``# Tools`` block trajsft trains with).
- ``llamafactory/``: sharegpt rows (with the teacher's tools, a ``tools`` column: the list as JSON text, mapped in
  ``dataset_info.json``), ``dataset_info.json`` and ``train_args.yaml`` (``template:
  qwen3_nothink``, ``dataset_dir``, ``dataset``, ``cutoff_len`` = the target's ``seq_len``, the
  mixture arguments). Every assistant value is written as Qwen3 renders that turn inside the full
  conversation: the think block only after the last user query, an empty one on the conversation's
  last turn, reasoning stripped of leading and trailing newlines. LLaMA-Factory's ``qwen3`` template would instead add an
  empty think block to every turn; ``qwen3_nothink`` adds nothing, so the values carry it.

Every sharegpt row is rendered with LLaMA-Factory 0.9.5's ``qwen3_nothink`` rules (:func:`lf_render`)
and compared with the official template's rendering of the full shard chat (:func:`qwen3_render`):
equal, or a prefix of it for a counted lossy reason, else the export fails (a bug here).
Counted *events* (the rendering is still exact):

- ``reasoning_in_think_block``, ``empty_think_block`` (the last turn's), ``reasoning_not_rendered``
  (reasoning before the last user query: Qwen3 does not render it, trajsft does not train on it;
  it is in the ``messages`` export), ``function_call_with_text``, ``parallel_tool_calls``,
  ``tool_replies_joined`` (consecutive tool replies as one observation, joined as Qwen3 renders
  them), ``tool_calls_as_text`` (a turn with a call whose arguments text is not what LLaMA-Factory's
  ``json.dumps`` writes, e.g. ``{"a":1}``: written verbatim in a ``gpt`` turn instead of a
  ``function_call`` one), ``tool_call_ids_dropped``, ``tool_reply_ids_dropped``,
  ``names_dropped:<role>`` (Qwen3 renders neither ids nor names);
- lossy (counted in ``lossy``, and per row in ``llamafactory/lossy.jsonl``):
  ``trailing_turns_dropped`` (sharegpt must end on an assistant turn; nothing after the last
  trained token changes a causal LM's loss), ``empty_system_prompt_dropped`` (LLaMA-Factory renders
  no block for an empty system prompt; Qwen3 renders an empty one; with tools the two agree),
  ``tools_block_blank_lines`` (a chat with tools and no system prompt: LLaMA-Factory's tool prompt starts with a
  blank line, ``<|im_start|>system\n\n\n# Tools``, where Qwen3 writes ``<|im_start|>system\n# Tools``: the prompt,
  not a trained token, differs);
- a chat sharegpt cannot hold at all is skipped with a reason (``SKIP_REASONS``), listed and
  counted; it is still in the ``messages`` export.

Beyond any value: LLaMA-Factory trains the ``\\n`` after each assistant ``<|im_end|>`` (its slot is
``{{content}}<|im_end|>\\n``) and truncates a chat longer than ``cutoff_len`` turn by turn where
trajsft keeps its first ``seq_len`` tokens. scripts/check_trainers.py measures both trainers
against trajsft's cache (docs/export.md).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache
from typing import Any

from ..plan.step_configs import ExportConfig
from ..plan.tools import names as tool_names

# dataset_info.json "tags" (LLaMA-Factory's sharegpt defaults, spelled out)
LF_TAGS = {
    "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
    "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
}
LF_COLUMNS = {"messages": "conversations", "system": "system"}
LF_TEMPLATE = "qwen3_nothink"  # LLaMA-Factory 0.9.5: Qwen3's slots, no think-block handling of its own
LF_VERSION = "0.9.5"
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"  # Qwen3's think block
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # LLaMA-Factory tool_call_words
REPLY_SEP = "\n</tool_response>\n<tool_response>\n"  # how Qwen3 renders consecutive tool replies
SKIP_REASONS = ("system_not_first", "assistant_before_user", "user_after_user", "assistant_after_assistant")
LOSSY = ("trailing_turns_dropped", "empty_system_prompt_dropped", "tools_block_blank_lines")
# LLaMA-Factory 0.9.5's QWEN_TOOL_PROMPT (llamafactory/data/tool_utils.py), appended to the system prompt: each tool
# written as "\n" + json.dumps(tool), as the official template's "\n" + tool | tojson
LF_TOOL_PROMPT = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
                  "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                  "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, "
                  "\"arguments\": <args-json-object>}}\n</tool_call>")
EMPTY_SYSTEM = "<|im_start|>system\n<|im_end|>\n"

# LLaMA-Factory 0.9.5's qwen3_nothink slots (llamafactory/data/template.py)
LF_SLOTS = {
    "system": "<|im_start|>system\n{{content}}<|im_end|>\n",
    "human": "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",
    "observation": "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    "gpt": "{{content}}<|im_end|>\n",
    "function_call": "{{content}}<|im_end|>\n",
}


class Unrepresentable(ValueError):
    """A chat the sharegpt format cannot hold; ``reason`` is the counted category."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def messages_row(rec: dict, tools: list[dict] | None = None) -> tuple[dict, int]:
    """A TRL / HF ``messages`` row: the shard record as it is, but for tool-call arguments given as a
    JSON object, written as the string the template's ``tojson`` renders of it (the same text, so
    the same tokens), and the count of those; with the teacher's ``tools``, a ``tools`` column holding them. One
    type per column: ``datasets`` up to 4.0 (the one LLaMA-Factory and TRL 0.24 install) cannot load a column that
    is a string in one row and an object in another."""
    n, msgs = 0, []
    for m in rec["messages"]:
        objects = sum(1 for c in m.get("tool_calls") or () if not isinstance(c["function"]["arguments"], str))
        if objects:
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": _args_text(c)}} for c in m["tool_calls"]]}
            n += objects
        msgs.append(m)
    return {**rec, "messages": msgs, **({"tools": tools} if tools else {})}, n


# ---- Qwen3's rendering of an assistant turn (the official template, in Python) -----------------
def last_query_index(msgs: list[dict]) -> int:
    """The official template's ``ns.last_query_index``: the last user turn that is not a wrapped tool reply."""
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if m["role"] == "user" and not (m["content"].startswith("<tool_response>") and m["content"].endswith("</tool_response>")):
            return i
    return len(msgs) - 1


def _args_text(call: dict) -> str:
    args = call["function"]["arguments"]
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def qwen3_call(call: dict) -> str:
    """One tool call as the official template renders it (arguments text verbatim)."""
    return '<tool_call>\n{"name": "' + call["function"]["name"] + '", "arguments": ' + _args_text(call) + "}\n</tool_call>"


def lf_call(name: str, arguments: Any) -> str:
    """One tool call as LLaMA-Factory 0.9.5 renders it (FunctionFormatter + QwenToolUtils: json.dumps twice)."""
    args = json.loads(json.dumps(arguments, ensure_ascii=False))
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def _call_object(call: dict) -> dict:
    args = call["function"]["arguments"]
    return {"name": call["function"]["name"], "arguments": json.loads(args) if isinstance(args, str) else args}


def _assistant_value(m: dict, i: int, last_query: int, is_last: bool, events: Counter) -> tuple[str, str]:
    """(tag, value) of assistant turn ``i``: the text Qwen3 renders between ``<|im_start|>assistant\\n``
    and ``<|im_end|>``, in the form LLaMA-Factory renders back to that exact text."""
    content, reasoning = m["content"], m.get("reasoning_content")
    if reasoning is None and "</think>" in content:  # the template's own split (no shard chat has it)
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    reasoning = reasoning or ""
    if i > last_query and (is_last or reasoning):
        head = THINK_OPEN + reasoning.strip("\n") + THINK_CLOSE + content.lstrip("\n")
        events["reasoning_in_think_block" if reasoning.strip("\n") else "empty_think_block"] += 1
    else:
        head = content
        if reasoning:
            events["reasoning_not_rendered"] += 1
    calls = m.get("tool_calls")
    if not calls:
        return LF_TAGS["assistant_tag"], head
    events["tool_call_ids_dropped"] += sum(1 for c in calls if "id" in c)
    if len(calls) > 1:
        events["parallel_tool_calls"] += 1
    text = head + ("\n" if content else "")  # Qwen3: "\n" before the first call only after content
    objs = [_call_object(c) for c in calls]
    if any(lf_call(o["name"], o["arguments"]) != qwen3_call(c) for o, c in zip(objs, calls)):
        events["tool_calls_as_text"] += 1
        return LF_TAGS["assistant_tag"], text + "\n".join(qwen3_call(c) for c in calls)
    payload = json.dumps(objs if len(objs) > 1 else objs[0], ensure_ascii=False)
    if not text:
        return LF_TAGS["function_tag"], payload  # the documented form: the call's JSON alone
    events["function_call_with_text"] += 1
    return LF_TAGS["function_tag"], text + CALL_OPEN + payload + CALL_CLOSE


def sharegpt_row(rec: dict, tools: list[dict] | None = None) -> tuple[dict, Counter]:
    """One shard record as a LLaMA-Factory sharegpt row, with its counted events; with the teacher's ``tools``, its
    ``tools`` column (the list as JSON text, as LLaMA-Factory reads it).

    Raises :class:`Unrepresentable` for a chat whose turn order sharegpt cannot hold
    (human/observation and gpt/function_call must alternate, starting with human).
    """
    events: Counter = Counter()
    full = rec["messages"]
    last_query = last_query_index(full)
    start = 0
    row: dict[str, Any] = {}
    if tools:
        row["tools"] = json.dumps(tools, ensure_ascii=False)
    if full and full[0]["role"] == "system":
        if full[0]["content"]:
            row["system"] = full[0]["content"]
        elif not tools:  # with tools both render "<|im_start|>system\n\n\n# Tools": nothing lost
            events["empty_system_prompt_dropped"] += 1
        start = 1
    elif tools:  # LLaMA-Factory's tool prompt opens with a blank line the official template does not write
        events["tools_block_blank_lines"] += 1
    last = max(i for i, m in enumerate(full) if m["role"] == "assistant")
    if last < len(full) - 1:
        events["trailing_turns_dropped"] += len(full) - 1 - last
    conv: list[dict] = []
    for i in range(start, last + 1):
        m = full[i]
        role = m["role"]
        if m.get("name") is not None:
            events[f"names_dropped:{role}"] += 1
        if role == "system":
            raise Unrepresentable("system_not_first", f"messages[{i - start}] is a system message after the first turn")
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
            tag, value = _assistant_value(m, i, last_query, i == len(full) - 1, events)
        user_side = tag in (LF_TAGS["user_tag"], LF_TAGS["observation_tag"])
        if user_side != (len(conv) % 2 == 0):
            if not conv:
                raise Unrepresentable("assistant_before_user",
                                      f"messages[{i - start}] is an assistant turn before any user turn")
            reason = "user_after_user" if user_side else "assistant_after_assistant"
            raise Unrepresentable(reason, f"messages[{i - start}] ({role}) follows a {conv[-1]['from']} turn")
        conv.append({"from": tag, "value": value})
    row["conversations"] = conv
    return row, events


# ---- the two renderings the export is checked against ----------------------------------------
def _slot(slot: str, **kwargs: str) -> str:
    """LLaMA-Factory's StringFormatter.apply on one string slot (each placeholder replaced once, in order)."""
    for name, value in kwargs.items():
        slot = slot.replace("{{" + name + "}}", value, 1)
    return slot


def _lf_function(value: str) -> str:
    """LLaMA-Factory 0.9.5's FunctionFormatter content (tool_format qwen) of a function_call value."""
    match = re.search(re.escape(CALL_OPEN) + "(.*?)" + re.escape(CALL_CLOSE), value, re.DOTALL)
    calls = json.loads(match.group(1) if match else value)
    text = "\n".join(lf_call(c["name"], c["arguments"]) for c in (calls if isinstance(calls, list) else [calls]))
    return (value.replace(match.group(0), "") if match else "") + text


def lf_render(row: dict) -> str:
    """The text LLaMA-Factory 0.9.5 (template qwen3_nothink, its qwen tool format) renders for a sharegpt row."""
    tools = json.loads(row["tools"]) if row.get("tools") else []
    tool_text = LF_TOOL_PROMPT.format(tool_text="".join(
        "\n" + json.dumps(t if t.get("type") == "function" else {"type": "function", "function": t}, ensure_ascii=False)
        for t in tools)) if tools else ""
    system = (row.get("system") or "") + tool_text
    out = _slot(LF_SLOTS["system"], content=system) if system else ""
    for i, t in enumerate(row["conversations"]):
        tag, value = t["from"], t["value"]
        if tag == LF_TAGS["user_tag"]:
            out += _slot(LF_SLOTS["human"], content=value, idx=str(i // 2))
        elif tag == LF_TAGS["function_tag"]:
            out += _slot(LF_SLOTS["function_call"], content=_lf_function(value))
        else:
            out += _slot(LF_SLOTS[tag], content=value)
    return out


@lru_cache(maxsize=1)
def _official():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from .template import load_template, strip_generation_tags

    return _compile_jinja_template(strip_generation_tags(load_template()))


def qwen3_render(messages: list[dict], tools: list[dict] | None = None) -> str:
    """The official Qwen3 template's text of a full chat (with the teacher's tools): what trajsft tokenizes and
    trains on."""
    return _official().render(messages=messages, tools=tools or None, add_generation_prompt=False)


def check_row(row: dict, events: Counter, messages: list[dict], tools: list[dict] | None = None) -> list[str]:
    """The row's lossy reasons ([] when LLaMA-Factory renders exactly what trajsft trains on);
    RuntimeError if it renders anything else than a counted loss explains."""
    got, want = lf_render(row), qwen3_render(messages, tools)
    if got == want:
        return []
    reasons = [k for k in LOSSY if events.get(k)]
    if "tools_block_blank_lines" in reasons:  # the two newlines LLaMA-Factory's tool prompt opens with
        got = got.replace("<|im_start|>system\n\n\n# Tools", "<|im_start|>system\n# Tools", 1)
    if "empty_system_prompt_dropped" in reasons and want.startswith(EMPTY_SYSTEM):
        want = want[len(EMPTY_SYSTEM):]
    if reasons and (got == want or ("trailing_turns_dropped" in reasons and want.startswith(got))):
        return reasons
    at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    raise RuntimeError(f"export: LLaMA-Factory would render this chat differently from trajsft at character {at}: "
                       f"{got[at:at + 40]!r} vs {want[at:at + 40]!r} (a bug in trajsft.data.export)")


def dataset_info(entries: dict[str, str], with_tools: set[str] = frozenset()) -> dict:
    """LLaMA-Factory's dataset_info.json: one sharegpt entry per dataset name -> file or dir (the names in
    ``with_tools`` map their ``tools`` column too)."""
    return {name: {"file_name": path, "formatting": "sharegpt",
                   "columns": {**LF_COLUMNS, **({"tools": "tools"} if name in with_tools else {})}, "tags": dict(LF_TAGS)}
            for name, path in entries.items()}


def _line(row: dict) -> str:
    """One jsonl line, keys sorted but for a ``tools`` list, written last in its own key order: the template's
    ``tojson`` keeps the order (a tool renders as trajsft trains it only with its keys as given)."""
    tools = row.get("tools")
    if not isinstance(tools, list):
        return json.dumps(row, ensure_ascii=False, sort_keys=True)
    rest = json.dumps({k: v for k, v in row.items() if k != "tools"}, ensure_ascii=False, sort_keys=True)
    return rest[:-1] + (", " if rest != "{}" else "") + '"tools": ' + json.dumps(tools, ensure_ascii=False) + "}"


def jsonl(rows: list[dict]) -> bytes:
    """Deterministic jsonl bytes (UTF-8, one object per line, sorted keys; a ``tools`` list as given)."""
    return "".join(_line(r) + "\n" for r in rows).encode()


# ---- the export step (rule `export`) ----------------------------------------------------
ROWS_PER_FILE = 2000
EXAMPLES = 20


def read_split(location: str, files: list[str]) -> list[dict]:
    import gzip

    from .. import io

    return [json.loads(line) for f in files for line in gzip.decompress(io.read_bytes(f"{location}/{f}")).splitlines()]


def shard_files(location: str) -> dict[str, list[str]]:
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


def convert_split(records: list[dict], tools: list[dict] | None = None
                  ) -> tuple[list[dict], Counter, list[dict], list[dict]]:
    """(sharegpt rows, events, skipped rows, lossy rows) of one split; every row is checked to render
    in LLaMA-Factory as trajsft trains its shard chat (with the teacher's ``tools``), less the counted losses
    (:func:`check_row`)."""
    rows, events, skipped, lossy = [], Counter(), [], []
    for rec in records:
        try:
            row, ev = sharegpt_row(rec, tools)
        except Unrepresentable as e:
            skipped.append({"traj_id": rec["traj_id"], "reason": e.reason, "detail": e.detail})
            continue
        try:
            reasons = check_row(row, ev, rec["messages"], tools)
        except RuntimeError as e:
            raise RuntimeError(f"traj_id {rec['traj_id']!r}: {e}") from None
        if reasons:
            lossy.append({"traj_id": rec["traj_id"], "reasons": reasons})
        rows.append(row)
        events.update(ev)
    return rows, events, skipped, lossy


def train_args(dataset_dir: str, datasets: list[str], eval_datasets: list[str], seq_len: int, model: dict | None,
               weights: dict[str, float]) -> dict:
    """LLaMA-Factory 0.9.5 training arguments (``llamafactory-cli train train_args.yaml``) that render
    the export as trajsft trains it; the user adds the model (when the student has no Hugging Face
    checkpoint) and the optimizer settings."""
    args: dict[str, Any] = {}
    if model:
        args["model_name_or_path"] = model["name_or_path"]
        if model.get("revision"):
            args["model_revision"] = model["revision"]
    args.update({"stage": "sft", "do_train": True, "template": LF_TEMPLATE, "dataset_dir": dataset_dir,
                 "dataset": ",".join(datasets), "cutoff_len": seq_len, "train_on_prompt": False, "mask_history": False})
    if eval_datasets:
        args["eval_dataset"] = ",".join(eval_datasets)
    if len(weights) > 1:
        args.update(mix_strategy="interleave_under", interleave_probs=",".join(f"{weights[t]:.6g}" for t in sorted(weights)))
    return args


def export(cfg: ExportConfig) -> dict:
    """Write ``messages/<teacher>/`` and ``llamafactory/`` under ``cfg.location``, each with
    the files that tell its trainer how to train it (TRL's template + SFTConfig, LLaMA-Factory's
    training arguments)."""
    import logging
    import shutil
    from pathlib import Path

    import yaml

    from .. import io
    from ..io import is_remote
    from .template import load_template

    log = logging.getLogger("trajsft")
    target, out = cfg.target, cfg.location
    if not is_remote(out) and Path(out).exists():
        shutil.rmtree(out)  # leftovers of a killed export of the same hash
    info: dict[str, str] = {}
    teachers, events, skipped, lossy_rows, lf_files, msg_files = {}, Counter(), [], [], {}, {}
    args_as_string, with_tools = 0, set()
    for teacher, shards_name in sorted(cfg.shards.items()):
        shards_location = cfg.shard_locations[teacher]
        files = shard_files(shards_location)
        tools = cfg.tools.get(teacher) or None
        entry = {"shards": shards_name, "weight": cfg.weights[teacher], "messages_rows": {}, "llamafactory_rows": {},
                 "llamafactory_rows_exact": {}, "skipped": {}, "tools": tool_names(tools)}
        for split, fnames in sorted(files.items()):
            recs = read_split(shards_location, fnames)
            msg_rows = [messages_row(r, tools) for r in recs]
            args_as_string += sum(n for _, n in msg_rows)
            msg_files[f"{teacher}/{split}"] = [f"messages/{teacher}/{f}" for f in
                                              _write_chunks(f"{out}/messages/{teacher}", split, [r for r, _ in msg_rows])]
            rows, ev, sk, lo = convert_split(recs, tools)
            lf_dir = f"{teacher}/{split}"
            lf_files[lf_dir] = [f"llamafactory/{lf_dir}/{f}" for f in _write_chunks(f"{out}/llamafactory/{lf_dir}", split, rows)]
            dataset = teacher if split == "train" else f"{teacher}_{split}"
            info[dataset] = lf_dir
            if tools:
                with_tools.add(dataset)
            entry["messages_rows"][split], entry["llamafactory_rows"][split] = len(recs), len(rows)
            entry["llamafactory_rows_exact"][split] = len(rows) - len(lo)
            for s in sk:
                entry["skipped"][s["reason"]] = entry["skipped"].get(s["reason"], 0) + 1
                skipped.append({"teacher": teacher, "split": split, **s})
            lossy_rows += [{"teacher": teacher, "split": split, **x} for x in lo]
            events.update(ev)
        teachers[teacher] = entry
    weights = {t: e["weight"] for t, e in teachers.items()}
    seq_len, model = cfg.seq_len, cfg.model
    lf_out = f"{out}/llamafactory"
    args = train_args(lf_out if is_remote(lf_out) else str(Path(lf_out).resolve()), sorted(weights),
                      [f"{t}_validation" for t in sorted(weights) if f"{t}_validation" in info], seq_len, model, weights)
    io.write_bytes(f"{lf_out}/dataset_info.json", json.dumps(dataset_info(info, with_tools), indent=2).encode())
    io.write_bytes(f"{lf_out}/train_args.yaml", yaml.safe_dump(args, sort_keys=False).encode())
    io.write_bytes(f"{lf_out}/skipped.jsonl", jsonl(skipped))
    io.write_bytes(f"{lf_out}/lossy.jsonl", jsonl(lossy_rows))
    msg_out = f"{out}/messages"
    tpl = f"{msg_out}/chat_template.jinja"
    sft = {"chat_template_path": tpl if is_remote(tpl) else str(Path(tpl).resolve()), "assistant_only_loss": True,
           "max_length": seq_len}
    io.write_bytes(tpl, load_template().encode())
    io.write_bytes(f"{msg_out}/sft_config.json", json.dumps(sft, indent=2).encode())
    lossy = {k: v for k, v in sorted(events.items()) if k in LOSSY}
    for k, v in lossy.items():
        log.warning("%s: llamafactory export: %d x %s", target, v, k)
    for s in skipped[:EXAMPLES]:
        log.warning("%s: llamafactory export skips %s (%s): %s", target, s["traj_id"], s["reason"], s["detail"])
    n_rows = sum(sum(e["llamafactory_rows"].values()) for e in teachers.values())
    result = {
        "target": target,
        "teachers": teachers,
        "messages": {"dir": msg_out, "files": msg_files, "arguments_objects_as_string": args_as_string,
                     "rows": sum(sum(e["messages_rows"].values()) for e in teachers.values())},
        # TRL: SFTConfig(**sft_config) renders each messages row with trajsft's own template
        "trl": {"chat_template": "messages/chat_template.jinja", "sft_config_file": "messages/sft_config.json",
                "sft_config": sft},
        "llamafactory": {
            "version": LF_VERSION, "dir": lf_out, "dataset_info": "dataset_info.json", "datasets": sorted(info),
            "train_args_file": "llamafactory/train_args.yaml", "train_args": args,
            "files": lf_files, "rows": n_rows, "rows_exact": n_rows - len(lossy_rows),
            "rows_lossy": dict(sorted(Counter(r for x in lossy_rows for r in x["reasons"]).items())),
            "lossy_list": "llamafactory/lossy.jsonl",
            "skipped": dict(sorted(Counter(s["reason"] for s in skipped).items())), "skipped_total": len(skipped),
            "skipped_examples": skipped[:EXAMPLES], "skipped_list": "llamafactory/skipped.jsonl",
            "lossy": lossy, "events": {k: v for k, v in sorted(events.items()) if k not in lossy},
        },
        # the target's weights, as sampling probabilities of the other trainers' interleaving
        "mix": None if len(weights) == 1 else {
            "weights": weights,
            "llamafactory_args": {k: args[k] for k in ("dataset", "mix_strategy", "interleave_probs")},
        },
    }
    io.write_bytes(f"{out}/manifest.json", json.dumps(result, indent=2).encode())
    return result
