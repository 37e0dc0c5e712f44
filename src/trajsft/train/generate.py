"""A trained model generating with Levanter's inference engine (``levanter.inference.engine.InferenceEngine``: paged
attention, single host): what ``trajsft serve`` answers with and what the next-action scores generate with.

:func:`load` parses the run's train_lm config (no tracker, no HF saving), loads the model as the cross-teacher
matrix does (:func:`trajsft.train.eval.load_model`) in the run's compute dtype (the KV cache's: they must agree)
and builds the engine; :func:`generate` runs a batch of prompts through it, as Levanter's own server batches
requests (``levanter.inference.openai.InferenceContext._execute_batch``). Imported lazily: it pulls in jax.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import ConfigError, one_line

END_OF_TURN = "<|im_end|>"  # every assistant turn the student trained on ends with it (the loss covers it)


def inference_config(train_cfg: dict) -> dict:
    """The run's train_lm config as generation parses it: no tracker, no HF saving, its own trainer id and logs."""
    cfg = copy.deepcopy(train_cfg)
    tr = cfg["trainer"]
    tr["tracker"] = []
    tr["id"] = f"serve-{tr['id']}"[:64]
    tr["log_dir"] = os.path.abspath(os.path.join("logs", "serve"))
    tr.pop("watch", None)
    cfg.pop("hf_save_path", None)
    return cfg


@dataclass
class Loaded:
    """A model ready to generate: Levanter's config, tokenizer, model and engine, and where its start went."""

    config: Any
    tokenizer: Any
    model: Any
    engine: Any
    engine_cfg: Any
    max_seq_len: int
    end: int  # the token id of END_OF_TURN
    seconds: dict = field(default_factory=dict)  # build, load


# the engine's settings of an evaluation (and `trajsft serve`'s default), from scripts/bench_generate.py on the demo's
# tiny Qwen3 on 2 CPU cores, 24 turns x 64 tokens (2026-11-27): steady 1374 tokens/s at 4 sequences and 128-token
# pages, 1343 at 1, 1333 at 8, 866 at 8 with 32-token pages; the compile dominates a small evaluation (6.4 s)
EVAL_MAX_SEQS = 4
EVAL_PAGE_SIZE = 128


def load(train_cfg: dict, source: dict, max_seqs: Optional[int] = None, page_size: int = EVAL_PAGE_SIZE) -> Loaded:
    """The model at ``source`` (``{"kind": "hf_export"|"checkpoint", "path"}``) of the run whose train_lm config is
    ``train_cfg``, with an engine for ``max_seqs`` sequences at once, its KV cache in pages of ``page_size`` tokens.
    A checkpoint that does not load as the run's model is one line (ConfigError). ``max_seqs`` None: EVAL_MAX_SEQS."""
    t0 = time.time()
    max_seqs = int(max_seqs or EVAL_MAX_SEQS)
    import haliax as hax

    from levanter.inference.engine import InferenceEngine, InferenceEngineConfig

    from . import eval as train_eval

    config = train_eval.initialize(inference_config(train_cfg))
    trainer = config.trainer
    tokenizer = config.data.the_tokenizer
    t_build = time.time()
    max_seq_len = int(config.model.seq_len)
    page_size = min(page_size, max_seq_len)
    engine_cfg = InferenceEngineConfig(
        max_seq_len=max_seq_len, max_seqs=max_seqs, page_size=page_size,
        max_pages=max_seqs * ((max_seq_len + page_size - 1) // page_size),
        compute_dtype=trainer.mp.compute_dtype, max_stop_seqs=1, max_stop_tokens=1,
        max_seqs_in_prefill=min(16, max_seqs), max_queued_tokens=max(512, max_seqs))
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.parameter_axis_mapping):
        try:
            # in the run's compute dtype (an HF export holds hf_save_dtype's), as the KV cache: they must agree
            model = trainer.mp.cast_to_compute(
                train_eval.load_model(config, tokenizer, **{source["kind"]: source["path"]}))
        except Exception as e:  # noqa: BLE001 - a checkpoint that does not load as the run's model: one line
            raise ConfigError(f"{source['path']} does not load as the run's model ({config.model.model_type}): "
                              f"{one_line(e)}") from None
        t_load = time.time()
        engine = InferenceEngine.from_model_with_config(model=model, tokenizer=tokenizer, config=engine_cfg)
    return Loaded(config, tokenizer, model, engine, engine_cfg, max_seq_len,
                  tokenizer.convert_tokens_to_ids(END_OF_TURN),
                  {"build": t_build - t0, "load": t_load - t_build})


def end_turn(tokens: list[int], end: int, cap: int) -> tuple[list[int], bool]:
    """A generation's tokens up to ``end`` (excluded), and whether the model ended its turn: it wrote ``end``, or
    stopped before the ``cap`` it was given."""
    toks = list(tokens)
    if end in toks:
        return toks[:toks.index(end)], True
    return toks, len(toks) < cap


def room(loaded: Loaded, prompt: list[int]) -> int:
    """Tokens the model may generate after ``prompt`` before its ``max_seq_len`` (0: none)."""
    return max(0, loaded.max_seq_len - len(prompt))


def generate(loaded: Loaded, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0,
             seed: int = 0) -> list[tuple[list[int], bool]]:
    """Each prompt's generated tokens (up to END_OF_TURN, excluded) and whether the model ended its turn; greedy at
    temperature 0. Prompts go through the engine ``engine_cfg.max_seqs`` at a time. A prompt that leaves no room
    (:func:`room`) is refused in one line: callers skip it (the next-action scores count it) or say so (serve)."""
    full = [i for i, p in enumerate(prompts) if room(loaded, p) < 1]
    if full:
        raise ConfigError(f"prompt {full[0]} holds {len(prompts[full[0]])} tokens: no room to generate within the "
                          f"model's seq_len {loaded.max_seq_len}")
    import haliax as hax
    import jax.numpy as jnp
    import jax.random as jrandom

    from levanter.inference.engine import Request
    from levanter.inference.jit_scheduler import SeqDecodingParams

    trainer = loaded.config.trainer
    out: list[tuple[list[int], bool]] = []
    stop = hax.named(jnp.asarray([loaded.end], dtype=jnp.int32), axis="position").broadcast_axis({"stop_seq": 1})
    step = loaded.engine_cfg.max_seqs
    for start in range(0, len(prompts), step):
        batch = prompts[start:start + step]
        reqs = []
        for i, prompt in enumerate(batch):
            cap = min(max_tokens, loaded.max_seq_len - len(prompt))
            params = SeqDecodingParams(max_num_tokens=jnp.array(len(prompt) + cap, dtype=jnp.int32),
                                       stop_tokens=stop, temperature=jnp.array(temperature, dtype=jnp.float32),
                                       key=jrandom.PRNGKey(seed + start + i))
            reqs.append(Request(prompt_tokens=list(prompt), request_id=i, decode_params=params, n_generations=1,
                                enable_logprobs=False))
        with hax.partitioning.set_mesh(trainer.device_mesh), hax.axis_mapping(trainer.compute_axis_mapping):
            result = loaded.engine.generate(reqs)
        for i, prompt in enumerate(batch):
            out.append(end_turn(result.tokens[i], loaded.end, min(max_tokens, loaded.max_seq_len - len(prompt))))
    return out
