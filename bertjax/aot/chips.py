"""TPU slices by name, as abstract devices the real TPU compiler (libtpu) compiles for on any
host, and the published figures of each chip generation.

A slice is named as Cloud TPU names it: ``v5p-128`` (v4 and v5p count TensorCores, two per
chip), ``v5e-256`` / ``v5litepod-256`` and ``v6e-256`` (chips), or by its chip grid
``v5e:2x2``. `topology_devices` asks libtpu for the slice's devices
(`jax.experimental.topologies.get_topology_desc`): no TPU is needed, only the ``libtpu``
package (the ``tpu`` and ``test`` extras).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip generation's published figures."""

    name: str  # as in slice names: v4, v5e, v5p, v6e
    hbm_bytes: int  # HBM per chip
    peak_bf16_flops: float  # dense bf16 FLOP/s per chip
    hbm_bytes_per_second: float
    ici_bytes_per_second: float  # bidirectional inter-chip interconnect per chip
    grid_dims: int  # 2: a 2-D torus of chips (v5e, v6e); 3: 3-D (v4, v5p)
    cores_in_name: bool  # slice names count TensorCores (2 per chip), not chips
    source: str


# Sources: Cloud TPU system architecture pages, docs.cloud.google.com/tpu/docs/<version>
# (read 2026-12). v4's page gives no per-chip ICI figure: 6 ICI links of 50 GB/s (Jouppi et al.,
# "TPU v4", ISCA 2023) are taken as 300 GB/s bidirectional.
CHIPS = {
    chip.name: chip
    for chip in (
        Chip("v4", 32 * GIB, 275e12, 1200e9, 300e9, 3, True, "tpu/docs/v4; ISCA 2023 (ICI)"),
        Chip("v5e", 16 * GIB, 197e12, 819e9, 400e9, 2, False, "tpu/docs/v5e"),
        Chip("v5p", 95 * GIB, 459e12, 2765e9, 1200e9, 3, True, "tpu/docs/v5p"),
        Chip("v6e", 32 * GIB, 918e12, 1640e9, 800e9, 2, False, "tpu/docs/v6e"),
    )
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "trillium": "v6e"}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice: its chip and its chip grid (e.g. (4, 4, 4))."""

    chip: Chip
    grid: tuple

    @property
    def chips(self) -> int:
        return math.prod(self.grid)

    @property
    def topology_name(self) -> str:
        return f"{self.chip.name}:{'x'.join(map(str, self.grid))}"


def _grid(chips: int, dims: int) -> tuple:
    """The usual grid of ``chips`` chips: the Cloud TPU shapes (2x2x1, 2x2x2, 2x2x4, 2x4x4,
    4x4x4, ...; 2x2, 2x4, 4x4, ...), each doubling the last of the smallest sides."""
    grid = [2, 2] + [1] * (dims - 2)
    while math.prod(grid) < chips:
        smallest = min(grid)
        last = max(i for i, side in enumerate(grid) if side == smallest)
        grid[last] *= 2
    if chips < 4 or math.prod(grid) != chips:
        raise ValueError(f"{chips} chips is not a slice size (4, 8, 16, ... chips)")
    return tuple(grid)


def parse_slice(name: str) -> Slice:
    """``v5p-128``, ``v5e-256``, ``v6e-8`` or ``v5e:2x2`` -> `Slice`; a clear error otherwise."""
    match = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+)|:(\d+(?:x\d+)+))", name.strip().lower())
    chip = None
    if match:
        chip = CHIPS.get(_ALIASES.get(match.group(1), match.group(1)))
    if chip is None:
        raise ValueError(
            f"--topology={name!r}: not a TPU slice; use e.g. v5p-128, v5e-256, v6e-8, v4-32 or "
            f"a chip grid such as v5e:2x2 (chips: {sorted(CHIPS)})"
        )
    if match.group(3):
        grid = tuple(int(side) for side in match.group(3).split("x"))
        return Slice(chip, grid)
    count = int(match.group(2))
    chips = count // 2 if chip.cores_in_name else count
    try:
        return Slice(chip, _grid(chips, chip.grid_dims))
    except ValueError as error:
        raise ValueError(f"--topology={name!r}: {error}") from None


def topology_devices(tpu_slice: Slice) -> list:
    """The slice's devices as libtpu describes them (abstract: they compile, never run)."""
    # libtpu takes a host-wide lock file when it starts; a compile for a slice runs nothing, so
    # it need not wait for another process holding it (any JAX process that loaded libtpu).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(
            topology_name=tpu_slice.topology_name, platform="tpu"
        )
    except Exception as error:  # libtpu missing, or a grid it does not know
        raise RuntimeError(
            f"libtpu could not describe {tpu_slice.topology_name}: {error}. Install the TPU "
            "compiler with pip install 'jax[tpu]' (the tpu extra)"
        ) from error
    return list(description.devices)
