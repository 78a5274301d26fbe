"""Attention with probability dropout by cuDNN's flash attention on NVIDIA GPUs: the scores, their
softmax and the dropout mask never reach HBM (the exact path writes all three in every layer).

`jax.nn.dot_product_attention` takes no dropout; the function below it does. This module calls
**a private JAX module**, `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`
(`PRIVATE`, with the keyword arguments in `ARGUMENTS`): tests/attention_kernels_test.py imports
it and checks those names, so a JAX upgrade that moves or changes it fails there, loudly.

Where the bits come from (XLA's cuDNN thunk, jax-cuda12-plugin 0.10): a Philox stream whose seed
is a constant of the compiled call and whose offset XLA keeps per call and per GPU, from 0 when
the executable loads, advanced at every execution. No mask can be handed in (the private call
takes a seed and a rate), so the step's rng key does not reach the bits; what this module makes
of the seed:

- **a seed per layer** (`layer_seed`: a CRC of the Flax module path), so layers draw different
  masks, and a recompile draws the same;
- **a seed per device** (`device_seed`): on a mesh of several devices the call is a
  `lax.switch` over the device's index (`jax.lax.axis_index` over every mesh axis, under the
  step's `shard_map` or one of its own) with one branch a device, each its own seed: without it
  every data-parallel replica dropped the same elements of its local row j (8 GPUs: an eighth as
  many independent masks as the model assumes), and tensor-parallel shards the same elements of
  their local heads. A device runs one branch, so its forward and backward calls advance together;
  `MAX_DEVICES` bounds the branches (beyond it the exact path serves);
- **microbatches**: each execution of a call advances its offset, so the k microbatches of a step
  draw k different masks, and a layer's forward and backward calls execute once per microbatch in
  the same order (a backward regenerates its forward's mask: the check below runs it).

Where a forward and its backward would not execute in lockstep, cuDNN is refused (`refusal`):
scanned stacks (the backward loop runs the layers in reverse), shared (ALBERT) layers (every
repeat would draw one seed's bits) and GradCache (`refused`: two passes over each chunk, whose
masks would agree only because two calls' counters happen to, `bertjax.objectives.gradcache`);
the exact path serves them, with the step's key. A run on GPUs first checks, on one small call,
that cuDNN's backward uses its forward's mask (`bertjax.ops.dropout_check`): where it does not,
`disable` turns the kernel off for dropout for the whole run, with one line.

What is checked without a GPU (tests/attention_kernels_test.py, tests/gpu_dropout_test.py): the
call's arguments (rate, scale, padding, causal, window), a seed per layer and per device in the
traced step, the refusals, masks that differ per device (a stand-in call drawing its mask from
the seed, on 8 CPU devices), and that the step compiles for `h100-8` with the fused calls in it
(docs/results/compile.md). Not checked here: the bits and numbers cuDNN computes;
`benchmarks/step/gpu_suite.sh` runs `bertjax.ops.dropout_check` on a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

PRIVATE = "jax._src.cudnn.fused_attention_stablehlo"
ARGUMENTS = ("q_seqlen", "kv_seqlen", "mask", "scale", "mask_type", "seed", "dropout_rate")
ARGUMENTS += ("sliding_window_length",)
MAX_DEVICES = 64  # one switch branch (a compiled cuDNN graph per layer and pass) per device

_disabled: list[str] = []  # why cuDNN's dropout is off for the run (the start-up check failed)
_refusals: list[str] = []  # why it is off while tracing (GradCache), innermost last


def fused():
    """The private module (import errors surface here and in the test)."""
    return importlib.import_module(PRIVATE)


def _layer():
    """The Flax module whose method is being traced (the attention layer), or None."""
    from flax.linen import module as flax_module

    stack = flax_module._context.module_stack  # noqa: SLF001  (no public accessor)
    return stack[-1] if stack else None


def layer_seed() -> int:
    """A static seed for the layer being traced: a CRC of its Flax module path (0 outside a
    module), so each layer's call draws its own stream and a recompile draws the same."""
    layer = _layer()
    path = "/".join(layer.path) if layer is not None and layer.scope is not None else ""
    return zlib.crc32(path.encode()) & 0x7FFFFFFF


def device_seed(base: int, device: int) -> int:
    """The seed of device ``device``'s call (its index over every mesh axis) in the layer whose
    seed is ``base``: distinct per device and per layer."""
    return zlib.crc32(f"{base}:{device}".encode()) & 0x7FFFFFFF


@contextlib.contextmanager
def refused(reason: str):
    """cuDNN draws no dropout bits for attention traced inside the block (the exact path, with
    the step's key, serves it); ``reason`` is what a forced cuDNN kernel's error says."""
    _refusals.append(reason)
    try:
        yield
    finally:
        _refusals.remove(reason)


def disable(reason: str) -> None:
    """cuDNN's dropout is off for the rest of the process (the start-up check failed)."""
    _disabled[:] = [reason]


def enable() -> None:
    """Undoes `disable` (a new check that passed)."""
    _disabled.clear()


def refusal() -> str | None:
    """Why the attention being traced cannot draw its dropout bits in cuDNN (None: it can)."""
    if _disabled:
        return _disabled[0]
    if _refusals:
        return _refusals[-1]
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > MAX_DEVICES:
        return f"{mesh.size} devices (a cuDNN call a device: at most {MAX_DEVICES})"
    if not mesh.empty and mesh.manual_axes and not mesh.are_all_axes_manual:
        return "a mesh manual over some axes only (no device index to seed each device's call)"
    cfg = getattr(_layer(), "cfg", None)
    if cfg is None:
        return None
    if cfg.scan_layers:
        return "scan_layers=True (the backward loop runs the layers in reverse: other bits)"
    if cfg.num_groups != cfg.num_hidden_layers:
        return "shared layers (num_hidden_groups: every repeat would draw the same bits)"
    return None


def per_device(call: Callable, base: int, arrays: tuple, specs: tuple, out_spec) -> jax.Array:
    """``call(seed, *arrays)`` with a seed of each device's own (`device_seed`): a plain call
    with device 0's seed on one device (or none), else a `lax.switch` over the device's index
    (every mesh axis), one branch a device; run under a `shard_map` of its own (``specs``,
    ``out_spec``: how the arrays and the result split over the mesh) unless the mesh is
    already manual (the step's per-replica loop)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return call(device_seed(base, 0), *arrays)
    names = tuple(mesh.axis_names)
    branches = [functools.partial(call, device_seed(base, d)) for d in range(mesh.size)]

    def local(*local_arrays):
        return jax.lax.switch(jax.lax.axis_index(names), branches, *local_arrays)

    if mesh.are_all_axes_manual:
        return local(*arrays)
    return jax.shard_map(local, in_specs=specs, out_specs=out_spec, check_vma=False)(*arrays)


def _specs(partition: PartitionSpec | None, q_BTNH, extra: tuple) -> tuple:
    """(in_specs, out_spec) of the activations [B, T, N, H] split as ``partition`` (batch and
    heads over the axes that divide them) and of the [B, ...] arrays in ``extra``."""
    if partition is None:
        return (PartitionSpec(),) * (3 + len(extra)), PartitionSpec()
    from bertjax.ops.splash import mesh_axes

    batch_axes, head_axes = mesh_axes(partition, q_BTNH.shape[0], q_BTNH.shape[2])
    rows_and_heads = PartitionSpec(batch_axes, None, head_axes)
    rows = tuple(PartitionSpec(batch_axes) for _ in extra)
    return (rows_and_heads,) * 3 + rows, rows_and_heads


def attention(
    q_BTNH,
    k_BSNH,
    v_BSNH,
    rate,
    lengths_B=None,
    causal=False,
    window=0,
    mask=None,
    partition: PartitionSpec | None = None,
    call: Callable | None = None,
):
    """Softmax attention with probabilities dropped at ``rate`` (kept ones scaled by 1 /
    (1 - rate)), by cuDNN: rows padded at the end by their ``lengths_B`` (``causal``; ``window``:
    keys up to this many positions to the left, 0: all), or a boolean ``mask`` [B, 1, T, S] that
    says everything (packed or gathered rows). ``partition``: the activations' sharding on the
    mesh being compiled for (None outside one); ``call(seed, q, k, v, lengths or mask)``: what
    computes one device's attention (default: cuDNN's; a test hands in a CPU stand-in)."""
    if call is None:
        call = functools.partial(_cudnn_call, rate=float(rate), causal=causal, window=window,
                                 dense=mask is not None)  # fmt: skip
    extra = (
        (jnp.broadcast_to(mask, (q_BTNH.shape[0], 1, *mask.shape[-2:])),)
        if mask is not None
        else (lengths_B,)
    )
    specs, out_spec = _specs(partition, q_BTNH, extra)
    return per_device(call, layer_seed(), (q_BTNH, k_BSNH, v_BSNH, *extra), specs, out_spec)


def _cudnn_call(seed, q_BTNH, k_BSNH, v_BSNH, rows, *, rate, causal, window, dense):
    """One device's cuDNN call: ``rows`` are the [B] lengths, or (``dense``) a [B, 1, T, S]
    mask."""
    module = fused()
    kinds = module.MaskType
    kwargs = {}
    if dense:
        shape = (q_BTNH.shape[0], 1, q_BTNH.shape[1], k_BSNH.shape[1])
        kwargs.update(mask=jnp.broadcast_to(rows, shape), mask_type=kinds.NO_MASK)
    else:
        kind = kinds.PADDING_CAUSAL if causal else kinds.PADDING
        kwargs.update(q_seqlen=rows, kv_seqlen=rows, mask_type=kind)
        kwargs["sliding_window_length"] = window + 1 if window else None
    return module.dot_product_attention(
        q_BTNH,
        k_BSNH,
        v_BSNH,
        scale=1.0 / math.sqrt(q_BTNH.shape[-1]),
        seed=seed,
        dropout_rate=rate,
        **kwargs,
    )


def lengths(key_segments) -> jax.Array:
    """[B] real tokens of right-padded rows (an `AttentionMask`'s key segments)."""
    return jnp.sum(key_segments > 0, axis=-1).astype(jnp.int32)
