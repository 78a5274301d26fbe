"""Device mesh, logical-axis rules (DP / FSDP / tensor parallel) and global batches.

Mesh axes are ``dcn``, ``data``, ``fsdp``, ``tensor`` and ``expert``. One rule table serves
every strategy: a mesh axis of size 1 shards nothing, so the mesh shape alone picks the strategy.
Experts live on the ``expert`` axis; outside the expert buffers tokens are data-parallel
across it too, so the batch is split over (dcn, data, fsdp, expert). ``dcn`` is data parallel
across TPU slices joined by the data-center network (multislice, MaxText's hybrid mesh): the
other axes lie within each slice, so only the gradient reduction crosses slices.

=============  ==========  ================================================================
logical name   mesh axis   why
=============  ==========  ================================================================
act_expert     expert      MoE expert buffers [E, G, C, M]: one slice of experts per device
act_batch      dcn, data,  the batch is split over every data-parallel device (ZeRO-3 too);
               fsdp,       in expert buffers, where ``expert`` is taken, over (dcn, data, fsdp)
               expert
act_heads      tensor      Megatron: attention is column-split by heads ...
act_mlp        tensor      ... and the MLP by its hidden units
act_vocab      tensor      MLM logits follow the vocab-split embedding table
act_len/embed  --          sequence and model width stay whole on each device
act_kv         --
vocab          tensor      embedding table / MLM bias split by rows (Megatron vocab parallel)
heads          tensor      q/k/v column split, output-projection row split
mlp            tensor      intermediate column split, output row split
embed          fsdp        ZeRO-3: every weight with a model-width axis is split over fsdp
factor         fsdp        ALBERT embedding width (only when the array has no 'embed' axis)
kv, embed_out  --          second axes of already-split weights
position       --          small tables stay replicated
types, classes --
layers         --          the stacked-layer axis of scanned encoders
expert         expert      MoE expert weights [E, ...] (expert parallelism)
=============  ==========  ================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")  # within a slice
DCN_AXIS = "dcn"  # across slices; the mesh's first axis (size 1 on one slice)
BATCH_AXES = (DCN_AXIS, "data", "fsdp", "expert")

# (logical name, mesh axes); earlier rules win and a mesh axis is used once per array.
LOGICAL_AXIS_RULES = (
    ("act_expert", "expert"),
    ("act_batch", BATCH_AXES),
    ("act_batch", (DCN_AXIS, "data", "fsdp")),  # arrays whose expert axis holds ``expert``
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("factor", "fsdp"),
    ("kv", None),
    ("embed_out", None),
    ("position", None),
    ("types", None),
    ("classes", None),
    ("layers", None),
    ("expert", "expert"),
)


def default_mesh_config() -> ml_collections.ConfigDict:
    """The ``config.mesh`` defaults: pure data parallelism over all devices."""
    c = ml_collections.ConfigDict()
    c.data = -1  # data-parallel replicas (-1: whatever the other axes leave)
    c.fsdp = 1  # ZeRO-3 shards: parameters, grads and optimizer state split over this axis
    c.tensor = 1  # Megatron tensor-parallel width (must divide heads, mlp and vocab)
    c.expert = 1  # MoE expert parallelism (must divide num_experts); also splits the batch
    c.dcn = 0  # data-parallel slices (multislice); 0: as many as the devices span (1 for most)
    return c


def mesh_shape(config: ml_collections.ConfigDict, num_devices: int) -> tuple:
    """Sizes of (data, fsdp, tensor, expert) within one slice of ``num_devices`` devices; one
    -1 fills the rest; product = num_devices."""
    unknown = sorted(set(config.keys()) - set(MESH_AXES) - {DCN_AXIS})
    if unknown:
        known = [DCN_AXIS, *MESH_AXES]
        raise ValueError(f"unknown config.mesh key(s) {unknown}; known axes: {known}")
    sizes = [int(config.get(axis, 1)) for axis in MESH_AXES]
    for axis, size in zip(MESH_AXES, sizes):
        if size == 0 or size < -1:
            raise ValueError(f"config.mesh.{axis}={size}: must be a positive size or -1")
    fill = [axis for axis, size in zip(MESH_AXES, sizes) if size == -1]
    if len(fill) > 1:
        raise ValueError(f"config.mesh: only one axis may be -1, got {fill}")
    known = math.prod(s for s in sizes if s != -1)
    if fill:
        if num_devices % known:
            raise ValueError(
                f"config.mesh.{fill[0]}=-1: the other axes ({known} devices) do not "
                f"divide the {num_devices} devices"
            )
        sizes[MESH_AXES.index(fill[0])] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} "
            f"devices but {num_devices} are available"
        )
    return tuple(sizes)


def num_slices(config: ml_collections.ConfigDict, devices: Sequence[jax.Device]) -> int:
    """The ``dcn`` axis size: ``config.dcn``, or (0) the number of slices the devices span
    (`jax.Device.slice_index`; 1 where devices have none). Devices that span slices need one
    slice per ``dcn`` index, so a slice is never split by the in-slice axes."""
    spanned = len({getattr(d, "slice_index", 0) or 0 for d in devices})
    dcn = int(config.get(DCN_AXIS, 0) or spanned)
    if dcn < 1 or len(devices) % dcn:
        raise ValueError(f"config.mesh.dcn={dcn}: must divide the {len(devices)} devices")
    if spanned > 1 and dcn != spanned:
        raise ValueError(
            f"config.mesh.dcn={dcn}, but the devices span {spanned} slices: set "
            f"config.mesh.dcn={spanned} (or 0), data parallel across the slices"
        )
    return dcn


def make_mesh(
    config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A (dcn, data, fsdp, tensor, expert) mesh over ``devices`` (default: all), Auto axis
    types: one ``dcn`` index per slice (JAX's hybrid mesh, each slice laid out for its own
    interconnect); without slices (CPU devices), ``dcn`` > 1 splits the devices in order."""
    devices = list(jax.devices() if devices is None else devices)
    dcn = num_slices(config, devices)
    shape = mesh_shape(config, len(devices) // dcn)
    axes, types = (DCN_AXIS, *MESH_AXES), (jax.sharding.AxisType.Auto,) * (len(shape) + 1)
    if dcn == 1:
        return jax.make_mesh((1, *shape), axes, axis_types=types, devices=devices)
    if hasattr(devices[0], "slice_index"):
        grid = mesh_utils.create_hybrid_device_mesh(
            (1, *shape), (dcn,) + (1,) * len(shape), devices
        )
    else:
        grid = np.asarray(devices, dtype=object).reshape((dcn, *shape))
    return Mesh(grid, axes, axis_types=types)


def logical_axis_rules() -> tuple:
    """The logical-name -> mesh-axis rules (see the module docstring)."""
    return LOGICAL_AXIS_RULES


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over data, fsdp and expert; other axes whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def logical_to_shardings(boxed_tree: Any, mesh: Mesh, rules: tuple | None = None) -> Any:
    """NamedShardings for a tree of nn.Partitioned (e.g. ``jax.eval_shape(model.init, ...)``)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules or logical_axis_rules())


def process_batch_rows(mesh: Mesh, global_batch_size: int) -> slice:
    """Rows of the global batch that this process must provide (contiguous)."""
    shards = _num_batch_shards(mesh)
    if global_batch_size % shards:
        raise ValueError(
            f"config.batch_size={global_batch_size} is not divisible by the "
            f"{shards} batch shards (mesh dcn x data x fsdp x expert)"
        )
    index_map = batch_sharding(mesh).addressable_devices_indices_map((global_batch_size,))
    starts = sorted({idx[0].start or 0 for idx in index_map.values()})
    stops = sorted({idx[0].stop or global_batch_size for idx in index_map.values()})
    rows = slice(starts[0], stops[-1])
    if sum(b - a for a, b in zip(starts, stops)) != rows.stop - rows.start:
        raise ValueError(
            f"this process's batch shards {list(zip(starts, stops))} are not "
            "contiguous; order the mesh devices by process"
        )
    return rows


def _num_batch_shards(mesh: Mesh) -> int:
    return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def global_batch(batch: dict, mesh: Mesh, global_batch_size: int) -> dict:
    """This host's numpy rows -> global jax.Arrays with the batch split over BATCH_AXES."""
    rows = process_batch_rows(mesh, global_batch_size)
    local = rows.stop - rows.start
    sharding = batch_sharding(mesh)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        if value.ndim == 0 or value.shape[0] != local:
            raise ValueError(
                f"batch[{key!r}] has shape {value.shape}; this process provides "
                f"rows {rows.start}:{rows.stop} of the global batch, so expected "
                f"leading size {local}"
            )
        out[key] = jax.make_array_from_process_local_data(
            sharding, value, (global_batch_size,) + value.shape[1:]
        )
    return out
