"""What the backward pass recomputes (``training.remat``): Levanter's layer remat, or a policy of ours.

Levanter checkpoints each layer of its scanned stack (``gradient_checkpointing``, haliax's
``ScanCheckpointPolicy``): by default it keeps only the layer's input and recomputes the whole layer forward in
the backward pass. The policies, least recompute first:

``save_attention``
    keeps the attention's output and log-normaliser (what its backward needs), recomputes only projections,
    MLP and elementwise work. On a TPU the attention is splash (a ``pallas_call``: its outputs are saved as
    they are); on a CPU it is Levanter's JAX flash attention, whose loop a policy cannot see into, so
    :func:`install` names its residuals ``trajsft_attention`` (checkpoint_name) and the policy saves that name.
    Written in the train_lm config as haliax's own form, ``save_block_internals: [trajsft_attention]``, so every
    process decodes it; the processes that differentiate (training, the fit compile) call :func:`prepare`.
``full``
    Levanter's default (``gradient_checkpointing: true``).
``offload_carries``
    the same recompute, the layer carries offloaded to pinned host memory (less HBM, host transfers).

``auto`` (the default on Ray profiles) is the least recompute that ``trajsft fit`` finds fits with a margin
(:mod:`trajsft.fit.check`); without a fit check it is ``full``. None of this enters a hash: the math is the same
up to floating point (tests/test_remat.py), so a resumed run may change it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

POLICIES = ("save_attention", "full", "offload_carries")  # least recompute first; at equal recompute, no host traffic
AUTO = "auto"
CHOICES = (*POLICIES, AUTO)
DEFAULT = "full"
ATTENTION = "trajsft_attention"  # the checkpoint name of the attention residuals
RECOMPUTES_ATTENTION = {"save_attention": False, "full": True, "offload_carries": True}


def levanter_value(policy: str) -> Any:
    """``model.gradient_checkpointing`` of the train_lm config for ``policy`` (``auto`` unresolved: ``full``)."""
    if policy in (AUTO, "full"):
        return True
    if policy == "offload_carries":
        return {"save_carries": "offload", "save_inputs": False}
    if policy == "save_attention":
        return {"save_carries": False, "save_inputs": False, "save_block_internals": [ATTENTION]}
    raise ValueError(f"training.remat {policy!r}: one of {', '.join(CHOICES)}")


def policy_of(value: Any) -> str:
    """The policy name of a train_lm ``gradient_checkpointing`` value (decoded or not)."""
    if dataclasses.is_dataclass(value):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        internals = value.get("save_block_internals")
        if isinstance(internals, (list, tuple)) and ATTENTION in internals:
            return "save_attention"
        if value.get("save_carries") == "offload":
            return "offload_carries"
    return "full"


def install() -> None:
    """Name the residuals of Levanter's JAX flash attention (its output and log-normaliser) ``trajsft_attention``,
    so a remat policy can save them (idempotent). Equinox reads the forward rule at call time."""
    import haliax as hax
    import levanter.models.flash_attention as fa
    from jax.ad_checkpoint import checkpoint_name

    forward = fa._flash_attention.fn_fwd
    if getattr(forward, "names_residuals", False):
        return

    def named_forward(*args, **kwargs):
        out, residuals = forward(*args, **kwargs)
        named = {}

        def name(x):
            named[id(x)] = checkpoint_name(x, ATTENTION)
            return named[id(x)]

        residuals = hax.tree_util.tree_map(name, residuals)
        # the output is one of the residuals (Levanter's forward returns o, (o, ell)): the named one, so that what
        # the layer computes from it (the output projection) reads the saved value, not a recomputed one
        return hax.tree_util.tree_map(lambda x: named.get(id(x), x), out), residuals

    named_forward.names_residuals = True
    fa._flash_attention.fn_fwd = named_forward


def save_attention_policy(**fields):
    """haliax's ScanCheckpointPolicy that also saves every ``pallas_call``'s outputs (splash attention on a TPU: the
    only kernel inside a Qwen3 layer)."""
    from haliax import ScanCheckpointPolicy

    class SaveAttention(ScanCheckpointPolicy):
        def _to_jax_policy(self, carry_name, input_name):
            named = super()._to_jax_policy(carry_name, input_name)

            def policy(prim, *avals, **params):
                if prim.name == "pallas_call":
                    return True
                return named(prim, *avals, **params)

            return policy

    return SaveAttention(**fields)


def prepare(model_cfg):
    """``model_cfg`` (a Levanter model config) ready to differentiate under its policy: the flash attention's
    residuals named and, for save_attention, the policy that also saves splash's outputs."""
    value = model_cfg.gradient_checkpointing
    if policy_of(value) != "save_attention":
        return model_cfg
    install()
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return dataclasses.replace(model_cfg, gradient_checkpointing=save_attention_policy(**fields))
