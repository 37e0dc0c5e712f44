import gzip
import json

import pytest

from trajsft.data import transform as T

SYS = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Fix the bug."}


def call(i, name="bash", args='{"command": "ls"}'):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def asst(content="", calls=None):
    m = {"role": "assistant", "content": content}
    if calls is not None:
        m["tool_calls"] = calls
    return m


def tool(i, out="ok", name="bash"):
    return {"role": "tool", "content": out, "tool_call_id": f"call_{i}", "name": name}


GOOD = [SYS, USER, asst("", [call(1)]), tool(1, "src/"), asst("Done.")]


def rows(*items):
    return [(T.Source("data/train-00000-of-00001.parquet", i), r) for i, r in enumerate(items)]


def row(messages, traj_id="t1", resolved=True, **kw):
    return {"messages": json.dumps(messages) if not isinstance(messages, str) else messages,
            "traj_id": traj_id, "instance_id": "x__y.1", "resolved": resolved, "model": "m", **kw}


def test_tool_calls_tool_call_id_and_name_preserved():
    msgs, _ = T.normalize_messages(json.dumps(GOOD))
    assert msgs[2]["tool_calls"] == [call(1)]
    assert msgs[3] == {"role": "tool", "content": "src/", "tool_call_id": "call_1", "name": "bash"}
    assert msgs[2]["content"] == ""  # empty content alongside tool calls is valid


def test_turns_after_the_last_assistant_turn_are_kept():
    """Removing them would make Qwen3's template render the last assistant turn with an
    empty think block (it is then the last message), which the teacher never produced."""
    trailing = [asst("", [call(2)]), tool(2, "submitted"), {"role": "user", "content": "thanks"}]
    msgs, ev = T.normalize_messages(GOOD + trailing)
    assert msgs == GOOD + trailing
    assert not ev


def test_drop_roles():
    msgs, ev = T.normalize_messages(GOOD + [{"role": "exit", "content": "submitted"}], drop_roles=["exit"])
    assert [m["role"] for m in msgs] == [m["role"] for m in GOOD]
    assert ev["dropped_role:exit"] == 1


@pytest.mark.parametrize(
    "messages,reason",
    [
        ("{not json", "invalid_json"),
        ('{"role": "user"}', "not_a_message_list"),
        ([SYS, USER, {"role": "narrator", "content": "x"}, asst("a")], "unknown_role"),
        ([SYS, USER], "no_assistant_turn"),
        ([SYS, USER, asst(42)], "non_string_content"),
        ([SYS, USER, {"role": "user", "content": {"a": 1}}, asst("a")], "non_string_content"),
        ([SYS, USER, asst("", [call(1, args="{bad")]), tool(1), asst("x")], "invalid_tool_arguments"),
        ([SYS, USER, asst("", [{"type": "function", "function": {}}])], "bad_tool_calls"),
        ([SYS, asst("hi")], "no_user_turn"),
    ],
)
def test_bad_messages(messages, reason):
    raw = messages if isinstance(messages, str) else json.dumps(messages)
    with pytest.raises(T.BadRow) as e:
        T.normalize_messages(raw)
    assert e.value.reason == reason


def test_text_part_lists_are_joined():
    msgs, _ = T.normalize_messages([SYS, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, asst("c")])
    assert msgs[1]["content"] == "ab"


def test_transform_counts_every_row_and_dedups():
    res = T.transform_rows(
        rows(row(GOOD, "a"), row(GOOD, "a"), row("{oops", "b"), row(GOOD, "c", resolved=False), {"messages": json.dumps(GOOD)}),
        "demo", {"drop_roles": ["exit"], "dedup_traj_id": True},
    )
    assert res.rows_in == 5
    assert len(res.records["train"]) == 2
    assert res.skipped == {"duplicate_traj_id": 1, "invalid_json": 1, "missing_traj_id": 1}
    assert sum(res.skipped.values()) + len(res.records["train"]) == res.rows_in
    assert len(res.skipped_rows) == 3
    ex = res.skipped_examples[0]
    assert ex["file"].endswith(".parquet") and ex["row"] == 1 and ex["reason"] == "duplicate_traj_id"


def test_resolved_only_filter():
    res = T.transform_rows(rows(row(GOOD, "a"), row(GOOD, "b", resolved=False)), "d", {"resolved_only": True})
    assert [r["traj_id"] for r in res.records["train"]] == ["a"]
    assert res.skipped == {"unresolved": 1}


def test_strict_error_is_one_line_naming_file_row_field_and_counting_all_bad_rows():
    res = T.transform_rows(rows(row(GOOD, "a"), row("{oops", "b"), row([SYS, USER], "c")), "d", {"strict": True})
    msg = res.strict_error()
    assert "\n" not in msg
    assert msg.startswith("data/train-00000-of-00001.parquet row 1 (traj_id='b'): field messages: ")
    assert msg.endswith("(and 1 more bad row(s))")
    assert [r["row"] for r in res.skipped_rows] == [1, 2]
    assert T.transform_rows(rows(row(GOOD, "a")), "d", {"strict": True}).strict_error() is None


def test_repairs_are_counted():
    src = [SYS, {"role": "user", "content": [{"type": "text", "text": "a"}]}, asst(None, [dict(call(1), id=5)]),
           {"role": "tool", "content": "x", "tool_call_id": 5}, asst("ok", [])]
    msgs, ev = T.normalize_messages(src)
    assert ev == {"joined_text_parts": 1, "null_content": 1, "id_to_string": 2, "empty_tool_calls_dropped": 1}
    assert msgs[2]["tool_calls"][0]["id"] == "5" and msgs[3]["tool_call_id"] == "5"
    assert "tool_calls" not in msgs[4]


def test_think_block_becomes_reasoning_as_the_template_reads_it():
    msgs, ev = T.normalize_messages([USER, asst("\n<think>\n\nplan\n\n</think>\n\n\nanswer")])
    assert msgs[1] == {"role": "assistant", "content": "answer", "reasoning_content": "plan"}
    assert ev == {"reasoning_from:think_tags": 1}


def test_legacy_function_call_becomes_tool_calls():
    msgs, ev = T.normalize_messages([USER, {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}}])
    assert msgs[1]["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert ev == {"function_call_to_tool_calls": 1, "unanswered_tool_calls": 1}


@pytest.mark.parametrize("value,expected", [(True, True), ("true", True), (" FALSE ", False), (1, True), (0, False), (None, None)])
def test_resolved_parsed(value, expected):
    assert T.parse_resolved(value)[0] is expected


def test_resolved_only_uses_parsed_booleans():
    res = T.transform_rows(rows(row(GOOD, "a", resolved="true"), row(GOOD, "b", resolved="false"), row(GOOD, "c", resolved="n/a")),
                           "d", {"resolved_only": True})
    assert [r["traj_id"] for r in res.records["train"]] == ["a"]
    assert res.skipped == {"unresolved": 1, "invalid_resolved": 1}
    assert res.events["resolved_from_string"] == 1


def test_heldout_split_deterministic_by_traj_id():
    ids = [f"traj-{i}" for i in range(2000)]
    held = [t for t in ids if T.heldout(t, 0.1)]
    assert 150 < len(held) < 250
    assert held == [t for t in ids if T.heldout(t, 0.1)]
    assert not any(T.heldout(t, 0.0) for t in ids)
    res = T.transform_rows(rows(*[row(GOOD, t) for t in ids[:200]]), "d", {"heldout_fraction": 0.1})
    assert {r["traj_id"] for r in res.records["validation"]} == {t for t in ids[:200] if T.heldout(t, 0.1)}


def test_gzip_jsonl_deterministic_and_roundtrips():
    recs = [{"messages": GOOD, "traj_id": "a"}, {"messages": GOOD, "traj_id": "b"}]
    a, b = T.gzip_jsonl(recs), T.gzip_jsonl(recs)
    assert a == b
    lines = gzip.decompress(a).decode().splitlines()
    assert [json.loads(x)["traj_id"] for x in lines] == ["a", "b"]


def test_shard_writer_cuts_by_estimated_tokens_and_matches_gzip_jsonl():
    recs = [{"messages": GOOD, "traj_id": f"t{i}", "pad": "x" * (40 * (i % 3))} for i in range(7)]
    sizes = [len(T.record_bytes(r)) for r in recs]
    limit_tokens = max(sizes) * 2 // T.BYTES_PER_TOKEN  # two largest lines fit
    out = {}
    w = T.ShardWriter("train", out.__setitem__, shard_tokens=limit_tokens)
    for r in recs:
        w.add(r)
    names = w.close()
    assert names == sorted(out) == [f"train-{i:05d}.jsonl.gz" for i in range(len(names))] and len(names) > 1
    got = [json.loads(x) for n in names for x in gzip.decompress(out[n]).decode().splitlines()]
    assert got == recs  # every record once, in order
    pos = 0
    for n in names:  # each shard is what gzip_jsonl writes for its records, within the token budget
        k = len(gzip.decompress(out[n]).splitlines())
        assert out[n] == T.gzip_jsonl(recs[pos:pos + k])
        assert sum(sizes[pos:pos + k]) <= limit_tokens * T.BYTES_PER_TOKEN or k == 1
        pos += k
    # a record larger than a shard gets one of its own; nothing written for an empty split
    out2 = {}
    w = T.ShardWriter("validation", out2.__setitem__, shard_tokens=1)
    w.add(recs[0]), w.add(recs[1])
    assert w.close() == ["validation-00000.jsonl.gz", "validation-00001.jsonl.gz"]
    assert T.ShardWriter("train", out2.__setitem__).close() == []
