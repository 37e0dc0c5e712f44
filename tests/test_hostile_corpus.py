"""The hostile corpus (tests/hostile_corpus.py): every row kind and file kind gets its expected
outcome, nothing crashes, and ``rows_in = kept + skipped`` holds for every manifest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import hostile_corpus as H
from trajsft.plan import step_configs
from trajsft.plan import config as C
from trajsft.plan import tools
from trajsft.data import download
from trajsft.data import shard
from trajsft.data import transform as T

TRANSFORM = {"drop_roles": ["exit"], "dedup_traj_id": True}
BASH = tools.PRESETS["bash"]  # the corpus's teacher was given bash, as the default config's teachers
TOOL_REASONS = ("unknown_tool", "missing_tool_argument")


def test_corpus_size():
    assert len(H.ROW_KINDS) >= 40 and len(H.FILE_KINDS) >= 10
    reasons = {x for _, (what, x) in H.ROW_KINDS.values() if what == "skip"}
    assert reasons <= set(T.REASONS)
    assert len(reasons) >= 20


@pytest.mark.parametrize("kind", sorted(H.ROW_KINDS))
def test_row_kind_outcome(kind):
    row, (what, expected) = H.ROW_KINDS[kind]
    rows = dict(H.corpus_rows())
    src = [(T.Source("f.parquet", 0), H.FIRST_DUP)] if kind == "duplicate_traj_id" else []
    src.append((T.Source("f.parquet", len(src)), rows[kind]))
    res = T.transform_rows(src, "hostile", TRANSFORM, tools=BASH)
    kept = len(res.records["train"]) + len(res.records["validation"])
    assert res.rows_in == kept + sum(res.skipped.values()) == len(src)
    assert len(res.skipped_rows) == sum(res.skipped.values())
    if what == "skip":
        assert res.skipped_rows[-1]["reason"] == expected, res.skipped_rows
        assert res.skipped_rows[-1]["row"] == len(src) - 1
        assert "\n" not in res.skipped_rows[-1]["detail"]
    else:
        assert not res.skipped_rows, res.skipped_rows
        for event, n in expected.items():
            assert res.events[event] == n, (event, res.events)
        rec = res.records["train"][0]
        T.gzip_jsonl([rec])  # writable


@pytest.mark.parametrize("kind", sorted(k for k, (what, r) in H.ROW_KINDS.items() if r in TOOL_REASONS))
def test_rows_that_disagree_with_the_tools_are_kept_without_tools(kind):
    """The tool checks come from the teacher's tools alone: with none (``tools: []``) the same rows are kept, and
    with a tool list naming the called function and no required argument too."""
    row = dict(H.corpus_rows())[kind]
    assert T.transform_rows([(T.Source("f", 0), row)], "hostile", TRANSFORM).kept["train"] == 1
    called = [c["function"]["name"] for m in T.normalize_messages(row["messages"], ["exit"])[0]
              for c in m.get("tool_calls", ())]
    lax = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in dict.fromkeys(called)]
    assert T.transform_rows([(T.Source("f", 0), row)], "hostile", TRANSFORM, tools=lax).kept["train"] == 1
    res = T.transform_rows([(T.Source("f", 0), row)], "hostile", TRANSFORM, tools=BASH)
    [skipped] = res.skipped_rows
    assert skipped["reason"] in TOOL_REASONS and skipped["detail"].startswith("messages["), skipped


def test_kept_rows_carry_parsed_resolved_and_reasoning():
    rows = dict(H.corpus_rows())
    res = T.transform_rows([(T.Source("f", i), rows[k]) for i, k in enumerate(
        ["resolved_string_true", "resolved_string_false", "resolved_missing", "thinking_field", "think_block_in_content"])], "h", TRANSFORM)
    by = {r["traj_id"]: r for r in res.records["train"]}
    assert by["resolved_string_true"]["resolved"] is True and by["resolved_string_false"]["resolved"] is False
    assert by["resolved_missing"]["resolved"] is None
    asst = [m for m in by["thinking_field"]["messages"] if m["role"] == "assistant"]
    assert asst[1]["reasoning_content"] == "I should list."
    asst = [m for m in by["think_block_in_content"]["messages"] if m["role"] == "assistant"]
    assert asst[1]["reasoning_content"] == "plan" and asst[1]["content"] == "Let me run it."


def make_plan(tmp_path, dataset, rows, **transform) -> C.Plan:
    over = {"storage_root": str(tmp_path / "store"),
            "teachers": {"demo": {"dataset": str(dataset), "rows": rows}},
            "transform": transform}
    return C.Plan(C.load(None, over), base_dir=C.REPO_DIR, state_dir=str(tmp_path / "state"))


def run_data_steps(plan) -> tuple[dict, dict]:
    names = {a.kind: a.name for a in plan.chain("demo")}
    raw = download.download(step_configs.download(plan, names["raw"]))
    return raw, shard.shard(step_configs.shard(plan, names["shards"]))


def read_shards(plan) -> list[dict]:
    art = next(a for a in plan.chain("demo") if a.kind == "shards")
    return [json.loads(line) for f in sorted(Path(art.location).glob("*.jsonl.gz"))
            for line in gzip.decompress(f.read_bytes()).splitlines()]


def test_corpus_through_the_real_data_steps(tmp_path):
    where = H.write_rows_dataset(tmp_path / "ds")
    plan = make_plan(tmp_path, tmp_path / "ds", len(where))
    _, m = run_data_steps(plan)
    assert m["rows_in"] == len(where) == m["kept_total"] + m["skipped_total"]
    assert sum(m["skipped"].values()) == m["skipped_total"]
    listed = [json.loads(x) for x in step_configs.shard(plan, plan.chain("demo")[1].name).skipped_list.read_text().splitlines()]
    assert len(listed) == m["skipped_total"] > 20  # every skipped row, not only the first 20
    assert len(m["skipped_examples"]) == 20
    expected = {kind: out for kind, (_, out) in H.ROW_KINDS.items()}
    for item in listed:
        kind = where[(item["file"], item["row"])]
        assert expected[kind] == ("skip", item["reason"]), (kind, item)
    kept = {r["traj_id"] for r in read_shards(plan)}
    assert kept == {k for k, (what, _) in expected.items() if what == "keep"} | {"dup"}
    assert m["kept_total"] == len(kept)
    rates = [r["resolved"] for r in read_shards(plan) if r.get("resolved") is not None]
    assert all(isinstance(r, bool) for r in rates)
    assert m["resolved_rate"] == sum(rates) / len(rates)


def test_strict_reports_every_bad_row_in_one_line(tmp_path):
    where = H.write_rows_dataset(tmp_path / "ds")
    plan = make_plan(tmp_path, tmp_path / "ds", len(where), strict=True)
    with pytest.raises(T.BadRow) as e:
        run_data_steps(plan)
    msg = str(e.value)
    n_bad = sum(1 for _row, (what, _x) in H.ROW_KINDS.values() if what == "skip")
    assert "\n" not in msg
    assert msg.startswith("data/train-00000-of-00002.parquet row ")
    assert f"(and {n_bad - 1} more bad row(s)); every bad row is listed in " in msg
    listed = Path(msg.rsplit(" listed in ", 1)[1]).read_text().splitlines()
    assert len(listed) == n_bad


def test_strict_fails_on_an_already_built_shard_set(tmp_path):
    """`strict` is not hashed (the shards are the same), so switching it on must still fail:
    the shard rule passes it as a Snakemake param (a changed param reruns the rule)."""
    smk = (C.REPO_DIR / "rules" / "data.smk").read_text()
    rule = smk[smk.index("rule shard:"):smk.index("rule tokenize:")]
    assert "params:" in rule and "strict=" in rule
    where = H.write_rows_dataset(tmp_path / "ds")
    run_data_steps(make_plan(tmp_path, tmp_path / "ds", len(where)))  # built without strict
    plan = make_plan(tmp_path, tmp_path / "ds", len(where), strict=True)
    with pytest.raises(T.BadRow, match="more bad row"):
        shard.shard(step_configs.shard(plan, plan.chain("demo")[1].name))


def test_a_strict_and_a_lenient_entry_of_one_dataset_share_it_and_the_strict_ones_training_checks_it(tmp_path):
    """Issue 67: two teacher entries read one dataset, one strict: no refusal of the whole workflow (a ConfigError
    before); the shard set is built once, leniently (bad rows skipped, counted, listed), and the strict entry's
    training refuses in one line when it skipped rows, the lenient one's goes on. In either order of the entries."""
    from trajsft.errors import DataError
    from trajsft.io import write_json
    from trajsft.train.target import check_strict

    where = H.write_rows_dataset(tmp_path / "ds")
    entry = {"dataset": str(tmp_path / "ds"), "revision": "local", "rows": len(where), "student": "tiny"}
    for order in (("lenient", "strict"), ("strict", "lenient")):
        teachers = {t: {**entry, "transform": {"strict": t == "strict"}} for t in order}
        plan = C.Plan(C.load(None, {"storage_root": str(tmp_path / "store"), "teachers": teachers}),
                      base_dir=C.REPO_DIR, state_dir=str(tmp_path / "state"))
        lenient, strict = ({a.kind: a for a in plan.chain(t)} for t in ("lenient", "strict"))
        assert lenient["shards"] is strict["shards"] and not lenient["shards"].spec["transform"]["strict"]
        assert plan.strict_shards("strict") == {"strict": strict["shards"]} and plan.strict_shards("lenient") == {}
    names = {a.kind: a.name for a in plan.chain("strict")}
    download.download(step_configs.download(plan, names["raw"]))
    made = shard.shard(step_configs.shard(plan, names["shards"]))  # lenient: built, bad rows counted
    assert made["skipped_total"] > 20
    write_json(strict["shards"].manifest, made)
    check_strict(step_configs.train(plan, "lenient"))  # the lenient entry trains
    with pytest.raises(DataError) as e:
        check_strict(step_configs.train(plan, "strict"))
    listed = Path(strict["shards"].manifest).parent / "skipped.jsonl"
    assert str(e.value) == (
        f"teacher strict is strict, but its data shards/{names['shards']} (shared with a lenient entry of the same "
        f"dataset, so built once, leniently) skipped {made['skipped_total']} row(s) ("
        + ", ".join(f"{k}: {v}" for k, v in sorted(made["skipped"].items()))
        + f"; each one is listed in {listed}): fix the dataset, or set teachers.strict.transform.strict: false")
    assert len(listed.read_text().splitlines()) == made["skipped_total"]
    write_json(strict["shards"].manifest, {**made, "skipped_total": 0, "skipped": {}})
    check_strict(step_configs.train(plan, "strict"))  # clean shared data: the strict entry trains too


@pytest.mark.parametrize("kind", sorted(H.FILE_KINDS))
def test_file_kind_outcome(kind, tmp_path):
    build, (what, expected) = H.FILE_KINDS[kind]
    ds = tmp_path / "ds"
    ds.mkdir()
    rows = build(ds)
    plan = make_plan(tmp_path, tmp_path / "missing" if kind == "local_path_missing" else ds, rows)
    if what == "error":
        with pytest.raises(T.USER_ERRORS) as e:
            run_data_steps(plan)
        msg = str(e.value)
        assert "\n" not in msg and expected in msg, msg
        assert "Traceback" not in msg
        return
    raw, m = run_data_steps(plan)
    assert m["rows_in"] == expected["rows_in"] == m["kept_total"] + m["skipped_total"]
    assert m["kept_total"] == expected["kept"] and m["skipped"] == expected["skipped"]
    assert raw["ignored_split_files"] == expected["ignored"]
