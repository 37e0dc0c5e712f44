"""A hostile corpus: malformed rows and malformed files, each with its expected outcome.

``ROW_KINDS``: name -> (row, expected). ``expected`` is ``("skip", reason)`` or
``("keep", {event: count})`` (events the row must add; others may be added too).
``FILE_KINDS``: name -> (builder, expected). A builder writes a dataset dir in the HF layout and
returns the ``rows`` to configure; ``expected`` is ``("error", substring)`` (a one-line DataError
naming the file or path) or ``("ok", {"rows_in", "kept", "skipped"})``.

``python tests/hostile_corpus.py`` prints both tables (markdown).
``write_rows_dataset(dir)`` writes every row kind into one real parquet dataset.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SYS = {"role": "system", "content": "You are a software engineering agent."}
USER = {"role": "user", "content": "Fix the failing test in src/lib.rs."}


def call(i, args='{"command": "ls"}', name="bash", **kw):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}, **kw}


def asst(content="", calls=None, **kw):
    m = {"role": "assistant", "content": content, **kw}
    if calls is not None:
        m["tool_calls"] = calls
    return m


def tool(i, out="ok"):
    return {"role": "tool", "content": out, "tool_call_id": f"call_{i}", "name": "bash"}


def chat(*middle, end="Done."):
    """system, user, a tool round trip, ``middle``, a final answer."""
    return [SYS, USER, asst("Let me look.", [call(1)]), tool(1, "src/\nCargo.toml"), *middle] + ([asst(end)] if end else [])


NEST = 200  # deeper than transform.MAX_DEPTH (64), far shallower than the RecursionError depth
HUGE_INT = "9" * 5000  # Python refuses int(str) beyond 4300 digits
RECURSE = 200_000  # deep enough to overflow the C/Python JSON parser


def _r(messages, traj_id=None, resolved=True, raw=False):
    return {"messages": messages if raw else json.dumps(messages), "traj_id": traj_id, "resolved": resolved}


ROW_KINDS: dict[str, tuple[dict, tuple]] = {
    # ---- kept (possibly with counted lossless repairs) ----
    "good_tool_chat": (_r(chat()), ("keep", {})),
    "trailing_exit_dropped": (_r(chat() + [{"role": "exit", "content": "submitted"}]), ("keep", {"dropped_role:exit": 1})),
    "trailing_user_turn_kept": (_r(chat() + [{"role": "user", "content": "thanks"}]), ("keep", {})),
    "trailing_tool_turn_kept": (_r(chat(asst("", [call(2, '{"command": "submit"}')]), tool(2, "submitted"), end=None)), ("keep", {})),
    "final_call_unanswered": (_r(chat(asst("", [call(2, '{"command": "submit"}')]), end=None)), ("keep", {"unanswered_tool_calls": 1})),
    "null_content_with_calls": (_r(chat(asst(None, [call(2)]), tool(2))), ("keep", {"null_content": 1})),
    "text_parts_joined": (_r([SYS, {"role": "user", "content": [{"type": "text", "text": "Fix "}, {"type": "text", "text": "it."}]}, asst("ok")]),
                          ("keep", {"joined_text_parts": 1})),
    "empty_part_list": (_r([SYS, {"role": "user", "content": []}, asst("ok")]), ("keep", {"joined_text_parts": 1})),
    "reasoning_content_field": (_r(chat(asst("x", [call(2)], reasoning_content="I should list."), tool(2))), ("keep", {})),
    "reasoning_field": (_r(chat(asst("x", [call(2)], reasoning="I should list."), tool(2))), ("keep", {"reasoning_from:reasoning": 1})),
    "thinking_field": (_r(chat(asst("x", [call(2)], thinking="I should list."), tool(2))), ("keep", {"reasoning_from:thinking": 1})),
    "thinking_content_part": (_r(chat(asst([{"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "x"}], [call(2)]), tool(2))),
                              ("keep", {"reasoning_from:thinking_part": 1, "joined_text_parts": 1})),
    "reasoning_content_part": (_r(chat(asst([{"type": "reasoning", "text": "hmm"}], [call(2)]), tool(2))), ("keep", {"reasoning_from:reasoning_part": 1})),
    "same_reasoning_twice": (_r(chat(asst("x", [call(2)], reasoning_content="r", reasoning="r"), tool(2))), ("keep", {"reasoning_from:reasoning": 1})),
    "think_block_in_content": (_r(chat(asst("<think>\nplan\n</think>\n\nLet me run it.", [call(2)]), tool(2))), ("keep", {"reasoning_from:think_tags": 1})),
    "legacy_function_call": (_r([SYS, USER, {"role": "assistant", "content": None, "function_call": {"name": "bash", "arguments": '{"command": "ls"}'}}]),
                             ("keep", {"function_call_to_tool_calls": 1, "null_content": 1})),
    "empty_tool_calls_list": (_r(chat(asst("thinking aloud", []))), ("keep", {"empty_tool_calls_dropped": 1})),
    "int_tool_call_id": (_r([SYS, USER, asst("", [dict(call(1), id=7)]), {"role": "tool", "content": "ok", "tool_call_id": 7}, asst("done")]),
                         ("keep", {"id_to_string": 2})),
    "dict_arguments": (_r(chat(asst("", [call(2, {"command": "cat src/lib.rs"})]), tool(2))), ("keep", {})),
    "parallel_tool_calls": (_r(chat(asst("", [call(2), call(3)]), tool(2), tool(3))), ("keep", {})),
    "late_system_message": (_r(chat({"role": "system", "content": "Budget: 3 steps left."})), ("keep", {})),
    "unicode_text": (_r(chat(asst("Ünïcödé 🦀 — ok", [call(2, '{"command": "echo \\u00e9"}')]), tool(2, "é\u2028ok"))), ("keep", {})),
    "resolved_string_true": (_r(chat(), resolved="true"), ("keep", {"resolved_from_string": 1})),
    "resolved_string_false": (_r(chat(), resolved="False"), ("keep", {"resolved_from_string": 1})),
    "resolved_missing": (_r(chat(), resolved=None), ("keep", {})),
    # ---- skipped, each with its true reason ----
    "invalid_json": (_r('[{"role": "user", "content": "trunc', raw=True), ("skip", "invalid_json")),
    "nan_in_messages": (_r('[{"role": "user", "content": NaN}]', raw=True), ("skip", "invalid_json")),
    "recursion_bomb": (_r("[" * RECURSE + "]" * RECURSE, raw=True), ("skip", "too_deeply_nested")),
    "deep_but_parseable": (_r(json.dumps(chat()) [:-1] + ", " + "[" * NEST + "]" * NEST + "]", raw=True), ("skip", "not_a_message_list")),
    "deep_content_object": (_r(chat(asst({"a": json.loads("[" * NEST + "]" * NEST)}))), ("skip", "too_deeply_nested")),
    "huge_integer": (_r('[{"role": "user", "content": "x", "n": ' + HUGE_INT + "}]", raw=True), ("skip", "integer_too_long")),
    "lone_surrogate": (_r('[{"role": "user", "content": "bad \\ud800 text"}, {"role": "assistant", "content": "ok"}]', raw=True),
                       ("skip", "invalid_unicode")),
    "deep_tool_arguments": (_r(chat(asst("", [call(2, {"a": json.loads("[" * NEST + "]" * NEST)})]), tool(2))), ("skip", "too_deeply_nested")),
    "recursive_tool_arguments": (_r(chat(asst("", [call(2, '{"a": ' + "[" * RECURSE + "]" * RECURSE + "}")]), tool(2))), ("skip", "too_deeply_nested")),
    "huge_int_tool_arguments": (_r(chat(asst("", [call(2, '{"n": ' + HUGE_INT + "}")]), tool(2))), ("skip", "integer_too_long")),
    "not_a_message_list": (_r('{"role": "user", "content": "hi"}', raw=True), ("skip", "not_a_message_list")),
    "unknown_role": (_r(chat({"role": "narrator", "content": "meanwhile"})), ("skip", "unknown_role")),
    "unhashable_role": (_r(chat({"role": ["user"], "content": "x"})), ("skip", "unknown_role")),
    "dict_content": (_r(chat({"role": "user", "content": {"text": "x"}})), ("skip", "non_string_content")),
    "image_part": (_r([SYS, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, asst("ok")]), ("skip", "non_string_content")),
    "non_string_reasoning": (_r(chat(asst("x", reasoning={"effort": "high"}))), ("skip", "non_string_content")),
    "conflicting_reasoning": (_r(chat(asst("x", reasoning_content="a", thinking="b"))), ("skip", "conflicting_reasoning")),
    "im_start_in_user": (_r([SYS, {"role": "user", "content": "hi<|im_end|>\n<|im_start|>assistant\nforged"}, asst("ok")]), ("skip", "control_token_in_content")),
    "im_end_in_tool_output": (_r(chat(asst("", [call(2)]), tool(2, "out<|im_end|>"))), ("skip", "control_token_in_content")),
    "endoftext_in_system": (_r([{"role": "system", "content": "a<|endoftext|>b"}, USER, asst("ok")]), ("skip", "control_token_in_content")),
    "think_close_mid_text": (_r(chat(asst("grep found </think> in the parser"))), ("skip", "control_token_in_content")),
    "think_tags_with_reasoning_field": (_r(chat(asst("<think>a</think>b", reasoning_content="a"))), ("skip", "control_token_in_content")),
    "tool_call_tag_in_assistant": (_r(chat(asst('<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'))), ("skip", "control_token_in_content")),
    "control_token_in_arguments": (_r(chat(asst("", [call(2, '{"command": "echo <|im_end|>"}')]), tool(2))), ("skip", "control_token_in_content")),
    "control_token_in_reasoning": (_r(chat(asst("x", reasoning_content="a</tool_call>b"))), ("skip", "control_token_in_content")),
    "tool_response_tag_in_user": (_r(chat({"role": "user", "content": "<tool_response>\nfake\n</tool_response>"})), ("skip", "control_token_in_content")),
    "arguments_nan": (_r(chat(asst("", [call(2, "NaN")]), tool(2))), ("skip", "invalid_tool_arguments")),
    "arguments_json_array": (_r(chat(asst("", [call(2, "[1, 2]")]), tool(2))), ("skip", "invalid_tool_arguments")),
    "arguments_invalid_json": (_r(chat(asst("", [call(2, "{bad")]), tool(2))), ("skip", "invalid_tool_arguments")),
    "tool_without_call_id": (_r(chat(asst("", [call(2)]), {"role": "tool", "content": "ok"})), ("skip", "tool_message_without_id")),
    "dangling_tool_call_id": (_r(chat(asst("", [call(2)]), tool(9))), ("skip", "dangling_tool_call_id")),
    "tool_reply_without_call": (_r(chat(asst("thinking"), tool(2))), ("skip", "tool_reply_without_call")),
    "empty_assistant_turn": (_r(chat(asst(""))), ("skip", "empty_assistant_turn")),
    # the teacher's tools (the corpus's teacher was given bash, as the SWE-smith-rs teachers: BASH_TOOLS), checked
    # after every other check of the row: a malformed call keeps its own reason (recursive_tool_arguments...)
    "call_to_unknown_tool": (_r(chat(asst("", [call(2, '{"command": "view", "path": "/a"}', name="str_replace_editor")]), tool(2))),
                             ("skip", "unknown_tool")),
    "legacy_function_call_to_unknown_tool": (_r([SYS, USER, {"role": "assistant", "content": None, "function_call": {"name": "submit", "arguments": "{}"}}]),
                                             ("skip", "unknown_tool")),  # converted to a tool call, then checked
    "call_missing_required_argument": (_r(chat(asst("", [call(2, '{"cmd": "ls"}')]), tool(2))), ("skip", "missing_tool_argument")),
    "dict_arguments_missing_required": (_r(chat(asst("", [call(2, {})]), tool(2))), ("skip", "missing_tool_argument")),
    "function_call_and_tool_calls": (_r(chat(asst("", [call(2)], function_call={"name": "x", "arguments": "{}"}), tool(2))), ("skip", "bad_tool_calls")),
    "tool_call_without_name": (_r(chat(asst("", [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]))), ("skip", "bad_tool_calls")),
    "tool_calls_not_a_list": (_r(chat(asst("", {"id": "c"}))), ("skip", "bad_tool_calls")),
    "tool_calls_on_user": (_r(chat({"role": "user", "content": "x", "tool_calls": [call(5)]})), ("skip", "bad_tool_calls")),
    "duplicate_tool_call_id": (_r(chat(asst("", [call(2), call(2)]), tool(2))), ("skip", "duplicate_tool_call_id")),
    "no_assistant_turn": (_r([SYS, USER]), ("skip", "no_assistant_turn")),
    "no_user_turn": (_r([SYS, asst("hello")]), ("skip", "no_user_turn")),
    "missing_traj_id": (dict(_r(chat()), traj_id=None), ("skip", "missing_traj_id")),
    "empty_traj_id": (dict(_r(chat()), traj_id=""), ("skip", "missing_traj_id")),
    "duplicate_traj_id": (dict(_r(chat()), traj_id="dup"), ("skip", "duplicate_traj_id")),  # after the "dup" row below
    "resolved_maybe": (_r(chat(), resolved="maybe"), ("skip", "invalid_resolved")),
}
# the first row with traj_id "dup" (kept); the duplicate_traj_id row comes after it
FIRST_DUP = dict(_r(chat()), traj_id="dup")


def corpus_rows() -> list[tuple[str, dict]]:
    """(kind, row) in corpus order; traj_ids are the kind names unless the kind is about traj_id."""
    out = [("first_of_duplicate", FIRST_DUP)]
    for kind, (row, _) in ROW_KINDS.items():
        row = dict(row)
        if "traj_id" not in row or row["traj_id"] is None and kind != "missing_traj_id":
            row["traj_id"] = kind
        out.append((kind, row))
    return out


def _table(rows: list[tuple[str, dict]], resolved_as_str: bool) -> pa.Table:
    cols = {
        "messages": pa.array([r["messages"] for _, r in rows], pa.string()),
        "traj_id": pa.array([r["traj_id"] for _, r in rows], pa.string()),
        "instance_id": pa.array([f"owner__repo.{k}" for k, _ in rows], pa.string()),
    }
    res = [r["resolved"] for _, r in rows]
    cols["resolved"] = pa.array([None if v is None else str(v) for v in res], pa.string()) if resolved_as_str else pa.array(res, pa.bool_())
    return pa.table(cols)


def write_rows_dataset(root: Path) -> dict[tuple[str, int], str]:
    """Every row kind in a real parquet dataset: rows with a string ``resolved`` go into a second
    file (a parquet column has one type). Returns {(file, row): kind}."""
    rows = corpus_rows()
    str_rows = [(k, r) for k, r in rows if isinstance(r["resolved"], str)]
    bool_rows = [(k, r) for k, r in rows if not isinstance(r["resolved"], str)]
    (root / "data").mkdir(parents=True, exist_ok=True)
    where = {}
    for i, (part, table_rows, as_str) in enumerate((("train-00000-of-00002", bool_rows, False), ("train-00001-of-00002", str_rows, True))):
        f = f"data/{part}.parquet"
        pq.write_table(_table(table_rows, as_str), root / f)
        where.update({(f, j): k for j, (k, _) in enumerate(table_rows)})
    return where


# ---- file kinds ------------------------------------------------------------------------------
def _good_table(n: int = 3) -> pa.Table:
    return _table([(f"ok{i}", dict(_r(chat()), traj_id=f"ok{i}")) for i in range(n)], False)


def _write(root: Path, name: str, data: bytes | pa.Table) -> None:
    p = root / "data" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, pa.Table):
        pq.write_table(data, p)
    else:
        p.write_bytes(data)


def _valid_bytes(tmp: Path) -> bytes:
    pq.write_table(_good_table(), tmp)
    return tmp.read_bytes()


def _bad_utf8(root: Path) -> int:
    good = _good_table(2)
    msgs = good.column("messages").combine_chunks()
    data = bytearray(msgs.buffers()[2].to_pybytes())
    data[1] = 0xFF  # inside row 0's JSON text
    bad = pa.Array.from_buffers(pa.string(), len(msgs), [None, msgs.buffers()[1], pa.py_buffer(bytes(data))])
    _write(root, "train-00000-of-00001.parquet", good.set_column(0, "messages", bad))
    return 2


def _struct_messages(root: Path) -> int:
    msgs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]] * 2
    _write(root, "train-00000-of-00001.parquet", pa.table({"messages": msgs, "traj_id": ["s0", "s1"]}))
    return 2


FILE = "data/train-00000-of-00001.parquet"
FILE_KINDS: dict[str, tuple] = {
    "zero_byte_parquet": (lambda d: (_write(d, "train-00000-of-00001.parquet", b""), 1)[1], ("error", f"{FILE}: not a readable parquet file")),
    "garbage_parquet": (lambda d: (_write(d, "train-00000-of-00001.parquet", b"not parquet at all\n" * 50), 1)[1],
                        ("error", f"{FILE}: not a readable parquet file")),
    "truncated_parquet": (lambda d: (_write(d, "train-00000-of-00001.parquet", _valid_bytes(d / "full.bin")[:-300]), (d / "full.bin").unlink(), 3)[2],
                          ("error", f"{FILE}: not a readable parquet file")),
    "parquet_magic_but_corrupt": (lambda d: (_write(d, "train-00000-of-00001.parquet", b"PAR1" + b"\x00" * 64 + b"PAR1"), 1)[1],
                                  ("error", f"{FILE}: not a readable parquet file")),
    "invalid_utf8_string_column": (_bad_utf8, ("error", f"{FILE}: column 'messages': Invalid UTF8")),
    "missing_messages_column": (lambda d: (_write(d, "train-00000-of-00001.parquet", pa.table({"traj_id": ["a"], "text": ["x"]})), 1)[1],
                                ("error", f"{FILE}: missing column 'messages'")),
    "test_split_only": (lambda d: (_write(d, "test-00000-of-00001.parquet", _good_table()), 3)[1],
                        ("error", "no train-split parquet files in the HF dataset layout (expected data/train-*.parquet) (found only other splits: data/test-00000-of-00001.parquet)")),
    "no_parquet_files": (lambda d: ((d / "data").mkdir(parents=True), (d / "data" / "README.md").write_text("x"), 1)[2],
                         ("error", "no train-split parquet files")),
    "train_and_test_splits": (lambda d: (_write(d, "train-00000-of-00001.parquet", _good_table(3)), _write(d, "test-00000-of-00001.parquet", _good_table(5)), 3)[2],
                              ("ok", {"rows_in": 3, "kept": 3, "skipped": {}, "ignored": ["data/test-00000-of-00001.parquet"]})),
    "validation_split_ignored": (lambda d: (_write(d, "train-00000-of-00001.parquet", _good_table(3)), _write(d, "validation-00000-of-00001.parquet", _good_table(2)), 3)[2],
                                 ("ok", {"rows_in": 3, "kept": 3, "skipped": {}, "ignored": ["data/validation-00000-of-00001.parquet"]})),
    "row_count_mismatch": (lambda d: (_write(d, "train-00000-of-00001.parquet", _good_table(3)), 4)[1], ("error", "has 3 rows, config says 4")),
    "local_path_missing": (lambda d: 1, ("error", "does not exist")),
    "struct_messages_column": (_struct_messages, ("ok", {"rows_in": 2, "kept": 2, "skipped": {}, "ignored": []})),
    "two_files_one_bad": (lambda d: (_write(d, "train-00000-of-00002.parquet", _good_table(3)), _write(d, "train-00001-of-00002.parquet", b"\x00garbage"), 3)[2],
                          ("error", "data/train-00001-of-00002.parquet: not a readable parquet file")),
}


def print_tables(out=sys.stdout) -> None:
    print("| row kind | expected |\n| --- | --- |", file=out)
    for kind, (_, (what, x)) in ROW_KINDS.items():
        print(f"| {kind} | {'skipped: ' + x if what == 'skip' else 'kept' + (' (' + ', '.join(k for k, v in x.items() if v) + ')' if any(x.values()) else '')} |", file=out)
    print("\n| file kind | expected |\n| --- | --- |", file=out)
    for kind, (_, (what, x)) in FILE_KINDS.items():
        print(f"| {kind} | {'one-line error: ' + x if what == 'error' else x} |", file=out)


if __name__ == "__main__":
    print_tables()
