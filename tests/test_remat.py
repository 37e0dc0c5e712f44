"""training.remat (trajsft.train.remat): every policy trains the same numbers; save_attention really saves the
attention on a CPU (Levanter's JAX flash attention), so its forward is not run again in the backward pass."""

from __future__ import annotations

import dataclasses

import pytest

from trajsft.plan import config as C
from trajsft.train import remat

pytestmark = pytest.mark.integration  # real JAX steps of the tiny model on the CPU (~30 s)

STEPS = 3
SEQ = 256
# float32 on a CPU: recomputing a layer's forward or saving it gives the same values up to the order of XLA's
# fused reductions; measured here the largest difference is ~1e-7 relative (the tolerance leaves 100x room)
RTOL, ATOL = 1e-5, 1e-7


def tiny_config(policy: str):
    import draccus
    import levanter.config  # noqa: F401  (draccus codecs)
    from levanter.layers.attention import AttentionBackend
    from levanter.models.qwen import Qwen3Config

    dims = C.load(None)["students"]["tiny"]["model"]
    cfg = draccus.decode(Qwen3Config, {"seq_len": SEQ, **dims,
                                       "gradient_checkpointing": remat.levanter_value(policy)})
    return remat.prepare(dataclasses.replace(cfg, attn_backend=AttentionBackend.JAX_FLASH,
                                             flash_attention_block_size=64))


def train(policy: str):
    """Losses and final gradients of STEPS AdamW steps on fixed random batches, under ``policy``."""
    import equinox as eqx
    import haliax as hax
    import jax
    import optax
    from levanter.models.lm_model import LmExample, compute_next_token_loss

    cfg = tiny_config(policy)
    Vocab, Batch = hax.Axis("vocab", 512), hax.Axis("batch", 2)
    model = cfg.build(Vocab, key=jax.random.PRNGKey(0))
    opt = optax.adamw(1e-2)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, state, tokens):
        ex = hax.vmap(LmExample.causal, Batch)(tokens)
        loss, grads = eqx.filter_value_and_grad(lambda m: compute_next_token_loss(m, ex).scalar())(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, loss, grads

    losses = []
    for i in range(STEPS):
        tokens = hax.random.randint(jax.random.PRNGKey(100 + i), (Batch, cfg.Pos), 0, Vocab.size)
        model, state, loss, grads = step(model, state, tokens)
        losses.append(float(loss))
    return losses, [x for x in jax.tree.leaves(eqx.filter(grads, eqx.is_array))]


@pytest.fixture(scope="module")
def full():
    return train("full")


@pytest.mark.parametrize("policy", [p for p in remat.POLICIES if p != "full"])
def test_every_policy_trains_the_same_losses_and_gradients(policy, full):
    import numpy as np

    losses, grads = train(policy)
    assert np.allclose(losses, full[0], rtol=RTOL, atol=0), (losses, full[0])
    assert len(grads) == len(full[1])
    for g, f in zip(grads, full[1]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(f), rtol=RTOL, atol=ATOL)


def attention_loops(policy) -> int:
    """While loops in the gradient's jaxpr: the flash attention forward is two (blocks of Q, blocks of K), its
    backward two; a layer forward recomputed in the backward pass runs the forward's two again."""
    import equinox as eqx
    import haliax as hax
    import jax
    from levanter.models.lm_model import LmExample, compute_next_token_loss

    cfg = tiny_config(policy) if isinstance(policy, str) else dataclasses.replace(
        tiny_config("full"), gradient_checkpointing=policy)
    Vocab, Batch = hax.Axis("vocab", 512), hax.Axis("batch", 2)
    model = cfg.build(Vocab, key=jax.random.PRNGKey(0))
    ex = hax.vmap(LmExample.causal, Batch)(hax.zeros((Batch, cfg.Pos), dtype=int))
    grad = eqx.filter_grad(lambda m: compute_next_token_loss(m, ex).scalar())
    return str(jax.make_jaxpr(grad)(model)).count("while[")


def test_save_attention_does_not_run_the_attention_forward_again_on_a_cpu():
    no_remat = attention_loops(False)
    assert attention_loops("full") == no_remat + 2 == attention_loops("offload_carries")
    assert attention_loops("save_attention") == no_remat


def test_the_policy_names_and_their_train_lm_values():
    assert remat.CHOICES == ("save_attention", "full", "offload_carries", "auto")
    for p in remat.POLICIES:
        assert remat.policy_of(remat.levanter_value(p)) == p
    assert remat.levanter_value("auto") is True and remat.policy_of(True) == "full"
    with pytest.raises(ValueError, match="training.remat 'nested': one of save_attention, full"):
        remat.levanter_value("nested")
