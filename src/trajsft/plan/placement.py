"""Where a workflow's jobs run, decided once from the config's ``executor:``: this machine (``local``) or a Ray
cluster's TPU slices (``ray``). :func:`placement` is the one place that reads the setting; everything else asks the
:class:`Placement` it returns (facts) or the executor built from it (behaviour: :mod:`trajsft.executor`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

LOCAL, RAY = "local", "ray"


@dataclass(frozen=True)
class Placement:
    """What a job needs to know of where it runs.

    ``on_cluster``: a Ray job on the cluster's hosts (they read only what they are shipped or what is in the storage
    root, and train on TPUs), else this machine's CPUs. ``cluster``: the name status shows (``ray`` for a profile
    that names none); ``cluster_name``: the one a done marker records (None for such a profile).
    ``address`` and ``tpu_type``: the profile's Ray head and slice type (None locally)."""

    name: str
    on_cluster: bool
    cluster: str
    cluster_name: str | None
    accelerator: str  # what Levanter trains on: "tpu" on a cluster, "cpu" here
    ray: Mapping[str, Any] = field(default_factory=dict)  # the profile's ray: section ({} locally)

    @property
    def address(self) -> str | None:
        return self.ray.get("address")

    @property
    def tpu_type(self) -> str | None:
        return self.ray.get("tpu_type")

    @property
    def ray_reachable(self) -> bool:
        """A cluster profile that names its head: its jobs can be asked for."""
        return self.on_cluster and bool(self.address)


def placement(cfg: Mapping[str, Any]) -> Placement:
    """The placement of a validated config (``executor:`` is ``local`` or ``ray``, the schema says)."""
    on_cluster = cfg["executor"] == RAY
    ray = dict(cfg.get("ray") or {}) if on_cluster else {}
    return Placement(
        name=RAY if on_cluster else LOCAL,
        on_cluster=on_cluster,
        cluster=ray.get("cluster", RAY) if on_cluster else LOCAL,
        cluster_name=ray.get("cluster") if on_cluster else LOCAL,
        accelerator="tpu" if on_cluster else "cpu",
        ray=ray,
    )
