"""Compile targets by name, and the published figures of each chip (one table).

A TPU slice is named as Cloud TPU names it: ``v5p-128`` (v4 and v5p count TensorCores, two per
chip), ``v5e-256`` / ``v5litepod-256`` and ``v6e-256`` (chips), or by its chip grid
``v5e:2x2``; ``num_slices`` > 1 makes a multislice target (slices joined by the data-center
network). GPU nodes are named by GPU and count: ``h100-8`` (one 8-GPU node), ``h200-16`` (two),
or ``h100:2x8`` (nodes x GPUs per node). Colab's runtimes are targets too: ``v5e-1``, ``v6e-1``,
``v2-8`` (TPUs), ``t4-1``, ``l4-1``, ``a100-40g-1`` (GPUs; ``-40g``: the 40 GB A100 Colab has).
`bertjax.aot.devices` turns a target into the abstract devices the real compiler compiles for on
any host. `compute_dtype` is the activations' dtype a run on given devices should use (float32
on a GPU without bfloat16 arithmetic, such as Colab's T4).
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

    name: str  # as in target names: v2, v4, v5e, v5p, v6e, h100, h200, a100, a100-40g, l4, t4
    platform: str  # "tpu" or "gpu"
    hbm_bytes: int  # HBM per chip (a GPU's memory)
    peak_bf16_flops: float  # dense bf16 FLOP/s per chip (the T4, without bf16: its fp32 peak)
    hbm_bytes_per_second: float
    ici_bytes_per_second: float  # bidirectional chip-to-chip bandwidth (ICI; NVLink on GPUs)
    dcn_bytes_per_second: float  # between slices / nodes, per chip (0: not published)
    grid_dims: int  # TPUs: 2 for a 2-D torus of chips (v5e, v6e), 3 for 3-D (v4, v5p)
    cores_in_name: bool  # slice names count TensorCores (2 per chip), not chips
    source: str
    bfloat16: bool = True  # computes in bfloat16 (not on a T4: compute capability 7.5)
    devices_per_chip: int = 1  # JAX devices a chip is: v2's two TensorCores, each its own HBM

    @property
    def hbm_per_device(self) -> int:
        return self.hbm_bytes // self.devices_per_chip


# TPU sources: Cloud TPU system architecture pages, docs.cloud.google.com/tpu/docs/<version>
# (read 2026-12). v4's page gives no per-chip ICI figure: 6 ICI links of 50 GB/s (Jouppi et al.,
# "TPU v4", ISCA 2023) are taken as 300 GB/s. DCN per chip: v5p's page gives 50 Gbps; v5e's
# 2 x 100 Gbps NICs per 8-chip host; v4's and v6e's pages give no per-chip figure, so a
# multislice target of those is refused rather than given a roofline without its DCN term.
# GPU sources: NVIDIA's H100, H200 and A100 datasheets (SXM, dense bf16 Tensor Core FLOP/s,
# NVLink bidirectional); DCN: the DGX H100/H200 (8 x 400 Gb/s ConnectX-7) and DGX A100
# (8 x 200 Gb/s HDR) networking, one port per GPU.
# Colab's: TPU v2 from Jouppi et al., "A Domain-Specific Supercomputer for Training Deep Neural
# Networks" (CACM 2020: 46 TFLOP/s bf16, 16 GiB and 700 GB/s of HBM, 4 ICI links of 496 Gbit/s
# per chip); the T4, L4 and A100 40GB datasheets (the T4 has no bf16: its fp32 peak; L4 dense
# bf16 is half the sparse figure); PCIe Gen3/Gen4 x16 between the T4s/L4s of a host.
CHIPS = {
    chip.name: chip
    for chip in (
        Chip(
            "v2", "tpu", 16 * GIB, 46e12, 700e9, 4 * 62e9 * 2, 0, 2, True, "CACM 2020",
            devices_per_chip=2,
        ),
        Chip("v4", "tpu", 32 * GIB, 275e12, 1200e9, 300e9, 0, 3, True, "tpu/docs/v4; ISCA 2023"),
        Chip("v5e", "tpu", 16 * GIB, 197e12, 819e9, 400e9, 25e9 / 8, 2, False, "tpu/docs/v5e"),
        Chip("v5p", "tpu", 95 * GIB, 459e12, 2765e9, 1200e9, 50e9 / 8, 3, True, "tpu/docs/v5p"),
        Chip("v6e", "tpu", 32 * GIB, 918e12, 1640e9, 800e9, 0, 2, False, "tpu/docs/v6e"),
        Chip("h100", "gpu", 80 * 10**9, 989.4e12, 3350e9, 900e9, 50e9, 0, False, "H100 SXM"),
        Chip("h200", "gpu", 141 * 10**9, 989.4e12, 4800e9, 900e9, 50e9, 0, False, "H200 SXM"),
        Chip("a100", "gpu", 80 * 10**9, 312e12, 2039e9, 600e9, 25e9, 0, False, "A100 SXM 80GB"),
        Chip("a100-40g", "gpu", 40 * 10**9, 312e12, 1555e9, 600e9, 0, 0, False, "A100 SXM 40GB"),
        Chip("l4", "gpu", 24 * 10**9, 121e12, 300e9, 64e9, 0, 0, False, "L4 datasheet"),
        Chip("t4", "gpu", 16 * 10**9, 8.1e12, 320e9, 32e9, 0, 0, False, "T4 datasheet", False),
    )
}  # fmt: skip
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
        return self.chips * self.chip.devices_per_chip * self.num_slices

    @property
    def topology_name(self) -> str:
        grid = "x".join(map(str, self.grid))
        return f"{self.chip.name}:{grid}" + (f" x {self.num_slices}" if self.num_slices > 1 else "")


def _grid(chips: int, dims: int) -> tuple:
    """The usual grid of ``chips`` chips: the Cloud TPU shapes (2x2x1, 2x2x2, 2x2x4, 2x4x4,
    4x4x4, ...; 2x2, 2x4, 4x4, ...), each doubling the last of the smallest sides; one chip
    (1x1: Colab's v5e-1 and v6e-1)."""
    if chips == 1:
        return (1,) * dims
    grid = [2, 2] + [1] * (dims - 2)
    while math.prod(grid) < chips:
        smallest = min(grid)
        last = max(i for i, side in enumerate(grid) if side == smallest)
        grid[last] *= 2
    if chips < 4 or math.prod(grid) != chips:
        raise ValueError(f"{chips} chips is not a slice size (1, 4, 8, 16, ... chips)")
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
    """``v5p-128``, ``v5e-256``, ``v6e-8``, ``v5e-1``, ``v5e:2x2``, ``h100-8``, ``h100:2x8``,
    ``t4-1``, ``a100-40g-1`` -> `Slice`
    (``num_slices`` TPU slices); a clear error naming the flag otherwise."""
    chip_name = r"[a-z0-9]+?(?:-\d+g)?"  # a memory size after the GPU: a100-40g
    match = re.fullmatch(rf"({chip_name})(?:-(\d+)|:(\d+(?:x\d+)+))", name.strip().lower())
    chip = None
    if match:
        chip = CHIPS.get(_ALIASES.get(match.group(1), match.group(1)))
    if chip is None:
        raise ValueError(
            f"--topology={name!r}: not a known target; use a TPU slice (v5p-128, v5e-256, v6e-8, "
            f"v4-32, or a chip grid such as v5e:2x2) or GPU nodes (h100-8, h200-16, a100:2x8), "
            f"or a Colab runtime (v5e-1, v6e-1, v2-8, t4-1, l4-1, a100-40g-1); "
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


def computes_in_bfloat16(device) -> bool:
    """Whether ``device`` (a JAX device, real or a compile target's abstract one) has bfloat16
    arithmetic: every TPU; an NVIDIA GPU of compute capability 8.0 or more (A100, L4, H100), not
    a T4 (7.5) or V100 (7.0), where XLA computes bfloat16 in float32 with extra conversions; a CPU
    counts as without (bfloat16 products there: `BertConfig.matmul_dtype`)."""
    if device.platform == "tpu":
        return True
    capability = getattr(device, "compute_capability", None)  # CUDA devices carry it
    return device.platform in ("gpu", "cuda") and float(capability or 0) >= 8.0


def compute_dtype(devices) -> str:
    """The activations' dtype (``config.model.dtype``) for a run on ``devices``: "bfloat16"
    where every device computes in it, else "float32" (float16 would need loss scaling, which
    bertjax does not do)."""
    return "bfloat16" if all(computes_in_bfloat16(d) for d in devices) else "float32"


def dtype_advice(dtype: str, devices) -> str:
    """One line for a run set to ``dtype`` on GPUs without bfloat16 arithmetic ("" otherwise):
    what the run gets and what to set."""
    slow = [d for d in devices if d.platform != "cpu" and not computes_in_bfloat16(d)]
    if dtype != "bfloat16" or not slow:
        return ""
    return (
        f"dtype: {slow[0].device_kind} has no bfloat16 arithmetic (XLA emulates it in float32, "
        "more slowly than float32 itself): set --config.model.dtype=float32"
    )
