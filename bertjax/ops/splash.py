"""Attention on a TPU through the Pallas splash-attention kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`): the `splash` kernel of
`bertjax.modeling.attention_kernels`, chosen on a TPU for aligned queries. Splash brings its own
forward and backward kernels (a custom VJP) and skips the key blocks a local layer never sees.

Who may attend whom is `bertjax.modeling.attention.AttentionMask`'s rule, with queries aligned
with keys (T == S): query t sees key s when ``key_segments[s] > 0``, ``query_segments[t] ==
key_segments[s]``, with a half-window h > 0, ``|t - s| <= h``, and when causal ``s <= t`` (within
a segment the index difference is the position difference). Splash gets it as a static per-head
mask (`FullMask`, `CausalMask`, or `LocalMask` with window (h, h), causal (h, 0)) and'ed with
segment ids: the queries' segments, and the keys' with padding (0) remapped to -1, which no query
has. Splash does not scale the logits: q is scaled by 1/sqrt(H) first.

Rows are padded up to a multiple of 128 (the kernel's lane width; the blocks are 512, 256 or 128
rows, whichever divides the padded length, no larger than it) with invisible keys, then cut back.
The head dimension is unconstrained here (on a TPU, 64 and multiples of 128 are the usual ones).

A Mosaic kernel is not partitioned by GSPMD ("Mosaic kernels cannot be automatically
partitioned"): with ``partition`` (the [B, T, N, H] activations' `PartitionSpec`; the caller
resolves its logical names) the call runs inside ``jax.shard_map`` over the mesh being compiled
for, each device on its own rows (the batch axes) and heads (the tensor axis), which is exact:
attention mixes neither rows nor heads. The sequence axis must not be sharded.

A query row with no visible key (a padding query of a packed row, segment 0) returns a finite
but meaningless value, the mean of the values over the key blocks the kernel visited (the dense
paths return the mean over all keys), and with a zero cotangent there it sends no gradient
anywhere. Padding queries of unpacked rows see the real keys (as BERT's) and match exactly.
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

Array = jax.Array

LANES = 128  # splash's blocks are multiples of the TPU lane width
BLOCKS = (512, 256, 128)  # the largest that divides the padded length is used


def block_size(length: int) -> int:
    """The splash block (q, kv, forward and backward) for rows padded to ``length``."""
    return next(block for block in BLOCKS if length % block == 0)


def kernel(
    heads: int, length: int, half_window: int, interpret: bool = False, causal: bool = False
) -> splash.splash_attention_kernel.SplashAttentionKernel:
    """The splash kernel of ``heads`` heads over ``length`` (a multiple of 128) aligned rows:
    ``kernel(q_NTH, k_NTH, v_NTH, segment_ids=SegmentIds(q=[T], kv=[T]))`` -> [N, T, H].
    ``causal``: no key after its query (a local causal layer sees the ``half_window`` keys
    before it and itself)."""
    shape = (length, length)
    if half_window:
        window = (half_window, 0 if causal else half_window)
        head_mask = splash.LocalMask(shape, window_size=window, offset=0)
    elif causal:
        head_mask = splash.CausalMask(shape)
    else:
        head_mask = splash.FullMask(shape)
    block = block_size(length)
    sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        use_fused_bwd_kernel=True,
    )
    return splash.make_splash_mha(
        splash.MultiHeadMask([head_mask] * heads),
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )


def _dividing(axes, size: int, what: str):
    """The mesh axes among ``axes`` (the names one dimension is split over) that split ``size``
    evenly, the most devices possible, in their order; the rest replicate that dimension inside
    shard_map, so each device computes attention for more of it than its share: allowed
    silently only for a dimension of 1 (the init's batch), logged otherwise."""
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    shape = jax.sharding.get_abstract_mesh().shape
    subsets = (
        tuple(n for i, n in enumerate(names) if mask >> i & 1) for mask in range(2 ** len(names))
    )
    fitting = [s for s in subsets if size % math.prod(shape[n] for n in s) == 0]
    best = max(fitting, key=lambda s: (math.prod(shape[n] for n in s), -len(s)))
    if best == names:
        return axes
    dropped = [n for n in names if n not in best and shape[n] > 1]
    if dropped and size > 1:
        logging.warning(
            "splash attention: the %s (%d) is not split over %s (sizes %s), which do not divide "
            "it: each device computes %d times its share",
            what, size, dropped, [shape[n] for n in dropped], math.prod(shape[n] for n in dropped),
        )  # fmt: skip
    return best or None


def mesh_axes(partition: PartitionSpec, batch: int, heads: int) -> tuple:
    """(batch axes, head axes) that a kernel's ``shard_map`` splits [B, T, N, H] activations
    sharded as ``partition`` over (those that divide ``batch`` and ``heads``; `_dividing`); the
    sequence axis must not be sharded."""
    batch_axes, length_axes, head_axes, _ = (*partition, None, None, None, None)[:4]
    if length_axes is not None:
        raise ValueError(f"a Pallas attention kernel cannot shard the sequence axis: {partition}")
    batch_axes = _dividing(batch_axes, batch, "batch")  # the init's batch is 1
    return batch_axes, _dividing(head_axes, heads, "heads")


def attention(
    q_BTNH: Array,
    k_BTNH: Array,
    v_BTNH: Array,
    query_segments: Array,
    key_segments: Array,
    half_window: int,
    interpret: bool = False,
    causal: bool = False,
    partition: PartitionSpec | None = None,
) -> Array:
    """Softmax attention [B, T, N, H] of aligned rows under the segments ([B, T] each, an
    `AttentionMask`'s), a local half-window (0: global) and ``causal`` by the splash kernel;
    ``interpret``: Pallas interpret mode (any backend, slow; the tests' CPU check);
    ``partition``: the inputs' and output's sharding over the current mesh's axes (batch and
    heads only), run under ``shard_map`` (None: a plain call, for one device or no mesh)."""
    if partition is not None:
        batch_axes, head_axes = mesh_axes(partition, q_BTNH.shape[0], q_BTNH.shape[2])
        rows, rows_and_heads = PartitionSpec(batch_axes), PartitionSpec(batch_axes, None, head_axes)
        local = functools.partial(
            attention, half_window=half_window, interpret=interpret, causal=causal
        )
        return jax.shard_map(
            local,
            in_specs=(rows_and_heads, rows_and_heads, rows_and_heads, rows, rows),
            out_specs=rows_and_heads,
            check_vma=False,  # pallas_call states no replication rule
        )(q_BTNH, k_BTNH, v_BTNH, query_segments, key_segments)
    batch, length, heads, head_dim = q_BTNH.shape
    if k_BTNH.shape[1] != length or v_BTNH.shape[1] != length:
        raise ValueError(f"splash attention needs aligned rows: T={length}, S={k_BTNH.shape[1]}")
    padded = -(-length // LANES) * LANES
    pad = padded - length

    def heads_major(x_BTNH: Array) -> Array:  # [B, T, N, H] -> [B, N, T', H]
        return jnp.pad(x_BTNH, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    scale = 1.0 / math.sqrt(head_dim)
    q_BNTH = heads_major(q_BTNH * jnp.asarray(scale, q_BTNH.dtype))
    k_BNTH, v_BNTH = heads_major(k_BTNH), heads_major(v_BTNH)
    keys_BT = key_segments.astype(jnp.int32)
    keys_BT = jnp.pad(jnp.where(keys_BT > 0, keys_BT, -1), ((0, 0), (0, pad)), constant_values=-1)
    queries_BT = jnp.pad(query_segments.astype(jnp.int32), ((0, 0), (0, pad)))
    run = kernel(heads, padded, half_window, interpret, causal)
    out_BNTH = jax.vmap(
        lambda q, k, v, sq, sk: run(q, k, v, segment_ids=splash.SegmentIds(sq, sk))
    )(q_BNTH, k_BNTH, v_BNTH, queries_BT, keys_BT)
    return out_BNTH.transpose(0, 2, 1, 3)[:, :length].astype(q_BTNH.dtype)
