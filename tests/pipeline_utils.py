"""Helpers for integration tests that run the real Snakemake workflow in a scratch workdir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def overrides_file(workdir: Path, config: dict | None) -> list[str]:
    """Config overrides as a --configfile (merged over config/config.yaml, like a profile's)."""
    if not config:
        return []
    path = Path(workdir) / "test-overrides.yaml"
    path.write_text(yaml.safe_dump(config))
    return ["--configfile", str(path)]


def snakemake_cmd(workdir: Path, *args: str, config: dict | None = None) -> list[str]:
    return [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2", *args,
            *overrides_file(workdir, config)]


def env(**extra: str | None) -> dict:
    """The tests' environment (offline Hub, offline W&B); ``extra`` overrides it (None: unset)."""
    e = dict(os.environ)
    e.setdefault("RAY_TMPDIR", "/tmp/rt-tests")
    e["HF_HUB_OFFLINE"] = "1"
    e["WANDB_MODE"] = "offline"
    e.update(extra)
    return {k: v for k, v in e.items() if v is not None}


def run(workdir: Path, *args: str, config: dict | None = None, check=True, timeout=900,
        extra_env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(snakemake_cmd(workdir, *args, config=config), capture_output=True, text=True,
                       env=env(**(extra_env or {})), timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"snakemake failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p


def start(workdir: Path, *args: str, config: dict | None = None, log: Path,
          extra_env: dict | None = None) -> subprocess.Popen:
    fh = open(log, "w")
    return subprocess.Popen(snakemake_cmd(workdir, *args, config=config), stdout=fh, stderr=subprocess.STDOUT,
                            env=env(**(extra_env or {})), start_new_session=True)


def train_and_watch(workdir: Path, config: dict, log: Path, target: str = "demo",
                    evaluations: tuple[str, ...] = ("--actions",)) -> list[dict] | dict[str, list[dict]]:
    """``snakemake checkpoints/<target>/done`` started, and ``trajsft eval <target> <evaluation> --watch --json``
    beside it for each of ``evaluations`` (``--actions``, ``--agent``: at once) until the run is done; all must
    succeed, without a traceback. The watcher's rows (one per export evaluated); several: by evaluation."""
    train = start(workdir, f"checkpoints/{target}/done", config=config, log=log)
    watchers = {}
    try:
        for e in evaluations:
            watchers[e] = subprocess.Popen(
                [sys.executable, "-m", "trajsft.cli", "eval", target, e, "--watch", "--interval", "1", "--json",
                 "--configfile", str(workdir / "test-overrides.yaml")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir, env=env())
        outs = {e: w.communicate(timeout=900) for e, w in watchers.items()}
        assert train.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        kill_group(train)
        for w in watchers.values():
            if w.poll() is None:
                w.kill()
    for e, w in watchers.items():
        assert w.returncode == 0 and "Traceback" not in outs[e][1], outs[e][1][-3000:]
    rows = {e: [json.loads(line) for line in outs[e][0].splitlines()] for e in evaluations}
    return rows[evaluations[0]] if len(evaluations) == 1 else rows


def kill_group(p: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    p.wait(timeout=60)


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before: {what}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what}")


def plan(workdir: Path, target: str, config: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "trajsft.cli", "plan", target, "--json", *overrides_file(workdir, config)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=workdir, env=env())
    [t] = json.loads(out.stdout)
    return t


def procs(p: subprocess.Popen, mark: str) -> list[psutil.Process]:
    """Descendants of Snakemake whose command line contains ``mark``."""
    out = []
    try:
        for c in psutil.Process(p.pid).children(recursive=True):
            try:
                if any(mark in part for part in c.cmdline()):
                    out.append(c)
            except psutil.Error:
                pass
    except psutil.NoSuchProcess:
        pass
    return out


def rule_jobs(p: subprocess.Popen, log_fragment: str) -> list[psutil.Process]:
    """Snakemake's rule-job processes (every rule's script, trajsft/rules/<rule>.py, is copied under .snakemake/scripts/) that hold
    a log open whose path contains ``log_fragment``: ``logs/tokenize/``, or ``launcher.log`` for a train job that
    follows a Ray job (its rule log is a link to the run's durable log)."""
    out = []
    for c in procs(p, ".snakemake/scripts/"):
        try:
            if any(log_fragment in f.path for f in c.open_files()):
                out.append(c)
        except psutil.Error:
            pass
    return out


def alive(ps: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for q in ps:
        try:
            if q.is_running() and q.status() != psutil.STATUS_ZOMBIE:
                out.append(q)
        except psutil.Error:
            pass
    return out


def kill9_snakemake_only(p: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL Snakemake itself (as `kill -9 <pid>` does); returns what it was running."""
    tree = psutil.Process(p.pid).children(recursive=True)
    assert tree, "Snakemake runs no job"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    return tree


def attempts(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "attempts.json").read_text())
