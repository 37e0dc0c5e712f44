"""Model FLOPs of a train step, analytically (XLA's cost analysis counts a scanned layer stack once).

``6·N·tokens + attention``: N is the parameters that multiply each token (every layer's q/k/v/o and MLP
projections and the LM head; the embedding lookup is not a matmul), 2 FLOPs per multiply-add, x3 for the
forward and backward passes. Attention adds ``QK^T`` and ``AV``: ``4·heads·head_dim·context`` per token
and layer forward, where the context is the whole sequence for Levanter's count (``lm_flops_per_token``,
what its ``throughput/mfu`` uses) and half of it on average for a causal mask (what the kernel can skip).
Pure functions (no jax): ``tests/test_fit.py`` checks them against Levanter's own count and against
XLA's count of an unscanned model.
"""

from __future__ import annotations

from typing import Mapping


def matmul_params(dims: Mapping[str, int], vocab: int) -> int:
    """Parameters that multiply every token: q, k, v, o and the gated MLP of each layer, and the LM head."""
    h, inter, layers = dims["hidden_dim"], dims["intermediate_dim"], dims["num_layers"]
    q = dims["num_heads"] * dims["head_dim"]
    kv = dims["num_kv_heads"] * dims["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter
    return layers * per_layer + h * vocab


def attention_flops_per_token(dims: Mapping[str, int], seq_len: int, causal: bool) -> float:
    """Forward FLOPs of ``QK^T`` and ``AV`` per token, all layers (context seq_len, or seq_len/2 causal)."""
    context = seq_len / 2 if causal else seq_len
    return 4.0 * dims["num_layers"] * dims["num_heads"] * dims["head_dim"] * context


def train_flops_per_token(dims: Mapping[str, int], vocab: int, seq_len: int, causal: bool = True) -> float:
    """Forward + backward FLOPs per token: ``3 x (2·N + attention)``."""
    return 3.0 * (2.0 * matmul_params(dims, vocab) + attention_flops_per_token(dims, seq_len, causal))


def remat_factor(dims: Mapping[str, int], vocab: int, seq_len: int, recompute_attention: bool) -> float:
    """Step FLOPs when the backward pass runs each layer's forward again, over the step without remat: ``(3F + R) /
    3F``, F the forward per token (Levanter's count: full attention), R what is recomputed: the layers (F less the
    LM head), less their attention when the policy saves its output."""
    attention = attention_flops_per_token(dims, seq_len, causal=False)
    forward = 2.0 * matmul_params(dims, vocab) + attention
    again = forward - 2.0 * dims["hidden_dim"] * vocab - (0.0 if recompute_attention else attention)
    return (3.0 * forward + again) / (3.0 * forward)
