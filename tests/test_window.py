"""Nothing trains on an empty window; long chats are truncated or dropped, counted and hashed.

Unit: ``data.cache.window_plan`` and the hashing/card bookkeeping. Integration: the real
tokenize step (Levanter's ChatProcessor + SerialCacheWriter, the demo tokenizer) drops chats whose first
``seq_len`` tokens hold no assistant token, honours ``long_chats``, and fails with one line when
nothing is left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trajsft.plan import step_configs
from trajsft.report import cards
from trajsft.plan import config as C
from trajsft.data import cache as data_cache
from trajsft.data import download
from trajsft.data import shard
from trajsft.errors import DataError

STATS = {"chats": 5, "lengths": [10, 100, 40, 300, 64], "empty_windows": [3]}


def test_window_plan_truncate_keeps_long_chats_and_counts_them():
    wp = data_cache.window_plan(STATS, 64, "truncate")
    assert wp["keep"] == [0, 1, 2, 4] and wp["dropped"] == [(3, "empty_window")]
    assert wp["counts"] == {
        "chats_in": 5, "chats_out": 4,
        "dropped_empty_window": {"chats": 1, "tokens": 300},
        "dropped_longer_than_seq_len": {"chats": 0, "tokens": 0},
        "truncated": {"chats": 1, "tokens_cut": 36},
    }


def test_window_plan_drop_drops_long_chats():
    wp = data_cache.window_plan(STATS, 64, "drop")
    assert wp["keep"] == [0, 2, 4]  # exactly seq_len tokens still fits
    assert wp["dropped"] == [(1, "longer_than_seq_len"), (3, "empty_window")]
    assert wp["counts"]["dropped_longer_than_seq_len"] == {"chats": 1, "tokens": 100}
    assert wp["counts"]["truncated"] == {"chats": 0, "tokens_cut": 0}
    with pytest.raises(ValueError):
        data_cache.window_plan(STATS, 64, "split")


def _plan(tmp_path, **over):
    return C.Plan(C.load(None, {"storage_root": str(tmp_path / "store"), **over}), base_dir=C.REPO_DIR,
                  state_dir=str(tmp_path / "state"))


def _tok(plan, target="demo"):
    return next(a for a in plan.chain(target) if a.kind == "tokenized")


def test_seq_len_and_long_chats_are_hashed_into_the_tokenized_artifact_only(tmp_path):
    base = _plan(tmp_path)
    drop = _plan(tmp_path, teachers={"demo": {"transform": {"long_chats": "drop"}}})
    longer = _plan(tmp_path, teachers={"demo": {"training": {"seq_len": 2048}}})
    shards = {p: next(a for a in p.chain("demo") if a.kind == "shards").hash for p in (base, drop, longer)}
    assert len(set(shards.values())) == 1  # the shards do not depend on either
    assert len({_tok(p).hash for p in (base, drop, longer)}) == 3
    assert _tok(base).inputs["long_chats"] == "truncate" and _tok(base).inputs["seq_len"] == 1024
    assert _tok(drop).spec["long_chats"] == "drop"


def test_card_counts_window_choices_and_stays_consistent():
    shards = {"teacher": "t", "rows_in": 5, "kept": {"train": 5, "validation": 0}, "kept_total": 5, "skipped": {},
              "skipped_total": 0, "events": {}, "trajectories": [{"turns": 1, "tool_calls": 0, "messages": 3, "chars": 9}] * 5}
    tok = {"teacher": "t", "window": {"seq_len": 64, "long_chats": "truncate", "train": data_cache.window_plan(STATS, 64)["counts"]},
           "stats": {"train": {"chats": 4, "tokens": 214, "assistant_tokens": 20, "lengths": [10, 100, 40, 64],
                               "assistant_lengths": [5, 5, 5, 5]}}}
    card = cards.dataset_card(shards, tok, 64)
    assert card["ok"], card["checks"]
    assert card["window"]["dropped_empty_window"] == {"chats": 1, "tokens": 300}
    assert card["window"]["truncated"] == {"chats": 1, "tokens": 36}
    tok["stats"]["train"]["chats"] = 5  # a cache that did not drop what the window says
    assert not cards.dataset_card(shards, tok, 64)["checks"]["tokenized_chats"]


# ---- integration: the real tokenize step ------------------------------------------------------
def _chat(user_words: int, answer_words: int) -> str:
    return json.dumps([{"role": "system", "content": "You are an agent."},
                       {"role": "user", "content": " ".join(["word"] * user_words)},
                       {"role": "assistant", "content": " ".join(["done"] * answer_words)}])


def _dataset(root: Path) -> dict:
    kinds = {"short0": (3, 3), "short1": (4, 2), "short2": (2, 5), "short3": (5, 1),
             "late_answer": (400, 3),  # first assistant token far beyond seq_len: no loss token
             "long_answer": (3, 400)}  # longer than seq_len, assistant tokens inside the window
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.table({"messages": [_chat(*v) for v in kinds.values()], "traj_id": list(kinds)}),
                   root / "data" / "train-00000-of-00001.parquet")
    return kinds


def _run(tmp_path, long_chats: str, seq_len: int = 96):
    from trajsft.data import tokenize

    ds = tmp_path / "ds"
    if not ds.exists():
        _dataset(ds)
    # no tools: their block (about 225 tokens) would leave these 96-token windows no assistant token
    plan = _plan(tmp_path / long_chats, teachers={"demo": {"dataset": str(ds), "rows": 6, "tools": [], "transform": {
        "heldout_fraction": 0.0, "long_chats": long_chats}, "training": {"seq_len": seq_len}}})
    names = {a.kind: a.name for a in plan.chain("demo")}
    download.download(step_configs.download(plan, names["raw"]))
    shards = shard.shard(step_configs.shard(plan, names["shards"]))
    Path(plan.get("shards", names["shards"]).manifest).parent.mkdir(parents=True, exist_ok=True)
    Path(plan.get("shards", names["shards"]).manifest).write_text(json.dumps(shards))
    return plan, tokenize.tokenize(step_configs.tokenize(plan, names["tokenized"]))


@pytest.mark.integration
def test_tokenize_drops_empty_windows_and_honours_long_chats(tmp_path):
    from trajsft.data import tokenize

    plan, m = _run(tmp_path, "truncate")
    tr = m["window"]["train"]
    assert tr["chats_in"] == 6 and tr["chats_out"] == 5
    assert tr["dropped_empty_window"]["chats"] == 1 and tr["truncated"]["chats"] == 1
    assert [(d["traj_id"], d["reason"]) for d in m["dropped"]] == [("late_answer", "empty_window")]
    assert m["cache_dir"].endswith("cache-packed")
    st = m["stats"]["train"]
    assert st["chats"] == 5 and st["empty_windows"] == [] and st["chats_truncated"] == 1
    # training reads the packed cache (kept chats only, in packing order)
    tok_name = next(a.name for a in plan.chain("demo") if a.kind == "tokenized")
    mpath = Path(plan.get("tokenized", tok_name).manifest)
    mpath.parent.mkdir(parents=True, exist_ok=True)
    mpath.write_text(json.dumps(m))
    assert tokenize.tokenized_cache_dir(plan.get("tokenized", tok_name)) == m["cache_dir"]
    assert data_cache.chat_cache_stats(m["cache_dir"], 96)["train"]["lengths"] == st["lengths"]
    # the kept chats are in first-fit-decreasing order: Levanter packs them into the FFD bins
    pk = m["packing"]["train"]
    assert st["lengths"] == sorted(st["lengths"], reverse=True)[:1] + st["lengths"][1:]  # the longest opens bin 0
    assert pk["levanter_packed"]["sequences"] == st["packed_sequences"] == pk["first_fit_decreasing"]["sequences"]
    assert pk["lower_bound"] <= st["packed_sequences"] <= pk["next_fit_in_shard_order"]["sequences"]
    assert "packed_ranges" not in st

    _, m = _run(tmp_path, "drop")
    assert sorted((d["traj_id"], d["reason"]) for d in m["dropped"]) == [
        ("late_answer", "empty_window"), ("long_answer", "longer_than_seq_len")]
    assert m["stats"]["train"]["chats"] == 4 and m["stats"]["train"]["chats_truncated"] == 0
    assert m["stats"]["train"]["max_length"] <= 96


@pytest.mark.integration
def test_nothing_left_is_one_line(tmp_path):
    with pytest.raises(DataError) as e:
        _run(tmp_path, "drop", seq_len=16)
    assert str(e.value) == ("demo: no training chat is left at seq_len 16: 6 have no assistant token within the first "
                            "16 tokens, 0 are longer (long_chats: drop)")
