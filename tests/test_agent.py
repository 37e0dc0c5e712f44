"""The agent evaluation's parts without a model (issue 69): the harness file, the gold fix as bash commands, the
scripted models' turns through the chat route's own submit contract, and the CLI's one-line refusals. The episodes
themselves (mini-swe-agent against the demo's student, the replay and a model that only submits, a killed evaluation
resumed) run in tests/test_pipeline.py on the trained demo."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from test_tasks import diff_of  # a bug in mini_math as a git diff

from trajsft.agent import harness as H
from trajsft.agent import replay as R
from trajsft.errors import ConfigError
from trajsft.plan import config as C
from trajsft.plan import step_configs
from trajsft.tasks import grade as G
from trajsft.tasks.record import Task

REPO = C.REPO_DIR
MINI = REPO / "tasks/demo/crates/mini_math"


def _task(patch: str) -> Task:
    return Task(instance_id="mini_math.t", repo="mini_math", patch=patch, FAIL_TO_PASS=("tests::x",), PASS_TO_PASS=(),
                problem_statement="mini_math: x fails\n\nbody")


def test_the_gold_fix_as_sed_commands_undoes_the_bug_line_for_line(tmp_path):
    """Each changed line becomes the smallest substitution that is found first on its line (widened where the
    differing text appears earlier on it); applied by bash to the bugged copy, the copy is the original again."""
    assert R._edit(3, "    if x > lo {", "    if x < lo {") == "3s/>/</"
    assert R._edit(7, "a + b + c", "a + b - c") == "7s/b +/b -/"  # the first '+' is not the one that changed
    assert R._edit(2, "x.len() == 0", "!(x.len() == 0)") == r"2s/x\.len() == 0/!(x.len() == 0)/"
    assert R._edit(1, "f(a*b, [c])", "f(a*b, c)") == r"1s/\[c\]/c/"
    bug = diff_of({"if x < lo {": "if !(x < lo) {", "} else if x > hi {": "} else if x < hi {"})
    [cmd] = R.gold_commands(_task(bug))
    assert cmd.startswith("sed -i '") and cmd.endswith(" 'src/lib.rs'") and cmd.count("s/") == 2
    repo = tmp_path / "r"
    G.checkout(MINI, repo, bug)
    subprocess.run(["bash", "-c", cmd], cwd=repo, check=True)
    assert (repo / "src/lib.rs").read_text() == (MINI / "src/lib.rs").read_text()
    added = "diff --git a/src/lib.rs b/src/lib.rs\n--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,1 +1,2 @@\n x\n+y\n"
    with pytest.raises(ValueError, match="no line-for-line gold edit"):
        R.gold_commands(_task(added))


def test_the_scripted_models_answer_each_episode_by_its_turn():
    """The replay's n-th turn is its script's n-th command as a Qwen3 tool call, closed with the end-of-turn token;
    an unknown episode or a turn past the script is plain text (mini-swe-agent's format error)."""
    from transformers import AutoTokenizer

    from trajsft.serve import chat
    from trajsft.train.generate import END_OF_TURN

    tok = AutoTokenizer.from_pretrained(REPO / "demo/tokenizer")
    script = {"a": ["ls", R.SUBMIT_COMMAND]}
    submit = R.submitter(tok, script, END_OF_TURN)
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    second = first + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"}]

    def answer(msgs, user):
        [r] = asyncio.run(submit(chat.render(tok, msgs, None), 64, 0.0, None, 1, user=user))
        assert r.tokens[-1] == tok.convert_tokens_to_ids(END_OF_TURN)
        return chat.assistant_message(tok.decode(r.tokens[:-1]), ended=True, stops=[])[0]

    calls = lambda m: [json.loads(c["function"]["arguments"])["command"] for c in m.get("tool_calls") or []]  # noqa: E731
    assert calls(answer(first, "a")) == ["ls"]
    assert calls(answer(second, "a")) == [R.SUBMIT_COMMAND]
    assert calls(answer(first, "b")) == [] and "no turn 0 for episode 'b'" in answer(first, "b")["content"]
    assert R.script("submit", [_task(diff_of({"x < lo": "x > lo"}))]) == {"mini_math.t": [R.SUBMIT_COMMAND]}
    with pytest.raises(ValueError, match="unknown built-in model 'oracle'"):
        R.script("oracle", [])


def test_the_demo_harness_is_the_demo_teachers_prompts():
    """config/agent/demo.yaml: the demo trajectories' system prompt verbatim and their user template, rendered by
    mini-swe-agent's jinja for a task, equal to the template's own rendering."""
    from jinja2 import StrictUndefined, Template

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from demo_assets.prompts import SYSTEM_PROMPT, USER_TEMPLATE
    finally:
        sys.path.remove(str(REPO / "scripts"))
    h = H.load(REPO / "config/agent/demo.yaml")
    assert h.system_template == SYSTEM_PROMPT
    title, body = "mini_math: clamp_above fails", "`tests::clamp_above` fails:\npanicked"
    got = Template(h.instance_template, undefined=StrictUndefined).render(task=f"{title}\n\n{body}", repo="mini_math")
    assert got == USER_TEMPLATE.format(title=title, body=body, repo_dir="mini_math", extra="Do not modify the tests.")
    out = Template(h.observation_template, undefined=StrictUndefined).render(
        output={"output": "x" * 1000, "returncode": 0, "exception_info": ""})
    assert out.startswith("<returncode>0</returncode>\n<output>\n") and "[... 700 characters cut ...]" in out
    assert len(out) < 400


def test_a_bad_harness_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"agent harness .*nope.yaml: no such file$"):
        H.load(tmp_path / "nope.yaml")
    bad = tmp_path / "h.yaml"
    bad.write_text(yaml.safe_dump({"system_template": "s", "instance_template": "", "extra": 1}))
    with pytest.raises(ConfigError, match=r"missing or empty: instance_template, observation_template, "
                                          r"format_error_template; unknown: extra$"):
        H.load(bad)
    bad.write_text("a: [")
    with pytest.raises(ConfigError, match=r"h.yaml: not YAML \("):
        H.load(bad)


def test_the_agent_evaluation_is_planned_per_target_and_hashes_its_inputs(tmp_path):
    """agent/<target>/done, content-addressed by the run, the task set, the harness file's content and the agent:
    settings; another harness text is another evaluation, the task set's sandbox is not."""
    def art(**over):
        p = C.Plan(C.load(None, {"storage_root": str(tmp_path / "s"), **over}), base_dir=REPO,
                   state_dir=str(tmp_path / "r"))
        return p.target("demo")["agent"], p

    a, p = art()
    assert a.manifest == "agent/demo/done" and a.name.startswith("demo-")
    assert a.inputs["run"] == p.target("demo")["run"].hash and a.inputs["task_set"] == p.task_set("demo").hash
    assert (a.inputs["step_limit"], a.inputs["max_tokens"]) == (4, 64)
    assert art(agent={"step_limit": 5})[0].hash != a.hash
    assert art(tasks={"demo": {"crates": "tasks/demo/crates", "sandbox": "none"}})[0].hash == a.hash
    other = tmp_path / "h.yaml"
    shutil.copy(REPO / "config/agent/demo.yaml", other)
    assert art(agent={"harness": str(other)})[0].hash == a.hash  # the same content
    other.write_text(other.read_text().replace("Do not modify the tests.", "Keep the API."))
    assert art(agent={"harness": str(other)})[0].hash != a.hash
    # said when the evaluation is asked for, never by every plan (a config without tasks: plans its trainings)
    bad, p = art(agent={"harness": str(tmp_path / "missing.yaml")})
    with pytest.raises(ConfigError, match=r"^config: demo: agent.harness: .*missing.yaml is not a file$"):
        step_configs.eval_agent(p, "demo")
    bad, p = art(tasks={}, agent={"tasks": "other"})
    with pytest.raises(ConfigError, match=r"^config: demo: agent.tasks: unknown task set 'other' \(config tasks: "
                                          r"demo\)$"):
        step_configs.eval_agent(p, "demo")


def test_the_cli_says_in_one_line_what_is_missing(tmp_path, monkeypatch, capsys):
    import trajsft.cli as cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["eval", "demo", "--agent", "--actions"]) == 2
    assert "--actions are the next-action scores" in capsys.readouterr().err
    assert cli.main(["eval", "demo", "mix-demo", "--agent", "--watch"]) == 2
    assert "--watch follows one target's student: name it" in capsys.readouterr().err
    assert cli.main(["eval", "demo", "--agent", "--watch"]) == 2  # the task set first
    assert "its task set demo-" in capsys.readouterr().err
    assert cli.main(["eval", "nope", "--agent"]) == 2
    assert "unknown target 'nope'" in capsys.readouterr().err
    assert cli.main(["eval", "demo", "--agent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trajsft: demo: its task set demo-") and "is not built: snakemake --cores 2 results/tasks/demo-" in err
    assert err.count("\n") == 1
    assert cli.main(["eval", "demo", "--replay"]) == 2
    assert "use it with --actions or --agent" in capsys.readouterr().err


def test_a_missing_harness_is_one_line_naming_its_group(monkeypatch):
    monkeypatch.setitem(sys.modules, "minisweagent", None)  # as if not installed: its import fails
    assert H.missing() == ("the agent harness is not installed (minisweagent): mini-swe-agent is in the lock's "
                           "`agent` group (uv sync --group agent)")
    monkeypatch.undo()
    assert H.missing() is None


def test_a_host_without_the_sandboxs_tools_is_one_line_before_any_episode(tmp_path, monkeypatch):
    """On a Ray profile the episodes run on a slice's host (trajsft.agent.job): the job's spec carries the
    evaluation's settings, the harness file's text and the located model; a host that lacks a sandbox tool is a
    configuration error naming the host and the tools (the driver's one MARK line, never retried), said before the
    model is loaded or a task read."""
    import dataclasses
    import socket

    from trajsft.agent import job
    from trajsft.errors import JobEnvironmentError
    from trajsft.report.trained import Trained
    from trajsft.tasks import sandbox

    p = C.Plan(C.load(None, {"storage_root": str(tmp_path / "s")}), base_dir=REPO, state_dir=str(tmp_path / "r"))
    cfg = step_configs.eval_agent(p, "demo")
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("train", "harness")}
    trained = Trained(target="demo", name="demo-x", run_dir=str(tmp_path / "nowhere"), source={}, train_cfg={})
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"eval": {**fields, "tasks": str(tmp_path / "no-tasks")},
                                "harness": (REPO / cfg.harness).read_text(), "trained": dataclasses.asdict(trained)}))
    monkeypatch.setattr(sandbox, "missing", lambda kind, needs_cargo=True: ["bwrap (apt-get install bubblewrap)"])
    with pytest.raises(JobEnvironmentError) as e:
        job.episodes_on_host(str(spec))
    assert str(e.value) == (f"the agent evaluation on {socket.gethostname()}: agent demo: the sandbox (bubblewrap) "
                            "needs bwrap (apt-get install bubblewrap)")
    monkeypatch.undo()  # the tools back: past the check, the task set that is not there (the model is not loaded)
    with pytest.raises(Exception, match="no-tasks"):
        job.episodes_on_host(str(spec))


def test_several_targets_are_shown_side_by_side():
    from trajsft.cli.eval import agent_side_by_side

    row = lambda i, ok, st="Submitted": {"instance_id": i, "resolved": ok, "exit_status": st}  # noqa: E731
    a = {"target": "demo", "tasks": 2, "resolved": 1, "resolve_rate": 0.5, "rows": [row("t1", True), row("t2", False)]}
    b = {"target": "mix-all", "tasks": 1, "resolved": 0, "resolve_rate": 0.0,
         "rows": [row("t2", False, "RepeatedFormatError")]}
    assert agent_side_by_side([a, b]) == [
        "TASK      demo                    mix-all",
        "t1        resolved (Submitted)",
        "t2        no (Submitted)          no (RepeatedForm)",
        "RESOLVED  1/2 (50.0%)             0/1 (0.0%)",
    ]


def test_an_online_evaluation_is_a_wandb_run_in_its_trainings_group(tmp_path, monkeypatch):
    """wandb.mode online: the student's evaluation is logged to the stand-in W&B server on loopback (the real SDK):
    the training's project, the training run's name as its group, job agent_eval, the rate in its history and
    summary, every episode's figures in the summary; a refused key is one line."""
    import threading

    from test_wandb_online import BAD, GOOD, wandb_env
    from trajsft.agent.evaluate import to_wandb
    from wandb_stub import make_server

    srv = make_server(0, refused={BAD})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for k, v in wandb_env(srv, tmp_path, GOOD).items():
            monkeypatch.setenv(k, v)
        p = C.Plan(C.load(None, {"storage_root": str(tmp_path / "s"), "wandb": {"mode": "online", "project": "sft"}}),
                   base_dir=REPO, state_dir=str(tmp_path / "r"))
        cfg = step_configs.eval_agent(p, "demo")
        rows = [{"instance_id": "t1", "resolved": True, "exit_status": "Submitted", "steps": 2, "prompt_tokens": 900,
                 "completion_tokens": 50, "seconds": 2.5},
                {"instance_id": "t2", "resolved": False, "exit_status": "LimitsExceeded", "steps": 4,
                 "prompt_tokens": 2000, "completion_tokens": 256, "seconds": 6.0}]
        # a second repeat of each task (agent.repeats: 2): t1 unresolved, t2 resolved this time
        rows += [{**rows[0], "repeat": 1, "resolved": False}, {**rows[1], "repeat": 1, "resolved": True}]
        result = {"resolve_rate": 0.5, "resolved": 2, "tasks": 2, "episodes": 4, "repeats": 2,
                  "repeat_rates": [0.5, 0.5], "resolve_rate_std": 0.0,
                  "exit_statuses": {"LimitsExceeded": 2, "Submitted": 2},
                  "harness": {"step_limit": 4, "max_tokens": 64}, "rows": rows}
        url = to_wandb(cfg, result)
        assert "WANDB_SERVICE" not in os.environ  # the SDK's service is gone with the run: no child process joins it
        run = srv.state["runs"][f"agent-{cfg.name}"]
        assert url and url.endswith(f"agent-{cfg.name}") and run["project"] == "sft"
        assert (run["group"], run["job_type"]) == (cfg.train.run.name, "agent_eval")
        assert run["history"][0]["agent/resolve_rate"] == 0.5 and run["summary"]["agent/resolved"] == 2
        assert run["history"][0]["agent/resolve_rate_std"] == 0.0 and run["history"][0]["agent/n_episodes"] == 4
        assert run["summary"]["agent/episodes"]["t2"]["exit_status"] == "LimitsExceeded"
        assert run["summary"]["agent/episodes"]["t2.r1"]["resolved"] and not run["summary"]["agent/episodes"]["t1.r1"][
            "resolved"]
        assert run["config"]["trajsft"]["value"]["run"] == cfg.train.run.name
        # a refused key (in a process of its own: the SDK keeps the first key it logged in with)
        probe = ("import json, sys; from trajsft.agent.evaluate import to_wandb; from trajsft.plan import config as C, "
                 "step_configs as S; from trajsft.errors import ConfigError\n"
                 f"p = C.Plan(C.load(None, {{'storage_root': {str(tmp_path / 's')!r}, 'wandb': {{'mode': 'online'}}}}))\n"
                 "try:\n    to_wandb(S.eval_agent(p, 'demo'), json.loads(sys.argv[1]))\n"
                 "except ConfigError as e:\n    print(e)")
        refused = subprocess.run([sys.executable, "-c", probe, json.dumps(result)], capture_output=True, text=True,
                                 timeout=120, cwd=tmp_path, env={**os.environ, "WANDB_API_KEY": BAD})
        assert re.match(r"agent demo: W&B: http://127.0.0.1:\d+ refused the API key \(HTTP 401\)", refused.stdout), \
            refused.stdout + refused.stderr[-2000:]
        offline = C.Plan(C.load(None, {"storage_root": str(tmp_path / "s")}), base_dir=REPO,
                         state_dir=str(tmp_path / "r"))
        assert to_wandb(step_configs.eval_agent(offline, "demo"), result) is None
        monkeypatch.setenv("WANDB_MODE", "offline")  # this machine has no way to W&B: nothing asked
        n = len(srv.state["requests"])
        assert to_wandb(cfg, result) is None and len(srv.state["requests"]) == n
    finally:
        srv.shutdown()


def test_the_resolve_rate_report_has_a_point_per_evaluated_export_and_the_final_one(tmp_path):
    """Rule report_agent's entry on two targets' results as the watch and the rule write them: the rows by step (the
    final evaluation last, at the step of the model it ran), a PNG plot, the HTML table beside it."""
    from types import SimpleNamespace

    from trajsft.agent import report
    from trajsft.agent.evaluate import RESULTS, STEPS

    def results(where, target, step, resolved):
        where.mkdir(parents=True, exist_ok=True)
        (where / RESULTS).write_text(json.dumps({
            "target": target, "model": "student", "tasks": 4, "resolved": resolved, "resolve_rate": resolved / 4,
            "exit_statuses": {"Submitted": resolved, "LimitsExceeded": 4 - resolved}, "task_set": "/r/tasks/mini-abc",
            "source": {"kind": "hf_export", "step": step}, "rows": []}))

    markers = []
    for target, evaluated in (("demo", [(14, 1), (27, 2)]), ("mix", [(27, 3)])):
        loc = tmp_path / "agent" / target
        for step, resolved in evaluated[:-1]:  # the watch's, then the rule's final evaluation
            results(loc / STEPS / f"step-{step}", target, step, resolved)
        results(loc, target, *evaluated[-1])
        (tmp_path / f"{target}.done").write_text(json.dumps({"target": target, "location": str(loc)}))
        markers.append(str(tmp_path / f"{target}.done"))
    out = SimpleNamespace(html=str(tmp_path / "r.html"), png=str(tmp_path / "r.png"), json=str(tmp_path / "r.json"))
    report.rule_agent(SimpleNamespace(input=markers, output=out))
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [(r["target"], r["step"], r["final"], r["resolved"]) for r in rows] == [
        ("demo", 14, False, 1), ("demo", 27, True, 2), ("mix", 27, True, 3)]
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "r.html").read_text()
    assert 'src="r.png"' in page and "<td>2/4</td><td>50.0%</td>" in page and "mini-abc" in page


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_watched_export_is_evaluated_into_its_steps_location_here_or_as_a_ray_job(tmp_path, monkeypatch, executor):
    """`trajsft eval --agent --watch`'s one export (agent.watch.at_step): the export of that step, into
    steps/step-<N>/ of the evaluation, without a W&B run of its own; here the episodes run in this process, on a Ray
    profile the rule's submitter runs them as a Ray job named by the step (its log the step's own)."""
    from trajsft.agent import evaluate, job, watch
    from trajsft.report.trained import Trained

    over = {"storage_root": str(tmp_path / "s")}
    if executor == "ray":
        over |= {"executor": "ray", "ray": {"address": "http://127.0.0.1:1", "cluster": "here", "tpu_type": "v5p-8"}}
    p = C.Plan(C.load(None, over), base_dir=REPO, state_dir=str(tmp_path / "r"))
    cfg = step_configs.eval_agent(p, "demo")
    export = Trained(target="demo", name="demo-x", run_dir="r", source={"kind": "hf_export", "step": 14}, train_cfg={})
    monkeypatch.setattr(watch, "locate", lambda train, step: export if step == 14 else None)
    calls = []
    monkeypatch.setattr(watch, "episodes", lambda c, model, location, trained: calls.append(
        ("here", model, location, trained)) or {"model": model, "rows": []})
    monkeypatch.setattr(watch, "finish", lambda c, location, result, wandb: calls.append(("finish", wandb)) or {})
    monkeypatch.setattr(job, "submit", lambda c, log, trained, location, key: calls.append(
        ("ray", log, location, trained, key)) or {"ray_job_id": f"trajsft-x-{key}-a0"})
    r = watch.at_step(cfg, 14, "logs/eval_agent/demo-step-14.log")
    where = f"{cfg.location}/{evaluate.STEPS}/step-14"
    assert r["step"] == 14 and watch.step_location(cfg, 14) == where
    if executor == "local":
        assert calls == [("here", "student", where, export), ("finish", False)]
    else:
        assert calls == [("ray", "logs/eval_agent/demo-step-14.log", where, export, "step14")]
        assert r["ray_job_id"] == "trajsft-x-step14-a0"
