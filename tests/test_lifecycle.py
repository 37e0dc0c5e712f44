"""Integration (issue 9): real `kill -9` of Snakemake (its pid only, not its process group)
during tokenize and during training, a SIGKILLed trainer (what the OOM killer does), and
SIGTERM to Snakemake: no orphaned rule job, no stale stop marker, a true attempts.json, one-line
causes, and the same command afterwards finishes the run. (The Ray launcher's kill -9 case lives in
test_tpu_profile.py, next to the emulated TPU slices it needs.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline_utils import REPO, alive, attempts, kill9_snakemake_only, plan, procs, rule_jobs, run, start, wait_for
from trajsft.train import checkpoints

pytestmark = pytest.mark.integration

# kills must land before the end: the last one a poll after the first checkpoint (step 3) is visible
STEPS = 20
OVER = {"teachers": {"demo": {"training": {"max_steps": STEPS}}},
        "checkpointing": {"keep_every_steps": 3, "save_interval_minutes": 600}}
TRACEBACK = "Traceback (most recent call last)"


def cli(wd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args, "--configfile", str(wd / "test-overrides.yaml")],
                          capture_output=True, text=True, cwd=wd, timeout=120)


COPIES = 20  # the demo rows COPIES times over: an in-process tokenize long enough to be killed mid-build


def _big_demo(root: Path) -> int:
    """The demo dataset (HF layout) with every row repeated COPIES times under new traj_ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True)
    tables = [pq.read_table(f) for f in sorted((REPO / "demo/dataset/data").glob("*.parquet"))]
    base = pa.concat_tables(tables)
    parts = []
    for k in range(COPIES):
        ids = [f"{t}-copy{k}" if t else t for t in base.column("traj_id").to_pylist()]
        parts.append(base.set_column(base.schema.get_field_index("traj_id"), "traj_id", pa.array(ids, pa.string())))
    pq.write_table(pa.concat_tables(parts), root / "data" / "train-00000-of-00001.parquet")
    return base.num_rows * COPIES


def test_rule_jobs_die_with_a_kill9ed_snakemake_and_the_rerun_finishes(tmp_path):
    wd = tmp_path
    rows = _big_demo(tmp_path / "bigdemo")
    over = json.loads(json.dumps(OVER))
    # the demo's held-out share divided by COPIES: about the demo's 6 held-out chats, not 20 times them (an
    # evaluation every 2 steps over 120 chats took 5.5 s of each 6 s, 100 CPU-s of the test)
    over["teachers"]["demo"].update(dataset=str(tmp_path / "bigdemo"), rows=rows,
                                    transform={"heldout_fraction": 0.1 / COPIES})
    OVER_BIG = over  # noqa: N806 - the module's OVER, with the bigger demo data
    t = plan(wd, "demo", OVER_BIG)
    [tok] = [a for a in t["artifacts"] if a["kind"] == "tokenized"]
    tok_dir, tok_manifest = wd / tok["location"], wd / tok["manifest"]
    run_dir = wd / t["checkpoint_dir"]
    done = wd / "checkpoints/demo/done"
    ckpts = str(run_dir / "checkpoints")

    # 1. kill -9 Snakemake while the tokenize job builds the cache (in its own process)
    p = start(wd, "checkpoints/demo/done", config=OVER_BIG, log=wd / "run1.log")
    wait_for(lambda: list(tok_dir.glob(".cache.building-*/train")), 300, "cache build to start", p)
    assert rule_jobs(p, "logs/tokenize/")
    tree = kill9_snakemake_only(p)
    wait_for(lambda: not alive(tree), 120, "the tokenize job to die with Snakemake")
    time.sleep(3)
    assert not tok_manifest.exists(), "an orphan wrote the manifest after Snakemake was gone"
    assert not (tok_dir / "cache").exists() and not list(tok_dir.glob(".cache.building-*"))
    tok_log = (wd / "logs/tokenize" / f"{tok['name']}.log").read_text()
    assert "is gone: stopping this job with it" in tok_log and "nothing was marked complete" in tok_log

    # 2. the same command (after Snakemake's own --unlock): tokenize reruns;
    #    then the trainer is SIGKILLed as the OOM killer would: one line, no traceback
    run(wd, "--unlock", config=OVER_BIG)
    p = start(wd, "checkpoints/demo/done", config=OVER_BIG, log=wd / "run2.log")
    [trainer] = wait_for(lambda: procs(p, "trajsft.train.train_lm_main"), 600, "train_lm to start", p)
    assert tok_manifest.exists()
    trainer.send_signal(signal.SIGKILL)
    assert p.wait(timeout=300) != 0
    out = (wd / "run2.log").read_text()
    assert "trajsft train demo: train_lm was killed by signal 9 (SIGKILL; out of memory?)" in out
    assert TRACEBACK not in out and "30 seconds" not in out
    last = attempts(run_dir)[-1]
    assert last["outcome"] == "failed" and "killed by signal 9" in last["error"]
    [row] = json.loads(cli(wd, "status", "demo", "--json").stdout)
    assert row["state"] == "failed" and row["cause"] == "out of memory"

    # 3. SIGTERM to Snakemake mid-training: the trainer stops, the attempt says so, and the
    #    stop marker of that run is gone once it has ended (a later run is not refused)
    p = start(wd, "checkpoints/demo/done", config=OVER_BIG, log=wd / "run3.log")
    wait_for(lambda: procs(p, "trajsft.train.train_lm_main"), 300, "train_lm to start", p)
    tree = psutil.Process(p.pid).children(recursive=True)
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=180) != 0
    wait_for(lambda: not alive(tree), 60, "the train job to end with Snakemake")
    assert not list((wd / ".snakemake").glob("trajsft-stopping-*")), "stale stop marker"
    last = attempts(run_dir)[-1]
    assert last["outcome"] == "interrupted" and "SIGTERM" in last["error"], last

    # 4. kill -9 Snakemake after the trainer wrote a checkpoint: the train job and the trainer
    #    die with it; nothing writes `done` behind the user's back; the attempt is recorded
    p = start(wd, "checkpoints/demo/done", config=OVER_BIG, log=wd / "run4.log")
    wait_for(lambda: procs(p, "trajsft.train.train_lm_main") and checkpoints.latest_checkpoint(ckpts), 600,
             "a trainer checkpoint", p)
    tree = kill9_snakemake_only(p)
    wait_for(lambda: not alive(tree), 120, "the train job and train_lm to die with Snakemake")
    time.sleep(3)
    assert not done.exists()
    ck = checkpoints.latest_checkpoint(ckpts)
    assert 1 <= ck["completed_steps"] < STEPS
    last = attempts(run_dir)[-1]
    assert last["outcome"] == "interrupted" and "Snakemake (run" in last["error"] and last.get("ended"), last

    # 5. README recovery: --unlock, then the same command resumes and finishes
    run(wd, "--unlock", config=OVER_BIG)
    res = run(wd, "checkpoints/demo/done", config=OVER_BIG)
    assert "another run_training holds" not in res.stdout + res.stderr
    d = json.loads(done.read_text())
    assert d["steps"] == STEPS
    result = json.loads((run_dir / "training_result.json").read_text())
    assert result["resumed_from_step"] == ck["completed_steps"]
    assert [a["outcome"] for a in attempts(run_dir)] == ["failed", "interrupted", "interrupted", "succeeded"]
    assert all(a.get("ended") for a in attempts(run_dir))
