"""Compile a target's Levanter train step for a TPU topology on a machine with no TPU (libtpu's compiler).

Run as a child process (``python -m trajsft.fit.compile REQUEST.json RESULT.json``): the only module of the
fit check that imports jax and Levanter, so the CLI and the rule processes stay light and a compile's memory
is returned to the system when it ends.

The step is Levanter's own: the request carries the train rule's ``train_lm`` config (built by
:func:`trajsft.train.levanter_config.train_lm_config` from the same typed specs), decoded here by draccus
into ``TrainLmConfig`` exactly as ``train_lm`` decodes it; the optimizer is ``config.optimizer.build``, the
loss ``compute_next_token_loss`` with ``z_loss_weight``, the state ``TrainerState.init`` and the step
``Trainer._train_step`` (mixed precision, compute/parameter axis mappings, microbatching, clipping). Only
the mesh differs: Levanter builds it from ``jax.devices()``, so a small subclass of ``Trainer`` returns a
mesh of the same axes (replica, data, model) over the topology's devices. Levanter picks its attention
kernel from the platform it runs on (JAX_FLASH on CPU, SPLASH on TPU), so the request names the TPU
run's kernel and the model config is given it explicitly.

Nothing is allocated: the model, optimizer state and batch are abstract (``eval_shape``) with the
shardings Levanter would give them; jax's jit, lower and compile run XLA's TPU compiler, which refuses a
program over the chip's HBM.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import resource
import sys
import time
from typing import Any


def _versions() -> dict:
    from trajsft.fit.check import versions

    return versions()


def _bytes_per_device(tree) -> int:
    """Bytes of the abstract arrays of ``tree`` held by one device (each leaf's shard shape)."""
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
            total += int(np.prod(shape, dtype=np.int64)) * leaf.dtype.itemsize
    return total


def _count(tree) -> int:
    import jax
    import numpy as np

    return sum(int(np.prod(x.shape, dtype=np.int64)) for x in jax.tree.leaves(tree) if hasattr(x, "shape"))


def compile_step(req: dict) -> dict:
    """Compile the train step of ``req["levanter"]`` for ``req["topology"]``; returns the figures (see module doc)."""
    t0 = time.time()
    import draccus
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    import levanter.config  # noqa: F401  (draccus codecs)
    from haliax.partitioning import ResourceAxis, infer_resource_partitions, round_axis_for_partitioning
    from jax.experimental import mesh_utils, topologies
    from jax.sharding import Mesh
    from levanter.layers.attention import AttentionBackend
    from levanter.main.train_lm import TrainLmConfig
    from levanter.models.lm_model import LmExample, compute_next_token_loss
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer
    from levanter.trainer_state import TrainerState

    from trajsft.train import remat

    cfg = draccus.decode(TrainLmConfig, req["levanter"])
    model_cfg = cfg.model
    if req.get("attn_backend"):
        model_cfg = dataclasses.replace(model_cfg, attn_backend=AttentionBackend[req["attn_backend"]])
    if req.get("model_overrides"):  # tests: an unscanned, un-rematted model for XLA's FLOP count
        model_cfg = dataclasses.replace(model_cfg, **req["model_overrides"])
    model_cfg = remat.prepare(model_cfg)  # training.remat as the train rule runs it (save_attention: our policy)
    trainer_cfg = dataclasses.replace(cfg.trainer, tracker=NoopConfig())

    topo = topologies.get_topology_desc(platform="tpu", topology_name=req["topology"])
    devices = list(topo.devices)
    n = len(devices)
    replica, model_axis = int(trainer_cfg.replica_ici_axis_size), int(trainer_cfg.model_axis_size)
    if n % (replica * model_axis):
        raise ValueError(f"{n} devices are not divisible by replica {replica} x model {model_axis}")
    shape = (replica, n // (replica * model_axis), model_axis)
    mesh = Mesh(mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True),
                (ResourceAxis.REPLICA, ResourceAxis.DATA, ResourceAxis.MODEL))

    class TopologyTrainer(Trainer):
        """Levanter's trainer on the topology's devices (its config builds the mesh from ``jax.devices()``)."""

        @property
        def device_mesh(self):
            return mesh

    optimizer = cfg.optimizer.build(trainer_cfg.num_train_steps)
    loss_fn = functools.partial(compute_next_token_loss, logsumexp_weight=cfg.z_loss_weight)
    trainer = TopologyTrainer(trainer_cfg, optimizer, loss_fn, add_default_hooks=False)
    param_map, compute_map = trainer.parameter_axis_mapping, trainer.compute_axis_mapping
    batch_size = int(trainer_cfg.train_batch_size)
    if batch_size % (n // model_axis):
        raise ValueError(f"batch_size {batch_size} is not divisible by the {n // model_axis} data-parallel devices")

    Pos = model_cfg.Pos
    Batch = hax.Axis(trainer_cfg.batch_axis, batch_size)
    with mesh, hax.axis_mapping(param_map):
        Vocab = round_axis_for_partitioning(hax.Axis("vocab", int(req["vocab_size"])), param_map)
        seed = jax.random.PRNGKey(int(trainer_cfg.seed))
        _data_key, _loader_key, model_key, training_key = jax.random.split(seed, 4)

        def init_state():
            model = model_cfg.build(Vocab, key=model_key)
            return TrainerState.init(optimizer, model, key=training_key, is_trainable=True, mp=trainer.mp,
                                     quantization=trainer_cfg.quantization,
                                     model_averaging=trainer_cfg.model_averaging)

        state_shape = eqx.filter_eval_shape(init_state)

        def make_batch():
            z = hax.zeros((Batch, Pos), dtype=jnp.int32)
            return hax.vmap(lambda t, m, s: LmExample.causal(t, loss_mask=m, segment_ids=s), Batch)(z, z, z)

        batch_shape = eqx.filter_eval_shape(make_batch)

        def abstract(tree, mapping):
            shardings = infer_resource_partitions(tree, mapping, mesh=mesh)

            def one(x, s):
                if isinstance(x, hax.NamedArray) and x.array is not None:
                    return hax.NamedArray(jax.ShapeDtypeStruct(x.array.shape, x.array.dtype, sharding=s), x.axes)
                if isinstance(x, jax.ShapeDtypeStruct):
                    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                return x

            return jax.tree.map(one, tree, shardings,
                                is_leaf=lambda x: isinstance(x, (hax.NamedArray, jax.ShapeDtypeStruct)))

        state_abs = abstract(state_shape, param_map)
        batch_abs = abstract(batch_shape, compute_map)

        def is_sds(x):
            return isinstance(x, jax.ShapeDtypeStruct)

        s_dyn, s_static = eqx.partition(state_abs, is_sds, is_leaf=is_sds)
        b_dyn, b_static = eqx.partition(batch_abs, is_sds, is_leaf=is_sds)

        def step(sd, bd):
            result = trainer._train_step(eqx.combine(sd, s_static), (eqx.combine(bd, b_static),), {},
                                         _no_hooks=True)
            return result.loss, eqx.filter(result.new_state, eqx.is_array)

        t1 = time.time()
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            lowered = jax.jit(step, donate_argnums=(0,)).lower(s_dyn, b_dyn)
        t2 = time.time()
        compiled = lowered.compile()
        t3 = time.time()
        # splash's forward kernel in the program: once, or again in the backward pass (the layer's forward recomputed)
        attention_forwards = len(re.findall(r"splash_m[hq]a_fwd", lowered.as_text()))

    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    params_bytes = _bytes_per_device(eqx.filter(state_abs.model, is_sds, is_leaf=is_sds))
    opt_bytes = _bytes_per_device(eqx.filter(state_abs.opt_state, is_sds, is_leaf=is_sds))
    args, out, alias = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes
    temp, code = mem.temp_size_in_bytes, mem.generated_code_size_in_bytes
    fpt = model_cfg.flops_per_token(int(req["vocab_size"]))
    return {
        "devices": n,
        "device_kind": devices[0].device_kind,
        "mesh": dict(zip(("replica", "data", "model"), shape)),
        "attn_backend": str(model_cfg.attn_backend.name if model_cfg.attn_backend else "default"),
        "params": _count(state_shape.model),
        "vocab_padded": Vocab.size,
        "hbm_per_chip": {
            "arguments_bytes": int(args), "params_bytes": int(params_bytes), "optimizer_state_bytes": int(opt_bytes),
            "other_arguments_bytes": int(args - params_bytes - opt_bytes), "outputs_bytes": int(out),
            "aliased_bytes": int(alias), "temporaries_bytes": int(temp), "generated_code_bytes": int(code),
            "peak_bytes": int(args + out - alias + temp + code),
        },
        "levanter_flops_per_token": None if fpt is None else float(fpt),
        "attention_forward_kernels": attention_forwards,
        "xla_flops_per_device": float(cost.get("flops", 0.0)),
        "compile_seconds": round(t3 - t2, 1), "lower_seconds": round(t2 - t1, 1),
        "setup_seconds": round(t1 - t0, 1),
        "peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
        "versions": _versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    req_path, out_path = argv
    with open(req_path) as f:
        req = json.load(f)
    try:
        result: dict[str, Any] = {"ok": True, **compile_step(req)}
    except Exception as e:  # the compiler's refusal (RESOURCE_EXHAUSTED ...) or a config it cannot build
        result = {"ok": False, "error_type": type(e).__name__, "error": str(e), "versions": _versions()}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
