"""Next-action scores (trajsft.report.actions) on the demo teacher's held-out chats, proven honest: the replay model
(the teacher's own turns) scores 1.0 on every agreement, a constant-text model exactly what the data says it should,
and output that does not parse is counted, never an error. The trained student: tests/test_pipeline.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from trajsft.data import download, shard
from trajsft.data.turns import Call, Parsed, parse_message
from trajsft.errors import DataError
from trajsft.plan import config as C
from trajsft.plan import step_configs
from trajsft.report import actions as A


def _shards(tmp_path, heldout: float) -> str:
    plan = C.Plan(C.load(None, {"storage_root": str(tmp_path / "store"),
                                "teachers": {"demo": {"transform": {"heldout_fraction": heldout}}}}),
                  base_dir=C.REPO_DIR, state_dir=str(tmp_path / "state"))
    names = {a.kind: a.name for a in plan.chain("demo")}
    download.download(step_configs.download(plan, names["raw"]))
    cfg = step_configs.shard(plan, names["shards"])
    shard.shard(cfg)
    return cfg.location


@pytest.fixture(scope="module")
def turns(tmp_path_factory):
    return A.held_out_turns("demo", _shards(tmp_path_factory.mktemp("actions"), 0.1), max_turns=40)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(C.REPO_DIR / "demo" / "tokenizer"))


def test_the_sample_is_deterministic_capped_and_held_out(turns, tmp_path):
    assert 0 < len(turns) <= 40 and all(t.reference["role"] == "assistant" for t in turns)
    assert len({(t.traj_id, t.index) for t in turns}) == len(turns)
    again = A.held_out_turns("demo", _shards(tmp_path, 0.1), max_turns=5)
    assert [(t.traj_id, t.index) for t in again] == [(t.traj_id, t.index) for t in turns[:5]]
    assert any(t.reference.get("tool_calls") for t in turns) and any(not t.reference.get("tool_calls") for t in turns)


def test_the_replay_model_scores_one_on_every_agreement(turns, tok):
    got = A.evaluate(A.Replay(tok), turns)
    assert got["turns"] == len(turns) and got["unparsed"] == 0 and got["tokens"] > 0
    assert {k: got[k] for k in A.AGREEMENTS} == {k: 1.0 for k in A.AGREEMENTS}
    assert got["applies_to"]["tool_name"] == sum(bool(t.reference.get("tool_calls")) for t in turns)


def test_a_constant_text_model_scores_what_the_data_says(turns):
    got = A.evaluate(A.ConstantText("I am done."), turns)
    with_calls = [t for t in turns if t.reference.get("tool_calls")]
    ends = [A.ends_episode(parse_message(t.reference)) for t in turns]
    assert got["valid"] == 1.0 and got["unparsed"] == 0
    assert got["tool_or_text"] == pytest.approx(1 - len(with_calls) / len(turns))
    assert got["ends_episode"] == pytest.approx(sum(ends) / len(turns))  # text ends an episode
    assert got["tool_name"] == got["arguments_exact"] == got["command_program"] == got["command_similarity"] == 0.0


def test_output_that_does_not_parse_is_counted_not_raised(turns):
    class Broken:
        name = "broken"

        def answer(self, ts):
            return [('<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>', False, 64) for _ in ts]

    got = A.evaluate(Broken(), turns)
    assert got["valid"] == 0.0 and got["unparsed"] == len(turns) and got["tokens"] == 64


def test_each_metric_on_one_turn():
    ls = Parsed("", (Call("bash", {"command": "ls  -la src"}),), True)
    teacher = Parsed("", (Call("bash", {"command": "ls -la"}),), True)
    got = A.score(ls, True, teacher)
    assert got["valid"] == got["tool_or_text"] == got["tool_name"] == got["command_program"] == 1.0
    assert got["arguments_exact"] == 0.0 and 0.7 < got["command_similarity"] < 1.0 and got["ends_episode"] == 1.0
    submit = Parsed("", (Call("bash", {"command": f"echo {A.SUBMIT} && git diff"}),), True)
    assert A.score(ls, True, submit)["ends_episode"] == 0.0 and A.ends_episode(submit)
    other = A.score(Parsed("", (Call("str_replace", {"path": "a"}),), True), False, teacher)
    assert other["valid"] == 0.0 and other["tool_name"] == 0.0 and other["command_program"] == 0.0  # cut by the cap
    text = A.score(Parsed("done", (), True), True, Parsed("All fixed.", (), True))
    assert text["tool_name"] is None and text["tool_or_text"] == 1.0 and text["ends_episode"] == 1.0
    # arguments written as a JSON string or an object are the same action
    same = parse_message({"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls -la"})}}]})
    assert A.score(same, True, teacher)["arguments_exact"] == 1.0


def _bash(cmd: str) -> Call:
    return Call("bash", {"command": cmd})


def test_every_tool_call_of_a_turn_is_compared_by_position():
    """A turn with two calls: the student must make both, in order; a missing, extra, renamed or changed second call
    counts (the first call alone used to decide every figure)."""
    teacher = Parsed("", (_bash("cargo test -q"), _bash("git diff")), True)
    same = A.score(teacher, True, teacher)
    assert {k: same[k] for k in ("tool_name", "arguments_exact", "command_program", "command_similarity")} == \
        {"tool_name": 1.0, "arguments_exact": 1.0, "command_program": 1.0, "command_similarity": 1.0}
    first_only = A.score(Parsed("", (_bash("cargo test -q"),), True), True, teacher)
    assert (first_only["tool_name"], first_only["arguments_exact"], first_only["command_program"]) == (0.0, 0.0, 0.0)
    assert first_only["command_similarity"] == 0.5  # one of the two commands matched exactly, the other missing
    second_differs = A.score(Parsed("", (_bash("cargo test -q"), _bash("git status")), True), True, teacher)
    assert second_differs["tool_name"] == 1.0 and second_differs["arguments_exact"] == 0.0
    assert second_differs["command_program"] == 1.0 and 0.5 < second_differs["command_similarity"] < 1.0
    renamed = A.score(Parsed("", (_bash("cargo test -q"), Call("str_replace", {"path": "a"})), True), True, teacher)
    assert renamed["tool_name"] == 0.0 and renamed["command_program"] == 0.0
    extra = A.score(Parsed("", (*teacher.calls, _bash("ls")), True), True, teacher)
    assert extra["tool_name"] == extra["arguments_exact"] == extra["command_program"] == 0.0
    assert extra["command_similarity"] == pytest.approx(2 / 3)
    # a turn submits when any of its calls does
    submits = Parsed("", (_bash("cargo test -q"), _bash(f"echo {A.SUBMIT} && git diff")), True)
    assert A.ends_episode(submits) and A.score(Parsed("", (_bash("ls"),), True), True, submits)["ends_episode"] == 0.0


def test_the_replay_model_scores_one_on_a_turn_with_two_calls(turns, tok):
    """The replay proof on a held-out turn whose teacher made two calls (a real turn, its second call added): every
    agreement 1.0; a model answering with the first call alone does not."""
    [base] = [t for t in turns if len(t.reference.get("tool_calls") or []) == 1][:1]
    second = {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": json.dumps(
        {"command": "git diff"})}}
    two = dataclasses.replace(base, reference={**base.reference, "tool_calls": [*base.reference["tool_calls"], second]})
    assert len(parse_message(two.reference).calls) == 2
    got = A.evaluate(A.Replay(tok), [two])
    assert {k: got[k] for k in A.AGREEMENTS} == {k: 1.0 for k in A.AGREEMENTS}
    one = A.evaluate(A.Replay(tok), [base])  # the teacher's first call only, scored against the two
    text, ended, n = A.Replay(tok).answer([base])[0]

    class FirstOnly:
        name = "first-only"

        def answer(self, ts):
            return [(text, ended, n) for _ in ts]

    partial = A.evaluate(FirstOnly(), [two])
    assert one["tool_name"] == 1.0 and partial["tool_name"] == 0.0 and partial["arguments_exact"] == 0.0


def test_an_empty_held_out_split_says_which_setting_to_change(tmp_path):
    with pytest.raises(DataError) as e:
        A.held_out_turns("demo", _shards(tmp_path, 0.0), max_turns=8)
    assert "demo: the held-out split is empty" in str(e.value) and "teachers.demo.transform.heldout_fraction" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_table_is_student_by_teacher():
    rows = {"replay": {"demo": {"valid": 1.0, "tool_name": 1.0}}, "demo-abc": {"demo": {"valid": 0.5, "tool_name": None}}}
    text = A.table(rows, ("valid", "tool_name"))
    assert "valid:" in text and "1.000" in text and "0.500" in text and text.count("\n") == 7


# ---- the evals artifact (rule eval_actions) ----------------------------------------------------------
def test_a_targets_evaluation_is_content_addressed_by_its_run_held_out_chats_and_settings():
    """evals/<target>/done is one artifact per target: its name changes with the run, the held-out shard sets and
    the actions: settings (the target's own over the config's), and its step config says exactly what it scores."""
    plan = C.Plan(C.load(), base_dir=C.REPO_DIR)
    ev = step_configs.eval_actions(plan, "demo")
    art = plan.target("demo")["evals"]
    assert (ev.target, ev.name, ev.location) == ("demo", art.name, art.location) and art.manifest == "evals/demo/done"
    assert (ev.max_turns, ev.max_tokens) == (8, 64)  # the demo's own actions: over the config's (32, 256)
    assert ev.held_out == {"demo": plan.shards("demo").location} and ev.train.run is plan.target("demo")["run"]
    assert art.inputs["run"] == ev.train.run.hash and art.inputs["held_out"] == [
        {"teacher": "demo", "shards": plan.shards("demo").hash}]
    assert (step_configs.eval_actions(plan, "gpt-5-mini").max_turns,
            step_configs.eval_actions(plan, "gpt-5-mini").max_tokens) == (32, 256)
    other = C.Plan(C.load(None, {"teachers": {"demo": {"actions": {"teachers": ["demo", "gpt-5-mini"]}}}}),
                   base_dir=C.REPO_DIR)
    assert list(step_configs.eval_actions(other, "demo").held_out) == ["demo", "gpt-5-mini"]
    assert other.target("demo")["evals"].name != art.name and other.target("demo")["run"].name == ev.train.run.name
    # the engine's batch (actions.max_seqs) reaches the evaluation and names nothing: a greedy turn is the same in any
    assert ev.max_seqs is None
    batched = C.Plan(C.load(None, {"actions": {"max_seqs": 1}}), base_dir=C.REPO_DIR)
    assert step_configs.eval_actions(batched, "demo").max_seqs == 1 and batched.target("demo")["evals"].name == art.name


def test_a_teacher_that_holds_out_nothing_says_which_setting_to_change():
    plan = C.Plan(C.load(), base_dir=C.REPO_DIR)
    assert step_configs.held_out_problem(plan, "demo") is None
    why = step_configs.held_out_problem(plan, "mix-minimax-gemini")
    assert why.startswith("teacher 'gemini-3-flash' holds out no chats (its transform.heldout_fraction is 0): set "
                          "teachers.gemini-3-flash.transform.heldout_fraction (or eval.heldout_fraction) above 0")
    with pytest.raises(C.ConfigError, match=r"^config: teachers\.demo\.actions\.teachers: unknown teacher 'nope' "):
        C.load(None, {"teachers": {"demo": {"actions": {"teachers": ["nope"]}}}})
    with pytest.raises(C.ConfigError, match=r"actions\.max_tokens: 0 is not allowed \(allowed: >= 1\)"):
        C.load(None, {"actions": {"max_tokens": 0}})


def test_the_reports_table_holds_every_split_and_figure():
    result = {"target": "demo", "model": "demo-0123456789", "max_turns": 8, "max_tokens": 64,
              "splits": {"demo": {"turns": 8, "valid": 0.25, "tool_or_text": 1.0, "tool_name": None,
                                  "arguments_exact": None, "command_program": None, "command_similarity": None,
                                  "ends_episode": 0.5, "tokens": 12.5, "unparsed": 1}}}
    page = A.render_html([result])
    assert page.count("<table") == 1 and "demo-0123456789" in page and "(8, 64)" in page
    row = page.split('<th class="row">')[1]
    assert "<td>8</td><td>0.250</td><td>1.000</td><td>-</td>" in row and "<td>12.500</td><td>1</td>" in row


# ---- streaming per chat, the side-by-side file ---------------------------------------------------------
class Counting:
    """The constant-text model, counting the turns it is asked; ``stop_after``: interrupted (as a kill would) once it
    has answered that many batches."""

    name = "counting"

    def __init__(self, stop_after: int | None = None):
        self.asked, self.batches, self.stop_after = [], 0, stop_after

    def answer(self, ts):
        if self.stop_after is not None and self.batches >= self.stop_after:
            raise KeyboardInterrupt("killed")
        self.batches += 1
        self.asked += [(t.traj_id, t.index) for t in ts]
        return [("I am done.", True, 3) for _ in ts]


def _cfg(tmp_path, location: str, max_turns: int = 12) -> step_configs.EvalActionsConfig:
    return step_configs.EvalActionsConfig(target="demo", name="demo-0123456789", location=location, train=None,
                                          held_out={"demo": _shards(tmp_path, 0.3)}, max_turns=max_turns, max_tokens=8)


def test_an_interrupted_evaluation_reruns_only_the_missing_chats_and_ends_as_an_uninterrupted_one(tmp_path):
    cfg = _cfg(tmp_path, str(tmp_path / "evals" / "demo-0123456789"))
    turns = A.sampled(cfg.held_out, cfg.max_turns)["demo"]
    chats = list(dict.fromkeys(t.traj_id for t in turns))
    assert len(chats) >= 3  # the sample spans several chats
    whole = A.eval_actions(_cfg(tmp_path, str(tmp_path / "whole")), model=Counting())
    # answered two turns at a time, killed after the second batch: the chats completed by then are on disk
    first = Counting(stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        A.score_chats(lambda: first, {"demo": turns}, cfg.location, batch=lambda m: 2)
    kept = list((tmp_path / "evals/demo-0123456789/chats").glob("*.json"))
    assert 0 < len(kept) < len(chats) and len(first.asked) == 4
    again = Counting()
    result = A.eval_actions(cfg, model=again)
    assert (result["chats"], result["chats_reused"], result["chats_scored"]) == (len(chats), len(kept),
                                                                                   len(chats) - len(kept))
    done_turns = {(json.loads(p.read_text())["traj_id"], r["index"]) for p in kept
                  for r in json.loads(p.read_text())["turns"]}
    assert set(again.asked) == {(t.traj_id, t.index) for t in turns} - done_turns  # only the missing chats' turns
    assert result["splits"] == whole["splits"] and result["splits"]["demo"]["turns"] == len(turns)
    assert json.loads((tmp_path / "evals/demo-0123456789/actions.json").read_text())["splits"] == whole["splits"]
    # everything scored: a rerun asks the model nothing (a real student is not even loaded)
    never = Counting(stop_after=0)
    assert A.eval_actions(cfg, model=never)["chats_scored"] == 0 and never.asked == []


def test_the_side_by_side_file_shows_context_teacher_and_student(tmp_path):
    cfg = _cfg(tmp_path, str(tmp_path / "sbs"), max_turns=3)
    result = A.eval_actions(cfg, model=A.ConstantText("I am done."))
    text = (tmp_path / "sbs" / A.SIDE_BY_SIDE).read_text()
    assert result["side_by_side"] == str(tmp_path / "sbs" / A.SIDE_BY_SIDE)
    turns = A.sampled(cfg.held_out, 3)["demo"]
    assert "## demo: the first 3 of 3 scored turns" in text and text.count("**teacher**") == 3
    assert text.count("**student**") == 3 and text.count("I am done.") >= 3 and "(context)" in text
    for t in turns:
        assert f"### {t.traj_id}, turn {t.index}" in text
    call = next((t for t in turns if t.reference.get("tool_calls")), None)
    if call is not None:  # a teacher's tool call is shown as name(arguments)
        assert f"{call.reference['tool_calls'][0]['function']['name']}(" in text


# ---- the teacher's tools in every prompt, and turns with no room to answer (issue 64) ----------------------------
def test_prompts_render_with_the_tools_the_student_trained_with(turns, tok, tmp_path):
    from trajsft.plan.tools import BASH

    plan = C.Plan(C.load(), base_dir=C.REPO_DIR)
    assert step_configs.eval_actions(plan, "demo").tools == {"demo": [BASH]}
    bare = C.Plan(C.load(None, {"teachers": {"demo": {"tools": []}}}), base_dir=C.REPO_DIR)
    assert step_configs.eval_actions(bare, "demo").tools == {"demo": None}
    # another teacher's split is prompted with the target's own tools (what its student trained with)
    other = C.Plan(C.load(None, {"tools": [], "teachers": {"demo": {"tools": "bash", "actions": {
        "teachers": ["demo", "gpt-5-mini"]}}}}), base_dir=C.REPO_DIR)
    assert step_configs.eval_actions(other, "demo").tools == {"demo": [BASH], "gpt-5-mini": [BASH]}
    with_tools = A.held_out_turns("demo", _shards(tmp_path, 0.1), max_turns=40, tools=[BASH])
    for t, bare_turn in zip(with_tools, turns):
        text = A.prompt_text(tok, t)
        assert text.startswith("<|im_start|>system\n") and text.count("# Tools\n") == 1
        assert text.endswith(A.prompt_text(tok, bare_turn).split("<|im_start|>user", 1)[1])
        assert json.dumps(BASH) in text  # the schema as the template writes it (tojson: the key order kept)
    # the teacher's own turns, rendered with the tools: still every agreement
    got = A.evaluate(A.Replay(tok), with_tools)
    assert {k: got[k] for k in A.AGREEMENTS} == {k: 1.0 for k in A.AGREEMENTS} and got["skipped_no_room"] == 0


def test_a_turn_whose_prompt_fills_the_context_is_skipped_and_counted(turns, tok, monkeypatch):
    """The student (through the engine's generate) is not asked a turn whose prompt leaves it no room to generate:
    the turn is skipped and counted, the rest are scored; the engine refuses such a prompt in one line."""
    from trajsft.errors import ConfigError
    from trajsft.train import generate

    lengths = sorted(len(tok.encode(A.prompt_text(tok, t), add_special_tokens=False)) for t in turns)
    cut = lengths[len(lengths) // 2]  # the longer half of the prompts fill a context of this many tokens

    class Loaded:
        tokenizer, max_seq_len = tok, cut

    asked = []

    def fake_generate(loaded, prompts, max_tokens):
        asked.extend(prompts)
        assert all(generate.room(loaded, p) > 0 for p in prompts)
        return [(tok.encode("done", add_special_tokens=False), True) for _ in prompts]

    monkeypatch.setattr(generate, "generate", fake_generate)
    full = sum(n >= cut for n in lengths)
    got = A.evaluate(A.Student("demo-x", Loaded(), 8), turns)
    assert got["skipped_no_room"] == full > 0 and got["turns"] == len(turns) - full == len(asked)
    assert got["valid"] == 1.0
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=rf"^prompt 0 holds {cut} tokens: no room to generate within the model's "
                                          rf"seq_len {cut}$"):
        generate.generate(Loaded(), [[1] * cut], 8)
    text = A.side_by_side({"demo": turns[:1]}, {"demo": [A.answered(turns[0], None)]}, "demo-x")
    assert "not asked: the prompt fills the student's seq_len (skipped, counted)" in text
