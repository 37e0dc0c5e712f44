"""The dataset rows: good trajectories plus the deliberately malformed ones, and their ground truth."""

from __future__ import annotations

import json
import random

from .settings import MODEL_NAME, N_ROWS, N_SHARDS, SEED
from .bugs import BUGS, Bug
from .prompts import USER_EXTRA, _ident
from .trajectories import Plan, build_trajectory


# --------------------------------------------------------------------------------------
# Dataset assembly (incl. malformed rows)
# --------------------------------------------------------------------------------------

DEFECTS = (
    ("invalid_json", "`messages` is not valid JSON (the string is truncated)"),
    ("unknown_role", "a message has role 'narrator', which is not system/user/assistant/tool/exit"),
    ("no_assistant_turn", "the conversation has no assistant message (system + user only; report this, not ends_with_user_turn)"),
    ("invalid_tool_call_arguments", "an assistant tool_calls[].function.arguments string is not valid JSON"),
    ("non_string_content", "a tool message has list-valued content instead of a string"),
    ("ends_with_user_turn", "a user message follows the last assistant turn"),
)


def _instance_id(rng: random.Random, bug: Bug) -> str:
    return f"{bug.repo}.{bug.commit}.{bug.mod_type}__{_ident(rng, 8)}"


def build_rows(rng: random.Random) -> tuple[list[dict], dict]:
    # Per-bug instance ids (several trajectories may share one instance).
    instances: list[tuple[Bug, str]] = []
    for bug in BUGS:
        for _ in range(2):
            instances.append((bug, _instance_id(rng, bug)))

    # Row plans.
    long_rows = set(rng.sample(range(N_ROWS), 6))
    direct_rows = set(rng.sample(sorted(set(range(N_ROWS)) - long_rows), 3))
    rest = sorted(set(range(N_ROWS)) - long_rows - direct_rows)
    # 6 defect rows, 3 reasoning_content rows, 1 inline-<think> row, 1 empty-content row,
    # 8 rows with a trailing `exit` message -- all distinct
    specials = rng.sample(rest, 6 + 3 + 1 + 1 + 8)
    defect_rows = specials[:6]
    reasoning_rows = set(specials[6:9])
    think_rows = {specials[9]}
    empty_content_row = specials[10]
    exit_rows = set(specials[11:19])
    # duplicate traj_id pair: first occurrence in shard 0, second in shard 1
    per_shard = N_ROWS // N_SHARDS
    dup_first = rng.choice([i for i in range(per_shard) if i not in specials and i not in long_rows and i not in direct_rows])
    dup_second = rng.choice([i for i in range(per_shard, N_ROWS) if i not in specials and i not in long_rows and i not in direct_rows])

    rows: list[dict] = []
    malformed: list[dict] = []
    edge_cases: dict[str, list[str]] = {
        "empty_assistant_content_with_tool_calls": [],
        "trailing_exit_message": [],
        "reasoning_content_field": [],
        "think_block_in_content": [],
        "parallel_tool_calls": [],
        "direct_answer_no_tool_calls": [],
        "long_tool_outputs": [],
    }
    for i in range(N_ROWS):
        bug, iid = instances[rng.randrange(len(instances))]
        if i == dup_second:
            iid = rows[dup_first]["instance_id"]
            bug = next(b for b in BUGS if iid.startswith(b.repo + "."))
        if i in direct_rows:
            n_turns = 0
        elif i in long_rows:
            n_turns = rng.randint(9, 12)
        else:
            n_turns = rng.choice([2, 2, 3, 3, 3, 4, 4, 5, 6])
        style = "plain"
        if i in reasoning_rows:
            style = "reasoning_content"
        elif i in think_rows:
            style = "think_inline"
        elif i == empty_content_row:
            style = "empty_content"
        plan = Plan(
            bug=bug,
            resolved=rng.random() < 0.7 and i not in direct_rows,
            n_turns=n_turns,
            long=i in long_rows,
            style=style,
            parallel=rng.random() < 0.3,
            extra=rng.choice(USER_EXTRA),
        )
        traj = build_trajectory(rng, plan)
        traj_id = f"{iid}.{_ident(rng, 8)}"
        if i == dup_second:
            traj_id = rows[dup_first]["traj_id"]
        msgs = traj.messages
        if i in exit_rows:
            msgs.append({
                "role": "exit",
                "content": "Submitted",
                "extra": {"exit_status": "Submitted", "submission": traj.patch},
            })
        messages_json: str | None = None

        # ---- valid edge cases bookkeeping --------------------------------------
        if style == "empty_content":
            edge_cases["empty_assistant_content_with_tool_calls"].append(traj_id)
        if style == "reasoning_content":
            edge_cases["reasoning_content_field"].append(traj_id)
        if style == "think_inline":
            edge_cases["think_block_in_content"].append(traj_id)
        if i in exit_rows:
            edge_cases["trailing_exit_message"].append(traj_id)
        if any(m["role"] == "assistant" and len(m.get("tool_calls") or []) > 1 for m in msgs):
            edge_cases["parallel_tool_calls"].append(traj_id)
        if i in direct_rows:
            edge_cases["direct_answer_no_tool_calls"].append(traj_id)
        if i in long_rows:
            edge_cases["long_tool_outputs"].append(traj_id)

        # ---- corruptions -------------------------------------------------------
        defect = None
        if i in defect_rows:
            defect = DEFECTS[defect_rows.index(i)][0]
            if defect == "invalid_json":
                full = json.dumps(msgs)
                messages_json = full[: len(full) - rng.randint(40, 200)]
            elif defect == "unknown_role":
                # between a tool response and the next assistant turn, so tool-call/response
                # adjacency stays intact and the unknown role is the only defect
                at = next(k for k in range(3, len(msgs)) if msgs[k - 1]["role"] == "tool" and msgs[k]["role"] == "assistant")
                msgs.insert(at, {"role": "narrator", "content": "The agent pauses to consider the failing test."})
            elif defect == "no_assistant_turn":
                del msgs[2:]
            elif defect == "invalid_tool_call_arguments":
                call_msgs = [m for m in msgs if m["role"] == "assistant" and m.get("tool_calls")]
                target = call_msgs[len(call_msgs) // 2]["tool_calls"][0]["function"]
                cmd = json.loads(target["arguments"])["command"]
                target["arguments"] = repr({"command": cmd})  # python dict repr: single quotes
            elif defect == "non_string_content":
                tool_msgs = [m for m in msgs if m["role"] == "tool"]
                target = tool_msgs[0]
                target["content"] = [{"type": "text", "text": target["content"]}]
            elif defect == "ends_with_user_turn":
                msgs.append({"role": "user", "content": "Thanks. Could you also add a regression test for this?"})
        if messages_json is None:
            messages_json = json.dumps(msgs)
        row = {
            "messages": messages_json,
            "instance_id": iid,
            "resolved": bool(traj.resolved),
            "model": MODEL_NAME,
            "traj_id": traj_id,
            "patch": traj.patch,
        }
        rows.append(row)
        if defect is not None:
            malformed.append({
                "row": i,
                "shard": i // per_shard,
                "traj_id": traj_id,
                "defect": defect,
                "description": dict(DEFECTS)[defect],
            })
    malformed.append({
        "row": dup_second,
        "shard": dup_second // per_shard,
        "traj_id": rows[dup_second]["traj_id"],
        "defect": "duplicate_traj_id",
        "description": (
            f"traj_id also used by row {dup_first} (shard {dup_first // per_shard}); both rows are "
            "otherwise valid and differ in content; the first occurrence is kept"
        ),
        "first_occurrence_row": dup_first,
    })
    malformed.sort(key=lambda m: m["row"])
    # Sanity checks of the corruptions.
    for m in malformed:
        raw = rows[m["row"]]["messages"]
        if m["defect"] == "invalid_json":
            try:
                json.loads(raw)
            except json.JSONDecodeError:
                pass
            else:  # pragma: no cover
                raise AssertionError("invalid_json row parses")
    assert rows[dup_first]["traj_id"] == rows[dup_second]["traj_id"]
    assert rows[dup_first]["messages"] != rows[dup_second]["messages"]
    assert len({r["traj_id"] for r in rows}) == N_ROWS - 1

    skipped_rows = {m["row"] for m in malformed}
    valid_rows = [r for k, r in enumerate(rows) if k not in skipped_rows]
    expected = {
        "description": (
            "Ground truth for demo/dataset. Row numbers are 0-based over the concatenation of "
            "the shards in file-name order. Each malformed row has exactly one defect; a "
            "validator should skip exactly these rows (for duplicate_traj_id: keep the first "
            "occurrence, skip the later one). Rows listed under valid_edge_cases are valid."
        ),
        "seed": SEED,
        "total_rows": N_ROWS,
        "rows_per_shard": {f"data/train-{s:05d}-of-{N_SHARDS:05d}.parquet": per_shard for s in range(N_SHARDS)},
        "columns": ["messages", "instance_id", "resolved", "model", "traj_id", "patch"],
        "malformed": malformed,
        "defect_counts": {d: sum(1 for m in malformed if m["defect"] == d) for d, _ in DEFECTS + (("duplicate_traj_id", ""),)},
        "expected_skipped": len(malformed),
        "expected_valid": len(valid_rows),
        "expected_valid_resolved": sum(1 for r in valid_rows if r["resolved"]),
        "expected_valid_unresolved": sum(1 for r in valid_rows if not r["resolved"]),
        "valid_edge_cases": edge_cases,
        "roles_to_drop": ["exit"],
    }
    return rows, expected
