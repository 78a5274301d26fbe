"""Compile targets by name, and the published figures of each chip (one table).

A TPU slice is named as Cloud TPU names it: ``v5p-128`` (v4 and v5p count TensorCores, two per
chip), ``v5e-256`` / ``v5litepod-256`` and ``v6e-256`` (chips), or by its chip grid
``v5e:2x2``; ``num_slices`` > 1 makes a multislice target (slices joined by the data-center
network). GPU nodes are named by GPU and count: ``h100-8`` (one 8-GPU node), ``h200-16`` (two),
or ``h100:2x8`` (nodes x GPUs per node). `bertjax.aot.devices` turns a target into the abstract
devices the real compiler compiles for on any host.
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 1 << 30
GPUS_PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator's published figures."""

    name: str  # as in target names: v4, v5e, v5p, v6e, h100, h200, a100
    platform: str  # "tpu" or "gpu"
    hbm_bytes: int  # HBM per chip
    peak_bf16_flops: float  # dense bf16 FLOP/s per chip
    hbm_bytes_per_second: float
    ici_bytes_per_second: float  # bidirectional chip-to-chip bandwidth (ICI; NVLink on GPUs)
    dcn_bytes_per_second: float  # between slices / nodes, per chip (0: not published)
    grid_dims: int  # TPUs: 2 for a 2-D torus of chips (v5e, v6e), 3 for 3-D (v4, v5p)
    cores_in_name: bool  # slice names count TensorCores (2 per chip), not chips
    source: str


# TPU sources: Cloud TPU system architecture pages, docs.cloud.google.com/tpu/docs/<version>
# (read 2026-12). v4's page gives no per-chip ICI figure: 6 ICI links of 50 GB/s (Jouppi et al.,
# "TPU v4", ISCA 2023) are taken as 300 GB/s. DCN per chip: v5p's page gives 50 Gbps; v5e's
# 2 x 100 Gbps NICs per 8-chip host; v4's and v6e's pages give no per-chip figure, so a
# multislice target of those is refused rather than given a roofline without its DCN term.
# GPU sources: NVIDIA's H100, H200 and A100 datasheets (SXM, dense bf16 Tensor Core FLOP/s,
# NVLink bidirectional); DCN: the DGX H100/H200 (8 x 400 Gb/s ConnectX-7) and DGX A100
# (8 x 200 Gb/s HDR) networking, one port per GPU.
CHIPS = {
    chip.name: chip
    for chip in (
        Chip("v4", "tpu", 32 * GIB, 275e12, 1200e9, 300e9, 0, 3, True, "tpu/docs/v4; ISCA 2023"),
        Chip("v5e", "tpu", 16 * GIB, 197e12, 819e9, 400e9, 25e9 / 8, 2, False, "tpu/docs/v5e"),
        Chip("v5p", "tpu", 95 * GIB, 459e12, 2765e9, 1200e9, 50e9 / 8, 3, True, "tpu/docs/v5p"),
        Chip("v6e", "tpu", 32 * GIB, 918e12, 1640e9, 800e9, 0, 2, False, "tpu/docs/v6e"),
        Chip("h100", "gpu", 80 * 10**9, 989.4e12, 3350e9, 900e9, 50e9, 0, False, "H100 SXM"),
        Chip("h200", "gpu", 141 * 10**9, 989.4e12, 4800e9, 900e9, 50e9, 0, False, "H200 SXM"),
        Chip("a100", "gpu", 80 * 10**9, 312e12, 2039e9, 600e9, 25e9, 0, False, "A100 SXM 80GB"),
    )
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "trillium": "v6e"}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A compile target: ``num_slices`` TPU slices of ``chip`` with chip grid ``grid`` (e.g.
    (4, 4, 4)), or GPU nodes with ``grid`` = (nodes, GPUs per node)."""

    chip: Chip
    grid: tuple
    num_slices: int = 1

    @property
    def chips(self) -> int:
        """Chips per slice (GPUs in all nodes)."""
        return math.prod(self.grid)

    @property
    def devices(self) -> int:
        return self.chips * self.num_slices

    @property
    def topology_name(self) -> str:
        grid = "x".join(map(str, self.grid))
        return f"{self.chip.name}:{grid}" + (f" x {self.num_slices}" if self.num_slices > 1 else "")


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


def _gpu_grid(chip: Chip, count: int, name: str) -> tuple:
    if count <= GPUS_PER_NODE and GPUS_PER_NODE % count == 0:
        return (1, count)
    if count % GPUS_PER_NODE:
        raise ValueError(
            f"--topology={name!r}: {count} GPUs is not whole {GPUS_PER_NODE}-GPU nodes; use "
            f"{chip.name}-8, {chip.name}-16, ... or {chip.name}:NODESx{GPUS_PER_NODE}"
        )
    return (count // GPUS_PER_NODE, GPUS_PER_NODE)


def parse_slice(name: str, num_slices: int = 1) -> Slice:
    """``v5p-128``, ``v5e-256``, ``v6e-8``, ``v5e:2x2``, ``h100-8``, ``h100:2x8`` -> `Slice`
    (``num_slices`` TPU slices); a clear error naming the flag otherwise."""
    match = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+)|:(\d+(?:x\d+)+))", name.strip().lower())
    chip = None
    if match:
        chip = CHIPS.get(_ALIASES.get(match.group(1), match.group(1)))
    if chip is None:
        raise ValueError(
            f"--topology={name!r}: not a known target; use a TPU slice (v5p-128, v5e-256, v6e-8, "
            f"v4-32, or a chip grid such as v5e:2x2) or GPU nodes (h100-8, h200-16, a100:2x8); "
            f"chips: {sorted(CHIPS)}"
        )
    if num_slices < 1:
        raise ValueError(f"--num_slices={num_slices}: must be 1 or more")
    if chip.platform == "gpu":
        if num_slices != 1:
            raise ValueError(
                f"--num_slices={num_slices}: slices are TPU slices; name GPU nodes in "
                f"--topology ({chip.name}:{num_slices}x{GPUS_PER_NODE})"
            )
        if match.group(3):
            grid = tuple(int(side) for side in match.group(3).split("x"))
            if len(grid) != 2:
                raise ValueError(f"--topology={name!r}: GPU nodes are NODESxGPUS, e.g. h100:2x8")
            return Slice(chip, grid)
        return Slice(chip, _gpu_grid(chip, int(match.group(2)), name))
    if num_slices > 1 and not chip.dcn_bytes_per_second:
        raise ValueError(
            f"--num_slices={num_slices}: {chip.name} has no published data-center network rate "
            "per chip (bertjax/aot/chips.py), so the traffic between slices cannot be bounded; "
            "compile one slice, or a chip with one (v5e, v5p)"
        )
    if match.group(3):
        return Slice(chip, tuple(int(side) for side in match.group(3).split("x")), num_slices)
    count = int(match.group(2))
    chips = count // 2 if chip.cores_in_name else count
    try:
        return Slice(chip, _grid(chips, chip.grid_dims), num_slices)
    except ValueError as error:
        raise ValueError(f"--topology={name!r}: {error}") from None
