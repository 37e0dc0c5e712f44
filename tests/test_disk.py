"""What a run writes under its storage root (trajsft.fit.disk), and the root's write probe (storage.probe_write):
`trajsft plan`, `trajsft preflight` and a Snakemake run's start say them (issue 45). The estimate is held to real
payloads in tests/test_pipeline.py (the demo's tokenized cache, checkpoint and HF export)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path


from trajsft import io, storage
from trajsft.fit import disk
from trajsft.plan import config as C
from trajsft.plan import step_configs

REPO = Path(__file__).resolve().parents[1]


def plan(root, **over):
    return C.Plan(C.load(None, {"storage_root": str(root), **over}), base_dir=C.REPO_DIR)


def test_the_8b_students_parameters_are_qwen3_8bs():
    """Qwen/Qwen3-8B's safetensors hold 8,190,735,360 parameters (vocab 151,936); Levanter resizes the vocabulary
    to the tokenizer's 151,669 (config.yaml), 2 x 267 x 4096 fewer."""
    tc = step_configs.train(plan("results"), "minimax-m2.5")
    assert disk.parameters(tc) == 8_190_735_360 - 2 * (151_936 - 151_669) * 4096


def test_a_fresh_root_counts_the_models_the_data_once_and_checkpoints_from_the_rows(tmp_path):
    p = plan(tmp_path / "root")
    runs = [step_configs.train(p, t) for t in ("minimax-m2.5", "mix-minimax-gemini")]
    fp = disk.estimate(runs)
    kinds = [(i.kind, i.name) for i in fp.items]
    assert len(kinds) == len(set(kinds))  # shared data (the model, minimax's tokens) once
    assert [k for k, _ in kinds].count("models") == 1 and [k for k, _ in kinds].count("tokenized") == 2
    params = disk.parameters(runs[0])
    [model] = [i for i in fp.items if i.kind == "models"]
    assert model.bytes == params * 2
    [ck] = [i for i in fp.items if i.kind == "checkpoints" and i.name == runs[0].run.name]
    # 2298 steps (7 epochs of 5251 rows, batch 16), one kept every 1000, the latest and the next: 4
    assert ck.bytes == 4 * params * 12 and "2298 steps" in ck.how
    [tok] = [i for i in fp.items if i.kind == "tokenized" and "minimax" in i.name]
    assert tok.bytes == 5251 * 32768 * 16
    assert fp.total == sum(i.bytes for i in fp.items) and fp.present == []


def test_what_is_at_the_root_already_counts_nothing(tmp_path):
    p = plan(tmp_path / "root")
    tc = step_configs.train(p, "demo")
    before = {i.kind for i in disk.estimate([tc]).items}
    assert before == {"tokenized", "checkpoints", "hf exports"}  # random init: no models snapshot
    [tok] = tc.tokenized.values()
    os.makedirs(tok.location)
    io.write_json(io.join(tok.location, storage.SEAL), {"objects": {}})
    os.makedirs(tc.run.location)
    Path(tc.run.location, "training_result.json").write_text("{}")
    fp = disk.estimate([tc])
    assert fp.items == [] and sorted(fp.present) == sorted([f"tokenized/{tok.name}", f"checkpoints/{tc.run.name}"])
    assert disk.estimate([tc], look=False).total > 0  # not asked: everything counts


def test_the_line_compares_free_space_and_a_bucket_says_what_is_written(tmp_path, monkeypatch):
    fp = disk.Footprint([disk.Item("checkpoints", "r", 3 << 30, "")])
    monkeypatch.setattr(io, "free_bytes", lambda path: 1 << 30)
    text, short = disk.line(str(tmp_path), fp)
    assert short and text == (f"storage root {tmp_path}: 1.0 GiB free; this run writes up to 3.0 GiB (checkpoints "
                              "3.0 GiB); it will not fit: free space or point storage_root elsewhere")
    monkeypatch.setattr(io, "free_bytes", lambda path: 4 << 30)
    assert disk.line(str(tmp_path), fp) == (f"storage root {tmp_path}: 4.0 GiB free; this run writes up to 3.0 GiB "
                                            "(checkpoints 3.0 GiB)", False)
    monkeypatch.setattr(io, "free_bytes", lambda path: None)
    assert disk.line("gs://b/t", disk.Footprint()) == (
        "storage root gs://b/t: this run writes up to 0 B (nothing: every artifact is there)", False)


def test_the_probe_creates_nothing_and_says_a_read_only_or_full_root_as_a_rule_would(tmp_path, monkeypatch):
    root = tmp_path / "a" / "b"
    assert storage.probe_write(str(root)) is None
    assert list(tmp_path.iterdir()) == []  # written and deleted in the nearest existing directory; no dir made
    (tmp_path / "f").write_text("x")
    assert storage.probe_write(str(tmp_path / "f" / "sub")) == (
        f"storage root {tmp_path / 'f' / 'sub'} is not writable: {tmp_path / 'f'} is not a directory")

    def refuse(code):
        def write_bytes(self, data):
            raise OSError(code, os.strerror(code), str(self))
        return write_bytes

    monkeypatch.setattr(Path, "write_bytes", refuse(errno.EROFS))
    assert storage.probe_write(str(tmp_path)) == (
        f"the storage root {tmp_path} is read-only: Read-only file system; free space or point storage_root "
        "elsewhere, then run the same command again")
    monkeypatch.setattr(Path, "write_bytes", refuse(errno.ENOSPC))
    assert storage.probe_write(str(tmp_path)).startswith(f"the storage root {tmp_path} is full: No space left on device; ")


def _cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)


def test_preflight_and_plan_say_the_root_and_what_the_run_writes(tmp_path):
    root = tmp_path / "root"
    p = _cli(tmp_path, "preflight", "demo", "--storage-root", str(root))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "local executor: storage root writable, W&B offline"
    assert lines[1].startswith(f"storage root {root}: ") and " free; this run writes up to " in lines[1]
    p = _cli(tmp_path, "plan", "demo", "--json", "--storage-root", str(root))
    [entry] = json.loads(p.stdout)
    space = entry["storage"]
    assert p.returncode == 0 and space["root"] == str(root) and space["problem"] is None
    assert space["writes_bytes"] == sum(w["bytes"] for w in space["writes"]) > 0 and space["free_bytes"] > 0
    assert space["target_writes"] == space["writes"] and space["target_writes_bytes"] == space["writes_bytes"]
    # two targets sharing the 8B student's snapshot: each one's share counts it, the plan's total once
    p = _cli(tmp_path, "plan", "minimax-m2.5", "gemini-3-flash", "--json", "--storage-root", str(root))
    a, b = (e["storage"] for e in json.loads(p.stdout))
    [model] = [w for w in a["writes"] if w["kind"] == "models"]
    assert model in a["target_writes"] and model in b["target_writes"]
    assert a["writes_bytes"] == a["target_writes_bytes"] + b["target_writes_bytes"] - model["bytes"]
    (tmp_path / "file").write_text("")
    p = _cli(tmp_path, "preflight", "--storage-root", str(tmp_path / "file" / "root"))
    assert p.returncode == 1 and p.stdout == "" and p.stderr.splitlines() == [
        f"trajsft preflight: storage root {tmp_path / 'file' / 'root'} is not writable: {tmp_path / 'file'} is not "
        "a directory"]
    p = _cli(tmp_path, "plan", "demo", "--storage-root", str(tmp_path / "file" / "root"))
    assert p.returncode == 0 and p.stderr.startswith("trajsft plan: storage root ") and "Traceback" not in p.stderr
    assert p.stdout.splitlines()[-1].startswith(f"storage root {tmp_path / 'file' / 'root'}: ")


def test_a_student_whose_vocabulary_is_unknown_is_said_not_estimated(tmp_path, monkeypatch):
    from trajsft.errors import DataError

    def unknown(cfg):  # what fit.check.vocab_size says of a Hub tokenizer with no vocab_size in the config
        raise DataError("students.qwen3-8b: give vocab_size (len of tokenizer Qwen/Qwen3-8B@b968826)")

    monkeypatch.setattr(disk.fit_check, "vocab_size", unknown)
    p = plan(tmp_path / "root")
    space = disk.check(str(tmp_path / "root"), [step_configs.train(p, "minimax-m2.5")])
    assert space["problem"] is None and space["writes_bytes"] is None and not space["short"]
    [text] = space["lines"]
    assert text.startswith(f"storage root {tmp_path / 'root'}: what this run writes is not estimated: students.qwen3-8b: "
                           "give vocab_size"), text
