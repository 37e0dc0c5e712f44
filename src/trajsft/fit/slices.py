"""TPU slice facts for the fit check: a profile's ``tpu_type`` as libtpu's topology, chips, HBM and peak FLOP/s.

Pure data (no jax). ``tpu_type`` is the Cloud TPU name the profiles use (``v5p-32``: 32 TensorCores =
16 chips of 2 cores; ``v5litepod-16`` / ``v6e-16``: 16 single-core chips). HBM per chip and peak dense
bf16 FLOP/s per chip are Google's published figures (cloud.google.com/tpu/docs/v5p, v5e, v6e, v4);
the HBM limit of a v5p chip is what XLA's TPU compiler reports for it (95.74 GiB of its 95 GB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Family:
    name: str  # libtpu's topology prefix
    cores_per_chip: int  # what the tpu_type number counts per chip
    chips_per_host: int
    hbm_bytes: int  # per chip, as the compiler counts it
    peak_bf16_flops: float  # per chip
    dims: int  # torus dimensions of the topology name
    devices_per_chip: int = 1  # JAX devices libtpu describes per chip (v4: one per TensorCore)


FAMILIES = {
    "v4": Family("v4", 2, 4, 32 * GIB, 275e12, 3, devices_per_chip=2),
    "v5p": Family("v5p", 2, 4, int(95.74 * GIB), 459e12, 3),
    "v5e": Family("v5e", 1, 4, 16 * GIB, 197e12, 2),
    "v6e": Family("v6e", 1, 4, 32 * GIB, 918e12, 2),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}
# the slice sizes (tpu_type numbers) a family is sold in, smallest first (what "a bigger slice" may be)
STANDARD = {
    "v4": (8, 16, 32, 64, 128, 256, 512),
    "v5p": (8, 16, 32, 64, 128, 256, 512),
    "v5e": (4, 8, 16, 32, 64, 128, 256),
    "v6e": (4, 8, 16, 32, 64, 128, 256),
}


@dataclass(frozen=True)
class Slice:
    tpu_type: str
    family: Family
    chips: int
    hosts: int
    topology: str  # libtpu's name, e.g. v5p:2x2x4

    @property
    def hbm_bytes(self) -> int:
        return self.family.hbm_bytes

    @property
    def devices(self) -> int:
        return self.chips * self.family.devices_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.family.hbm_bytes // self.family.devices_per_chip

    @property
    def peak_flops(self) -> float:
        """Peak dense bf16 FLOP/s of the whole slice."""
        return self.chips * self.family.peak_bf16_flops


# chip grids of the standard slices (Google's topology names)
GRIDS = {
    3: {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"},
    2: {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
}


def parse(tpu_type: str) -> Slice:
    """``v5p-32`` -> 16 chips, 4 hosts, ``v5p:2x2x4``. One-line ValueError for what is not a TPU slice."""
    prefix, _, num = tpu_type.strip().lower().rpartition("-")
    prefix = ALIASES.get(prefix, prefix)
    fam = FAMILIES.get(prefix)
    if fam is None or not num.isdigit():
        raise ValueError(f"tpu_type {tpu_type!r}: not a TPU slice the fit check knows "
                         f"(one of {', '.join(f'{f}-N' for f in FAMILIES)}, e.g. v5p-32)")
    chips = int(num) // fam.cores_per_chip
    grid = GRIDS[fam.dims].get(chips) if int(num) % fam.cores_per_chip == 0 else None
    if grid is None:
        raise ValueError(f"tpu_type {tpu_type!r}: {num} is not a {fam.name} slice size "
                         f"({', '.join(map(str, STANDARD[fam.name]))})")
    return Slice(tpu_type=tpu_type, family=fam, chips=chips, hosts=max(1, math.ceil(chips / fam.chips_per_host)),
                 topology=f"{fam.name}:{grid}")


def bigger(tpu_type: str) -> list[str]:
    """The standard slices of the same family larger than ``tpu_type``, smallest first."""
    s = parse(tpu_type)
    prefix = tpu_type.strip().lower().rpartition("-")[0]
    n = s.chips * s.family.cores_per_chip
    return [f"{prefix}-{k}" for k in STANDARD[s.family.name] if k > n]
