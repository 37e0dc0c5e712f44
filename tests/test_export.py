"""Rule `export` (trajsft.data.export): LLaMA-Factory sharegpt + TRL/HF messages jsonl.

Loaded back with `datasets` and checked against the shards: the messages rows turn by turn, the
sharegpt rows by LLaMA-Factory's documented rules (tags from dataset_info.json, human/observation and
gpt/function_call alternating from a human turn, a function_call value that is a JSON call or list of
calls, optionally after the turn's text in <tool_call>...</tool_call>) and by their rendering with
LLaMA-Factory 0.9.5's qwen3_nothink slots against the OFFICIAL Qwen3 template's rendering of the full
shard chat (tests/data). These tests need no torch; LLaMA-Factory and TRL themselves run on the same
exports in scripts/check_trainers.py (a separate environment: LLaMA-Factory pins datasets<=4.0.0).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import pytest

import hostile_corpus as H
from test_steps import build_shards, make_plan
from trajsft.plan import step_configs
from trajsft.plan.kinds import KINDS
from trajsft.plan import config as C
from trajsft.data import export
from trajsft.data import download
from trajsft.data import shard
from trajsft.data import transform as T
from trajsft.plan.tools import BASH

SEP = "\n</tool_response>\n<tool_response>\n"


def _plain(x):
    """A value loaded by `datasets` without the None it fills in for absent keys."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def _load(files: list[Path]) -> list[dict]:
    ds = datasets.load_dataset("json", data_files=[str(f) for f in files], split="train")
    return [_plain(r) for r in ds]


def _shard_records(plan, teacher="demo") -> dict[str, list[dict]]:
    import gzip

    loc = Path(plan.get("shards", plan.target(teacher)["export"].spec["shards"][teacher]).location)
    out: dict[str, list[dict]] = {}
    for f in sorted(loc.glob("*.jsonl.gz")):
        out.setdefault(f.name.split("-")[0], []).extend(json.loads(x) for x in gzip.decompress(f.read_bytes()).splitlines())
    return out


@pytest.fixture(scope="module")
def demo_export(tmp_path_factory):
    plan = make_plan(tmp_path_factory.mktemp("export"))
    build_shards(plan)
    return plan, export.export(step_configs.export(plan, "demo")), Path(step_configs.export(plan, "demo").location)


def test_messages_jsonl_loads_with_datasets_and_equals_the_shards(demo_export):
    plan, res, out = demo_export
    shards = _shard_records(plan)
    for split, recs in shards.items():
        loaded = _load(sorted((out / "messages" / "demo").glob(f"{split}-*.jsonl")))
        assert len(loaded) == len(recs) == res["teachers"]["demo"]["messages_rows"][split]
        for got, want in zip(loaded, recs):
            # every turn, reasoning, tool call id, tool_call_id and name; the teacher's tools, key order kept
            assert got == _plain({**want, "tools": [BASH]}) and list(got["tools"][0]) == list(BASH)
    calls = [c for r in shards["train"] for m in r["messages"] for c in m.get("tool_calls", ())]
    assert len(calls) > 100 and all(c.get("id") for c in calls)


def _check_sharegpt(row: dict, tags: dict) -> None:
    """LLaMA-Factory's documented sharegpt rules for one row."""
    conv = row["conversations"]
    assert conv and len(conv) % 2 == 0
    for i, t in enumerate(conv):
        allowed = (tags["user_tag"], tags["observation_tag"]) if i % 2 == 0 else (tags["assistant_tag"], tags["function_tag"])
        assert t[tags["role_tag"]] in allowed, (i, t)
        if t["from"] == tags["function_tag"]:
            v = t["value"]
            payload = v[v.index("<tool_call>") + 11: -12] if v.endswith("</tool_call>") else v
            calls = json.loads(payload)
            for c in calls if isinstance(calls, list) else [calls]:
                assert set(c) == {"name", "arguments"} and isinstance(c["arguments"], dict)


OFFICIAL = (Path(__file__).resolve().parent / "data" / "qwen3_chat_template.official.jinja").read_text(encoding="utf-8")


def _official(msgs: list[dict], tools: list[dict] | None = None) -> str:
    """What trajsft trains on: the official Qwen3 template's text of the full chat (with the teacher's tools)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(OFFICIAL).render(messages=msgs, tools=tools, add_generation_prompt=False)


def _renders_as_trained(row: dict, rec: dict) -> bool:
    """LLaMA-Factory's text of the row is the official rendering of the chat with the demo's tools (exact), or,
    when trailing turns were dropped, the official rendering up to the last assistant turn."""
    got, want = export.lf_render(row), _official(rec["messages"], [BASH])
    if got == want:
        return True
    last = max(i for i, m in enumerate(rec["messages"]) if m["role"] == "assistant")
    return last < len(rec["messages"]) - 1 and want.startswith(got) and got.endswith("<|im_end|>\n")


def test_llamafactory_dataset_loads_and_round_trips(demo_export):
    plan, res, out = demo_export
    lf = out / "llamafactory"
    info = json.loads((lf / "dataset_info.json").read_text())
    assert set(info) == {"demo", "demo_validation"}
    for name, entry in info.items():
        assert entry["formatting"] == "sharegpt" and entry["columns"] == {"messages": "conversations", "system": "system",
                                                                          "tools": "tools"}
        assert entry["tags"]["function_tag"] == "function_call" and entry["tags"]["observation_tag"] == "observation"
    shards = _shard_records(plan)
    for name, entry in info.items():
        split = "train" if name == "demo" else "validation"
        rows = _load(sorted((lf / entry["file_name"]).glob("*.jsonl")))  # a dir file_name: every file in it
        assert len(rows) == len(shards[split])  # the demo has no chat sharegpt cannot hold
        for row, rec in zip(rows, shards[split]):
            _check_sharegpt(row, entry["tags"])
            assert json.loads(row["tools"]) == [BASH] and row["tools"] == json.dumps([BASH])  # naming bash, as written
            assert _renders_as_trained(row, rec), rec["traj_id"]
    lf, ev = res["llamafactory"], res["llamafactory"]["events"]
    n_calls = sum(len(m.get("tool_calls", ())) for r in shards["train"] + shards.get("validation", []) for m in r["messages"])
    assert ev["tool_call_ids_dropped"] == n_calls  # Qwen3 renders no ids: not lossy
    assert ev["reasoning_in_think_block"] > 0 and ev["parallel_tool_calls"] > 0 and ev["tool_replies_joined"] > 0
    assert ev["empty_think_block"] > 40  # the last turn's empty think block, written into its value
    assert lf["lossy"] == {"trailing_turns_dropped": 1} and lf["rows_lossy"] == {"trailing_turns_dropped": 1}
    assert lf["rows_exact"] == lf["rows"] - 1 == 54
    lossy_rows = [json.loads(x) for x in (out / "llamafactory" / "lossy.jsonl").read_text().splitlines()]
    assert [r["reasons"] for r in lossy_rows] == [["trailing_turns_dropped"]]


def test_export_names_how_to_train_it(demo_export):
    """LLaMA-Factory's training arguments and TRL's template + SFTConfig, in files and the manifest."""
    import yaml

    from trajsft.data.template import load_template

    plan, res, out = demo_export
    args = yaml.safe_load((out / "llamafactory" / "train_args.yaml").read_text())
    assert args == res["llamafactory"]["train_args"]
    assert args["template"] == "qwen3_nothink" and args["stage"] == "sft"
    assert args["dataset"] == "demo" and args["eval_dataset"] == "demo_validation"
    assert args["cutoff_len"] == plan.target("demo")["run"].spec["training"]["seq_len"] == 1024
    assert Path(args["dataset_dir"]) == (out / "llamafactory").resolve() and (Path(args["dataset_dir"]) / "dataset_info.json").exists()
    assert "model_name_or_path" not in args  # the demo student is random-init: no checkpoint to name
    sft = json.loads((out / "messages" / "sft_config.json").read_text())
    assert sft == res["trl"]["sft_config"] and sft["assistant_only_loss"] is True and sft["max_length"] == 1024
    assert Path(sft["chat_template_path"]).read_text() == load_template() and "{%- generation %}" in load_template()


def test_final_turn_value_carries_the_empty_think_block_and_early_reasoning_is_not_rendered():
    """Qwen3 renders an empty think block on the conversation's last assistant turn (qwen3_nothink
    adds none: the value carries it), reasoning only after the last user query."""
    msgs = [U, {"role": "assistant", "content": "first", "reasoning_content": "early"},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": "\nsecond"}]
    row, ev = export.sharegpt_row(_rec(msgs))
    assert [t["value"] for t in row["conversations"]] == ["fix it", "first", "again", "<think>\n\n</think>\n\nsecond"]
    assert ev == Counter({"reasoning_not_rendered": 1, "empty_think_block": 1})
    assert export.lf_render(row) == _official(msgs)
    msgs[-1]["reasoning_content"] = "\nlate\n"
    row, _ = export.sharegpt_row(_rec(msgs))
    assert row["conversations"][-1]["value"] == "<think>\nlate\n</think>\n\nsecond" and export.lf_render(row) == _official(msgs)


def test_empty_system_prompt_is_lossy_per_row():
    msgs = [{"role": "system", "content": ""}, U, {"role": "assistant", "content": "ok"}]
    rows, events, skipped, lossy = export.convert_split([_rec(msgs, "e")])
    assert "system" not in rows[0] and lossy == [{"traj_id": "e", "reasons": ["empty_system_prompt_dropped"]}]


def test_with_tools_a_chat_without_a_system_prompt_is_lossy_by_two_newlines_and_an_empty_one_is_exact():
    """LLaMA-Factory appends its Qwen tool prompt ("\n\n# Tools...") to the system prompt: with one, or an empty one,
    it renders the official template's block exactly; with none its block opens with a blank line (counted)."""
    call = {"role": "assistant", "content": "", "tool_calls": [_call(1)]}
    reply = {"role": "tool", "content": "a.rs", "tool_call_id": "c1"}
    done = {"role": "assistant", "content": "ok"}
    cases = {"sys": [{"role": "system", "content": "Be brief."}, U, call, reply, done],
             "empty": [{"role": "system", "content": ""}, U, call, reply, done], "none": [U, call, reply, done]}
    rows, events, skipped, lossy = export.convert_split([_rec(m, k) for k, m in cases.items()], [BASH])
    assert not skipped and lossy == [{"traj_id": "none", "reasons": ["tools_block_blank_lines"]}]
    assert events["tools_block_blank_lines"] == 1 and not events["empty_system_prompt_dropped"]
    for row, (k, msgs) in zip(rows, cases.items()):
        got, want = export.lf_render(row), _official(msgs, [BASH])
        assert json.loads(row["tools"]) == [BASH] and want.count("# Tools") == 1
        if k == "none":
            assert got != want and got.replace("<|im_start|>system\n\n\n# Tools", "<|im_start|>system\n# Tools") == want
        else:
            assert got == want, k
    info = export.dataset_info({"demo": "demo/train", "other": "other/train"}, {"demo"})
    assert info["demo"]["columns"]["tools"] == "tools" and "tools" not in info["other"]["columns"]
    # a tools list keeps its key order in the jsonl (the rest sorted): the template's tojson renders that order
    line = export.jsonl([{"z": 1, "a": 2, "tools": [BASH]}]).decode()
    assert line == '{"a": 2, "z": 1, "tools": ' + json.dumps([BASH]) + "}\n"


def _rec(msgs, traj_id="t"):
    return {"messages": msgs, "traj_id": traj_id, "teacher": "x"}


U = {"role": "user", "content": "fix it"}


def _call(i, name="bash", args='{"command": "ls"}'):
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}


def test_parallel_calls_reasoning_system_and_joined_replies():
    msgs = [{"role": "system", "content": "sys"}, U,
            {"role": "assistant", "content": "two at once", "reasoning_content": "plan", "tool_calls": [_call(1), _call(2, "edit", {"path": "a"})]},
            {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "A"},
            {"role": "tool", "tool_call_id": "c2", "content": "B"},
            {"role": "assistant", "content": "", "tool_calls": [_call(3, args='{"command":"ls"}')]},
            {"role": "tool", "tool_call_id": "c3", "content": "C"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "thanks"}]
    row, ev = export.sharegpt_row(_rec(msgs))
    assert row["system"] == "sys"
    assert [t["from"] for t in row["conversations"]] == ["human", "function_call", "observation", "gpt", "observation", "gpt"]
    # the trailing user turn is the last query: Qwen3 renders no reasoning before it, nor an empty think block
    assert row["conversations"][1]["value"] == ('two at once\n<tool_call>[{"name": "bash", "arguments": {"command": "ls"}}, '
                                                '{"name": "edit", "arguments": {"path": "a"}}]</tool_call>')
    assert row["conversations"][2]["value"] == "A" + SEP + "B"
    # arguments text LLaMA-Factory would re-dump ({"command":"ls"}): the call verbatim, as Qwen3 renders it
    assert row["conversations"][3]["value"] == '<tool_call>\n{"name": "bash", "arguments": {"command":"ls"}}\n</tool_call>'
    assert ev == Counter({"tool_call_ids_dropped": 3, "tool_reply_ids_dropped": 3, "names_dropped:tool": 1, "tool_calls_as_text": 1,
                          "trailing_turns_dropped": 1, "reasoning_not_rendered": 1, "parallel_tool_calls": 1,
                          "function_call_with_text": 1, "tool_replies_joined": 1})
    assert export.check_row(row, ev, msgs) == ["trailing_turns_dropped"]
    assert _official(msgs).startswith(export.lf_render(row))
    kept, n = export.messages_row(_rec(msgs))  # the messages export keeps everything, object arguments as their text
    assert n == 1 and kept["messages"][2]["tool_calls"][1]["function"]["arguments"] == '{"path": "a"}'
    assert kept["messages"][:2] + kept["messages"][3:] == msgs[:2] + msgs[3:] and _official(kept["messages"]) == _official(msgs)
    more = msgs[:-1] + [{"role": "user", "content": "more"}, {"role": "assistant", "content": "bye"}]
    row, ev = export.sharegpt_row(_rec(more))
    assert ev["reasoning_not_rendered"] == 1 and row["conversations"][-1]["value"] == "<think>\n\n</think>\n\nbye"
    assert export.check_row(row, ev, more) == [] and export.lf_render(row) == _official(more)
    msgs = msgs[:-1]  # now the last query is "fix it": the reasoning is rendered, "done" is the last turn
    row, ev = export.sharegpt_row(_rec(msgs))
    assert row["conversations"][1]["value"].startswith("<think>\nplan\n</think>\n\ntwo at once\n<tool_call>[")
    assert row["conversations"][-1]["value"] == "<think>\n\n</think>\n\ndone"
    assert export.check_row(row, ev, msgs) == [] and export.lf_render(row) == _official(msgs)


@pytest.mark.parametrize("msgs,reason", [
    ([U, {"role": "assistant", "content": "a", "tool_calls": [_call(1)]}, {"role": "tool", "tool_call_id": "c1", "content": "x"},
      {"role": "user", "content": "more"}, {"role": "assistant", "content": "b"}], "user_after_user"),
    ([U, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "assistant_after_assistant"),
    ([{"role": "assistant", "content": "hi"}, U, {"role": "assistant", "content": "b"}], "assistant_before_user"),
    ([U, {"role": "system", "content": "late"}, {"role": "assistant", "content": "b"}], "system_not_first"),
])
def test_unrepresentable_chats_are_skipped_with_a_reason(msgs, reason):
    rows, events, skipped, lossy = export.convert_split([_rec(msgs, "bad"), _rec([U, {"role": "assistant", "content": "ok"}], "good")])
    assert len(rows) == 1 and skipped == [{"traj_id": "bad", "reason": reason, "detail": skipped[0]["detail"]}]
    assert reason in export.SKIP_REASONS and "\n" not in skipped[0]["detail"]


def test_every_kept_hostile_row_exports_or_is_skipped_with_a_reason():
    rows = [(T.Source("f", i), r) for i, (k, r) in enumerate(H.corpus_rows())]
    res = T.transform_rows(rows, "hostile", {"drop_roles": ["exit"], "dedup_traj_id": True})
    recs = res.records["train"] + res.records["validation"]
    for rec in recs:  # one type per column (datasets <= 4.0 fails otherwise), the same text rendered
        kept, _ = export.messages_row(rec, [BASH])
        assert all(isinstance(c["function"]["arguments"], str) for m in kept["messages"] for c in m.get("tool_calls", ()))
        assert _official(kept["messages"], kept["tools"]) == _official(rec["messages"], [BASH])
    out, events, skipped, lossy = export.convert_split(recs, [BASH])  # raises if a row renders otherwise
    assert len(out) + len(skipped) == len(recs) and len(out) > 20
    for row, rec in zip(out, [r for r in recs if r["traj_id"] not in {s["traj_id"] for s in skipped}]):
        _check_sharegpt(row, export.LF_TAGS)
        assert _renders_as_trained(json.loads(json.dumps(row)), rec) or rec["messages"][0] == {"role": "system", "content": ""}, \
            rec["traj_id"]


def test_export_hash_covers_data_and_weights_not_cosmetics(tmp_path):
    base = make_plan(tmp_path).target("demo")["export"]
    assert base.location.endswith(f"exports/{base.name}") and base.manifest.endswith("exports/demo/manifest.json")
    assert make_plan(tmp_path, wandb={"project": "other"}).target("demo")["export"].hash == base.hash
    assert make_plan(tmp_path, training={"learning_rate": 1e-3}).target("demo")["export"].hash == base.hash
    assert make_plan(tmp_path, teachers={"demo": {"training": {"seq_len": 2048}}}).target("demo")["export"].hash != base.hash
    assert make_plan(tmp_path, transform={"resolved_only": True}).target("demo")["export"].hash != base.hash
    cfg = C.load()
    plan = C.Plan(cfg)
    mix = plan.target("mix-minimax-gemini")["export"]
    assert set(mix.spec["shards"]) == {"minimax-m2.5", "gemini-3-flash"}
    w = dict(cfg["mixtures"]["mix-minimax-gemini"]["teachers"])
    w["gemini-3-flash"] = w["gemini-3-flash"] * 3
    cfg2 = C.load(None, {"mixtures": {"mix-minimax-gemini": {"teachers": w}}})
    assert C.Plan(cfg2).target("mix-minimax-gemini")["export"].hash != mix.hash


def test_mixture_export_has_every_teacher_and_the_weights(tmp_path):
    demo = {"dataset": "demo/dataset", "revision": "local", "rows": 60, "student": "tiny", "transform": {"heldout_fraction": 0.1}}
    plan = make_plan(tmp_path, teachers={"demo2": demo}, mixtures={"mix-demo": {"teachers": {"demo": 3, "demo2": 1}, "student": "tiny"}})
    build_shards(plan)
    names = {a.kind: a.name for a in plan.chain("demo2")}
    download.download(step_configs.download(plan, names["raw"]))
    shard.shard(step_configs.shard(plan, names["shards"]))
    res = export.export(step_configs.export(plan, "mix-demo"))
    out = Path(plan.target("mix-demo")["export"].location)
    info = json.loads((out / "llamafactory" / "dataset_info.json").read_text())
    assert set(info) == {"demo", "demo_validation", "demo2", "demo2_validation"}
    assert res["mix"]["weights"] == {"demo": 0.75, "demo2": 0.25}
    assert res["mix"]["llamafactory_args"] == {"dataset": "demo,demo2", "mix_strategy": "interleave_under", "interleave_probs": "0.75,0.25"}
    args = res["llamafactory"]["train_args"]
    assert {k: args[k] for k in ("dataset", "eval_dataset", "mix_strategy", "interleave_probs", "template")} == {
        "dataset": "demo,demo2", "eval_dataset": "demo_validation,demo2_validation", "mix_strategy": "interleave_under",
        "interleave_probs": "0.75,0.25", "template": "qwen3_nothink"}
    for t in ("demo", "demo2"):
        assert len(_load(sorted((out / "messages" / t).glob("train-*.jsonl")))) == res["teachers"][t]["messages_rows"]["train"]


@pytest.mark.integration
def test_snakemake_export_rule_on_the_demo(tmp_path):
    """The real rule (download -> shard -> export, no training: ~20 s): manifest, log, benchmark."""
    from pipeline_utils import run

    run(tmp_path, "results/exports/demo/manifest.json")
    m = json.loads((tmp_path / "results/exports/demo/manifest.json").read_text())
    plan = make_plan(tmp_path)  # same config, so the same content-addressed name
    assert m["name"] == plan.target("demo")["export"].name and m["hash_inputs"]["format"] == KINDS["exports"].format
    out = tmp_path / m["location"]  # storage_root `results`, relative to the workdir
    assert (out / "llamafactory" / "dataset_info.json").exists() and (out / "manifest.json").exists()
    assert m["messages"]["rows"] == 55 and m["llamafactory"]["rows"] + m["llamafactory"]["skipped_total"] == 55
    assert (tmp_path / "benchmarks/export/demo.tsv").exists() and (tmp_path / "logs/export/demo.log").exists()
    assert (tmp_path / "results/exports/demo/skipped.jsonl").exists()


def test_trainers_requirements_pin_the_documented_versions():
    """envs/trainers-requirements.txt (scripts/check_trainers.py's environment) holds every pin of its
    .in file, and the transformers trajsft's uv.lock has."""
    import re

    envs = C.REPO_DIR / "envs"
    pins = [x for x in (envs / "trainers-requirements.in").read_text().splitlines() if x and not x.startswith("#")]
    compiled = set((envs / "trainers-requirements.txt").read_text().splitlines())
    assert pins and all(p in compiled for p in pins), [p for p in pins if p not in compiled]
    lock = (C.REPO_DIR / "uv.lock").read_text()
    [locked] = re.findall(r'name = "transformers"\nversion = "([^"]+)"', lock)
    assert f"transformers=={locked}" in pins and "llamafactory==0.9.5" in pins


def _check_trainers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_trainers", C.REPO_DIR / "scripts" / "check_trainers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_trainers_judges_token_agreement():
    """The check's comparison: TRL must equal trajsft; LLaMA-Factory may add the newline after a trained
    <|im_end|> (9 here) and, for a lossy row, render a prefix; anything else is a failure."""
    ck = _check_trainers()
    ids, mask = [1, 2, 3, 9, 5, 6, 7, 9, 5], [0, 0, 1, 1, 0, 0, 1, 1, 0]
    d = {"seq_len": 6, "trajsft": [{"ids": ids, "mask": mask, "in_llamafactory": True, "lossy": False},
                                   {"ids": ids, "mask": mask, "in_llamafactory": True, "lossy": True}]}
    lf_full = {"ids": ids, "trained": [2, 3, 4, 6, 7, 8]}
    lf_prefix = {"ids": ids[:8], "trained": [2, 3, 4, 6, 7]}
    trl = {"ids": ids[:6], "trained": [2, 3]}
    probe = {"trl": [trl, trl], "llamafactory": {str(ck.NO_TRUNCATION): [lf_full, lf_prefix], "6": [{"ids": [1], "trained": []}] * 2}}
    f = ck.compare(d, probe, im_end=9)
    assert f["failures"] == [] and f["llamafactory_fit_seq_len"] == 0 and f["llamafactory_trained_equal_plus_newline"] == 2
    bad = {**probe, "trl": [trl, {"ids": ids[:6], "trained": [2, 3, 4]}]}
    assert ck.compare(d, bad, im_end=9)["failures"][0].startswith("TRL: ids 2/2, trained 1/2")
    bad = {**probe, "llamafactory": {**probe["llamafactory"], str(ck.NO_TRUNCATION): [lf_prefix, lf_prefix]}}
    assert any(m.startswith("LLaMA-Factory (no truncation)") for m in ck.compare(d, bad, im_end=9)["failures"])
