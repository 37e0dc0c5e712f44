"""Smoke test of ``scripts/benchmark.py`` (the benchmark itself is not a test; this only checks it runs
and that its figures are sane). No Snakemake: ``--with-cache`` and the demo rule run (``--no-rule``) are
not exercised here."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark.py"


def _load_script():
    name = "trajsft_benchmark_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses need the module registered while it executes
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(240)
def test_benchmark_smoke(capsys, tmp_path, monkeypatch):
    bm = _load_script()
    # every temp dir the benchmark (and its children) make must be gone when it returns
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    # --- packing on a hand-made length list, checked against a hand calculation ---------------
    # seq_len 32, next-fit in order, over-long chats truncated to their first 32 tokens, alone:
    #   [10, 20] -> 30 | [5] (5+40 > 32) | [40 -> 32] | [3] (3+33 > 32) | [33 -> 32] | [1]
    lengths = [10, 20, 5, 40, 3, 33, 1]
    asst = [4, 10, 5, 20, 3, 30, 1]  # the script puts assistant tokens at the end of each chat
    seq_len = 32
    exp_packs = 6
    exp_non_pad = 30 + 5 + 32 + 3 + 32 + 1
    exp_eff = exp_non_pad / (exp_packs * seq_len)
    exp_trunc_tokens = (40 - 32) + (33 - 32)
    # assistant tokens kept: chat 4 keeps positions 20..31 of 20..39 (12), chat 6 keeps 3..31 of 3..32 (29)
    exp_asst_kept = 4 + 10 + 5 + 12 + 3 + 29 + 1
    for use_levanter in (True, False):
        st = bm.packing_from_lengths(lengths, seq_len, asst, use_levanter=use_levanter)
        assert st["packed_sequences"] == exp_packs, st
        assert st["non_pad_tokens"] == exp_non_pad, st
        assert st["packing_efficiency"] == pytest.approx(exp_eff), st
        assert st["tokens_truncated"] == exp_trunc_tokens
        assert st["truncated_token_share"] == pytest.approx(exp_trunc_tokens / sum(lengths))
        assert st["chats_truncated"] == 2 and st["truncated_chat_share"] == pytest.approx(2 / 7)
        assert st["assistant_tokens_kept"] == exp_asst_kept
        assert st["assistant_truncated_share"] == pytest.approx(1 - exp_asst_kept / sum(asst))
    # Levanter's 64-segment cap: 70 one-token chats in 1000-token sequences -> 64 + 6
    st = bm.packing_from_lengths([1] * 70, 1000, use_levanter=True)
    assert st["packed_sequences"] == 2 and st["packing_efficiency"] == pytest.approx(70 / 2000)

    # --- the whole script on 20 synthetic chats (CLI path, --json) ----------------------------
    assert bm.main(["--chats", "20", "--seq-len", "16384", "--seed", "0", "--repeats", "1", "--json", "--quiet",
                    "--scale-chats", "16", "--profile-chats", "300", "--no-rule"]) == 0
    assert sorted(os.listdir(scratch)) == []
    out = capsys.readouterr().out.strip()
    r = json.loads(out)  # exactly one JSON object on stdout
    d, t, p = r["dataset"], r["tokenize"], r["packing"]

    assert r["chats"] == 20 and p["chats"] == 20
    # the default tokenizer is the real Qwen3 one (fetched with npm and cached by trajsft.data.qwen3_tokenizer)
    assert r["tokenizer_is_qwen3"] and r["tokenizer_vocab"] == 151_669 and "Qwen3" in r["tokenizer_note"]
    # length profile: thousands to tens of thousands of tokens, 10-80 tool-calling turns
    assert 1000 < d["length_p5"] < d["length_p50"] < d["length_max"]
    assert 10 <= d["turns_min"] <= d["turns_max"] <= 80
    assert 0 < d["assistant_fraction"] < 1

    # throughput
    for path in ("chat_processor", "raw_batch_encode"):
        assert t[path]["seconds"] > 0 and t[path]["tokens_per_s"] > 0 and t[path]["chats_per_s"] > 0
    assert t["ratio_ours_over_raw"] > 0
    assert t["ratio_ours_over_raw"] == pytest.approx(
        t["chat_processor"]["tokens_per_s"] / t["raw_batch_encode"]["tokens_per_s"])
    assert t["raw_ids_identical"] is True
    assert t["build_chat_cache"] is None  # no Ray without --with-cache

    # packing figures
    assert p["seq_len"] == 16384
    assert "GreedyPrepackedDataset" in p["packer"] and p["crosscheck_reference_greedy"] is True
    assert p["packed_sequences"] >= 1
    assert 0 < p["packing_efficiency"] <= 1
    assert p["packing_efficiency"] == pytest.approx(p["non_pad_tokens"] / (p["packed_sequences"] * 16384))
    assert p["non_pad_tokens"] == d["tokens"] - p["tokens_truncated"]
    assert 0 <= p["truncated_token_share"] < 1
    assert 0 <= p["truncated_chat_share"] < 1
    assert 0 <= p["assistant_truncated_share"] < 1
    # with the stratified log-normal (median 12k) about a third of 20 chats exceed 16384 tokens
    assert p["chats_truncated"] >= 1 and p["truncated_token_share"] > 0
    assert p["chats_truncated"] == round(d["longer_than_seq_len"] * 20)

    # both packers and the lower bound; Levanter's packer over the FFD cache order makes exactly the FFD bins
    x = r["packers"]
    assert x["chats"] == 20 and x["levanter_next_fit"]["sequences"] == p["packed_sequences"]
    assert x["levanter_next_fit"]["non_pad"] == pytest.approx(p["packing_efficiency"])
    assert x["lower_bound"] <= x["ffd"]["sequences"] <= x["levanter_next_fit"]["sequences"]
    assert x["ffd"]["levanter_makes_the_ffd_bins"] is True and x["ffd"]["non_pad"] >= x["levanter_next_fit"]["non_pad"]
    assert [q["profile"] for q in r["packer_profiles"]] == [q[0] for q in bm.PACKING_PROFILES]
    for q in r["packer_profiles"]:
        assert q["chats"] == 300 and q["ffd"]["levanter_makes_the_ffd_bins"] is True
        assert q["lower_bound"] <= q["ffd"]["sequences"] < q["levanter_next_fit"]["sequences"]
    sc = r["tokenize_scaling"]
    assert [sc["runs"][k]["chats"] for k in ("1", "4", "16")] == [1, 4, 16]
    assert all(sc["runs"][k]["tokens"] > 0 for k in sc["runs"])
    assert sc["ratio_inprocess_over_raw"] == pytest.approx(sc["raw_all_cores"]["seconds"] / sc["runs"]["16"]["seconds"])
    # the serial (before-the-pool) build of the same 16x shards; tiny data: the rule's build has no pool either
    assert sc["serial_16x"]["workers"] == 0 and sc["serial_16x"]["tokens"] == sc["runs"]["16"]["tokens"]
    assert sc["runs"]["16"]["workers"] == 0 and sc["runs"]["16"]["shard_bytes"] > 0
    assert sc["ratio_serial_over_raw"] == pytest.approx(sc["raw_all_cores"]["seconds"] / sc["serial_16x"]["seconds"])
    # the pool, timed explicitly (the rule uses it only from POOL_MIN_CPUS cores): the same rows
    assert sc["pool_16x"]["workers"] >= 2 and sc["pool_16x"]["tokens"] == sc["runs"]["16"]["tokens"]
    assert r["rule_demo"] is None

    # the human-readable table renders from the same figures
    table = bm.format_table(r)
    for needle in ("ChatProcessor", "raw tokenizer", "ratio ours/raw", "packing efficiency", "chats truncated",
                   "assistant tokens lost", "the real Qwen3 tokenizer", "Levanter packs the FFD bins",
                   "in-process / raw", "linearity", "serial / raw", "pool speed-up"):
        assert needle in table



def test_bench_train_removes_its_temp_dir_also_on_failure(tmp_path, monkeypatch):
    """bench_train.py's scratch workdir is a temp dir of its own: gone at the end, here after its
    first Snakemake run fails (a Snakemake that exits 1), with the log's tail kept in the error."""
    name = "trajsft_bench_train_script"
    spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name("bench_train.py"))
    bt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bt)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    failing = tmp_path / "snakemake"
    failing.write_text("#!/bin/sh\necho 'snakemake: no such rule' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(bt, "SNAKEMAKE", str(failing))
    with pytest.raises(RuntimeError, match="no such rule"):
        bt.bench_train_overhead(log=lambda s: None)
    assert sorted(os.listdir(scratch)) == []
    kept = tmp_path / "mine"
    with pytest.raises(RuntimeError):
        bt.bench_train_overhead(str(kept), log=lambda s: None)
    assert (kept / "bench_train.log").exists()  # a workdir the user gave is theirs: kept
