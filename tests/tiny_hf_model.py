"""A tiny Qwen3 checkpoint in the Hugging Face layout, made here (no download): what the tests' fake Hub
serves in place of Qwen/Qwen3-8B. ``config.json`` + ``model.safetensors`` with HF's Qwen3 tensor names,
at the demo student's dimensions (config/config.yaml ``students.tiny``) and the demo tokenizer's vocabulary,
so that Levanter initialises the demo's model from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# config/config.yaml students.tiny.model
TINY = {"hidden_dim": 64, "intermediate_dim": 192, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "head_dim": 16}
VOCAB = 2006  # len(demo/tokenizer)


def tensors(dims: dict = TINY, vocab: int = VOCAB, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i, hd = dims["hidden_dim"], dims["intermediate_dim"], dims["head_dim"]
    nh, nkv = dims["num_heads"], dims["num_kv_heads"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    out = {"model.embed_tokens.weight": w(vocab, h), "model.norm.weight": np.ones(h, np.float32),
           "lm_head.weight": w(vocab, h)}
    for n in range(dims["num_layers"]):
        p = f"model.layers.{n}."
        out.update({
            p + "self_attn.q_proj.weight": w(nh * hd, h), p + "self_attn.k_proj.weight": w(nkv * hd, h),
            p + "self_attn.v_proj.weight": w(nkv * hd, h), p + "self_attn.o_proj.weight": w(h, nh * hd),
            p + "self_attn.q_norm.weight": np.ones(hd, np.float32), p + "self_attn.k_norm.weight": np.ones(hd, np.float32),
            p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h), p + "mlp.down_proj.weight": w(h, i),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
        })
    return out


def config(dims: dict = TINY, vocab: int = VOCAB) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": dims["hidden_dim"],
            "intermediate_size": dims["intermediate_dim"], "num_hidden_layers": dims["num_layers"],
            "num_attention_heads": dims["num_heads"], "num_key_value_heads": dims["num_kv_heads"],
            "head_dim": dims["head_dim"], "vocab_size": vocab, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False,
            "hidden_act": "silu", "torch_dtype": "float32"}


def files(dims: dict = TINY, vocab: int = VOCAB, seed: int = 0) -> dict[str, bytes]:
    """The checkpoint's files: relative path -> bytes."""
    from safetensors.numpy import save

    return {"config.json": (json.dumps(config(dims, vocab), indent=2) + "\n").encode(),
            "generation_config.json": b'{"do_sample": false}\n',
            "model.safetensors": save(tensors(dims, vocab, seed), metadata={"format": "pt"}),
            "README.md": b"# tiny-qwen3 (test checkpoint)\n"}


def write(dest: Path, **kw) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for rel, data in files(**kw).items():
        (dest / rel).write_bytes(data)
    return dest
