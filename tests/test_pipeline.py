"""Integration: the real Snakemake workflow on the bundled demo teacher, Levanter on CPU."""

from __future__ import annotations

import dataclasses
import json
import re
import math
import os
import shutil
import subprocess
import statistics
import sys
from pathlib import Path

import pytest

import chromium
import required
from gce_fixtures import CountingProxy
from pipeline_utils import REPO, env, kill_group, plan, run, start, train_and_watch, wait_for
from test_cards import assert_png
from trajsft.train import checkpoints

pytestmark = pytest.mark.integration
LAUNCH = "[trajsft.levanter_run] launch train_lm"


def manifest(workdir: Path, t: dict, kind: str) -> dict:
    [a] = [a for a in t["artifacts"] if a["kind"] == kind]
    return json.loads((workdir / a["manifest"]).read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The README's main job, from a clean state: `snakemake` (demo training + cards + curves)."""
    wd = tmp_path_factory.mktemp("demo")
    proxy = CountingProxy()  # every plain-HTTP request of the run (the GCE metadata server's scheme) is seen
    try:
        # a progress line at most every second (10 s by default): the demo's 27 steps take about a minute
        p = run(wd, extra_env={**proxy.env(), "TRAJSFT_PROGRESS_SECONDS": "1"})
    finally:
        proxy.stop()
    _ASKED[wd] = list(proxy.requests)
    _TERMINAL[wd] = (p.stdout, p.stderr)
    # what `trajsft status` prints right after the run, before any test of this module (in whatever order)
    # reruns it: test_rerun_is_noop... records a second, not relaunched, attempt
    _STATUS_AFTER_RUN[wd] = cli(wd, "status", "--offline").stdout
    return wd, plan(wd, "demo")


_STATUS_AFTER_RUN: dict[Path, str] = {}
_TERMINAL: dict[Path, tuple[str, str]] = {}  # what the demo run printed (stdout, stderr)
_ASKED: dict[Path, list[str]] = {}  # what the demo run sent through its proxy


def test_a_local_run_asks_no_metadata_server(demo):
    """The demo trained on this machine (not a GCE VM) asks the GCE metadata server nothing: 3 requests per run
    before trajsft.gce.may_be_gce (the single-process-on-a-pod check of the train rule and of train_lm's launch)."""
    wd, _ = demo
    asked = [r for r in _ASKED[wd] if "metadata.google.internal" in r or "169.254.169.254" in r]
    assert asked == [], _ASKED[wd]


def test_the_training_shows_its_progress_on_the_terminal_not_in_its_log(demo):
    """Step/total, loss, tokens/s and an ETA at a bounded rate on the rule job's stderr (Snakemake's terminal), for
    several steps; the training's log (the rule's log: `trajsft logs demo`) holds none of it."""
    wd, t = demo
    _, err = _TERMINAL[wd]
    lines = [x for x in err.splitlines() if x.startswith("trajsft train demo: step ")]
    steps = {int(re.match(r"trajsft train demo: step (\d+)/", x).group(1)) for x in lines}
    assert len(steps) >= 3 and max(steps) <= 27, lines
    assert all(re.fullmatch(r"trajsft train demo: step \d+/27 · loss \d+\.\d{4}( · [\d.]+k? tokens/s)?"
                            r"( · ETA \d+:\d\d)?", x) for x in lines), lines
    assert any(" · ETA " in x for x in lines), lines
    log = (wd / "logs/train/demo.log").read_text()
    assert "trajsft train demo: step" not in log


def test_done_marker_points_at_content_addressed_run(demo):
    wd, t = demo
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    run_name = Path(t["checkpoint_dir"]).name
    assert done["run"] == run_name and run_name == f"demo-{done['hash']}"
    assert done["checkpoint_dir"] == t["checkpoint_dir"]
    assert done["wandb_run_id"] == done["hash"]
    assert math.isfinite(done["final_loss"]) and 0 < done["final_loss"] < math.log(2006)
    assert done["steps"] >= 2
    assert Path(done["hf_export"]).name == f"step-{done['steps'] - 1}"


def test_hf_export_loads_with_transformers_and_safetensors(demo):
    from safetensors.flax import load_file  # bf16 exports: numpy has no bfloat16
    from transformers import AutoConfig, AutoTokenizer

    wd, _ = demo
    hf = Path(json.loads((wd / "checkpoints/demo/done").read_text())["hf_export"])
    cfg = AutoConfig.from_pretrained(hf)
    assert cfg.model_type == "qwen3" and cfg.num_hidden_layers == 2 and cfg.hidden_size == 64
    assert cfg.rope_theta == 1e6
    tensors = {}
    for f in hf.glob("*.safetensors"):
        tensors.update(load_file(f))
    assert any("embed_tokens" in k for k in tensors)
    emb = next(v for k, v in tensors.items() if "embed_tokens" in k)
    assert emb.shape[1] == 64 and emb.shape[0] >= len(AutoTokenizer.from_pretrained(REPO / "demo/tokenizer"))
    assert str(emb.dtype) == "bfloat16"  # checkpointing.hf_save_dtype (cosmetic) defaults to bf16
    assert {str(v.dtype) for v in tensors.values()} == {"bfloat16"}


def test_final_hf_export_and_eval_run_once(demo):
    """The demo (one teacher, 2 passes: Levanter's `epoch` > 0) writes its final HF export once and
    evaluates once at the end, although train_lm.main re-runs the end-of-training hooks."""
    wd, t = demo
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    lev = json.loads((wd / done["checkpoint_dir"] / "provenance" / "config.json").read_text())["levanter"]
    assert lev["epoch"] > 0 and lev["trainer"]["watch"] == {"interval": 0}
    log = (wd / done["log"]).read_text()
    final = done["hf_export"]
    assert log.count(f"Saving HF-compatible checkpoint to {final}") == 1, "final HF export written more than once"
    assert log.count("end-of-training hooks already ran for step") == 1
    last = done["steps"] - 1
    logged = [json.loads(line[line.index("{"):]) for line in log.splitlines() if '"event": "log"' in line]
    evals = [e["step"] for e in logged if "eval/loss" in e.get("metrics", {})]
    # the demo's last step is on the eval period: Trainer.train's scheduled eval ran, and neither its
    # forced end-of-training run nor train_lm.main's second one evaluates again
    assert last % lev["trainer"]["steps_per_eval"] == 0
    assert evals.count(last) == 1
    # the persistent compilation cache lives on the storage root
    assert any((wd / "results" / "jax-compilation-cache").iterdir())


def test_shard_manifest_counts_every_row(demo):
    wd, t = demo
    m = manifest(wd, t, "shards")
    expected = json.loads((REPO / "demo/dataset/EXPECTED.json").read_text())
    assert m["rows_in"] == expected["total_rows"] == 60
    assert m["kept_total"] + m["skipped_total"] == m["rows_in"]
    # the demo's malformed rows; text-part content lists are joined and think blocks in content
    # become reasoning_content (both lossless, counted), a trailing user turn is kept (it carries
    # no loss), every other defect is a counted skip, and every skipped row is listed
    assert m["skipped"] == {"duplicate_traj_id": 1, "invalid_json": 1, "invalid_tool_arguments": 1,
                            "no_assistant_turn": 1, "unknown_role": 1}
    assert m["events"] == {"dropped_role:exit": 8, "joined_text_parts": 1, "reasoning_from:think_tags": 4}
    listed = (wd / "results/shards" / m["name"] / "skipped.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["reason"] for x in listed) == sorted(m["skipped"])
    assert m["kept"]["validation"] >= 1  # the demo holds out 10% by traj_id hash


def test_token_stats(demo):
    wd, t = demo
    shards, tok = manifest(wd, t, "shards"), manifest(wd, t, "tokenized")
    st = tok["stats"]["train"]
    assert st["chats"] == shards["kept"]["train"] == len(st["lengths"])
    assert st["tokens"] == sum(st["lengths"])
    assert 0 < st["assistant_fraction"] < 1
    assert st["longer_than"]["1024"]["chats"] > 0  # the demo has chats longer than its seq len


def test_provenance(demo):
    wd, t = demo
    run_dir = Path(t["checkpoint_dir"])
    if not run_dir.is_absolute():
        run_dir = wd / run_dir
    prov = run_dir / "provenance"
    cfg = json.loads((prov / "config.json").read_text())
    assert cfg["hash"] == run_dir.name.rsplit("-", 1)[1] and cfg["levanter"]["trainer"]["id"] == cfg["hash"]
    code = json.loads((prov / "code.json").read_text())
    assert len(code["git_commit"]) == 40
    assert (prov / "uncommitted.diff").exists()
    assert json.loads((prov / "packages.json").read_text())["levanter"] == "1.2.dev1644"
    attempts = json.loads((run_dir / "attempts.json").read_text())
    assert attempts[-1]["outcome"] == "succeeded" and attempts[-1]["ended"] >= attempts[-1]["started"]
    assert attempts[-1]["hostname"]
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B offline run files missing"


# the opt-in cross-teacher matrix over the demo: no hashed setting changes, so the demo's run is reused
EVAL = {"eval": {"targets": ["demo"]}}


def test_every_run_logs_eval_loss_per_teacher(demo):
    wd, _ = demo
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    step, loss = done["eval_loss"]["eval/demo/loss"]
    assert step == done["steps"] - 1 and math.isfinite(loss)


def _stored_dtypes(hf_dir: str) -> set[str]:
    from safetensors import safe_open

    out = set()
    for f in Path(hf_dir).glob("*.safetensors"):
        with safe_open(str(f), "np") as st:
            out |= {st.get_slice(k).get_dtype() for k in st.keys()}
    assert out, f"no safetensors in {hf_dir}"
    return out


def test_cross_teacher_matrix_of_the_demo(demo):
    """Rule eval_matrix (HF export) and `trajsft eval --model checkpoint`, both with Levanter's own
    evaluator, match the training's own final eval/demo/loss on the same held-out split."""
    wd, t = demo
    p = run(wd, config=EVAL)
    assert "eval_matrix" in p.stderr and "rule train:" not in p.stderr and "rule tokenize:" not in p.stderr
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    _, trained_eval = done["eval_loss"]["eval/demo/loss"]
    doc = json.loads((wd / "results/eval/matrix.json").read_text())
    assert doc["rows"] == ["demo"] and doc["columns"] == ["demo"] and doc["same_chats"] == {"demo": True}
    assert doc["models"]["demo"] == {"kind": "hf_export", "path": done["hf_export"], "step": done["steps"] - 1}
    cell = doc["cells"]["demo"]["demo"]
    tok = manifest(wd, t, "tokenized")
    val = tok["stats"]["validation"]
    assert cell["tokenized"] == tok["name"] and cell["chats"] == val["chats"] >= 1
    # loss tokens: the held-out chats' assistant tokens inside each chat's seq_len window
    assert 0 < cell["tokens"] <= val["assistant_tokens"] and cell["sequences"] >= 1
    # the export's weights as stored (Levanter writes no dtype into config.json): a bf16 export is
    # evaluated from bf16-rounded weights, the training's own eval from the f32 ones
    f32 = _stored_dtypes(done["hf_export"]) == {"F32"}
    assert cell["loss"] == pytest.approx(trained_eval, rel=1e-4 if f32 else 2e-2)
    assert_png(wd / "results/eval/matrix.png")
    assert '<table id="matrix">' in (wd / "results/eval/matrix.html").read_text()

    out = wd / "cli-eval"
    (wd / "eval.yaml").write_text(json.dumps(EVAL))
    c = subprocess.run([sys.executable, "-m", "trajsft.cli", "eval", "--model", "checkpoint", "--out", str(out), "--json",
                        "--configfile", str(wd / "eval.yaml")], capture_output=True, text=True, cwd=wd, env=env(),
                       timeout=900)
    assert c.returncode == 0, c.stderr[-3000:]
    ck = json.loads(c.stdout)
    assert ck["models"]["demo"]["kind"] == "checkpoint" and ck["models"]["demo"]["step"] == done["steps"] - 1
    ck_cell = ck["cells"]["demo"]["demo"]
    assert ck_cell["tokens"] == cell["tokens"] and ck_cell["loss"] == pytest.approx(trained_eval, rel=1e-4)
    assert json.loads((out / "matrix.json").read_text()) == ck
    # nothing changed: the matrix is up to date
    again = run(wd, "-n", config=EVAL)
    assert "Nothing to be done" in again.stdout + again.stderr


needs_chromium = required.skip_unless(chromium.available(), "TRAJSFT_REQUIRE_CHROMIUM", chromium.INSTALL_HINT)


@needs_chromium
def test_report_of_the_demo_renders_in_chromium(demo, tmp_path):
    wd, _ = demo
    run(wd, config=EVAL)  # the opt-in matrix (a no-op when test_cross_teacher_matrix_of_the_demo ran)
    run(wd, "--report", str(wd / "report.html"), config=EVAL)
    info = chromium.check_snakemake_report(wd / "report.html", tmp_path / "shots")
    assert info["errors"] == []
    assert {"Dataset cards", "Teacher comparison", "Training curves", "Checkpoints",
            "Cross-teacher matrix", "Next actions"} <= set(info["categories"])
    res = info["results"]
    assert res["results/eval/matrix.png"]["ok"] and res["results/eval/matrix.png"]["w"] > 600
    acts = res["results/evals/actions.html"]
    assert acts["ok"] and acts["tables"] == 1 and "tool_name" in acts["text"] and "demo" in acts["text"]
    matrix = res["results/eval/matrix.html"]
    assert matrix["ok"] and matrix["tables"] == 1 and "demo" in matrix["text"] and "tokens" in matrix["text"]
    for name in ("results/cards/demo/card.png", "results/curves/demo.png"):
        assert res[name]["ok"] and res[name]["w"] > 600, res[name]
    table = res["results/cards/teachers.html"]
    assert table["ok"] and table["tables"] == 1 and "demo" in table["text"]
    card = json.loads((wd / "results/cards/demo/card.json").read_text())
    shards = json.loads(next((wd / "results/shards").glob("demo-*/manifest.json")).read_text())
    assert (card["rows_in"], card["skipped"]) == (shards["rows_in"], shards["skipped"])
    shutil.copy(tmp_path / "shots" / "landing.png", wd / "report-landing.png")


def cli(wd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], capture_output=True, text=True, cwd=wd,
                          timeout=120)


def test_status_and_logs_of_a_local_run(demo):
    wd, t = demo
    p = cli(wd, "status", "--json")
    rows = {r["target"]: r for r in json.loads(p.stdout)}
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert rows["demo"]["state"] == "done" and rows["demo"]["hash"] == done["hash"]
    assert rows["demo"]["hf_export"] == done["hf_export"] and rows["demo"]["cluster"] == "local"
    assert rows["minimax-m2.5"]["state"] == "not started"
    human = cli(wd, "status", "demo").stdout
    assert "demo" in human.splitlines()[1] and "done" in human.splitlines()[1]
    tail = cli(wd, "logs", "demo", "-n", "5").stdout.splitlines()
    assert tail == (wd / "logs/train/demo.log").read_text().splitlines()[-5:]


def test_the_offline_wandb_runs_status_names_are_uploaded_by_its_command(demo, tmp_path):
    """The demo logs to W&B offline (its config): status names its runs and the command that uploads them (issue 67);
    that command, run as status prints it against a W&B stand-in on loopback, delivers every training step."""
    import glob
    import threading

    from wandb_stub import make_server

    wd, _ = demo
    [row] = json.loads(cli(wd, "status", "demo", "--json", "--offline").stdout)
    pattern = row["wandb_offline"]
    assert pattern and pattern.endswith("/wandb/offline-run-*"), row
    said = cli(wd, "status", "demo", "--offline").stdout
    [line] = [x for x in said.splitlines() if "W&B offline" in x]
    cmd = re.search(r"`(wandb sync [^`]+)`", line).group(1)
    copy = tmp_path / "wandb"  # wandb sync marks what it synced: a copy, the demo's run dir stays as it was
    for d in glob.glob(str(wd / pattern)):
        shutil.copytree(d, copy / Path(d).name, symlinks=True)
    srv = make_server(0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        runs = sorted(glob.glob(str(copy / Path(pattern).name)))
        assert runs and cmd == f"wandb sync {pattern}"
        p = subprocess.run([str(Path(sys.executable).parent / "wandb"), "sync", *runs], cwd=tmp_path, text=True,
                           capture_output=True, timeout=300,
                           env=env(WANDB_BASE_URL=f"http://127.0.0.1:{srv.server_port}", WANDB_API_KEY="a" * 40,
                                   WANDB_MODE=None))
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        srv.shutdown()
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    synced = srv.state["runs"][done["hash"]]
    assert sum(1 for h in synced["history"] if "train/loss" in h) == done["steps"], synced["history"][:2]


def test_status_example_is_a_real_demo_run(demo):
    """docs/status-example.txt (scripts/render_docs.sh, shown in the README) is what `trajsft status`
    prints after this demo run, paths relative to the run's directory; only the loss digits may differ
    between machines. Read by the fixture before the rerun test records a second (not relaunched) attempt."""
    import re

    wd, _ = demo
    out = _STATUS_AFTER_RUN[wd].replace(f"{wd}/", "")
    example = (REPO / "docs/status-example.txt").read_text()
    loss = re.compile(r"(?<= )\d+\.\d{4}\b")
    assert loss.sub("<loss>", out) == loss.sub("<loss>", example), "stale: run scripts/render_docs.sh"


def test_rerun_is_noop_and_finished_training_is_not_relaunched(demo):
    wd, t = demo
    out = run(wd, "-n", "checkpoints/demo/done")
    assert "Nothing to be done" in out.stdout + out.stderr
    log = wd / "logs/train/demo.log"
    launches = log.read_text().count(LAUNCH)
    before = json.loads((wd / "checkpoints/demo/done").read_text())
    (wd / "checkpoints/demo/done").unlink()
    run(wd, "checkpoints/demo/done")
    after = json.loads((wd / "checkpoints/demo/done").read_text())
    assert log.read_text().count(LAUNCH) == launches  # Levanter would exit 1 on a relaunch
    assert (after["hash"], after["steps"], after["hf_export"]) == (before["hash"], before["steps"], before["hf_export"])


KILL_STEPS = 20  # the killed and resumed training's length


def test_kill_and_resume(tmp_path):
    """SIGKILL mid-tokenize leaves nothing that looks complete; SIGKILL mid-training resumes."""
    wd = tmp_path
    # 20 steps: the kill in 2. lands a poll after the first checkpoint (step 3) is visible, well before the last step
    # even when checkpoints become visible a few steps late (evaluated every 2 steps: n // 10)
    over = {"teachers": {"demo": {"training": {"max_steps": KILL_STEPS}}},
            "checkpointing": {"keep_every_steps": 3, "save_interval_minutes": 600}}
    t = plan(wd, "demo", over)
    tok_dir = wd / [a for a in t["artifacts"] if a["kind"] == "tokenized"][0]["location"]
    tok_manifest = wd / [a for a in t["artifacts"] if a["kind"] == "tokenized"][0]["manifest"]
    run_dir = wd / t["checkpoint_dir"]

    # 1. kill while the tokenized cache is being built. The build dir exists from the tokenizer load
    # on (seconds); its split dirs only for the fraction of a second the in-process writer needs on
    # the demo, too short to hit reliably. The kill safety (rename only at the end) covers both.
    p = start(wd, "checkpoints/demo/done", config=over, log=wd / "attempt1.log")
    [building] = wait_for(lambda: list(tok_dir.glob(".cache.building-*")), 300, "cache build to start", p, poll=0.05)
    kill_group(p)
    assert building.is_dir(), "the build finished before the kill landed"
    assert not tok_manifest.exists() and not (tok_dir / "cache").exists()

    # 2. kill after a checkpoint was written (a killed Snakemake leaves its lock: --unlock first)
    run(wd, "--unlock", config=over)
    p = start(wd, "checkpoints/demo/done", config=over, log=wd / "attempt2.log")
    ck = wait_for(lambda: checkpoints.latest_checkpoint(str(run_dir / "checkpoints")), 600, "a trainer checkpoint", p)
    kill_group(p)
    assert not (wd / "checkpoints/demo/done").exists()
    latest = checkpoints.latest_checkpoint(str(run_dir / "checkpoints"))
    assert latest["completed_steps"] >= ck["completed_steps"] >= 1 and latest["completed_steps"] < KILL_STEPS
    [row] = json.loads(cli(wd, "status", "demo", "--json", "--configfile", str(wd / "test-overrides.yaml")).stdout)
    assert row["state"] == "failed" and row["cause"] == "killed (no end recorded)"
    assert row["next"] == f"resume from step {latest['completed_steps']}" and row["steps_total"] == KILL_STEPS

    # 3. rerun the same target: resumes from that checkpoint and finishes
    run(wd, "--unlock", config=over)
    run(wd, "checkpoints/demo/done", config=over)
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    result = json.loads((run_dir / "training_result.json").read_text())
    assert done["steps"] == KILL_STEPS
    assert result["resumed_from_step"] == latest["completed_steps"]
    resumed_log = (wd / "logs/train/demo.log").read_text()
    assert f"Resuming training from step {latest['completed_steps']}" in resumed_log
    assert "Unknown leaf type" not in resumed_log  # Levanter's None-leaf warning, filtered in the child
    attempts = json.loads((run_dir / "attempts.json").read_text())
    assert [a["outcome"] for a in attempts] == ["interrupted", "succeeded"]
    assert tok_manifest.exists() and (tok_dir / "cache").is_dir()
    assert not list(tok_dir.glob(".cache.building-*")), "stale build dir left behind"


def test_serve_the_demo_to_the_openai_sdk(demo, tmp_path):
    """`trajsft serve demo` (issue 39): the openai SDK drives the trained student for a few turns with tools and a
    tool-call history and gets well-formed chat completions, each prompt rendered as training renders it; a
    malformed request is a 400 and the server keeps serving; what cannot be served (a target not trained, a step
    with no export, an export of another architecture, a busy port) is one line; SIGINT ends it with exit 0."""
    import re
    import signal

    import openai
    from transformers import AutoTokenizer

    from trajsft.data.template import load_template

    wd, t = demo
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    log = tmp_path / "serve.log"
    with open(log, "w") as fh:
        # JAX_PLATFORMS unset, as a user's shell has it: libtpu (installed for the fit check) must not look for a TPU
        p = subprocess.Popen([sys.executable, "-m", "trajsft.cli", "serve", "demo", "--port", "0"], cwd=wd,
                             env=env(JAX_PLATFORMS=None), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = wait_for(lambda: re.search(r"ready in ([\d.]+)s \(build", log.read_text()), 300,
                         "trajsft serve to print that it is ready", proc=p)
        head = log.read_text()
        noise = re.findall(r".*(?:libtpu|TPU_WORKER|Source Location Trace|backend 'tpu'|InitGoogle).*", head)
        assert not noise, noise  # a CPU machine: no TPU errors
        [url] = re.findall(r"at (http://127\.0\.0\.1:\d+/v1) as model demo-", head)
        assert f"demo (hf_export step {done['steps'] - 1}, {done['hf_export']})" in head  # the final HF export
        print(f"trajsft serve demo: ready in {ready.group(1)} s")
        client = openai.OpenAI(base_url=url, api_key="not-needed", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list()] == [Path(done["checkpoint_dir"]).name]
        tok = AutoTokenizer.from_pretrained(str(REPO / "demo/tokenizer"))
        tools = [{"type": "function", "function": {"name": "bash", "description": "run a shell command",
                                                   "parameters": {"type": "object", "required": ["command"],
                                                                  "properties": {"command": {"type": "string"}}}}}]
        messages = [{"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": "Fix the failing test in this Rust crate."}]
        for turn in range(3):
            r = client.chat.completions.create(model="demo", messages=messages, tools=tools, max_tokens=24,
                                               temperature=0.7, seed=turn)
            [choice] = r.choices
            assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")
            assert choice.message.content or choice.message.tool_calls
            rendered = [{**m, "content": m.get("content") or ""} for m in messages]
            want = tok.apply_chat_template(rendered, tools=tools, chat_template=load_template(), add_generation_prompt=True)
            assert r.usage.prompt_tokens == len(want) and 0 < r.usage.completion_tokens <= 24
            assert r.model == Path(done["checkpoint_dir"]).name
            # the history grows as an agent's: its call (arguments a JSON string) and the tool's reply
            call = {"id": f"call_{turn}", "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": f"cargo test -q {turn}"})}}
            messages += [{"role": "assistant", "content": choice.message.content, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"test result: FAILED {turn}"}]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="demo", messages=[{"role": "robot", "content": "x"}])
        assert "messages[0].role is 'robot'" in str(e.value)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=messages)
        again = client.chat.completions.create(model="demo", messages=messages[:2], max_tokens=4)
        assert again.choices[0].message.role == "assistant"  # still serving
        # what cannot be served: one line each, exit 2, nothing loaded
        port = url.rsplit(":", 1)[1].split("/")[0]
        q = cli(wd, "serve", "demo", "--port", port)
        assert q.returncode == 2 and q.stderr.startswith(f"trajsft: cannot listen on 127.0.0.1:{port}: "), q.stderr
        wrong = wd / done["checkpoint_dir"] / "hf/step-999"
        shutil.copytree(wd / done["hf_export"], wrong)
        cfg = json.loads((wrong / "config.json").read_text())
        (wrong / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
        try:
            for args, line in [
                (["minimax-m2.5"], "trajsft: minimax-m2.5 is not trained: no run minimax-m2.5-"),
                (["demo", "--step", "5"], f"trajsft: demo: run {done['run']} has no HF export at step 5 under "),
                (["demo", "--step", "999"], f"trajsft: {wrong} is a checkpoint of another architecture than the run's "
                                            "model: num_layers 2 but config.json num_hidden_layers 3"),
                (["demo"], f"trajsft: {wrong} is a checkpoint of another"),  # the newest export: served by default
            ]:
                q = cli(wd, "serve", *args)
                assert q.returncode == 2 and q.stderr.startswith(line) and q.stderr.count("\n") == 1, (args, q.stderr)
        finally:
            shutil.rmtree(wrong)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
        assert log.read_text().rstrip().endswith("trajsft serve: demo stopped")
    finally:
        if p.poll() is None:
            kill_group(p)


def test_next_action_scores_of_the_demo_student_and_of_the_replay(demo):
    """Issue 40: the demo's `snakemake` wrote evals/demo/done (rule eval_actions: its student generated each sampled
    held-out turn greedily through the engine `trajsft serve` uses), content-addressed by the run, the held-out
    shard set and the demo's actions: settings; `trajsft eval demo --actions` prints those figures, every metric in
    [0, 1]. Other settings are computed on the spot; with --replay the teacher's own turns score 1.0 on every
    agreement (tests/test_actions.py proves the same without the CLI)."""
    from trajsft.report.actions import AGREEMENTS

    wd, _ = demo
    done = json.loads((wd / "evals/demo/done").read_text())
    run = json.loads((wd / "checkpoints/demo/done").read_text())["run"]
    assert done["kind"] == "evals" and done["model"] == run and done["hash_inputs"]["run"] == run.split("-")[-1]
    assert (done["max_turns"], done["max_tokens"]) == (8, 64) and done["source"]["kind"] in ("hf_export", "checkpoint")
    assert json.loads((wd / done["location"] / "actions.json").read_text())["splits"] == done["splits"]
    assert (done["chats_scored"], done["chats_reused"]) == (done["chats"], 0) and done["chats"] > 0
    assert (wd / done["side_by_side"]).read_text().count("**student**") == 8  # every scored turn (8 < 12 shown)
    p = cli(wd, "eval", "demo", "--actions", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    [row] = json.loads(p.stdout)
    assert row["from"] == "evals/demo/done" and row["model"] == run and list(row["splits"]) == ["demo"]
    assert row["side_by_side"] == done["side_by_side"]
    split = row["splits"]["demo"]
    # 7 of the 8 sampled turns: one prompt fills the demo's seq_len with the tools block (skipped, counted)
    assert split == done["splits"]["demo"] and (split["turns"], split["skipped_no_room"]) == (7, 1)
    assert 0 < split["tokens"] <= 65
    names = [k for k in split if k in AGREEMENTS]
    assert any("valid" in k for k in names) and any("tool_name" in k for k in names)
    assert all(split[k] is None or 0.0 <= split[k] <= 1.0 for k in names), split
    other = cli(wd, "eval", "demo", "--actions", "--json", "--max-turns", "2", "--max-tokens", "8")
    assert other.returncode == 0, other.stderr[-3000:]
    [o] = json.loads(other.stdout)
    assert o["from"] == "computed" and o["splits"]["demo"]["turns"] == 2 and o["splits"]["demo"]["tokens"] <= 9
    replay = cli(wd, "eval", "demo", "--actions", "--replay", "--json", "--max-turns", "4")
    assert replay.returncode == 0, replay.stderr[-3000:]
    [r] = json.loads(replay.stdout)
    assert r["model"] == "replay" and r["splits"]["demo"]["turns"] == 4
    assert all(r["splits"]["demo"][k] == 1.0 for k in AGREEMENTS if r["splits"]["demo"][k] is not None)
    assert r["splits"]["demo"]["valid"] == r["splits"]["demo"]["tool_name"] == 1.0


def test_the_generation_benchmark_measures_two_engine_settings_on_the_demo(demo):
    """scripts/bench_generate.py (issue 41): tokens/s of the evaluation's engine at its settings, in one run, on the
    trained demo (a small version: its figures are the benchmark's, not a test's)."""
    wd, _ = demo
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_generate.py"), "--workdir", str(wd), "--turns",
                        "4", "--max-tokens", "8", "--settings", "4x128,8x32", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert len(r["settings"]) == 2 and all(s["steady_tokens_per_s"] > 0 and s["turns"] == 4 for s in r["settings"])
    assert {"max_seqs", "page_size"} == set(r["fastest"]) and min(s["steady_ratio_to_slowest"] for s in r["settings"]) == 1.0


def test_watch_scores_each_export_of_a_running_training_and_the_report_grows_a_row_per_step(demo, tmp_path):
    """`trajsft eval demo --actions --watch` beside a running demo training (issue 41): each HF export is scored as it
    appears (here two: every 14 steps, and the final one of its 27), under the evaluation's steps/step-<N>/; it ends when the
    run is done; the report's table then has a row per step and one for the final evaluation. Another seed names
    another run (its data comes from the demo's root through copy_from: not rebuilt). Beside it (issue 70),
    `trajsft eval demo --agent --watch` works a one-crate task set with each export, under steps/step-<N>/ of the
    agent evaluation, and the resolve-rate report has a point per export and the final evaluation's."""
    demo_wd, _ = demo
    wd = tmp_path / "watch"
    wd.mkdir()
    crates = tmp_path / "crates"
    shutil.copytree(REPO / "tasks/demo/crates/mini_math", crates / "mini_math")
    over = {"copy_from": [str(demo_wd / "results")], "checkpointing": {"hf_export_every_steps": 14},
            "teachers": {"demo": {"training": {"seed": 7}}},
            "tasks": {"mini": {"crates": str(crates)}}, "agent": {"tasks": "mini"}}
    arts = {a["kind"]: a for a in plan(wd, "demo", over)["artifacts"]}
    agent_watch = needs_sandbox(skip=False)
    # the data, copied from the demo's root; the task set, built here
    run(wd, arts["tokenized"]["manifest"], *([arts["tasks"]["manifest"]] if agent_watch else []), config=over)
    watched = train_and_watch(wd, over, wd / "train.log", evaluations=("--actions", "--agent")[:1 + agent_watch])
    rows = watched["--actions"] if agent_watch else watched
    steps = [r["step"] for r in rows]
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert len(steps) == 2 and steps == sorted(steps) and steps[-1] == int(Path(done["hf_export"]).name[5:]), steps
    # 7 of the 8 sampled turns: one prompt fills the demo's seq_len with the tools block (skipped, counted)
    assert all(r["model"] == done["run"] and (r["splits"]["demo"]["turns"], r["splits"]["demo"]["skipped_no_room"])
               == (7, 1) for r in rows)
    # the rule's final evaluation, then the report: a row per watched step and the final one
    run(wd, "evals/demo/done", "results/evals/actions.html", config=over)
    table = (wd / "results/evals/actions.html").read_text()
    assert all(f"export step {s}</span>" in table for s in steps) and "final step" in table
    report = json.loads((wd / "results/evals/actions.json").read_text())
    assert [r["step"] for r in report] == [*steps, steps[-1]] and [r["final"] for r in report] == [False, False, True]
    if not agent_watch:
        return
    agent = watched["--agent"]  # a row per export, as they appeared
    assert [r["step"] for r in agent] == steps and all(r["tasks"] == agent[0]["tasks"] >= 2 for r in agent), agent
    for r in agent:
        results = wd / r["results"]
        assert results == wd / arts["agent"]["location"] / "steps" / f"step-{r['step']}" / "results.json"
        doc = json.loads(results.read_text())
        assert doc["source"]["step"] == r["step"] and len(doc["rows"]) == r["tasks"] and doc["model"] == "student"
    run(wd, "agent/demo/done", "results/agent/resolve_rate.html", config=over)  # the final evaluation, the report
    plotted = json.loads((wd / "results/agent/resolve_rate.json").read_text())
    assert [(r["step"], r["final"]) for r in plotted] == [(steps[0], False), (steps[1], False), (steps[1], True)]
    assert [r["resolved"] for r in plotted[:2]] == [r["resolved"] for r in agent]
    assert (wd / "results/agent/resolve_rate.png").read_bytes()[:4] == b"\x89PNG"
    assert 'src="resolve_rate.png"' in (wd / "results/agent/resolve_rate.html").read_text()


def test_ctrl_c_of_a_local_training_saves_its_step_and_the_rerun_resumes_from_it(demo, tmp_path):
    """Ctrl-C (SIGINT to Snakemake's process group) mid-training (issue 67): the trainer finishes its step and saves
    it, the terminal gets one line from trajsft (said once; no training log dumped), status says "stopped" and where the rerun resumes, and the rerun resumes from that step > 0.
    Another seed names another run (its data copied from the demo's root)."""
    import signal

    demo_wd, _ = demo
    wd = tmp_path / "ctrlc"
    wd.mkdir()
    over = {"copy_from": [str(demo_wd / "results")], "teachers": {"demo": {"training": {"seed": 11}}}}
    [tokenized] = [a["manifest"] for a in plan(wd, "demo", over)["artifacts"] if a["kind"] == "tokenized"]
    run(wd, tokenized, config=over)  # the data, copied from the demo's root
    log = wd / "snakemake.log"
    p = start(wd, "checkpoints/demo/done", config=over, log=log, extra_env={"TRAJSFT_PROGRESS_SECONDS": "1"})
    try:
        wait_for(lambda: [int(s) for s in re.findall(r"trajsft train demo: step (\d+)/27", log.read_text())
                          if int(s) >= 4], 600, "the demo's training to pass step 4", proc=p)
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=300) != 0
    finally:
        if p.poll() is None:
            kill_group(p)
    out = log.read_text()
    said = [x for x in out.splitlines() if "trajsft train demo: stopped (got SIGINT)" in x]
    assert len(said) == 1, out[-3000:]  # once, on stderr (trajsft's profiles do not dump a failed job's log)
    m = re.fullmatch(r"trajsft train demo: stopped \(got SIGINT\); its checkpoint of step (\d+)/27 is kept: rerun "
                     r"the same command to resume from it", said[0])
    assert m and int(m.group(1)) >= 4, said[0]
    assert "Traceback" not in out and "levanter.json_logger" not in out, out[-3000:]  # no training log dumped
    s = cli(wd, "status", "demo", "--json", "--offline", "--configfile", str(wd / "test-overrides.yaml"))
    [row] = json.loads(s.stdout)
    assert (row["state"], row["cause"], row["next"]) == ("stopped", "stopped", f"resume from step {m.group(1)}"), row
    run(wd, "checkpoints/demo/done", config=over)
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["attempts"] == 2 and done["steps"] == 27
    train_log = (wd / "logs/train/demo.log").read_text()
    assert f"Resuming training from step {m.group(1)}" in train_log


def test_a_sweep_trains_each_cell_once_and_compares_them(demo, tmp_path):
    """`snakemake sweeps/lr-demo/done` (issue 43) with the sweep of docs/sweeps.md beside the demo's root: the 3.0e-3
    cell is the demo itself (its run copied from the demo's root through copy_from, not trained again), the 1.0e-3
    cell trains on the demo's data; results.csv has both rows, the loss curves and the per-setting picture beside
    it, and a rerun has nothing to do."""
    import csv

    from test_sweeps import LR_DEMO

    demo_wd, t = demo
    wd = tmp_path / "sweep"
    wd.mkdir()
    run(wd, "sweeps/lr-demo/done", config={"copy_from": [str(demo_wd / "results")], **LR_DEMO})
    with open(wd / "sweeps/lr-demo/results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["cell"], r["learning_rate"], r["state"]) for r in rows] == [
        ("lr-demo-learning_rate-0.001", "0.001", "done"), ("demo", "0.003", "done")], rows
    assert rows[1]["checkpoint_dir"] == t["checkpoint_dir"] and all(float(r["final_eval_loss"]) > 0 for r in rows)
    assert sum(bool(r["best"]) for r in rows) == 1
    assert LAUNCH not in (wd / "logs/train/demo.log").read_text()  # the demo's weights were copied, not retrained
    assert LAUNCH in (wd / "logs/train/lr-demo-learning_rate-0.001.log").read_text()
    done = json.loads((wd / "sweeps/lr-demo/done").read_text())
    assert done["cells"] == [r["cell"] for r in rows] and done["curves_drawn"] >= 1
    for png in ("loss.png", "settings.png"):
        assert_png(wd / "sweeps/lr-demo" / png)
    again = run(wd, "-n", "sweeps/lr-demo/done", config={"copy_from": [str(demo_wd / "results")], **LR_DEMO})
    assert "Nothing to be done" in again.stdout + again.stderr


def _mount(root: Path, options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root)], check=True, capture_output=True)


def _remount(root: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(root)], check=True, capture_output=True)


def _tmpfs_allowed(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        _mount(probe, "size=1m")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False
    subprocess.run(["umount", str(probe)], check=True)
    return True


def test_a_full_or_read_only_storage_root_is_one_line_and_the_rerun_finishes(demo, tmp_path):
    """The demo's storage_root on a tmpfs: read-only, then 3 MB (the data fits, the checkpoint does not), then grown
    to 100 MB. Each failure is one line naming the root and the cause, with no trace on the terminal (the train
    rule's echoed log is that line); the failed attempt's record survives in the workdir (the root was full) and
    status shows it; after the space is freed the same command finishes with an HF export byte-identical to the
    clean demo run's."""
    if not _tmpfs_allowed(tmp_path):
        required.skip_or_fail("TRAJSFT_REQUIRE_TMPFS", "needs `mount -t tmpfs` (root): this machine does not allow it")
    clean = Path(json.loads((demo[0] / "checkpoints/demo/done").read_text())["hf_export"])
    root, wd = tmp_path / "root", tmp_path / "wd"
    root.mkdir()
    wd.mkdir()
    _mount(root, "size=3m,ro")
    try:
        config = {"storage_root": str(root)}
        p = run(wd, "checkpoints/demo/done", config=config, check=False)
        out = p.stdout + p.stderr
        assert p.returncode != 0 and "Traceback" not in out and "Logging error" not in out, out[-3000:]
        # said at the start, before any rule ran (the write probe: trajsft.storage.probe_write)
        ro = f"trajsft: the storage root {root} is read-only: Read-only file system"
        assert out.count(ro) == 1, out[-3000:]  # the one line, said once
        assert "rule download" not in out, out[-3000:]
        _remount(root, "rw,size=3m")
        p = run(wd, "checkpoints/demo/done", config=config, check=False)
        out = p.stdout + p.stderr
        assert p.returncode != 0 and "Traceback" not in out and "Logging error" not in out, out[-3000:]
        # the start says what the run writes against the 3 MB (trajsft.fit.disk), then goes on: an upper bound
        assert f"trajsft: note: storage root {root}: 3.0 MiB free; this run writes up to " in out, out[-3000:]
        assert "it will not fit" in out
        line = f"trajsft train demo: the training could not write: the storage root {root} is full: No space left on device"
        # said once, by the rule: nothing repeats it (trajsft's profiles do not show a failed job's log)
        said = [x.strip() for x in out.splitlines() if line in x]
        assert len(said) == 1 and said[0].startswith(line), out[-3000:]
        assert len(out.splitlines()) < 400, len(out.splitlines())  # was 4,000 lines: the training log echoed
        # the record of the failure: in the workdir (the root was full), its real cause in status
        [kept] = (wd / "results/attempts").glob("demo-*.json")
        assert json.loads(kept.read_text())[-1]["outcome"] == "failed"
        s = subprocess.run([sys.executable, "-m", "trajsft.cli", "status", "demo", "--json", "--storage-root",
                            str(root)], capture_output=True, text=True, cwd=wd, env=env(), timeout=120)
        [row] = json.loads(s.stdout)
        assert row["state"] == "failed" and "is full: No space left on device" in row["cause"], row
        _remount(root, "size=100m")
        run(wd, "checkpoints/demo/done", config=config)
        done = json.loads((wd / "checkpoints/demo/done").read_text())
        attempts = json.loads((Path(done["checkpoint_dir"]) / "attempts.json").read_text())
        assert [a["outcome"] for a in attempts] == ["failed", "succeeded"] and not kept.exists()  # folded in
        got = Path(done["hf_export"])
        files = sorted(f.relative_to(clean) for f in clean.rglob("*") if f.is_file())
        assert files and files == sorted(f.relative_to(got) for f in got.rglob("*") if f.is_file())
        assert all((clean / f).read_bytes() == (got / f).read_bytes() for f in files), files
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)


def test_the_storage_estimate_bounds_what_the_demo_wrote(demo):
    """trajsft.fit.disk's figures are upper bounds of the demo's real payloads, and not loose ones: its parameter
    count is the HF export's, a checkpoint and an export within 2x of theirs; the tokenized caches within 4x of rows x
    seq_len x 16 bytes (Levanter compresses them, and most chats are shorter than seq_len: about 37% here)."""
    from trajsft.fit import disk
    from trajsft.plan import config as C, step_configs

    wd = demo[0]
    tc = step_configs.train(C.Plan(C.load(None, {"storage_root": str(wd / "results")}), base_dir=C.REPO_DIR), "demo")
    fp = disk.estimate([tc], look=False)
    est = {i.kind: i.bytes for i in fp.items}

    def du(path: Path) -> int:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    run_dir = Path(tc.run.location)
    [hf] = (run_dir / "hf").iterdir()
    st = (hf / "model.safetensors").read_bytes()
    header = json.loads(st[8:8 + int.from_bytes(st[:8], "little")])
    assert sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__") == disk.parameters(tc)
    [tok] = tc.tokenized.values()
    [ckpt] = (run_dir / "checkpoints").iterdir()  # 25 steps: the final one (the estimate allows it and the next)
    assert est["tokenized"] / 4 <= du(Path(tok.location)) <= est["tokenized"]
    assert est["checkpoints"] / 2 / 2 <= du(ckpt) <= est["checkpoints"] / 2
    assert est["hf exports"] / 2 <= du(hf) <= est["hf exports"]


def test_agent_evaluation_of_the_demo_student_the_replay_and_a_model_that_only_submits(demo):
    """Issue 69: after the demo, `snakemake agent/demo/done` builds the demo task set and lets the trained student
    work every task through mini-swe-agent (tool-calling mode, the demo teacher's prompts, in the task's sandbox),
    each submission graded by the tests; `trajsft eval demo --agent --json` reads the figures back. Every task's
    first prompt, tools included, takes under half the student's context. The replay model (each task's gold fix as
    bash tool calls, through the same route) resolves every task, and a run of it killed mid-way reruns only the
    tasks without a graded row; a model that only submits resolves none."""
    import signal

    from transformers import AutoTokenizer
    from trajsft.agent import evaluate, harness
    from trajsft.plan import config as C
    from trajsft.plan import step_configs
    from trajsft.plan.tools import BASH
    from trajsft.serve import chat
    from trajsft.tasks import taskset

    needs_sandbox()
    wd, _ = demo
    # four episodes at once against the one engine (it batches their turns; not hashed: the same evaluation)
    run(wd, "agent/demo/done", config={"agent": {"episodes_at_once": 4}}, timeout=900)
    done = json.loads((wd / "agent/demo/done").read_text())
    student = json.loads((wd / "checkpoints/demo/done").read_text())["run"]
    assert done["kind"] == "agent" and done["hash_inputs"]["run"] == student.split("-")[-1]
    assert done["tasks"] >= 8 and 0 <= done["resolved"] <= done["tasks"] and done["source"]["kind"] == "hf_export"
    assert done["harness"]["episodes_at_once"] == 4
    p = cli(wd, "eval", "demo", "--agent", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert (doc["tasks"], doc["resolved"], doc["model"]) == (done["tasks"], done["resolved"], "student")
    assert len(doc["rows"]) == doc["tasks"] and all(1 <= r["steps"] <= 4 for r in doc["rows"])
    assert all(r["exit_status"] != "could_not_start" and r["graded"]["applied"] for r in doc["rows"])
    episodes = wd / done["location"] / "episodes"
    for r in doc["rows"]:  # mini-swe-agent's own trajectory, the submission and the row, per task
        traj = json.loads((episodes / f"{r['instance_id']}.traj.json").read_text())
        assert traj["trajectory_format"].startswith("mini-swe-agent") and traj["messages"][0]["role"] == "system"
        assert (episodes / f"{r['instance_id']}.diff").exists()
    human = cli(wd, "eval", "demo", "--agent")
    assert f"demo (student): resolved {doc['resolved']}/{doc['tasks']}" in human.stdout, human.stderr[-2000:]

    plan_ = C.Plan(C.load([C.DEFAULT_CONFIG]), base_dir=C.REPO_DIR, state_dir=str(wd / "results"))
    cfg = step_configs.eval_agent(plan_, "demo")
    cfg = dataclasses.replace(cfg, tasks=str(wd / cfg.tasks))
    tasks = taskset.load(cfg.tasks).tasks
    h = harness.load(cfg.harness)
    tok = AutoTokenizer.from_pretrained(C.REPO_DIR / "demo/tokenizer")
    from jinja2 import Template

    for t in tasks:  # every first prompt, tools included, under half the student's seq_len (1024)
        first = [{"role": "system", "content": h.system_template},
                 {"role": "user", "content": Template(h.instance_template).render(task=t.problem_statement, repo=t.repo)}]
        assert len(chat.render(tok, first, [BASH])) < 512, t.instance_id

    replay = [sys.executable, "-m", "trajsft.cli", "eval", "demo", "--agent", "--replay", "--json"]
    graded = lambda: [p for p in (wd / done["location"] / "replay/episodes").glob("*.json")  # noqa: E731
                      if not p.name.endswith(".traj.json")] if (wd / done["location"] / "replay/episodes").exists() else []
    killed = subprocess.Popen(replay, cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(),
                              start_new_session=True)
    try:
        wait_for(lambda: len(graded()) >= 3, 300, "three graded replay episodes", killed)
    finally:
        kill_group(killed, signal.SIGKILL)
    before = len(graded())
    assert 3 <= before < len(tasks)
    again = subprocess.run(replay, cwd=wd, capture_output=True, text=True, env=env(), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    r = json.loads(again.stdout)
    assert (r["model"], r["tasks"], r["resolved"], r["resolve_rate"]) == ("replay", len(tasks), len(tasks), 1.0), r
    assert f"{before} of {len(tasks)} tasks already graded" in again.stderr
    assert f"running the other {len(tasks) - before}" in again.stderr
    assert all(x["exit_status"] == "Submitted" for x in r["rows"])

    crate = [t.instance_id for t in tasks if t.repo == "mini_math"]
    only = evaluate.eval_agent(dataclasses.replace(cfg, episodes_at_once=3), "submit",
                               location=str(wd / "submit-only"), only=crate)
    assert (only["tasks"], only["resolved"]) == (len(crate), 0) and only["exit_statuses"] == {"Submitted": len(crate)}

    # the context, never a hang: a first prompt over it cannot start (graded: unresolved); a prompt that outgrows it
    # mid-episode ends the episode, its diff graded as it stands (the replay's fix is in: resolved)
    import yaml

    doc = yaml.safe_load(Path(cfg.harness).read_text())
    for name, over in (("long", {"system_template": doc["system_template"] * 40}),
                       ("grows", {"observation_template": "padding " * 700 + doc["observation_template"]})):
        harness_file = wd / f"harness-{name}.yaml"
        harness_file.write_text(yaml.safe_dump({**doc, **over}))
        got = evaluate.eval_agent(dataclasses.replace(cfg, harness=str(harness_file)), "replay",
                                  location=str(wd / f"context-{name}"), only=crate[:1])
        [row] = json.loads(Path(got["results"]).read_text())["rows"]
        if name == "long":
            assert (row["exit_status"], row["steps"], row["resolved"]) == ("could_not_start", 1, False), row
        else:
            assert (row["exit_status"], row["steps"], row["resolved"]) == ("context_exceeded", 2, True), row
        assert "maximum context length is 1024 tokens" in row["error"]

    # issue 71: `repeats: 3` at a temperature on the demo's one-crate set (mini_math): three sampled episodes per
    # task, each with a seed of its own; the rate is their mean, printed with the std of the three repeats' rates
    shutil.copytree(REPO / "tasks/demo/crates/mini_math", wd / "crates-mini/mini_math")
    over = {"agent": {"repeats": 3, "temperature": 0.7, "episodes_at_once": 4},
            "tasks": {"demo": {"crates": str(wd / "crates-mini")}}}
    refused = run(wd, "agent/demo/done", config={"agent": {"repeats": 3}}, check=False)
    assert refused.returncode != 0 and "agent.repeats is 3 with agent.temperature 0" in refused.stderr, \
        refused.stderr[-2000:]
    run(wd, "agent/demo/done", config=over, timeout=900)
    done3 = json.loads((wd / "agent/demo/done").read_text())
    assert (done3["tasks"], done3["episodes"], done3["repeats"]) == (len(crate), 3 * len(crate), 3), done3
    rows3 = json.loads((wd / done3["location"] / "results.json").read_text())["rows"]
    assert sorted((r["instance_id"], r["repeat"]) for r in rows3) == sorted((i, k) for i in crate for k in range(3))
    rates = [sum(r["resolved"] for r in rows3 if r["repeat"] == k) / len(crate) for k in range(3)]
    assert done3["repeat_rates"] == rates and done3["resolve_rate"] == pytest.approx(sum(rates) / 3)
    assert done3["resolve_rate_std"] == pytest.approx(statistics.stdev(rates))
    for k in (1, 2):  # each repeat's files beside the first's
        assert (wd / done3["location"] / f"episodes/{crate[0]}.r{k}.traj.json").exists()
    human = cli(wd, "eval", "demo", "--agent", "--configfile", str(wd / "test-overrides.yaml"))
    assert human.returncode == 0, human.stderr[-2000:]
    assert (f"demo (student): resolved {done3['resolved']}/{3 * len(crate)} episodes: {done3['resolve_rate']:.1%} ± "
            f"{done3['resolve_rate_std']:.1%} (mean ± std of 3 repeats)") in human.stdout, human.stdout

    # scripts/bench_agent.py (issue 71), a small version: 1 and 4 episodes at once on three tasks, the ratios printed
    bench = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_agent.py"), "--workdir", str(wd), "--tasks",
                            "3", "--repeats", "1", "--at-once", "1,4", "--json"], capture_output=True, text=True,
                           timeout=600)
    assert bench.returncode == 0, bench.stderr[-3000:]
    b = json.loads(bench.stdout)
    assert [s["episodes_at_once"] for s in b["settings"]] == [1, 4] and all(s["episodes"] == 3 for s in b["settings"])
    assert b["settings"][0]["tokens_per_s_ratio_to_one"] == 1.0 and all(
        s["generated_tokens"] > 0 and s["batches"] > 0 and 0 < s["occupancy"] <= 1 for s in b["settings"])


def needs_sandbox(skip: bool = True) -> bool:
    """Whether the sandbox's tools are here; without them the test is skipped (or, not ``skip``, goes on without
    its agent part: False), unless TRAJSFT_REQUIRE_SANDBOX=1 requires them (it fails)."""
    from trajsft.tasks.sandbox import missing

    lacking = missing("bubblewrap")
    if lacking and (skip or required.required("TRAJSFT_REQUIRE_SANDBOX")):
        required.skip_or_fail("TRAJSFT_REQUIRE_SANDBOX", f"the sandbox needs {', '.join(lacking)}")
    return not lacking
