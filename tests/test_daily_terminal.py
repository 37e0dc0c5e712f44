"""A daily user's terminal (issue 67): quick daily commands, outputs git does not see, one line for a misuse."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from docs_utils import REPO


def trajsft(*args: str, cwd=REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_version_names_the_commit_and_the_stack():
    p = trajsft("--version")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    [line] = p.stdout.splitlines()
    assert re.match(r"^trajsft \d+\.\d+\.\d+ \(commit [0-9a-f]{10}(, uncommitted changes)?\); levanter \S+, jax \S+, "
                    r"snakemake \S+, ray \S+$", line), line


@pytest.mark.parametrize("path", ["evals/demo/done", "sweeps/lr/results.csv", "agent/demo/done",
                                  "results/tasks/demo-0123456789/manifest.json", "checkpoints/demo/done"])
def test_what_the_workflow_writes_in_the_checkout_is_ignored_by_git(path):
    """So a run's provenance is not 'dirty' after the demo, a sweep or an agent evaluation."""
    p = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=REPO)
    assert p.returncode == 0, f"{path} is not ignored by git"


def test_the_ignore_check_sees_a_path_git_would_show():
    assert subprocess.run(["git", "check-ignore", "--no-index", "-q", "src/trajsft/new.py"], cwd=REPO).returncode == 1


def test_the_venv_is_byte_compiled_by_ci_only():
    """uv checks (and prints "Bytecode compiled N files") on every `uv run` where pyproject.toml asks for it: only
    .ci/run does, by UV_COMPILE_BYTECODE=1."""
    import tomllib

    uv = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["uv"]
    assert "compile-bytecode" not in uv
    assert re.search(r"^export UV_COMPILE_BYTECODE=1$", (REPO / ".ci/run").read_text(), re.M)


@pytest.mark.integration
def test_a_second_uv_run_prints_no_bytecode_pass():
    uv = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(uv):
        pytest.skip("uv is not on PATH")
    env = {k: v for k, v in os.environ.items() if k != "UV_COMPILE_BYTECODE"}
    outs = [subprocess.run([uv, "run", "--locked", "--offline", "python", "-c", "pass"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert all(p.returncode == 0 for p in outs), [p.stderr for p in outs]
    assert "Bytecode compiled" not in outs[1].stderr + outs[1].stdout, outs[1].stderr


def _json_line(step: int, metrics: dict) -> str:
    import json

    rec = {"tracker": "json_logger", "event": "log", "step": step, "metrics": metrics}
    return f"2026-11-29T07:05:25 - 0 - levanter.json_logger - json_logger.py:89 - INFO :: {json.dumps(rec)}\n"


def test_training_progress_is_one_line_per_new_step_at_a_bounded_rate(tmp_path):
    from trajsft.train.progress import Progress

    log = tmp_path / "train.log"
    log.write_text(_json_line(3, {"train/loss": 9.0}))  # an earlier launch's: not this one's progress
    now = [100.0]
    said: list[str] = []
    p = Progress("trajsft train demo", str(log), 25, every=10, out=said.append, clock=lambda: now[0])
    p.look()
    assert said == []  # nothing new yet
    with open(log, "a") as f:
        f.write("compiling...\n" + _json_line(0, {"train/loss": 4.5}) + _json_line(0, {"throughput/tokens_per_second": 1234.5}))
    p.look()
    assert said == ["trajsft train demo: step 1/25 · loss 4.5000 · 1.2k tokens/s"]
    now[0] = 105.0
    with open(log, "a") as f:
        f.write(_json_line(4, {"train/loss": 3.25}))
    p.look()
    assert len(said) == 1  # 5 s since the last line: wait
    now[0] = 110.0
    p.look()  # 10 s per 4 steps since the first one seen: 20 steps left
    assert said[-1] == "trajsft train demo: step 5/25 · loss 3.2500 · 1.2k tokens/s · ETA 0:50"
    now[0] = 130.0
    p.look()
    assert len(said) == 2  # no new step: no repeat
    with open(log, "a") as f:
        f.write(_json_line(5, {"train/loss": 3.0})[:40])  # half a line: read when whole
    p.look()
    assert len(said) == 2
    with open(log, "a") as f:
        f.write(_json_line(5, {"train/loss": 3.0})[40:])
    p.look()
    assert said[-1].startswith("trajsft train demo: step 6/25 · loss 3.0000")


def test_progress_is_looked_at_while_a_child_runs(tmp_path):
    import time

    from trajsft.train.launch import run_subprocess
    from trajsft.train.progress import shown_while

    looks = []

    class Looked:
        def look(self):
            looks.append(1)

    with shown_while(Looked(), tick_s=0.1):
        rc = run_subprocess([sys.executable, "-c", "import time; time.sleep(0.7)"], str(tmp_path / "log"),
                            dict(os.environ), str(tmp_path), "header")
    assert rc == 0 and len(looks) >= 3
    n = len(looks)
    time.sleep(0.3)
    assert len(looks) == n  # no look after the block


def test_ctrl_c_of_any_command_is_one_line(monkeypatch, capsys):
    import trajsft.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_plan", interrupted)
    assert cli.main(["plan", "demo"]) == 130
    assert capsys.readouterr().err == "trajsft plan: stopped (Ctrl-C)\n"


@pytest.mark.parametrize("args, line", [
    (["serve", "demo", "--port", "70000"], "trajsft serve: --port 70000 is not a TCP port (0-65535; 0: any free one)"),
    (["serve", "demo", "--max-seqs", "0"], "trajsft serve: --max-seqs 0: serve at least 1 sequence at once"),
    (["plan", "--configfile", "config/config.yaml", "demo"],
     "trajsft: demo is a directory, not a config file (--configfile takes every following argument, as in snakemake; "
     "put targets first: trajsft plan demo --configfile ...)"),
])
def test_a_misuse_is_one_line_and_exit_2(args, line):
    p = trajsft(*args)
    assert (p.returncode, p.stderr, p.stdout) == (2, line + "\n", ""), p.stderr


def test_where_snakemake_parses_a_config_file_itself_trajsft_plan_says_where_it_breaks(tmp_path):
    """Snakemake reads --configfile itself and says only "not valid JSON or YAML" (left as it is); the command the
    docs name for more, `trajsft plan <target> --configfile <file>`, says the file, line and column."""
    from pipeline_utils import SNAKEMAKE

    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {learning_rate: [1\n")
    sm = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n", "--configfile", str(bad)],
                        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert sm.returncode == 1 and "Config file is not valid JSON or YAML" in sm.stdout + sm.stderr, sm.stderr
    p = trajsft("plan", "demo", "--configfile", "bad.yaml", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("trajsft: bad.yaml: not valid YAML: while parsing a flow sequence in \"bad.yaml\", "
                               "line 1, column 27"), p.stderr
    assert "trajsft plan <target> --configfile" in (REPO / "docs/observing-runs.md").read_text()


@pytest.mark.integration
def test_fit_says_what_it_compiles_and_ctrl_c_stops_it_in_one_line(tmp_path):
    """`trajsft fit` names the policy it compiles on the terminal; Ctrl-C then is one line (52 before: tracebacks),
    exit 130, and the compile process is gone. A fit cache of its own: nothing cached, the compile starts."""
    import signal
    import time

    import psutil

    pytest.importorskip("libtpu")
    env = dict(os.environ, TRAJSFT_FIT_CACHE=str(tmp_path / "fit-cache"))
    p = subprocess.Popen([sys.executable, "-m", "trajsft.cli", "fit", "demo", "--tpu-type", "v5p-8", "--remat", "full",
                          "--no-suggest", "--configfile", str(REPO / "tests/data/fit_aligned.yaml")],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stderr.readline()  # blocks until the first line
    assert first.startswith("trajsft fit: compiling demo's train step for v5p-8 (remat full, batch "), first
    deadline, children = time.time() + 30, []
    while time.time() < deadline and not any("trajsft.fit.compile" in " ".join(c.cmdline()) for c in children):
        time.sleep(0.1)  # the line is said just before the compile process starts
        children = psutil.Process(p.pid).children(recursive=True)
    assert any("trajsft.fit.compile" in " ".join(c.cmdline()) for c in children)
    time.sleep(1)  # well into the compile's start-up
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "trajsft fit: stopped (Ctrl-C)\n" and out == "", err
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_a_followed_ray_job_shows_its_progress_from_the_log_the_follower_writes(tmp_path, monkeypatch, capsys):
    """The Ray executor's attempt: while the job is followed (its log written by the follower), the terminal gets
    the same progress lines as a local training."""
    import time

    from trajsft.executor import executor_for
    from trajsft.plan import config as C, step_configs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAJSFT_PROGRESS_SECONDS", "0")
    plan = C.Plan(C.load(None, {"executor": "ray", "ray": {"address": "http://127.0.0.1:1", "tpu_type": "v5p-8"},
                                "storage_root": str(tmp_path / "root")}), base_dir=C.REPO_DIR)
    tc = step_configs.train(plan, "demo")
    os.makedirs(tc.state_dir)

    def followed(got, lev, attempt):  # the follower appending the job's log
        for step in range(3):
            with open(got.log, "a") as f:
                f.write(_json_line(step, {"train/loss": 5.0 - step}))
            time.sleep(0.3)
        time.sleep(2.5)
        return {"steps": 3}

    import trajsft.cluster.submit as submit

    monkeypatch.setattr(submit, "train_on_ray", followed)
    assert executor_for(plan.cfg).train_attempt(tc, {"trainer": {"num_train_steps": 27}}, 1) == {"steps": 3}
    said = capsys.readouterr().err.splitlines()
    assert said and said[-1].startswith("trajsft train demo: step 3/27 · loss 3.0000"), said
    assert all(x.startswith("trajsft train demo: step ") for x in said), said


# ---- one cause, once, whole (part 5) ----------------------------------------------------------------------------------

def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cause_of(url: str, **kw) -> str | None:
    import requests

    from trajsft.errors import network_cause

    with pytest.raises(requests.RequestException) as e:
        requests.get(url, **kw)
    return network_cause(e.value)


def test_the_root_cause_of_a_network_failure_names_the_host():
    """What `trajsft plan` says of a bucket, said of any request: requests wraps urllib3 wraps the socket's error."""
    import socket
    import threading

    from trajsft.errors import network_cause

    assert _cause_of("http://trajsft-no-such-host.invalid/x", timeout=10) == (
        "trajsft-no-such-host.invalid does not resolve (no network, or DNS down)")
    port = _closed_port()
    assert _cause_of(f"http://127.0.0.1:{port}/x", timeout=10) == (
        f"127.0.0.1:{port} refused the connection (nothing listens there)")
    with socket.socket() as mute:  # accepts, never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        held = []
        threading.Thread(target=lambda: held.append(mute.accept()), daemon=True).start()
        assert _cause_of(f"http://127.0.0.1:{mute.getsockname()[1]}/x", timeout=0.3) == (
            f"127.0.0.1:{mute.getsockname()[1]} did not answer in time")
    with socket.socket() as rude:  # accepts, then closes at once: a reply cut short names no host but the request
        rude.bind(("127.0.0.1", 0))
        rude.listen()
        threading.Thread(target=lambda: rude.accept()[0].close(), daemon=True).start()
        assert _cause_of(f"http://127.0.0.1:{rude.getsockname()[1]}/x", timeout=10) == (
            f"127.0.0.1:{rude.getsockname()[1]} reset the connection")  # (or RemoteDisconnected: a reset too)
    assert network_cause(ValueError("bad value")) is None and network_cause(OSError("disk")) is None


def test_a_dead_childs_cause_is_the_exception_its_last_traceback_ended_with(tmp_path):
    from trajsft.logs import last_exception
    from trajsft.train.metrics import LAUNCH_MARK
    from trajsft.train.run import child_cause

    first = "Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    f()\nKeyError: 'x'\n"
    chained = ("Traceback (most recent call last):\n  File \"b.py\", line 2\nValueError: inner\n\nDuring handling of "
               "the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File "
               "\"b.py\", line 4, in g\n    raise X\n    ^^^^^^^\njax.errors.JaxRuntimeError: INTERNAL: out of memory\n"
               "2026-11-29 INFO after the fact\n")
    assert last_exception(first + "noise\n" + chained) == "jax.errors.JaxRuntimeError: INTERNAL: out of memory"
    assert last_exception("Traceback (most recent call last):\n  File \"c.py\"\nSystemExit\n") == "SystemExit"
    assert last_exception("no trace here\n") is None
    log = tmp_path / "train.log"
    log.write_text(f"{LAUNCH_MARK} 1\n{first}{LAUNCH_MARK} 2\nstep 3\n")
    assert child_cause(str(log)) == ""  # the last launch died of no traceback (a signal): nothing to add
    log.write_text(f"{LAUNCH_MARK} 1\nok\n{LAUNCH_MARK} 2\n{first}")
    assert child_cause(str(log)) == " (KeyError: 'x')" and child_cause(str(tmp_path / "none.log")) == ""
    from trajsft.cluster import host  # a slice host's train_lm: the same cause, not the last line with "Error" in it

    log.write_text(chained + "2026-11-29 ERROR wandb: an unrelated error line after it\n")
    assert host._last_error(str(log)) == "jax.errors.JaxRuntimeError: INTERNAL: out of memory"
    log.write_text("gloo Error: peer closed\nlast words\n")  # no traceback: the last error-like line, as before
    assert host._last_error(str(log)) == "gloo Error: peer closed"


def test_snakemake_does_not_restate_a_rule_scripts_own_failure(capsys):
    """The rule said its cause (exit 1) or its stop (130, 143): Snakemake's CalledProcessError record naming the
    temporary script is left out; a rule killed by a signal (-9) said nothing, so it stays."""
    import logging

    from trajsft.logs import one_line_stops

    name = f"trajsft-said-{os.getpid()}"
    one_line_stops(name)
    lg = logging.getLogger(name)
    seen = []
    lg.addHandler(h := logging.Handler())
    h.emit = seen.append
    record = ("RuleException:\nCalledProcessError in file \"/w/rules/data.smk\", line 19:\nCommand 'set -euo pipefail;"
              "  /w/.venv/bin/python /w/.snakemake/scripts/tmpbjp5newr.download.py' returned non-zero exit status {}.")
    try:
        for code in (1, 130, 143, -9, 2):
            lg.error(record.format(code))
    finally:
        lg.removeHandler(h)
    assert [r.getMessage()[-4:] for r in seen] == [" -9.", "s 2."]
    assert capsys.readouterr().err == ""


# ---- progress on the data steps ---------------------------------------------------------------------------------------

def test_a_data_step_says_its_count_at_a_bounded_rate_and_nothing_when_short():
    from trajsft.terminal import Counted

    now = [100.0]
    lines: list[str] = []
    c = Counted("trajsft shard raw-x", 1000, every=10, out=lines.append, clock=lambda: now[0])
    for _ in range(3):  # 300 rows in 9 s: shorter than the first line's wait, nothing said
        now[0] += 3
        c.add(100)
    assert lines == []
    now[0] += 1  # 10 s in
    c.add(100)
    assert lines == ["trajsft shard raw-x: 400/1,000 rows · 40 rows/s · ETA 0:15"]
    now[0] += 5
    c.add(100)  # 5 s later: not yet
    now[0] += 5
    c.add(500)
    assert lines[1:] == ["trajsft shard raw-x: 1,000/1,000 rows · 50 rows/s"]  # done: no ETA
    n = Counted("trajsft tokenize x", None, "chats", every=0, out=lines.append, clock=lambda: now[0] + 2)
    assert list(n.counting("ab")) == ["a", "b"] and lines[-1] == "trajsft tokenize x: 2 chats"  # no total, no rate


def test_the_shard_step_shows_its_rows_on_stderr(tmp_path, monkeypatch, capfd):
    from trajsft.data import download, shard
    from trajsft.plan import config as C, step_configs

    monkeypatch.setenv("TRAJSFT_PROGRESS_SECONDS", "0")  # every row: the demo's 60 take well under 10 s
    plan = C.Plan(C.load(None, {"storage_root": str(tmp_path / "store")}), base_dir=C.REPO_DIR,
                  state_dir=str(tmp_path / "state"))
    names = {a.kind: a.name for a in plan.chain("demo")}
    download.download(step_configs.download(plan, names["raw"]))
    capfd.readouterr()
    shard.shard(step_configs.shard(plan, names["shards"]))
    lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith(f"trajsft shard {names['shards']}: ")]
    assert len(lines) == 60 and lines[-1].startswith(f"trajsft shard {names['shards']}: 60/60 rows · ")
    assert re.search(r": 30/60 rows · [\d.k]+ rows/s · ETA \d+:\d\d$", lines[29]), lines[29]


def test_evaluation_and_serving_run_jax_on_the_cpu_where_no_accelerator_is(monkeypatch):
    """libtpu (installed for the fit check) would look for a TPU and print its lockfile / worker-hostname errors:
    where no accelerator device is, JAX is told cpu, also when jax was imported first (test_pipeline: serve)."""
    import jax

    from trajsft.train import eval as ev

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(ev.glob, "glob", lambda pattern: [])
    ev.use_this_machines_platform()
    assert os.environ["JAX_PLATFORMS"] == "cpu" and jax.config.jax_platforms == "cpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(ev.glob, "glob", lambda pattern: ["/dev/accel0"] if "accel" in pattern else [])
    ev.use_this_machines_platform()  # a TPU VM: JAX picks
    assert "JAX_PLATFORMS" not in os.environ
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert ev.jax_platforms() == "tpu"  # the caller's own choice wins
