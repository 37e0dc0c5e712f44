"""Tests for trajsft.train.run.

Fast unit tests cover config building, checkpoint discovery and metric parsing. Tests marked
``integration`` build a real Levanter chat cache (in-process) from a throwaway byte-level BPE tokenizer and
synthetic tool-calling chats, train a tiny Qwen3 on CPU, SIGKILL + resume a run, and check the HF
exports load with ``transformers.AutoConfig`` and ``safetensors``. They never touch the HF Hub.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from spec_utils import run_inputs, target_spec
from trajsft.data import cache as data_cache
from trajsft.train import checkpoints
from trajsft.train import levanter_config
from trajsft.train import metrics
from trajsft.train import run as train_run

# the Levanter children never reach for the Hub (this process is offline for the whole session: conftest.py)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}

SEQ_LEN = 256
TINY = {
    "hidden_dim": 32,
    "intermediate_dim": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 8,
}

# A Qwen-style template with tool calls; {% generation %} marks the assistant (loss) tokens.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- if message.get('content') -%}{{- message['content'] -}}{%- endif -%}"
    "{%- if message.get('tool_calls') -%}"
    "{%- for tc in message['tool_calls'] -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc['function']['name'] + '\", \"arguments\": '"
    " + tc['function']['arguments'] + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

WORDS = "the a file list read write dir python error fix test run bash grep cat ls output value ok".split()


def synthetic_chats(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def words(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": words(3, 12)}]
        for t in range(rng.randint(1, 2)):
            call = {
                "id": f"call_{t}",
                "type": "function",
                "function": {"name": rng.choice(["bash", "read_file"]), "arguments": json.dumps({"cmd": words(1, 4)})},
            }
            msgs.append({"role": "assistant", "content": words(0, 6) or None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{t}", "content": words(2, 10)})
        msgs.append({"role": "assistant", "content": words(2, 10)})
        out.append({"messages": msgs, "traj_id": f"traj-{seed}-{i}", "teacher": "synthetic", "reward": 1.0})
    return out


def make_tokenizer(path: str, corpus: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return path


def write_jsonl_gz(path: str, rows: list[dict]) -> str:
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    d = tmp_path_factory.mktemp("assets")
    chats = synthetic_chats(64, seed=1)
    tok = make_tokenizer(str(d / "tokenizer"), [json.dumps(c) for c in chats])
    train = [
        write_jsonl_gz(str(d / "train-00000.jsonl.gz"), chats[:28]),
        write_jsonl_gz(str(d / "train-00001.jsonl.gz"), chats[28:56]),
    ]
    val = [write_jsonl_gz(str(d / "val-00000.jsonl.gz"), chats[56:])]
    return {"dir": str(d), "tokenizer": tok, "train": train, "validation": val, "chats": chats}


@pytest.fixture(scope="session")
def chat_cache(assets, tmp_path_factory):
    cache_dir = str(tmp_path_factory.mktemp("caches") / "teacher_a")
    t0 = time.time()
    stats = data_cache.build_chat_cache(
        assets["train"], assets["validation"], cache_dir, assets["tokenizer"], CHAT_TEMPLATE, seq_len=SEQ_LEN
    )
    stats["_build_seconds"] = time.time() - t0
    return stats


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("jax_cache"))


def _tiny_config(assets, chat_cache, run_dir, run_id, jax_cache, num_train_steps, weights=None, remat="full", **kw):
    """The config of a tiny model on the test cache (each teacher of ``weights`` reads it)."""
    weights = weights or {"teacher_a": 1.0}
    spec = target_spec(weights=weights, model=TINY, seq_len=SEQ_LEN, batch_size=4,
                       learning_rate=3e-3, warmup=0.1, remat=remat)
    packed = chat_cache["train"]["packed_sequences"]
    return levanter_config.train_lm_config(spec, run_inputs(
        run_dir, {t: (chat_cache["cache_dir"], packed) for t in weights}, num_train_steps, run_id=run_id,
        tokenizer=assets["tokenizer"], chat_template=CHAT_TEMPLATE, watch_interval=0,
        jax_compilation_cache_dir=jax_cache, **kw))


# --------------------------------------------------------------------------------------
# unit tests (no Levanter run); the config itself: tests/test_levanter_config.py
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "memory"])
def test_discover_latest_checkpoint_is_levanters(tmp_path, where):
    """Our copy (no jax import in the train rule's process) picks what Levanter's picks, layout by layout."""
    import fsspec
    from levanter.checkpoint import discover_latest_checkpoint as levanters

    root = str(tmp_path) if where == "local" else f"memory://ck-{tmp_path.name}"
    fs = fsspec.filesystem("file" if where == "local" else "memory")

    def put(path: str, step: int, ts: str, tmp: bool = False) -> None:
        fs.makedirs(path, exist_ok=True)
        with fs.open(f"{path}/metadata.json", "w") as f:
            f.write(json.dumps({"step": step, "timestamp": ts, "is_temporary": tmp}))

    layouts = {
        "empty": [],
        "newest timestamp wins over a higher step": [("a/step-9", 9, "2025-01-01T00:00:01"),
                                                    ("a/step-4", 4, "2025-01-01T00:00:03")],
        "same timestamp: higher step": [("b/step-3", 3, "2025-01-01T00:00:05"), ("b/step-7", 7, "2025-01-01T00:00:05")],
        "temporary newest": [("c/step-2", 2, "2025-01-01T00:00:01"), ("c/tmp", 5, "2025-01-01T00:00:09", True)],
        "the dir itself": [("d", 6, "2025-01-01T00:00:02")],
        "the dir itself and a newer subdir": [("e", 6, "2025-01-01T00:00:02"), ("e/step-8", 8, "2025-01-01T00:00:04")],
    }
    for name, ckpts in layouts.items():
        base = f"{root}/{name.replace(' ', '_').replace(':', '')}"
        fs.makedirs(f"{base}/unfinished-step-99", exist_ok=True)  # no metadata.json: not a checkpoint
        with fs.open(f"{base}/a-file", "w") as f:
            f.write("x")
        for rel, step, ts, *tmp in ckpts:
            sub = rel.split("/", 1)[1] if "/" in rel else ""
            put(f"{base}/{sub}".rstrip("/"), step, ts, *tmp)
        assert checkpoints.discover_latest_checkpoint(base) == levanters(base), name
        if ckpts:
            assert checkpoints.discover_latest_checkpoint(base) is not None, name


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("cut", ["", '{"step": 11, "timest'])
def test_a_checkpoint_cut_off_mid_save_is_set_aside_and_levanter_resumes_from_the_one_before(tmp_path, where, cut):
    """A kill while Levanter writes metadata.json (its last save step) leaves it empty or partial: Levanter's
    discovery would raise on every relaunch. Ours skips it, and set_aside_cut_checkpoints moves it out of
    Levanter's way, after which Levanter picks the checkpoint before."""
    import fsspec
    from levanter.checkpoint import discover_latest_checkpoint as levanters

    root = str(tmp_path / "ck") if where == "local" else f"memory://cut-{tmp_path.name}"
    fs = fsspec.filesystem("file" if where == "local" else "memory")
    fs.makedirs(f"{root}/step-5", exist_ok=True)
    fs.makedirs(f"{root}/step-11", exist_ok=True)
    with fs.open(f"{root}/step-5/metadata.json", "w") as f:
        f.write(json.dumps({"step": 5, "timestamp": "2025-01-01T00:00:01", "is_temporary": False}))
    with fs.open(f"{root}/step-11/metadata.json", "w") as f:
        f.write(cut)
    with pytest.raises(ValueError):
        levanters(root)  # what a relaunch would meet
    assert checkpoints.discover_latest_checkpoint(root).endswith("step-5")
    assert checkpoints.latest_checkpoint(root)["completed_steps"] == 6

    cut_dirs = checkpoints.set_aside_cut_checkpoints(root)
    assert [d.rstrip("/").rsplit("/", 1)[1] for d in cut_dirs] == ["step-11"]
    assert fs.cat(f"{root}/step-11/{checkpoints.CUT_OFF}").decode() == cut
    assert levanters(root) == checkpoints.discover_latest_checkpoint(root) and levanters(root).endswith("step-5")
    assert checkpoints.set_aside_cut_checkpoints(root) == []  # once
    assert checkpoints.set_aside_cut_checkpoints(f"{root}/absent") == []


def test_the_train_rule_process_does_not_import_jax(tmp_path):
    """latest_checkpoint (called by the train rule's own process before and after train_lm) and the
    rule's modules never import jax or Levanter."""
    code = (
        "import json, sys\n"
        "from trajsft.rule_job import run_rule\n"
        "from trajsft.train import target, run, checkpoints\n"
        f"p = {str(tmp_path)!r} + '/step-3'\n"
        "import os; os.makedirs(p)\n"
        "open(p + '/metadata.json', 'w').write(json.dumps({'step': 3, 'timestamp': '2025-01-01T00:00:01'}))\n"
        f"assert checkpoints.latest_checkpoint({str(tmp_path)!r})['completed_steps'] == 4\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'levanter', 'haliax'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_latest_checkpoint_and_metrics(tmp_path):
    ck = tmp_path / "ck"
    for step, ts, tmp in [(4, "2025-01-01T00:00:01", False), (9, "2025-01-01T00:00:03", True)]:
        (ck / f"step-{step}").mkdir(parents=True)
        (ck / f"step-{step}" / "metadata.json").write_text(
            json.dumps({"step": step, "timestamp": ts, "is_temporary": tmp})
        )
    (ck / "step-12").mkdir()  # unfinished save: no metadata.json -> ignored
    latest = checkpoints.latest_checkpoint(str(ck))
    assert latest["step"] == 9 and latest["completed_steps"] == 10 and latest["is_temporary"]
    assert checkpoints.latest_checkpoint(str(tmp_path / "nope")) is None

    log = tmp_path / "train.log"
    rec = lambda s, m: (  # noqa: E731
        "2025-01-01T00:00:00 - 0 - levanter.json_logger - json_logger.py:89 - INFO :: "
        + json.dumps({"tracker": "json_logger", "event": "log", "step": s, "metrics": m})
    )
    log.write_text(
        "\n".join(
            [
                f"{metrics.LAUNCH_MARK} train_lm id=x",
                rec(0, {"train/loss": 5.0}),
                rec(1, {"train/loss": 4.0}),
                rec(2, {"train/loss": 3.9}),
                f"{metrics.LAUNCH_MARK} train_lm id=x",
                "... - levanter.main.train_lm - train_lm.py:262 - INFO :: Resuming training from step 2",
                rec(2, {"train/loss": 3.5}),
                rec(3, {"train/loss": 3.0, "global_step": 3}),
                rec(3, {"eval/loss": 3.2, "eval/a/loss": 3.1}),
                rec(3, {"train/loss": 3.0}),
                f"{metrics.LAUNCH_MARK} export x",
            ]
        )
        + "\n"
    )
    m = metrics.read_metrics(str(log))
    assert metrics.loss_history(m) == [[0, 5.0], [1, 4.0], [2, 3.5], [3, 3.0]]
    assert [x["kind"] for x in m["launches"]] == ["train_lm", "train_lm", "export"]
    assert m["launches"][1]["resumed_from_step"] == 2 and m["launches"][1]["first_step"] == 2
    assert metrics.eval_losses(m) == {"eval/loss": [3, 3.2], "eval/a/loss": [3, 3.1]}


# --------------------------------------------------------------------------------------
# integration tests (real Ray / Levanter / JAX on CPU)
# --------------------------------------------------------------------------------------


@pytest.mark.integration
def test_build_chat_cache_stats(assets, chat_cache):
    from transformers import AutoTokenizer

    st = chat_cache
    tr, va = st["train"], st["validation"]
    assert tr["chats"] == 56 and va["chats"] == 8
    assert tr["tokens"] == sum(tr["lengths"]) and len(tr["lengths"]) == 56
    assert tr["assistant_tokens"] == sum(tr["assistant_lengths"])
    assert 0.05 < tr["assistant_fraction"] < 0.95
    assert 0 < tr["packed_sequences"] <= 56
    # the cache holds exactly what the tokenizer + template produce (same order as the shards)
    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    enc = tok.apply_chat_template(
        [c["messages"] for c in assets["chats"][:3]],
        chat_template=CHAT_TEMPLATE,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert tr["lengths"][:3] == [len(x) for x in enc["input_ids"]]
    assert tr["assistant_lengths"][:3] == [sum(x) for x in enc["assistant_masks"]]
    # published atomically: no leftover build dirs, stats file present
    parent = os.path.dirname(st["cache_dir"])
    assert sorted(os.listdir(parent)) == ["teacher_a"]
    assert os.path.exists(os.path.join(st["cache_dir"], "trajsft_cache_stats.json"))
    # the packed count is what Levanter's own chat dataset yields
    import haliax as hax
    from levanter.data.text import ChatLmDatasetFormat, dataset_for_format, load_lm_dataset_cache

    fmt = ChatLmDatasetFormat(chat_template=CHAT_TEMPLATE)
    cache = load_lm_dataset_cache(os.path.join(st["cache_dir"], "train"), fmt, tok)
    ds = dataset_for_format(fmt, hax.Axis("position", SEQ_LEN), cache, eos_id=tok.eos_token_id, ignore_index=-100)
    assert len(ds.as_sync_dataset()) == tr["packed_sequences"]
    # second call: no rebuild, same numbers
    t0 = time.time()
    again = data_cache.build_chat_cache(
        assets["train"], assets["validation"], st["cache_dir"], assets["tokenizer"], CHAT_TEMPLATE, seq_len=SEQ_LEN
    )
    assert time.time() - t0 < 30 and again["train"]["tokens"] == tr["tokens"]


def _assert_hf_export_loads(path: str, vocab: int):
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoTokenizer

    conf = AutoConfig.from_pretrained(path)
    assert conf.model_type == "qwen3" and conf.hidden_size == TINY["hidden_dim"] and conf.vocab_size == vocab
    weights = load_file(os.path.join(path, "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (vocab, TINY["hidden_dim"])
    assert "lm_head.weight" in weights and len(weights) > 10
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template == CHAT_TEMPLATE


@pytest.mark.integration
def test_train_tiny_mixture_with_eval(assets, chat_cache, jax_cache, tmp_path):
    """Two 'teachers' (the same cache twice, different weights) -> mixture config, eval, export; under
    training.remat save_attention (the attention's residuals saved: tests/test_remat.py)."""
    run_dir = str(tmp_path / "mix")
    cfg = _tiny_config(assets, chat_cache, run_dir, "tiny-mix", jax_cache, 6, weights={"a": 3.0, "b": 1.0},
                       remat="save_attention")
    assert "configs" in cfg["data"]
    log = os.path.join(run_dir, "train.log")
    res = train_run.run_training(cfg, run_dir, log, env=OFFLINE_ENV)
    assert "trajsft: remat save_attention (SaveAttention)" in open(log).read()
    assert res["launched"] and res["returncode"] == 0 and res["resumed_from_step"] == 0
    assert res["steps"] == 6 and [s for s, _ in res["loss_history"]] == list(range(6))
    assert math.isfinite(res["final_loss"]) and res["final_loss"] < res["loss_history"][0][1]
    assert res["checkpoint_dir"].endswith("checkpoints/step-5") and os.path.isdir(res["checkpoint_dir"])
    assert res["hf_export"].endswith("hf/step-5") and checkpoints.hf_export_complete(res["hf_export"])
    assert {"eval/loss", "eval/a/loss", "eval/b/loss"} <= set(res["eval_loss"])
    assert all(math.isfinite(v) for _, v in res["eval_loss"].values())
    vocab = json.load(open(os.path.join(res["hf_export"], "config.json")))["vocab_size"]
    _assert_hf_export_loads(res["hf_export"], vocab)
    # W&B offline files live inside the run directory
    assert any(n.startswith("offline-run-") for n in os.listdir(os.path.join(run_dir, "wandb")))
    assert json.load(open(os.path.join(run_dir, "training_result.json")))["final_loss"] == res["final_loss"]


def _wait_for(pred, timeout, proc=None, what=""):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.integration
def test_kill_resume_and_finished_run(assets, chat_cache, jax_cache, tmp_path, capsys):
    run_dir = str(tmp_path / "kr")
    log = os.path.join(run_dir, "train.log")
    P = chat_cache["train"]["packed_sequences"]
    N = 120
    cfg = _tiny_config(assets, chat_cache, run_dir, "tiny-kr", jax_cache, N, keep_every=10)
    assert cfg["epoch"] == (N - 1) * 4 // P + 1 > 1  # several passes over the data
    ckpt_dir = cfg["trainer"]["checkpointer"]["base_path"]

    # launch run_training in a child process (as Snakemake would), SIGKILL the trainer after the
    # first permanent checkpoint, then rerun: it must resume from that checkpoint
    driver = (
        "import json,sys; from trajsft.train import run as train_run; "
        "cfg=json.load(open(sys.argv[1])); train_run.run_training(cfg, sys.argv[2], sys.argv[3], env=json.loads(sys.argv[4]))"
    )
    os.makedirs(run_dir, exist_ok=True)
    cfg_json = os.path.join(run_dir, "cfg.json")
    json.dump(cfg, open(cfg_json, "w"))
    parent = subprocess.Popen(
        [sys.executable, "-c", driver, cfg_json, run_dir, log, json.dumps(OFFLINE_ENV)], start_new_session=True
    )
    try:
        first = os.path.join(ckpt_dir, "step-10", "metadata.json")
        _wait_for(lambda: os.path.exists(first), 240, parent, "first checkpoint")
        os.killpg(parent.pid, signal.SIGKILL)  # driver and trainer, no cleanup
        parent.wait(30)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    latest = checkpoints.latest_checkpoint(ckpt_dir)
    assert latest is not None and latest["completed_steps"] < N, "run finished before it could be killed"
    killed_at = latest["completed_steps"]
    # and the next save was cut off by the kill as it wrote metadata.json: the relaunch resumes from the one before
    cut = os.path.join(ckpt_dir, f"step-{killed_at + 1}")
    os.makedirs(cut, exist_ok=True)
    with open(os.path.join(cut, "metadata.json"), "w") as f:
        f.write('{"step": ')

    res = train_run.run_training(cfg, run_dir, log, env=OFFLINE_ENV)
    assert res["launched"] and res["returncode"] == 0
    assert res["resumed_from_step"] == killed_at
    assert "metadata.json was cut off mid-save" in capsys.readouterr().out
    assert res["steps"] == N and res["checkpoint_dir"].endswith(f"step-{N - 1}")
    assert [s for s, _ in res["loss_history"]] == list(range(N))
    assert math.isfinite(res["final_loss"])
    assert checkpoints.hf_export_complete(res["hf_export"])
    assert "Resuming training from step" in open(log).read()
    assert "Unknown leaf type" not in open(log).read()  # Levanter's None-leaf warning on resume, filtered
    steps_saved = sorted(int(n.split("-")[1]) for n in os.listdir(ckpt_dir) if n.startswith("step-"))
    assert steps_saved[-1] == N - 1 and 10 in steps_saved

    # finished run: no relaunch (Levanter would exit 1), same answer
    size = os.path.getsize(log)
    again = train_run.run_training(cfg, run_dir, log, env=OFFLINE_ENV)
    assert not again["launched"] and again["resumed_from_step"] is None and again["returncode"] is None
    assert again["steps"] == N and again["final_loss"] == res["final_loss"]
    assert again["checkpoint_dir"] == res["checkpoint_dir"] and os.path.getsize(log) == size

    # a lost / partial final HF export is regenerated from the final trainer checkpoint
    import shutil

    shutil.rmtree(res["hf_export"])
    os.makedirs(res["hf_export"])
    open(os.path.join(res["hf_export"], "model.safetensors"), "wb").write(b"\0" * 10)  # truncated
    fixed = train_run.run_training(cfg, run_dir, log, env=OFFLINE_ENV)
    assert not fixed["launched"] and checkpoints.hf_export_complete(fixed["hf_export"])
    vocab = json.load(open(os.path.join(fixed["hf_export"], "config.json")))["vocab_size"]
    _assert_hf_export_loads(fixed["hf_export"], vocab)
