"""The project chat template: render parity with the official Qwen3 template + assistant masks.

(a) With the ``{% generation %}`` markers ignored, ``trajsft``'s template must render
    byte-identically to the official Qwen3 template (tests/data copy) for every conversation.
(b) With ``return_assistant_tokens_mask=True`` the masked tokens must be exactly what the
    assistant generates in each turn (content / think block / tool calls + ``<|im_end|>``),
    never the ``<|im_start|>assistant\\n`` header and never system/user/tool text.
(c) The template file itself: generation tags present and well-formed, stripped text equal
    to the official template outside the assistant branch, helpers consistent.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import jinja2.ext
import pyarrow.parquet as pq
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trajsft.data.template import TEMPLATE_PATH, load_template, strip_generation_tags, template_sha256

REPO = Path(__file__).resolve().parents[1]
OFFICIAL_PATH = REPO / "tests" / "data" / "qwen3_chat_template.official.jinja"
OFFICIAL_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"
DEMO_TOKENIZER = REPO / "demo" / "tokenizer"
DEMO_DATASET = REPO / "demo" / "dataset"

OFFICIAL = OFFICIAL_PATH.read_text(encoding="utf-8")
OURS = load_template()


# --------------------------------------------------------------------------------------
# Conversations
# --------------------------------------------------------------------------------------

def _call(name: str, arguments, call_id: str = "call_0", *, wrap: bool = True) -> dict:
    fn = {"name": name, "arguments": arguments}
    if not wrap:
        return fn
    return {"id": call_id, "type": "function", "function": fn}


def _bash(cmd: str, call_id: str = "call_0") -> dict:
    return _call("bash", json.dumps({"command": cmd}), call_id)


def _tool(content: str, call_id: str = "call_0") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": "bash", "content": content}


SYS = {"role": "system", "content": "You are a helpful assistant that can run shell commands."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command & return <stdout>.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command"}},
                "required": ["command"],
            },
        },
    }
]

CHATS: dict[str, tuple[list[dict], dict]] = {
    "user_only_gen_prompt": ([{"role": "user", "content": "Hi there"}], {"add_generation_prompt": True}),
    "user_only_no_thinking": (
        [SYS, {"role": "user", "content": "Hi"}],
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
    "single_turn": ([SYS, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}], {}),
    "no_system": ([{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}], {}),
    "multi_turn_plain": (
        [
            SYS,
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7 is prime."},
            {"role": "user", "content": "Another one?"},
            {"role": "assistant", "content": "11."},
            {"role": "user", "content": "Thanks"},
        ],
        {"add_generation_prompt": True},
    ),
    "multi_turn_think_in_content": (
        [
            SYS,
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\nold reasoning, dropped\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "<think>\n\nnew reasoning\n\n</think>\n\n\nA2"},
        ],
        {},
    ),
    "reasoning_content_field": (
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "dropped: before last query"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2", "reasoning_content": "\nkept\n"},
        ],
        {},
    ),
    "reasoning_content_none_falls_back_to_content": (
        [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "<think>inline</think>answer", "reasoning_content": None},
        ],
        {},
    ),
    "empty_assistant_content": ([{"role": "user", "content": "?"}, {"role": "assistant", "content": ""}], {}),
    "tool_calls_string_args": (
        [
            SYS,
            {"role": "user", "content": "List files"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [_bash("ls -la")]},
            _tool("<returncode>0</returncode>\n<output>\nCargo.toml\nsrc\n</output>"),
            {"role": "assistant", "content": "There are two entries."},
        ],
        {},
    ),
    "tool_calls_empty_content": (
        [
            SYS,
            {"role": "user", "content": "Run tests"},
            {"role": "assistant", "content": "", "tool_calls": [_bash("cargo test 2>&1 | tail -n 5")]},
            _tool("test result: ok. 3 passed"),
            {"role": "assistant", "content": "All tests pass."},
        ],
        {},
    ),
    "tool_calls_dict_args_and_flat_call": (
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "Zürich", "unit": "C"})]},
            _tool('{"temp": 3}'),
            {"role": "assistant", "content": "again", "tool_calls": [_call("get_weather", '{"city": "Bern"}', wrap=False)]},
            _tool('{"temp": 4}'),
            {"role": "assistant", "content": "3°C in Zürich, 4°C in Bern."},
        ],
        {},
    ),
    "parallel_calls_consecutive_tool_responses": (
        [
            SYS,
            {"role": "user", "content": "Inspect the repo"},
            {
                "role": "assistant",
                "content": "Two commands at once.",
                "tool_calls": [_bash("ls", "call_a"), _bash("cat Cargo.toml | head -3", "call_b"), _bash("pwd", "call_c")],
            },
            _tool("src\ntests", "call_a"),
            _tool('[package]\nname = "demo"', "call_b"),
            _tool("/testbed", "call_c"),
            {"role": "assistant", "content": "Done."},
        ],
        {},
    ),
    "agentic_reasoning_every_step": (
        [
            SYS,
            {"role": "user", "content": "Fix the bug in src/lib.rs"},
            {"role": "assistant", "content": "Viewing.", "reasoning_content": "find it", "tool_calls": [_bash("nl -ba src/lib.rs")]},
            _tool("     1\tfn f() -> bool { 1 > 2 }"),
            {"role": "assistant", "content": "", "tool_calls": [_bash("sed -i 's/>/</' src/lib.rs")]},
            _tool(""),
            {"role": "assistant", "content": "Testing.", "reasoning_content": "run tests", "tool_calls": [_bash("cargo test")]},
            _tool("ok"),
            {"role": "assistant", "content": "Fixed."},
        ],
        {},
    ),
    "agentic_think_inline_then_gen_prompt": (
        [
            SYS,
            {"role": "user", "content": "Fix it"},
            {"role": "assistant", "content": "<think>\nplan\n</think>\n\nLooking.", "tool_calls": [_bash("ls")]},
            _tool("a.rs"),
        ],
        {"add_generation_prompt": True},
    ),
    "user_tool_response_not_a_query": (
        [
            {"role": "user", "content": "real query"},
            {"role": "assistant", "content": "<think>r1</think>call", "tool_calls": [_bash("ls")]},
            {"role": "user", "content": "<tool_response>\nfake user tool output\n</tool_response>"},
            {"role": "assistant", "content": "<think>r2</think>final"},
        ],
        {},
    ),
    "system_not_first": (
        [
            {"role": "user", "content": "hello"},
            {"role": "system", "content": "late system message"},
            {"role": "assistant", "content": "hi"},
        ],
        {},
    ),
    "tools_with_system": (
        [SYS, {"role": "user", "content": "ls please"}, {"role": "assistant", "content": "", "tool_calls": [_bash("ls")]}, _tool("x")],
        {"tools": TOOLS, "add_generation_prompt": True},
    ),
    "tools_without_system": (
        [{"role": "user", "content": "ls please"}, {"role": "assistant", "content": "ok"}],
        {"tools": TOOLS},
    ),
    "whitespace_content_intermediate": (
        [
            {"role": "user", "content": "Go"},
            {"role": "assistant", "content": "  \nLet me look.  \n", "tool_calls": [_bash("ls")]},
            _tool("  spaced output  \n"),
            {"role": "assistant", "content": "\n\nDone\n"},
        ],
        {},
    ),
    "whitespace_content_before_last_query": (
        [
            {"role": "user", "content": " Q1 "},
            {"role": "assistant", "content": " A1 \n"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "\tA2"},
        ],
        {},
    ),
    "tool_first_message": ([_tool("orphan output"), {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], {}),
    "unicode_and_special_chars": (
        [
            {"role": "user", "content": "Ünïcödé → {{ not jinja }} {% raw %} \\n"},
            {"role": "assistant", "content": "Émoji 🦀 and `code` <b>html</b> & \"quotes\""},
        ],
        {},
    ),
}

# Conversations on which the official template raises; ours must raise too.
FAILING_CHATS: dict[str, list[dict]] = {
    "assistant_content_none": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [_bash("ls")]}],
    "assistant_content_list": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}],
    "assistant_content_missing_with_reasoning": [{"role": "user", "content": "q"}, {"role": "assistant", "reasoning_content": "r"}],
}


def _demo_rows() -> list[dict]:
    rows: list[dict] = []
    for f in sorted((DEMO_DATASET / "data").glob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


def _demo_chats() -> dict[str, list[dict]]:
    """Every valid demo row (exit messages dropped), keyed by traj_id."""
    expected = json.loads((DEMO_DATASET / "EXPECTED.json").read_text())
    bad = {m["row"] for m in expected["malformed"]}
    out = {}
    for i, row in enumerate(_demo_rows()):
        if i in bad:
            continue
        msgs = [m for m in json.loads(row["messages"]) if m["role"] != "exit"]
        out[row["traj_id"]] = msgs
    return out


DEMO_CHATS = _demo_chats()


def _all_cases() -> list[tuple[str, list[dict], dict]]:
    cases = [(k, m, kw) for k, (m, kw) in CHATS.items()]
    cases += [(f"demo:{k}", m, {}) for k, m in DEMO_CHATS.items()]
    return cases


ALL_CASES = _all_cases()
CASE_IDS = [c[0] for c in ALL_CASES]


# --------------------------------------------------------------------------------------
# Rendering helpers
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER))


def _plain_env() -> jinja2.Environment:
    """A Jinja environment configured like transformers', without the generation extension."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return env


PLAIN_ENV = _plain_env()


def _hf_render(tok, template: str, msgs: list[dict], kw: dict) -> str:
    kw = dict(kw)
    tools = kw.pop("tools", None)
    return tok.apply_chat_template(copy.deepcopy(msgs), tools=tools, tokenize=False, chat_template=template, **kw)


def _render_with_indices(tok, msgs: list[dict], kw: dict) -> tuple[str, list[tuple[int, int]]]:
    """Render like apply_chat_template(..., return_assistant_tokens_mask=True) does."""
    from transformers.utils.chat_template_utils import render_jinja_template

    kw = dict(kw)
    tools = kw.pop("tools", None)
    rendered, indices = render_jinja_template(
        conversations=[copy.deepcopy(msgs)],
        tools=tools,
        chat_template=OURS,
        return_assistant_tokens_mask=True,
        **{**tok.special_tokens_map, **kw},
    )
    return rendered[0], [tuple(x) for x in indices[0]]


def _generated_segments(official_text: str) -> list[str]:
    """From the OFFICIAL rendering: what the assistant generated in each completed turn.

    Each assistant block is ``<|im_start|>assistant\\n`` + generated text + ``<|im_end|>``;
    the generated segment is everything after the header up to and including ``<|im_end|>``.
    (A trailing generation prompt has no ``<|im_end|>`` and is not a generated segment.)
    """
    segs = []
    for block in official_text.split("<|im_start|>")[1:]:
        if block.startswith("assistant\n") and "<|im_end|>" in block:
            body = block[len("assistant\n"):]
            segs.append(body[: body.index("<|im_end|>") + len("<|im_end|>")])
    return segs


# --------------------------------------------------------------------------------------
# (a) byte-identical rendering
# --------------------------------------------------------------------------------------

def test_official_copy_is_pinned():
    assert hashlib.sha256(OFFICIAL_PATH.read_bytes()).hexdigest() == OFFICIAL_SHA256


def test_case_coverage():
    """The parity cases really cover the template's branches."""
    assert len(ALL_CASES) >= 60
    assert len(DEMO_CHATS) == json.loads((DEMO_DATASET / "EXPECTED.json").read_text())["expected_valid"]
    official = {name: _render_plain(OFFICIAL, msgs, kw) for name, msgs, kw in ALL_CASES}
    joined = "".join(official.values())
    for needle in ("<tools>", "<tool_call>", "<tool_response>", "<think>\n\n</think>", "<|im_start|>system\nlate"):
        assert needle in joined, needle
    # a think block with real reasoning, and one that was dropped (before the last query)
    assert "<think>\nkept\n</think>\n\nA2" in official["reasoning_content_field"]
    assert "dropped" not in official["reasoning_content_field"]
    assert "old reasoning" not in official["multi_turn_think_in_content"]
    assert "<think>\nnew reasoning\n</think>\n\nA2" in official["multi_turn_think_in_content"]


def _render_plain(template: str, msgs: list[dict], kw: dict) -> str:
    kw = dict(kw)
    return PLAIN_ENV.from_string(template).render(messages=copy.deepcopy(msgs), tools=kw.pop("tools", None), **kw)


@pytest.mark.parametrize(("name", "msgs", "kw"), ALL_CASES, ids=CASE_IDS)
def test_render_identical_to_official(tok, name, msgs, kw):
    official = _hf_render(tok, OFFICIAL, msgs, kw)
    assert official  # sanity
    # transformers environment, generation tags as no-ops
    assert _hf_render(tok, OURS, msgs, kw) == official
    # the tokenizer's own (default) chat template is ours
    kw2 = dict(kw)
    tools = kw2.pop("tools", None)
    assert tok.apply_chat_template(copy.deepcopy(msgs), tools=tools, tokenize=False, **kw2) == official
    # stripped template in a plain Jinja environment (no generation extension)
    assert _render_plain(strip_generation_tags(OURS), msgs, kw) == official
    assert _render_plain(OFFICIAL, msgs, kw) == official
    # with the assistant tracker active (the mask code path) the text is the same too
    text, _ = _render_with_indices(tok, msgs, kw)
    assert text == official


@pytest.mark.parametrize("name", sorted(FAILING_CHATS))
def test_errors_match_official(tok, name):
    msgs = FAILING_CHATS[name]
    with pytest.raises(Exception):
        _hf_render(tok, OFFICIAL, msgs, {})
    with pytest.raises(Exception):
        _hf_render(tok, OURS, msgs, {})
    with pytest.raises(Exception):
        _render_plain(strip_generation_tags(OURS), msgs, {})


# --------------------------------------------------------------------------------------
# (b) assistant masks
# --------------------------------------------------------------------------------------

MASK_CASES = [c for c in ALL_CASES if any(m.get("role") == "assistant" for m in c[1])]


@pytest.mark.parametrize(("name", "msgs", "kw"), MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_generation_spans_are_assistant_output(tok, name, msgs, kw):
    """Character spans recorded by the generation block == assistant output of the official render."""
    official = _hf_render(tok, OFFICIAL, msgs, kw)
    text, spans = _render_with_indices(tok, msgs, kw)
    assert text == official
    expected = _generated_segments(official)
    assert expected, "case has completed assistant turns"
    assert [text[s:e] for s, e in spans] == expected
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))  # ordered, disjoint
    for s, e in spans:
        assert text[:s].endswith("<|im_start|>assistant\n")  # the header is outside
        assert text[s:e].endswith("<|im_end|>")
        assert text[e:e + 1] in ("\n", "")  # the newline after <|im_end|> is outside
        assert "<|im_start|>" not in text[s:e] and "<tool_response>" not in text[s:e]


def _runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    prev = 0
    for i, m in zip(ids, mask):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(i)
        prev = m
    return runs


@pytest.mark.parametrize(("name", "msgs", "kw"), MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_assistant_token_masks(tok, name, msgs, kw):
    kw = dict(kw)
    tools = kw.pop("tools", None)
    out = tok.apply_chat_template(
        copy.deepcopy(msgs), tools=tools, tokenize=True, return_assistant_tokens_mask=True, return_dict=True, **kw
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    assert sum(mask) > 0

    official = _hf_render(tok, OFFICIAL, msgs, {**kw, "tools": tools})
    expected = _generated_segments(official)
    assert tok.decode(ids) == official  # lossless, so decoding token runs is exact

    runs = _runs(ids, mask)
    # masked tokens == exactly the generated text of each assistant turn, turn by turn
    decoded = [tok.decode(r) for r in runs]
    assert len(decoded) == len(expected)
    for got, want in zip(decoded, expected):
        if want[:1].isspace():
            # Byte-level BPE (like Qwen's) merges the header's "\n" with leading whitespace
            # of the content into one token; transformers masks that whole token.
            assert got in (want, "\n" + want)
        else:
            assert got == want
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(r[-1] == im_end for r in runs)

    # nothing from system/user/tool turns (or any header) is masked in
    unmasked = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert unmasked.count("<|im_start|>") == official.count("<|im_start|>")
    assert unmasked.count("<tool_response>") == official.count("<tool_response>")
    for m in msgs:
        if m["role"] in ("system", "user", "tool") and m["content"]:
            assert m["content"] in unmasked, m["role"]


def test_mask_excludes_headers_and_tool_responses(tok):
    msgs, _ = CHATS["parallel_calls_consecutive_tool_responses"]
    out = tok.apply_chat_template(msgs, tokenize=True, return_assistant_tokens_mask=True, return_dict=True)
    masked = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    assert masked == (
        "Two commands at once.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "cat Cargo.toml | head -3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call><|im_end|>'
        "<think>\n\n</think>\n\nDone.<|im_end|>"
    )
    for forbidden in ("<tool_response>", "<|im_start|>", "You are a helpful", "Inspect the repo", "/testbed"):
        assert forbidden not in masked


def test_mask_with_generation_prompt_has_no_open_span(tok):
    msgs, kw = CHATS["agentic_think_inline_then_gen_prompt"]
    out = tok.apply_chat_template(msgs, tokenize=True, return_assistant_tokens_mask=True, return_dict=True, **kw)
    ids, mask = out["input_ids"], out["assistant_masks"]
    # the trailing "<|im_start|>assistant\n" generation prompt is not masked
    tail = tok.decode(ids[-3:])
    assert tail.endswith("<|im_start|>assistant\n")
    assert mask[-1] == 0
    masked = tok.decode([i for i, m in zip(ids, mask) if m])
    # the tool response is not a new query, so the turn's inline think block is rendered
    assert masked == '<think>\nplan\n</think>\n\nLooking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'


# --------------------------------------------------------------------------------------
# (c) the template file and helpers
# --------------------------------------------------------------------------------------

TAG_RE = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")


def test_template_has_one_generation_block():
    tags = [m.group(0) for m in TAG_RE.finditer(OURS)]
    assert tags == ["{%- generation %}", "{%- endgeneration %}"]
    start, end = OURS.index("{%- generation %}"), OURS.index("{%- endgeneration %}")
    block = OURS[start:end]
    # the block opens right after the assistant header and closes right after <|im_end|>
    assert OURS[:start].rstrip().endswith("{{- '<|im_start|>' + message.role + '\\n' }}")
    assert block.rstrip().endswith("{{- '<|im_end|>' }}")
    assert "tool_call" in block and "<think>" in block
    assert "<|im_start|>" not in block


def test_stripped_template_differs_from_official_only_in_assistant_emission():
    stripped = strip_generation_tags(OURS)
    assert not TAG_RE.search(stripped)

    def split(t: str) -> tuple[str, str, str]:
        a = t.index('{%- elif message.role == "assistant" %}')
        b = t.index('{%- elif message.role == "tool" %}')
        return t[:a], t[a:b], t[b:]

    s_pre, s_mid, s_post = split(stripped)
    o_pre, o_mid, o_post = split(OFFICIAL)
    assert s_pre == o_pre and s_post == o_post
    # Inside the assistant branch, the only edits: the header is emitted on its own, the
    # three content emissions lose the header prefix, and '<|im_end|>\n' is split in two.
    removed, added = [], []
    for line in difflib.ndiff(o_mid.splitlines(), s_mid.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:].strip())
        elif line.startswith("+ "):
            added.append(line[2:].strip())
    assert sorted(removed) == sorted([
        "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}",
        "{{- '<|im_start|>' + message.role + '\\n' + content }}",
        "{{- '<|im_start|>' + message.role + '\\n' + content }}",
        "{{- '<|im_end|>\\n' }}",
    ])
    assert sorted(added) == sorted([
        "{{- '<|im_start|>' + message.role + '\\n' }}",
        "{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}",
        "{{- '' + content }}",
        "{{- '' + content }}",
        "{{- '<|im_end|>' }}",
        "{{- '\\n' }}",
    ])


def test_template_helpers():
    assert TEMPLATE_PATH.is_file()
    assert TEMPLATE_PATH.read_text(encoding="utf-8") == load_template()
    assert template_sha256() == hashlib.sha256(TEMPLATE_PATH.read_bytes()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", template_sha256())
    # strip_generation_tags: standalone tag lines vanish entirely, inline tags are removed
    text = "a\n    {%- generation %}\nb{% generation -%}c{%endgeneration%}\n  {% endgeneration %}\nd"
    assert strip_generation_tags(text) == "a\nbc\nd"
    assert strip_generation_tags(OFFICIAL) == OFFICIAL


def test_demo_tokenizer_matches_template(tok):
    assert tok.chat_template == OURS
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.bos_token is None
    assert 1000 <= len(tok) <= 2100
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
              "<tool_response>", "</tool_response>", "<think>", "</think>"):
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids) == t, t
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)


# --------------------------------------------------------------------------------------
# Demo assets (scripts/make_demo_assets.py): layout, ground truth, reproducibility
# --------------------------------------------------------------------------------------

KNOWN_ROLES = {"system", "user", "assistant", "tool", "exit"}


def _row_defects(raw: str) -> set[str]:
    """Independent re-check of the defects EXPECTED.json claims (per row, no duplicates)."""
    try:
        msgs = json.loads(raw)
    except json.JSONDecodeError:
        return {"invalid_json"}
    found = set()
    if any(m.get("role") not in KNOWN_ROLES for m in msgs):
        found.add("unknown_role")
    if any(not isinstance(m.get("content"), str) for m in msgs):
        found.add("non_string_content")
    for m in msgs:
        for call in m.get("tool_calls") or []:
            try:
                json.loads(call["function"]["arguments"])
            except json.JSONDecodeError:
                found.add("invalid_tool_call_arguments")
    kept = [m for m in msgs if m.get("role") != "exit"]
    if not any(m.get("role") == "assistant" for m in kept):
        found.add("no_assistant_turn")
    elif kept[-1].get("role") == "user":
        found.add("ends_with_user_turn")
    return found


def test_demo_dataset_layout_and_expected():
    expected = json.loads((DEMO_DATASET / "EXPECTED.json").read_text())
    files = sorted(p.relative_to(DEMO_DATASET).as_posix() for p in (DEMO_DATASET / "data").iterdir())
    assert files == ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    card = (DEMO_DATASET / "README.md").read_text()
    front = card.split("---\n")[1]
    assert "- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n" in front
    for f in files:
        t = pq.read_table(DEMO_DATASET / f)
        assert t.schema.names == ["messages", "instance_id", "resolved", "model", "traj_id", "patch"]
        assert [str(x) for x in t.schema.types] == ["string", "string", "bool", "string", "string", "string"]
        assert t.num_rows == expected["rows_per_shard"][f]
    rows = _demo_rows()
    assert len(rows) == expected["total_rows"] == 60
    assert any(not r["resolved"] for r in rows) and any(r["resolved"] for r in rows)
    assert all(r["patch"].startswith("diff --git a/") and r["traj_id"].startswith(r["instance_id"] + ".") for r in rows)
    assert all(re.fullmatch(r"[\w-]+__[\w-]+\.[0-9a-f]{8}\.\w+__[0-9a-z]{8}", r["instance_id"]) for r in rows)

    by_row = {m["row"]: m for m in expected["malformed"]}
    seen: set[str] = set()
    for i, row in enumerate(rows):
        found = _row_defects(row["messages"])
        if row["traj_id"] in seen:
            found.add("duplicate_traj_id")
        seen.add(row["traj_id"])
        if i in by_row:
            want = by_row[i]["defect"]
            assert by_row[i]["traj_id"] == row["traj_id"]
            assert found == {want}, (i, found)
        else:
            assert not found, (i, found)
    assert {m["defect"] for m in expected["malformed"]} == {
        "invalid_json", "unknown_role", "no_assistant_turn", "invalid_tool_call_arguments",
        "non_string_content", "duplicate_traj_id", "ends_with_user_turn",
    }
    assert expected["expected_valid"] == len(rows) - len(by_row) == len(DEMO_CHATS)
    # the valid edge cases are present
    edge = expected["valid_edge_cases"]
    assert edge["empty_assistant_content_with_tool_calls"] and edge["trailing_exit_message"]
    for traj_id in edge["empty_assistant_content_with_tool_calls"]:
        assert any(m["role"] == "assistant" and m["content"] == "" and m.get("tool_calls") for m in DEMO_CHATS[traj_id])
    lengths = [len(s) for s in DEMO_CHATS.values()]
    assert min(lengths) == 3 and max(lengths) >= 20


def test_demo_rows_length_spread(tok):
    """Most demo rows fit 1024 tokens; some (long tool outputs) do not."""
    n_tokens = [len(tok.apply_chat_template(m, tokenize=True)) for m in DEMO_CHATS.values()]
    assert sum(n > 1024 for n in n_tokens) >= 5
    assert sum(n <= 1024 for n in n_tokens) >= len(n_tokens) // 2


def test_demo_assets_are_reproducible(tmp_path):
    """Re-running the generator reproduces the committed demo assets byte for byte."""
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_demo_assets.py"), "--out", str(tmp_path)],
        check=True, capture_output=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )

    def listing(root: Path) -> list[Path]:
        return sorted(p.relative_to(root) for d in ("dataset", "tokenizer") for p in (root / d).rglob("*") if p.is_file())

    committed = listing(REPO / "demo")
    assert listing(tmp_path) == committed
    for rel in committed:
        assert (tmp_path / rel).read_bytes() == (REPO / "demo" / rel).read_bytes(), rel
    assert sum((REPO / "demo" / rel).stat().st_size for rel in committed) < 2_000_000
