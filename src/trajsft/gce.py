"""What a GCE VM (a Cloud TPU host) learns about itself from the GCE metadata server.

A TPU VM made by ``gcloud compute tpus tpu-vm create`` (marin's clusters) sets no ``TPU_*`` variables:
Ray's ``TPUAcceleratorManager``, JAX's ``cloud_tpu_cluster`` and Levanter ask the metadata server
(``http://metadata.google.internal/computeMetadata/v1/``, header ``Metadata-Flavor: Google``). GKE
sets the variables instead, and they come first, as in Ray. :func:`tpu_identity` reads a host's slice,
worker id, hosts and accelerator type that way; :func:`zone` and :func:`project` say where a VM runs.

Requests go through ``requests`` (so an ``http_proxy`` reaches a stand-in server, as the tests do),
bounded by a short timeout; a machine with no metadata server answers ``None`` at once after the
first failed request (remembered per process). The server is asked only where this machine can be a GCE VM
(:func:`may_be_gce`): a laptop's or a CI machine's local run asks nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Mapping, Optional

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/"
HEADERS = {"Metadata-Flavor": "Google"}
_state = {"unreachable": False}
GCE_ENV = "TRAJSFT_GCE"  # "1": ask the metadata server (the emulated TPU hosts set it), "0": never ask
TPU_IDENTITY_VARS = ("TPU_NAME", "TPU_WORKER_ID", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")
PRODUCT_NAME = "/sys/class/dmi/id/product_name"


def may_be_gce(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this machine can be a GCE VM, so that its metadata server is worth asking: ``$TRAJSFT_GCE`` says so
    ("1" / "0"), else the firmware names Google Compute Engine, TPU devices exist (``/dev/accel*``, ``/dev/vfio``),
    or a TPU identity variable is set (GKE's). Nothing here makes a request."""
    import glob

    env = os.environ if env is None else env
    forced = (env.get(GCE_ENV) or "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if any((env.get(v) or "").strip() for v in TPU_IDENTITY_VARS):
        return True
    try:
        with open(PRODUCT_NAME) as f:
            if "google" in f.read().lower():
                return True
    except OSError:
        pass
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def metadata(path: str, timeout_s: float = 2.0, tries: int = 3) -> Optional[str]:
    """The metadata server's answer for ``path`` (e.g. ``instance/zone``), or None: unknown key (404),
    empty, or no metadata server here (its name does not resolve or nothing listens: remembered). A server
    that is slow to answer (a loaded VM) is asked again, ``tries`` times in all, with a longer timeout each
    time: a host must not take itself for "not a TPU VM" because one answer came late. Where this machine cannot
    be a GCE VM (:func:`may_be_gce`), None without a request."""
    if _state["unreachable"] or not may_be_gce():
        return None
    import requests

    for k in range(tries):
        try:
            r = requests.get(METADATA_URL + path, headers=HEADERS, timeout=timeout_s * (2 ** k))
        except requests.Timeout:
            continue
        except requests.RequestException:
            _state["unreachable"] = True
            return None
        text = r.text.strip()
        return text if r.status_code == 200 and text else None
    return None


def zone(get: Callable[[str], Optional[str]] = metadata) -> Optional[str]:
    """This VM's zone (``us-east5-a``), from ``projects/<n>/zones/<zone>``."""
    z = get("instance/zone")
    return z.rsplit("/", 1)[-1] if z else None


def project(get: Callable[[str], Optional[str]] = metadata) -> Optional[str]:
    return get("project/project-id")


def region_of(zone_or_region: str) -> str:
    """``us-east5-a`` -> ``us-east5``; a region stays as it is."""
    parts = zone_or_region.strip().lower().split("-")
    return "-".join(parts[:2]) if len(parts) >= 3 else "-".join(parts)


@dataclasses.dataclass(frozen=True)
class TpuIdentity:
    """Who this host is in its TPU slice. Empty / None where it is not a TPU host."""

    slice_name: str = ""
    worker_id: Optional[int] = None
    hostnames: tuple[str, ...] = ()
    accelerator_type: str = ""
    source: str = ""  # "env", "metadata" or "" (not a TPU host): where the worker id came from

    @property
    def num_hosts(self) -> int:
        return len(self.hostnames)


def _hosts_of_endpoints(endpoints: str) -> tuple[str, ...]:
    """``worker-network-endpoints`` (``<id>:<uid>:<ip>,...``, one per host in worker order) -> the IPs,
    as JAX's ``cloud_tpu_cluster`` reads them."""
    out = []
    for ep in endpoints.split(","):
        parts = ep.strip().split(":")
        if parts and parts[-1]:
            out.append(parts[2] if len(parts) >= 3 else parts[-1])
    return tuple(out)


def tpu_identity(env: Optional[Mapping[str, str]] = None,
                 get: Callable[[str], Optional[str]] = metadata) -> TpuIdentity:
    """This host's identity in its slice: each ``TPU_*`` variable overrides what the metadata server says
    (Ray's order). The metadata server is only asked for what the variables leave out."""
    env = os.environ if env is None else env

    def pick(var: str, key: str) -> tuple[str, str]:
        v = (env.get(var) or "").strip()
        if v:
            return v, "env"
        m = get(f"instance/attributes/{key}") or ""
        return m.strip(), ("metadata" if m.strip() else "")

    worker, source = pick("TPU_WORKER_ID", "agent-worker-number")
    name, _ = pick("TPU_NAME", "instance-id")
    accel, _ = pick("TPU_ACCELERATOR_TYPE", "accelerator-type")
    hosts_env = tuple(h.strip() for h in (env.get("TPU_WORKER_HOSTNAMES") or "").split(",") if h.strip())
    if hosts_env:
        hosts = hosts_env
    elif worker or name or accel:  # a TPU host: its slice's hosts, as JAX finds them
        hosts = _hosts_of_endpoints(get("instance/attributes/worker-network-endpoints") or "")
    else:
        hosts = ()
    try:
        worker_id = int(worker) if worker else None
    except ValueError:
        from .errors import JobEnvironmentError

        # e.g. libtpu, loaded where it finds no TPU, writes its warning into TPU_WORKER_ID for every child
        what = "TPU_WORKER_ID" if source == "env" else "the metadata server's agent-worker-number"
        raise JobEnvironmentError(f"{what} is {worker[:120]!r}, not a worker number") from None
    return TpuIdentity(slice_name=name, worker_id=worker_id, hostnames=hosts, accelerator_type=accel, source=source)
