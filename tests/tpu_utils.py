"""Shared helpers of the TPU-profile tests: the test profile, Snakemake and the CLI against a test cluster."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import requests
import yaml

from pipeline_utils import REPO, SNAKEMAKE
from trajsft.plan.config import deep_merge

HF = "hf_test_" + secrets.token_hex(12)
WK = "wk_test_" + secrets.token_hex(20)  # the W&B SDK's shape: 40+ characters

# The slice scenarios train the demo on 256-token windows, not its 1024 (the data rules build both, once a session):
# what they test is the cluster, and attention, quadratic in seq_len, is most of a step on CPU. Measured here, the
# demo's step with batch 8 on 4 CPU devices (bf16 compute, as on an emulated v5p-8 host): 2.02 s at 1024, 0.20 s at
# 256. Tests that evaluate or serve the trained student (its prompts need the context) and the fit checks (their
# compiles are shared with tests/test_fit.py) keep 1024.
SHORT_SEQ_LEN = 256


def short_seq(overrides: dict) -> dict:
    """``overrides`` with the demo trained on SHORT_SEQ_LEN-token windows and holding out no chat, as the real
    teachers' default (``heldout_fraction`` 0): the trainer then never evaluates, as nothing of these scenarios
    reads an evaluation (the demo's tenth of its chats held out cost each train_lm start an evaluation's compile,
    and the run an evaluation every ``n // 10`` steps, every step below 10). Its tokenized data is built by
    :func:`data_rules`. No tools: their block (about 225 tokens of the demo tokenizer) would leave the windows no
    assistant token."""
    return deep_merge(overrides, {"teachers": {"demo": {"training": {"seq_len": SHORT_SEQ_LEN},
                                                        "transform": {"heldout_fraction": 0.0}, "tools": []}}})


def make_profile(dest: Path, address: str, storage_root: Path, overrides: dict | None = None) -> Path:
    """profiles/tpu-east5 with only the address and storage root changed (+ test overrides)."""
    src = REPO / "profiles/tpu-east5"
    dest.mkdir(parents=True, exist_ok=True)
    cluster = (src / "cluster.yaml").read_text()
    cluster = re.sub(r"(?m)^storage_root: .*$", f"storage_root: {storage_root}", cluster)
    cluster = re.sub(r"(?m)^  address: .*$", f"  address: {address}", cluster)
    (dest / "cluster.yaml").write_text(cluster)
    files = [str(dest / "cluster.yaml")]
    if overrides:
        (dest / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        files.append(str(dest / "overrides.yaml"))
    prof = yaml.safe_load((src / "config.yaml").read_text())
    prof["configfiles"] = files
    (dest / "config.yaml").write_text(yaml.safe_dump(prof))
    return dest


def sm_env(head, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN")}
    env.update(head.client_env())
    env.update({"HF_TOKEN": HF, "WANDB_API_KEY": WK, "RAY_TMPDIR": "/tmp/rt-tests", "HF_HUB_OFFLINE": "1"})
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def sm_cmd(wd: Path, profile: Path, *args: str) -> list[str]:
    return [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(profile),
            "checkpoints/demo/done", *args]


def snakemake(wd, profile, head, *args, check=True, timeout=900, **env):
    p = subprocess.run(sm_cmd(wd, profile, *args), capture_output=True, text=True, env=sm_env(head, **env),
                       timeout=timeout, cwd=REPO)
    if check and p.returncode != 0:
        raise AssertionError(f"snakemake failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def jobs(head, run_hash: str | None = None) -> list[dict]:
    """The cluster's jobs (of one run), without preflight's Python probes (tagged in their metadata)."""
    r = requests.get(f"{head.address}/api/jobs/", headers=head.headers(), timeout=10)
    r.raise_for_status()
    out = [j for j in r.json() if not (j.get("metadata") or {}).get("trajsft_probe")]
    if run_hash:
        out = [j for j in out if (j.get("submission_id") or "").startswith(f"trajsft-{run_hash}-")]
    return out


def plan_of(wd: Path, profile: Path) -> dict:
    """``trajsft plan demo --json`` with the profile's config files (offline: no storage root is asked)."""
    cmd = [sys.executable, "-m", "trajsft.cli", "plan", "demo", "--json", "--offline",
           "--configfile", str(profile / "cluster.yaml")]
    if (profile / "overrides.yaml").exists():
        cmd += ["--configfile", str(profile / "overrides.yaml")]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=wd).stdout)[0]


def run_hash(wd: Path, profile: Path) -> str:
    return plan_of(wd, profile)["checkpoint_dir"].rsplit("-", 1)[1]


_SHARED_DATA: dict[str, tuple[Path, Path]] = {}


def data_rules(base: Path, ray_head, overrides: dict | None = None, *more: dict):
    """The data rules, once per test session: they run locally and write content-addressed artifacts
    to the storage root, so the TPU-profile and multi-host modules share one storage root and one
    seed workdir (cluster settings are cosmetic: the same artifacts either way). Each module gets its
    own ``base`` for its workdirs and profiles; tests copy the seed state with :func:`workdir`.

    The demo's tokenized data at its seq_len and as :func:`short_seq` trains it, and for each of ``more`` (other
    overrides a module's tests train with), each built once a session."""
    if "seed" not in _SHARED_DATA:
        storage, wd = base / "storage", base / "seed"
        wd.mkdir()
        _SHARED_DATA["seed"] = storage, wd
    storage, seed = _SHARED_DATA["seed"]
    for over in (overrides or {}, short_seq(overrides or {}), *more):
        key = json.dumps({k: v for k, v in over.items() if k != "ray"}, sort_keys=True)  # ray: cosmetic here
        if key not in _BUILT:
            _tokenize(seed, storage, ray_head, over, seed.parent / f"seed-profile-{len(_BUILT)}")
            _BUILT.add(key)
    return base, storage, seed


_BUILT: set[str] = set()  # the overrides (but ray) whose tokenized data the session's seed workdir holds


def _tokenize(wd: Path, storage: Path, ray_head, overrides: dict, profile_dir: Path) -> None:
    prof = make_profile(profile_dir, ray_head.address, storage, overrides)
    tok = [a for a in plan_of(wd, prof)["artifacts"] if a["kind"] == "tokenized"][0]
    p = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--profile", str(prof),
                        tok["manifest"]], capture_output=True, text=True, env=sm_env(ray_head), cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]


def workdir(data, name: str) -> Path:
    base, _, seed = data
    wd = base / name
    shutil.copytree(seed, wd, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    return wd


def trajsft(wd: Path, head, *args: str) -> subprocess.CompletedProcess:
    """The `trajsft` CLI run in a test workdir, talking to the test head."""
    env = sm_env(head)
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], capture_output=True, text=True, cwd=wd,
                          env=env, timeout=120)


def status(wd: Path, prof: Path, head) -> dict:
    p = trajsft(wd, head, "status", "demo", "--profile", str(prof), "--json")
    assert p.returncode == 0, p.stderr
    [row] = json.loads(p.stdout)
    return row


