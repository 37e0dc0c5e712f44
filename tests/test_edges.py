"""Issue 9 edges that need no training: run identity and stop markers (real processes and
signals), download staging, config errors, plan/status after a config change, CLI misuse,
and what Ray would upload with the working dir (Ray's own packaging code)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import psutil
import pytest
import yaml

from pipeline_utils import REPO, SNAKEMAKE, wait_for
from trajsft.plan import step_configs
from trajsft.plan import config as C
from trajsft.runtime import signals


def py(code: str, *, env: dict | None = None, cwd=None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **(env or {})},
                            cwd=cwd, **kw)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def dead_run_id() -> str:
    p = sleeper()
    rid = signals.run_id(psutil.Process(p.pid))
    p.kill()
    p.wait()
    return rid


def is_stopping(rid: str | None, workdir: Path) -> bool:
    env = {signals.RUN_ENV: signals.run_env(rid)} if rid else {}
    env_clean = {k: v for k, v in os.environ.items() if k != signals.RUN_ENV}
    out = subprocess.run([sys.executable, "-c", "from trajsft.runtime import signals; print(signals.snakemake_is_stopping())"],
                         env={**env_clean, **env}, cwd=workdir, capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


# ---- stop markers: tied to the exact run --------------------------------------------------
def test_stop_marker_names_pid_and_start_time_and_goes_away_when_its_run_exits(tmp_path):
    fake_snakemake = py("""
        import sys, time
        from trajsft.runtime import signals
        print(signals.mark_stopping(), flush=True)
        sys.stdin.readline()
    """, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    marker = tmp_path / fake_snakemake.stdout.readline().strip()
    rid = signals.run_id(psutil.Process(fake_snakemake.pid))
    assert marker.name == f"trajsft-stopping-{rid}" and marker.exists()
    assert is_stopping(rid, tmp_path)  # a rule job of that run does not start a new attempt
    fake_snakemake.stdin.write("\n")
    fake_snakemake.stdin.flush()
    assert fake_snakemake.wait(30) == 0
    assert not marker.exists(), "the marker must be removed when its Snakemake run ends"


def test_marker_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    p = py("from trajsft.runtime import signals; signals.mark_stopping(); import time; time.sleep(120)", cwd=tmp_path)
    rid = signals.run_id(psutil.Process(p.pid))
    marker = signals.stop_marker(rid, tmp_path)
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL)  # no atexit: the marker stays behind ...
    p.wait()
    assert marker.exists()
    live = py("from trajsft.runtime import signals; signals.register_run(); print('ok')", cwd=tmp_path,
              stdout=subprocess.PIPE, text=True)
    assert live.communicate(timeout=30)[0].strip() == "ok"
    assert not marker.exists()  # ... until the next Snakemake run starts


def test_reused_pid_does_not_inherit_an_old_stop_marker(tmp_path):
    """A marker written by an earlier process that had the same pid (different start time)."""
    new = sleeper()
    try:
        rid = signals.run_id(psutil.Process(new.pid))
        pid, start = rid.split("-")
        old_marker = signals.stop_marker(f"{pid}-{int(start) - 12345}", tmp_path)
        old_marker.parent.mkdir(parents=True)
        old_marker.touch()
        (tmp_path / ".snakemake" / f"trajsft-stopping-{pid}").touch()  # the old pid-only format
        assert not is_stopping(rid, tmp_path)
        signals.remove_stale_markers(tmp_path)
        assert not list((tmp_path / ".snakemake").glob("trajsft-stopping-*"))
    finally:
        new.kill()
        new.wait()


def test_pid_1_ancestor_does_not_match(tmp_path):
    """Every process descends from PID 1: a marker of a Snakemake that ran as PID 1 (a container)
    must not stop rule jobs of another run, nor jobs without a run."""
    one = psutil.Process(1)
    (tmp_path / ".snakemake").mkdir()
    signals.stop_marker(signals.run_id(one), tmp_path).touch()
    (tmp_path / ".snakemake" / "trajsft-stopping-1").touch()
    other = sleeper()
    try:
        assert not is_stopping(signals.run_id(psutil.Process(other.pid)), tmp_path)
        assert not is_stopping(None, tmp_path)
    finally:
        other.kill()
        other.wait()


# ---- rule jobs die with their Snakemake ---------------------------------------------------
def test_rule_job_stops_and_cleans_up_when_its_snakemake_is_killed(tmp_path):
    fake_snakemake = sleeper()
    rid = signals.run_id(psutil.Process(fake_snakemake.pid))
    job = py("""
        import time
        from pathlib import Path
        from trajsft.runtime import signals
        signals.install_stop_handler()
        signals.watch_snakemake(poll_s=0.2)
        Path("started").touch()
        try:
            time.sleep(120)
        except KeyboardInterrupt as e:
            Path("cleaned-up").write_text(str(e))
            raise SystemExit(130)
    """, env={signals.RUN_ENV: signals.run_env(rid)}, cwd=tmp_path)
    deadline = time.time() + 30
    while not (tmp_path / "started").exists() and time.time() < deadline:
        time.sleep(0.1)
    os.kill(fake_snakemake.pid, signal.SIGKILL)
    fake_snakemake.wait()
    assert job.wait(timeout=20) == 130
    assert f"Snakemake (run {rid}) is gone" in (tmp_path / "cleaned-up").read_text()


def test_rule_job_of_a_run_that_is_already_gone_stops_at_once(tmp_path):
    job = py("""
        import time
        from trajsft.runtime import signals
        signals.install_stop_handler()
        signals.watch_snakemake(poll_s=0.2)
        time.sleep(120)
    """, env={signals.RUN_ENV: signals.run_env(dead_run_id())}, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    _, err = job.communicate(timeout=20)
    assert job.returncode != 0 and "SnakemakeGone" in err


def test_run_of_another_host_is_not_watched(tmp_path):
    """A cluster executor may forward the env var to another node: that pid means nothing there."""
    job = py("""
        import time
        from trajsft.runtime import signals
        assert signals.current_run() is None and not signals.snakemake_is_stopping()
        assert signals.watch_snakemake(poll_s=0.1) is None
        time.sleep(1)
    """, env={signals.RUN_ENV: f"some-other-host/{dead_run_id()}"}, cwd=tmp_path)
    assert job.wait(timeout=30) == 0


# ---- attempts.json stays true ---------------------------------------------------------------
def test_attempt_of_a_live_process_is_not_marked_interrupted(tmp_path):
    from trajsft.runtime import provenance

    live = sleeper()
    try:
        started = provenance.now()
        attempts = [{"attempt": 1, "outcome": "running", "pid": live.pid, "hostname": socket.gethostname(),
                     "started": started},
                    ]
        (tmp_path / "attempts.json").write_text(json.dumps(attempts))
        assert provenance.running_attempt(str(tmp_path))["pid"] == live.pid
        live.kill()
        live.wait()
        assert provenance.running_attempt(str(tmp_path)) is None
        provenance.record_attempt(str(tmp_path))
        a = provenance.read_attempts(str(tmp_path))
        assert [x["outcome"] for x in a] == ["interrupted", "running"]
    finally:
        live.kill()


def test_exit_reason_of_a_signal():
    from trajsft.train.launch import exit_reason

    assert exit_reason(-9) == "train_lm was killed by signal 9 (SIGKILL; out of memory?)"
    assert exit_reason(-15) == "train_lm was killed by signal 15 (SIGTERM)"
    assert exit_reason(1) == "train_lm exited with code 1"


# ---- download staging -----------------------------------------------------------------------
def test_download_stages_under_storage_root_and_removes_stale_staging(tmp_path, monkeypatch):
    from trajsft.data import download

    monkeypatch.chdir(tmp_path)
    # a temp dir of this test's own: the machine's /tmp also holds what other tests (another worker) make meanwhile
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    plan = C.Plan(C.load(None, {"storage_root": str(tmp_path / "store")}), base_dir=C.REPO_DIR)
    [raw] = [a for a in plan.chain("demo") if a.kind == "raw"]
    staging = step_configs.download(plan, raw.name).staging
    assert staging == tmp_path / "store" / "raw" / ".staging"
    killed = staging / f"{raw.name}.{dead_run_id()}"  # what a killed download leaves
    (killed / "data").mkdir(parents=True)
    (killed / "data" / "train-00000-of-00001.parquet").write_bytes(b"x" * 1000)
    live = sleeper()
    try:
        running = staging / f"other.{signals.run_id(psutil.Process(live.pid))}"
        running.mkdir()
        before = set(os.listdir(tempfile.gettempdir()))
        res = download.download(step_configs.download(plan, raw.name))
        assert not killed.exists() and running.exists()  # only dead downloads are removed
        assert set(os.listdir(staging)) == {running.name}
    finally:
        live.kill()
        live.wait()
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("trajsft")]
    assert res["rows"] == 60
    umask = os.umask(0)
    os.umask(umask)
    mode = os.stat(raw.location).st_mode & 0o777
    assert mode == 0o777 & ~umask and mode & 0o055, oct(mode)  # not 0700


def test_stale_cache_builds_of_dead_or_zombie_builders_are_removed_live_ones_kept(tmp_path):
    """A builder SIGKILLed with its Snakemake stays a zombie until init reaps it (seconds on a busy machine):
    the next build must not take it for alive, or its dir is left behind for good."""
    from trajsft.data import cache

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not waited for: a zombie
    wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30, "a zombie child")
    live = sleeper()
    try:
        dirs = {who: tmp_path / f".cache.building-{rid}-0123abcd" for who, rid in (
            ("zombie", signals.run_id(psutil.Process(zombie.pid))), ("dead", dead_run_id()),
            ("live", signals.run_id(psutil.Process(live.pid))), ("reused pid", f"{live.pid}-1"))}
        for d in dirs.values():
            (d / "train").mkdir(parents=True)
        (tmp_path / ".cache-packed.building-1-1-0123abcd").mkdir()  # another cache's build: not ours to judge
        cache._cleanup_stale_builds(str(tmp_path), "cache")
        assert {who for who, d in dirs.items() if d.exists()} == {"live"}
        assert (tmp_path / ".cache-packed.building-1-1-0123abcd").exists()
    finally:
        live.kill()
        live.wait()
        zombie.wait()


def test_an_interrupted_build_leaves_no_build_dir_while_its_writes_are_still_in_flight(tmp_path):
    """An interrupt can land while tensorstore still writes the last batch on its own threads (CI saw
    a `.cache.building-*` dir outlive a tokenize job killed with its Snakemake): the failed build's
    dir is removed until it stays gone, even when a late write recreates files in it."""
    import threading

    from trajsft.data import cache

    final = tmp_path / "cache"
    late = threading.Event()

    def late_writer(build_dir: str) -> None:  # what an in-flight tensorstore write does
        late.wait(10)
        for k in range(5):
            time.sleep(0.05)
            os.makedirs(os.path.join(build_dir, "train", "input_ids"), exist_ok=True)
            Path(build_dir, "train", "input_ids", f"chunk-{k}").write_bytes(b"x")

    with pytest.raises(KeyboardInterrupt):
        with cache._building(str(final)) as build_dir:
            (Path(build_dir) / "train").mkdir()
            writer = threading.Thread(target=late_writer, args=(build_dir,))
            writer.start()
            late.set()
            raise KeyboardInterrupt
    writer.join()
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())


# ---- config errors --------------------------------------------------------------------------
def write(path: Path, obj) -> str:
    path.write_text(yaml.safe_dump(obj) if not isinstance(obj, str) else obj)
    return str(path)


def test_schema_violations_are_one_line_each(tmp_path):
    bad = write(tmp_path / "bad.yaml", "training: {learning_rate: -0.1, batch_size: 0, lr_schedule: cosin}\n")
    with pytest.raises(C.ConfigError) as e:
        C.load([C.DEFAULT_CONFIG, bad])
    assert str(e.value).splitlines() == [
        "config: training.batch_size: 0 is not allowed (allowed: >= 1)",
        "config: training.learning_rate: -0.1 is not allowed (allowed: > 0)",
        "config: training.lr_schedule: 'cosin' is not allowed (allowed: cosine, linear, constant)",
    ]


def test_yaml_1_1_exponent_is_a_float(tmp_path):
    f = write(tmp_path / "lr.yaml", "training: {learning_rate: 3e-3}\nteachers: {demo: {training: {epsilon: 1e-6}}}\n")
    assert yaml.safe_load(Path(f).read_text())["training"]["learning_rate"] == "3e-3"  # YAML 1.1
    cfg = C.load([C.DEFAULT_CONFIG, f])
    assert cfg["training"]["learning_rate"] == 3e-3 and cfg["teachers"]["demo"]["training"]["epsilon"] == 1e-6
    same = C.load([C.DEFAULT_CONFIG, write(tmp_path / "lr2.yaml", "training: {learning_rate: 0.003}\n")])
    plan_a, plan_b = C.Plan(cfg), C.Plan(same)
    assert plan_a.target("minimax-m2.5")["run"].hash == plan_b.target("minimax-m2.5")["run"].hash


def sm(*args, cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    """Snakemake on the repository's workflow in ``cwd``; ``env`` over the Hub offline (a None value: unset)."""
    e = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(cwd), "--cores", "1", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={k: v for k, v in e.items() if v is not None})


def test_one_line_is_what_every_error_line_goes_through():
    from trajsft.errors import one_line

    assert one_line("a\n  b\tc ") == "a b c"
    assert one_line("x" * 301) == "x" * 297 + "..." and len(one_line("y " * 200, 200)) == 200
    assert one_line(OSError()) == "OSError" and one_line("") == ""


def test_a_workflow_stop_is_its_message_alone_on_stderr(capsys):
    """What rules/common.smk raises instead of sys.exit: the record Snakemake logs for it (file, line, trace, or an
    input function's wrapper) becomes the message on stderr; any other error record is left to Snakemake."""
    from trajsft.logs import WorkflowStop, one_line_stops

    name = f"trajsft-test-{os.getpid()}"
    one_line_stops(name)
    one_line_stops(name)  # idempotent: the workflow is read more than once
    lg = logging.getLogger(name)
    assert len(lg.filters) == 2  # and the restated failure of a rule script (test_daily_terminal)
    seen = []
    lg.addHandler(h := logging.Handler())
    h.emit = seen.append
    try:
        stop = WorkflowStop("trajsft: checkpoints/x/done: unknown target 'x'")
        lg.error(f"InputFunctionException in rule unknown_target in file common.smk, line 98:\nError:\n  {stop!r}\n"
                 "Wildcards:\n  other=x\nTraceback:\n  File common.smk, line 98")
        lg.error("MissingInputException in rule train: results/raw/x/manifest.json")
    finally:
        lg.removeHandler(h)
    assert capsys.readouterr().err == "trajsft: checkpoints/x/done: unknown target 'x'\n"
    assert [r.getMessage() for r in seen] == ["MissingInputException in rule train: results/raw/x/manifest.json"]


def test_snakemake_config_errors_are_one_line_per_problem(tmp_path):
    bad = write(tmp_path / "bad.yaml", "training: {learning_rate: -1, batch_size: 0}\n")
    p = sm("-n", "checkpoints/demo/done", "--configfile", bad, cwd=tmp_path)
    assert p.returncode == 1
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("config:")]
    assert err == ["config: training.batch_size: 0 is not allowed (allowed: >= 1)",
                   "config: training.learning_rate: -1 is not allowed (allowed: > 0)"]
    assert "Traceback" not in p.stderr and "jsonschema" not in p.stderr


def test_snakemake_typo_target_lists_valid_targets(tmp_path):
    p = sm("-n", "checkpoints/minimax/done", cwd=tmp_path)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("trajsft: checkpoints/minimax/done: unknown target 'minimax' (teachers and mixtures: ")
    assert "minimax-m2.5" in last and "mix-all" in last
    assert "MissingRuleException" not in p.stderr and "Traceback" not in p.stderr
    assert sm("-n", "checkpoints/demo/done", cwd=tmp_path).returncode == 0  # real targets unaffected


def test_snakemake_evals_of_a_typo_or_of_a_target_without_held_out_chats_is_one_line(tmp_path):
    """evals/<target>/done (rule eval_actions): a typo lists the targets; a target whose teachers hold out nothing
    (the reference config) says which setting to change, before anything runs."""
    typo = sm("-n", "evals/minimax/done", cwd=tmp_path)
    assert typo.returncode == 1 and "Traceback" not in typo.stderr and "MissingRuleException" not in typo.stderr
    assert typo.stderr.strip().splitlines()[-1].startswith(
        "trajsft: evals/minimax/done: unknown target 'minimax' (teachers and mixtures: ")
    none = sm("-n", "evals/minimax-m2.5/done", cwd=tmp_path)
    assert none.returncode == 1 and "Traceback" not in none.stderr
    assert none.stderr.strip().splitlines()[-1].startswith(
        "trajsft: evals/minimax-m2.5/done: teacher 'minimax-m2.5' holds out no chats (its transform.heldout_fraction "
        "is 0): set teachers.minimax-m2.5.transform.heldout_fraction (or eval.heldout_fraction) above 0")
    plan = sm("-n", "evals/demo/done", cwd=tmp_path)
    assert plan.returncode == 0 and "eval_actions" in plan.stdout and "train" in plan.stdout


def test_two_entries_of_one_dataset_that_disagree_are_one_line_with_no_frames(tmp_path):
    """A ConfigError only the plan sees (two teacher entries read one dataset with different rows) while Snakemake
    reads the workflow: the one line, no "File ..." frames (seven before)."""
    lr2 = write(tmp_path / "lr2.yaml", "teachers:\n  minimax-lr2: {dataset: AlienKevin/SWE-smith-rs-minimax-m2.5-"
                                       "trajectories, revision: dfd98db, rows: 5000}\n")
    p = sm("-n", "--configfile", lr2, cwd=tmp_path)
    assert p.returncode == 1 and "File " not in p.stdout + p.stderr and "Traceback" not in p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        "trajsft: config: teachers minimax-lr2 and minimax-m2.5 read the same data (raw/SWE-smith-rs-minimax-m2.5-"
        "trajectories-3a2ecb9bcc) but set rows 5000 and 5251: make them equal (the data is built once for both)")


def test_a_failed_rules_root_cause_reaches_the_terminal_once_and_whole(tmp_path):
    """Issue 67 part 5: a teacher's data and the student's weights with the Hub unreachable (nothing listens at its
    address). Each failed rule says its cause once, not cut, naming the root cause as `trajsft plan` does (4 times
    before, cut at "(Caused by Na..."); Snakemake neither restates it (its CalledProcessError naming a temporary
    script) nor dumps the log, which keeps it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = sm("--keep-going", "checkpoints/minimax-m2.5/done", cwd=tmp_path,
           env={"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "Traceback" not in out and "CalledProcessError" not in out, out[-3000:]
    why = f"cannot reach the Hugging Face Hub: 127.0.0.1:{port} refused the connection (nothing listens there)"
    for rule, what in [("download", "AlienKevin/SWE-smith-rs-minimax-m2.5-trajectories@dfd98db"),
                       ("download_model", "Qwen/Qwen3-8B@")]:
        said = [ln for ln in out.splitlines() if why in ln and f": {what}" in ln]
        assert len(said) == 1 and said[0].startswith(f"trajsft {rule} ") and said[0].endswith(why), out[-3000:]
        [log] = (tmp_path / "logs" / rule).glob("*.log")
        assert why in log.read_text()
        assert f"log: logs/{rule}/" in out  # where the details are: Snakemake's own line


def test_target_after_configfile_is_named_in_one_line(tmp_path):
    """--configfile takes every following argument: an existing done marker would load as YAML."""
    mine = write(tmp_path / "mine.yaml", "training: {learning_rate: 1e-3}\n")
    (tmp_path / "checkpoints/demo").mkdir(parents=True)
    (tmp_path / "checkpoints/demo/done").write_text(json.dumps({"hash": "0123456789", "run": "demo-0123456789"}))
    p = sm("-n", "--configfile", mine, "checkpoints/demo/done", cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert (
        f"trajsft: {tmp_path}/checkpoints/demo/done was read as a --configfile (it takes every following argument): "
        "put targets before --configfile, e.g. snakemake checkpoints/demo/done --configfile mine.yaml\n") in p.stderr
    assert sm("-n", "checkpoints/demo/done", "--configfile", mine, cwd=tmp_path).returncode == 0


def test_changed_rows_reruns_the_download_check(tmp_path):
    first = sm("results/raw/" + C.Plan(C.load()).chain("demo")[0].name + "/manifest.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    raw = C.Plan(C.load()).chain("demo")[0].name
    wrong = write(tmp_path / "rows.yaml", {"teachers": {"demo": {"rows": 61}}})
    p = sm(f"results/raw/{raw}/manifest.json", "--configfile", wrong, cwd=tmp_path)
    assert p.returncode != 0
    assert "demo/dataset@local has 60 rows, config says 61 (teachers.demo.rows)" in p.stderr + p.stdout


# ---- plan and status after a config change --------------------------------------------------
def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_plan_and_status_after_config_change(tmp_path):
    old = C.Plan(C.load()).target("demo")["run"]
    done = {"target": "demo", "hash": old.hash, "run": old.name, "finished": "2026-11-20T10:00:00+00:00",
            "hf_export": f"results/checkpoints/{old.name}/hf/{old.hash}/step-26", "steps": 27}
    (tmp_path / "checkpoints/demo").mkdir(parents=True)
    (tmp_path / "checkpoints/demo/done").write_text(json.dumps(done))
    (tmp_path / f"results/checkpoints/{old.name}").mkdir(parents=True)
    (tmp_path / f"results/checkpoints/{old.name}/manifest.json").write_text(json.dumps(done))
    first = cli(tmp_path, "plan", "demo").stdout.splitlines()[0]
    assert first.endswith("[done]")
    lr = write(tmp_path / "lr.yaml", "teachers: {demo: {training: {learning_rate: 1e-3}}}\n")
    new_hash = C.Plan(C.load([C.DEFAULT_CONFIG, lr])).target("demo")["run"].hash
    line = cli(tmp_path, "plan", "demo", "--configfile", lr).stdout.splitlines()[0]
    assert "[not done" in line and f"earlier config (hash {old.hash})" in line
    for marker_left in (True, False):  # Snakemake deletes the old marker when the new run fails
        if not marker_left:
            (tmp_path / "checkpoints/demo/done").unlink()
        [row] = json.loads(cli(tmp_path, "status", "demo", "--json", "--configfile", lr).stdout)
        assert row["hash"] == new_hash and row["state"] != "done"
        assert row["previous_done"]["run"] == old.name and row["previous_done"]["hash"] == old.hash
        human = cli(tmp_path, "status", "demo", "--configfile", lr).stdout
        assert f"config changed since the finished run {old.name}" in human and new_hash in human
    # back to the old config: that run is finished even though its marker is gone
    [row] = json.loads(cli(tmp_path, "status", "demo", "--json").stdout)
    assert (row["state"], row["hash"], row["previous_done"]) == ("done", old.hash, None)
    assert row["next"] == "rewrite the missing done marker (no training)"
    assert cli(tmp_path, "plan", "demo").stdout.splitlines()[0].endswith("[not done]")


# ---- CLI misuse -----------------------------------------------------------------------------
def test_configfile_takes_several_files_like_snakemake(tmp_path):
    a = write(tmp_path / "a.yaml", "teachers: {demo: {training: {learning_rate: 1e-3}}}\n")
    b = write(tmp_path / "b.yaml", "teachers: {demo: {training: {batch_size: 4}}}\n")
    both = C.Plan(C.load([C.DEFAULT_CONFIG, a, b])).target("demo")["run"].hash
    p = cli(tmp_path, "plan", "--json", "--configfile", a, b)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["checkpoint_dir"].endswith(both)
    swallowed = cli(tmp_path, "plan", "--configfile", a, "checkpoints/demo/done")
    assert swallowed.returncode == 2 and len(swallowed.stderr.strip().splitlines()) == 1
    assert "looks like a target" in swallowed.stderr and "trajsft plan demo --configfile" in swallowed.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("cmd", [["logs", "demo"], ["stop", "demo"]])
def test_logs_and_stop_without_a_cluster_are_one_line(tmp_path, cmd):
    cfg = write(tmp_path / "c.yaml", {"ray": {"address": f"http://127.0.0.1:{free_port()}"}})
    p = cli(tmp_path, *cmd, "--profile", "tpu-local", "--configfile", cfg)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"trajsft {cmd[0]}: cannot use Ray at http://127.0.0.1:")
    # tpu-local names no cluster yaml: the hint says how the tunnel is opened and where to name it
    assert "is the head up and its dashboard forwarded? `ray dashboard --port" in lines[0]
    assert "set ray.cluster_config" in lines[0]


# ---- what goes up with the working dir ------------------------------------------------------
def test_secret_files_are_not_packaged_with_the_working_dir(tmp_path):
    """Build the package with Ray's own packaging code, as job submission does."""
    import shutil

    from ray._private.runtime_env.packaging import create_package

    from trajsft.cluster.submit import runtime_env

    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=shutil.ignore_patterns(".venv", ".git", "results", "checkpoints", "logs",
                                                              ".snakemake", "__pycache__", "docs", "tests"))
    planted = [".env", ".envrc", "server.pem", "gcp-credentials.json", "config/.netrc", "src/trajsft/.env.local",
               ".aws/credentials", ".config/gcloud/application_default_credentials.json", "id_rsa"]
    for rel in planted:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("SECRET=planted\n")
    env = runtime_env({"ray": {}})
    pkg = tmp_path / "pkg.zip"
    create_package(str(work), pkg, include_gitignore=True, excludes=env["excludes"])
    names = zipfile.ZipFile(pkg).namelist()
    assert "Snakefile" in names and "src/trajsft/cluster/entrypoint.py" in names and "demo/tokenizer/tokenizer.json" in names
    for rel in planted:
        assert rel not in names, rel
    assert not [n for n in names if any(part.startswith(".") for part in n.split("/"))], names
