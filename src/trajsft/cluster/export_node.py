"""Where the driver's fallback HF export runs: never on the head.

The final HF export is written on the slice by Levanter's own hook. When a kill interrupted it, the
driver (on the head: a shared CPU VM, 32 GB on marin's clusters) must not load the weights itself:
Qwen3-8B in f32 is about 33 GB. It runs the export as a Ray task pinned to another node whose declared
memory fits (:func:`memory_needed`, from the checkpoint's own size), or refuses in one line naming the
memory it needs. A TPU host qualifies (it declares hundreds of GB); the export runs there on its CPU.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Iterable, Optional

from ..errors import JobEnvironmentError
from ..io import fs_and_path, join

GIB = 2**30
# the export process itself (Python, JAX, Levanter, the tokenizer) above its weights: the demo's export peaked at
# 0.44 GiB of RSS here; 1 GiB leaves room
PROCESS_BYTES = 1 * GIB
HEAD_RESOURCE = "node:__internal_head__"


def memory_needed(checkpoint_path: str) -> int:
    """Peak memory of exporting ``checkpoint_path``: its f32 weights (the size of its ``model`` tree, as Levanter
    writes them), their bf16 copy being written (half that), and the process."""
    fs, path = fs_and_path(join(checkpoint_path, "model"))
    model_bytes = int(fs.du(path))
    return int(model_bytes * 1.5) + PROCESS_BYTES


@dataclasses.dataclass(frozen=True)
class Node:
    node_id: str
    host: str
    memory: int  # bytes the node declares to Ray
    cpus: float
    head: bool


def nodes_of(ray_nodes: Iterable[dict]) -> list[Node]:
    """The alive nodes of ``ray.nodes()``."""
    out = []
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        out.append(Node(node_id=n["NodeID"], host=n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "?",
                        memory=int(res.get("memory", 0)), cpus=float(res.get("CPU", 0)), head=HEAD_RESOURCE in res))
    return out


def choose(nodes: list[Node], need: int, driver_node: Optional[str] = None) -> Node:
    """The node with the most declared memory among those that fit ``need``, have a CPU and are neither the head
    nor the driver's node; a one-line :class:`JobEnvironmentError` if there is none."""
    others = [n for n in nodes if not n.head and n.node_id != driver_node and n.cpus >= 1]
    fits = [n for n in others if n.memory >= need]
    if fits:
        return max(fits, key=lambda n: n.memory)
    largest = max(others, key=lambda n: n.memory, default=None)
    seen = (f"the largest other node declares {largest.memory / GIB:.1f} GiB ({largest.host})" if largest
            else "no node with a CPU but the head is up")
    raise JobEnvironmentError(
        f"the final HF export needs about {need / GIB:.1f} GiB of memory and no node of the cluster but the head has "
        f"that much ({seen}); it never runs on the head: add a CPU node type of at least {need / GIB:.0f} GiB, or "
        "set ray.export_memory_gib; nothing was loaded")


def export_on_a_node(cfg: dict, checkpoint_path: str, output_dir: str, *, need: int, work_dir: Optional[str] = None):
    """Run :func:`trajsft.train.hf_export.export_hf` (on CPU) as a Ray task on the node :func:`choose` picks, with its
    log and scratch files in ``work_dir`` (a local run dir every node shares, as in the tests) or a temporary dir of
    that node. Returns that node. Call from the driver, inside its Ray session."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = choose(nodes_of(ray.nodes()), need, ray.get_runtime_context().get_node_id())
    print(f"[trajsft.remote_train] final HF export {output_dir} incomplete: exporting on {node.host} (node "
          f"{node.node_id[:12]}, which declares {node.memory / GIB:.1f} GiB; it needs about {need / GIB:.1f} GiB), "
          "never on the head", flush=True)
    task = ray.remote(_export).options(
        num_cpus=1, memory=need, max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
    where = ray.get(task.remote(cfg, checkpoint_path, output_dir, work_dir))
    if where["node_id"] != node.node_id:  # NodeAffinity with soft=False: cannot happen
        raise RuntimeError(f"the HF export ran on node {where['node_id']}, not on {node.node_id}")
    return dataclasses.replace(node, host=where["host"])


def _export(cfg: dict, checkpoint_path: str, output_dir: str, work_dir: Optional[str]) -> dict:
    import os
    import tempfile

    import ray

    from ..train import hf_export

    work = work_dir or tempfile.mkdtemp(prefix="trajsft-export-")
    hf_export.export_hf(cfg, checkpoint_path, output_dir, env={"JAX_PLATFORMS": "cpu"},
                        log_path=os.path.join(work, "export_hf.log"), cwd=work)
    return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}
