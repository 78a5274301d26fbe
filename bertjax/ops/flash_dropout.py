"""Attention with probability dropout on a TPU, the scores never in HBM: Pallas forward and
backward kernels (splash's blocking: query and key blocks of 512, 256 or 128 rows, an online
softmax over key blocks) that regenerate each block's keep-bits from the layer's seed
(`bertjax.ops.keep_bits`) instead of storing a [B, N, T, S] mask. The `flash_dropout` kernel of
`bertjax.modeling.attention_kernels`, chosen on a TPU for attention with dropout.

Semantics (the exact path's, `exact_attention` with ``keep`` and ``rate``): p = softmax of the
visible logits; each p is kept with probability 1 - rate and scaled by 1 / (1 - rate), else 0;
out = p' v. The softmax's normalizer counts every visible key (dropout acts after it). The keep
decisions are `keep_bits`' hash of (seed, row, head, query position, key), not the exact path's
`keep_mask`: same distribution, different bits.

Who sees whom is `AttentionMask`'s rule on segments and positions as given (queries need not be
aligned with keys: gathered rows are served): query t sees key s when ``query_segments[t] ==
key_segments[s] > 0``, within ``half_window`` positions when local, not after it when causal.
Rows are padded to multiples of 128 with segments that see nothing, then cut back. A query that
sees no key returns a finite value (the mean of the values of the key blocks it met) and, with
the zero cotangent such a row gets, sends no gradient. No block is skipped: local and causal
layers are masked, not made cheaper.

Layout: every block is [keys, queries] (queries in lanes), so per-query statistics (the
log-sum-exp, dO . O) are lane-dense rows; queries enter transposed ([B, N, H, T]), keys as
[B, N, S, H] (and transposed where a product wants them), so every product is a plain or
right-transposed matmul. The backward is one kernel (grid over key blocks, query blocks inside):
dK and dV accumulate in VMEM, each (key block, query block) writes its dQ part, summed outside.
1 / (1 - rate) is folded into the output's normalization and into dO, so dropping is a select.

Like splash, the kernel runs inside ``shard_map`` on a mesh (``partition``; rows and heads split,
never the sequence axis), and in Pallas interpret mode off a TPU (the tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec

from bertjax.ops import keep_bits, splash

Array = jax.Array

MASKED = -0.7 * float(np.finfo(np.float32).max)  # a hidden logit: exp(MASKED - m) == 0
NT = (((1,), (1,)), ((), ()))  # contract both operands' last axes: a @ b^T
STEP = 512 * 512  # scores a grid step computes at most (heads x query block x key block)


@dataclasses.dataclass(frozen=True)
class _Call:
    """What the kernels are compiled for (static)."""

    block_q: int
    block_k: int
    heads_per_step: int  # heads one grid step computes (small blocks: more work to overlap)
    rate: float  # 0: no dropout
    half_window: int
    causal: bool
    words: int  # hash words per query row (keep_bits.words_per_query of the real key count)
    interpret: bool

    @property
    def dropout(self) -> bool:
        return self.rate > 0.0


def _visible(call: _Call, qinfo: Array, kinfo: Array) -> Array:
    """[bk, bq] True where the query (lanes; qinfo rows: segment, position) sees the key
    (sublanes; kinfo columns: segment, position)."""
    seen = kinfo[:, 0:1] == qinfo[0:1, :]
    if call.half_window or call.causal:
        offset = qinfo[1:2, :] - kinfo[:, 1:2]
        if call.half_window:
            seen = seen & (jnp.abs(offset) <= call.half_window)
        if call.causal:
            seen = seen & (offset >= 0)
    return seen


def _keep(call: _Call, keys_ref, b, head, heads, qinfo, key_block) -> Array:
    """[bk, bq] keep decisions of this block of ``head`` (keep_bits' hash of its words)."""
    index = 2 * (b * heads + head)
    k1, k2 = keys_ref[index], keys_ref[index + 1]
    counters = keep_bits.word_counters(
        qinfo[1:2, :], key_block * call.block_k, call.block_k, call.words
    )
    h = keep_bits.mix(counters + k1, k2)
    return keep_bits.halves(h) < keep_bits.threshold(call.rate)


def _forward_kernel(keys_ref, q_ref, k_ref, vt_ref, qinfo_ref, kinfo_ref, o_ref, lse_ref,
                    m_ref, l_ref, acc_ref, *, call: _Call, heads: int):  # fmt: skip
    b, n, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, MASKED, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    qinfo, kinfo = qinfo_ref[...], kinfo_ref[...]
    visible = _visible(call, qinfo, kinfo)
    for g in range(call.heads_per_step):  # independent heads: the scheduler interleaves them
        s = jnp.dot(k_ref[g], q_ref[g], preferred_element_type=jnp.float32)  # [bk, bq]
        s = jnp.where(visible, s, MASKED)
        m_prev = m_ref[g]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=0, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[g] = alpha * l_ref[g] + jnp.sum(p, axis=0, keepdims=True)
        m_ref[g] = m_new
        if call.dropout:
            head = n * call.heads_per_step + g
            p = jnp.where(_keep(call, keys_ref, b, head, heads, qinfo, j), p, 0.0)
        vt = vt_ref[g]
        acc_ref[g] = alpha * acc_ref[g] + jnp.dot(
            vt, p.astype(vt.dtype), preferred_element_type=jnp.float32
        )

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        total = l_ref[...]  # the softmax's normalizer (every visible key, dropped or not)
        o_ref[...] = (acc_ref[...] * (1.0 / (1.0 - call.rate) / total)).astype(o_ref.dtype)
        lse_ref[...] = m_ref[...] + jnp.log(total)


def _backward_kernel(keys_ref, q_ref, k_ref, kt_ref, v_ref, do_ref, qinfo_ref, kinfo_ref,
                     stats_ref, dq_ref, dk_ref, dv_ref, dk_acc, dv_acc, *, call: _Call,
                     heads: int):  # fmt: skip
    b, n, j, i = (pl.program_id(a) for a in range(4))

    @pl.when(i == 0)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    qinfo, kinfo = qinfo_ref[...], kinfo_ref[...]
    visible = _visible(call, qinfo, kinfo)
    for g in range(call.heads_per_step):
        stats = stats_ref[g]
        q, do = q_ref[g], do_ref[g]  # [H, bq] each; do already scaled by 1 / (1 - rate)
        s = jnp.dot(k_ref[g], q, preferred_element_type=jnp.float32)  # [bk, bq]
        s = jnp.where(visible, s, MASKED)
        p = jnp.exp(s - stats[0:1, :])
        dp = jnp.dot(v_ref[g], do, preferred_element_type=jnp.float32)  # [bk, bq]
        kept = p
        if call.dropout:
            head = n * call.heads_per_step + g
            keep = _keep(call, keys_ref, b, head, heads, qinfo, j)
            kept, dp = jnp.where(keep, p, 0.0), jnp.where(keep, dp, 0.0)
        dv_acc[g] += jax.lax.dot_general(
            kept.astype(do.dtype), do, NT, preferred_element_type=jnp.float32
        )
        ds = p * (dp - stats[1:2, :])
        dk_acc[g] += jax.lax.dot_general(
            ds.astype(q.dtype), q, NT, preferred_element_type=jnp.float32
        )
        kt = kt_ref[g]
        dq_ref[g] = jnp.dot(kt, ds.astype(kt.dtype), preferred_element_type=jnp.float32)

    @pl.when(i == pl.num_programs(3) - 1)
    def _():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _params(call: _Call):
    return dict(
        interpret=call.interpret,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
    )


def _forward(call: _Call, q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys):
    """(out [B, N, H, T], log-sum-exp [B, N, 1, T]) of padded head-major inputs."""
    batch, heads, head_dim, length = q_BNHT.shape
    keys_length = k_BNSH.shape[2]
    bq, bk, hs = call.block_q, call.block_k, call.heads_per_step
    grid = (batch, length // bq, heads // hs, keys_length // bk)  # key blocks innermost
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=grid,
        in_specs=[
            pl.BlockSpec((None, hs, head_dim, bq), lambda b, i, n, j, _: (b, n, 0, i)),
            pl.BlockSpec((None, hs, bk, head_dim), lambda b, i, n, j, _: (b, n, j, 0)),
            pl.BlockSpec((None, hs, head_dim, bk), lambda b, i, n, j, _: (b, n, 0, j)),
            pl.BlockSpec((None, 2, bq), lambda b, i, n, j, _: (b, 0, i)),
            pl.BlockSpec((None, bk, 2), lambda b, i, n, j, _: (b, j, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, hs, head_dim, bq), lambda b, i, n, j, _: (b, n, 0, i)),
            pl.BlockSpec((None, hs, 1, bq), lambda b, i, n, j, _: (b, n, 0, i)),
        ],
        scratch_shapes=[
            pltpu.VMEM((hs, 1, bq), jnp.float32),
            pltpu.VMEM((hs, 1, bq), jnp.float32),
            pltpu.VMEM((hs, head_dim, bq), jnp.float32),
        ],
    )
    return pl.pallas_call(
        functools.partial(_forward_kernel, call=call, heads=heads),
        grid_spec=spec,
        out_shape=[
            jax.ShapeDtypeStruct(q_BNHT.shape, q_BNHT.dtype),
            jax.ShapeDtypeStruct((batch, heads, 1, length), jnp.float32),
        ],
        **_params(call),
    )(keys, q_BNHT, k_BNSH, jnp.swapaxes(v_BNSH, 2, 3), qinfo, kinfo)


def _backward(call: _Call, residuals, do_BNHT):
    q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys, o_BNHT, lse = residuals
    batch, heads, head_dim, length = q_BNHT.shape
    keys_length = k_BNSH.shape[2]
    bq, bk, hs = call.block_q, call.block_k, call.heads_per_step
    blocks_k = keys_length // bk
    delta = jnp.sum(do_BNHT.astype(jnp.float32) * o_BNHT.astype(jnp.float32), axis=2)
    stats = jnp.concatenate([lse, delta[:, :, None]], axis=2)  # [B, N, 2, T]
    do_BNHT = (do_BNHT * (1.0 / (1.0 - call.rate))).astype(q_BNHT.dtype)
    grid = (batch, heads // hs, blocks_k, length // bq)  # query blocks innermost
    rows_q = pl.BlockSpec((None, hs, head_dim, bq), lambda b, n, j, i, _: (b, n, 0, i))
    rows_k = pl.BlockSpec((None, hs, bk, head_dim), lambda b, n, j, i, _: (b, n, j, 0))
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=grid,
        in_specs=[
            rows_q,
            rows_k,
            pl.BlockSpec((None, hs, head_dim, bk), lambda b, n, j, i, _: (b, n, 0, j)),
            rows_k,
            rows_q,
            pl.BlockSpec((None, 2, bq), lambda b, n, j, i, _: (b, 0, i)),
            pl.BlockSpec((None, bk, 2), lambda b, n, j, i, _: (b, j, 0)),
            pl.BlockSpec((None, hs, 2, bq), lambda b, n, j, i, _: (b, n, 0, i)),
        ],
        out_specs=[
            pl.BlockSpec((None, hs, None, head_dim, bq), lambda b, n, j, i, _: (b, n, j, 0, i)),
            rows_k,
            rows_k,
        ],
        scratch_shapes=[
            pltpu.VMEM((hs, bk, head_dim), jnp.float32),
            pltpu.VMEM((hs, bk, head_dim), jnp.float32),
        ],
    )
    dq_parts, dk, dv = pl.pallas_call(
        functools.partial(_backward_kernel, call=call, heads=heads),
        grid_spec=spec,
        out_shape=[
            jax.ShapeDtypeStruct((batch, heads, blocks_k, head_dim, length), jnp.float32),
            jax.ShapeDtypeStruct(k_BNSH.shape, k_BNSH.dtype),
            jax.ShapeDtypeStruct(v_BNSH.shape, v_BNSH.dtype),
        ],
        **_params(call),
    )(keys, q_BNHT, k_BNSH, jnp.swapaxes(k_BNSH, 2, 3), v_BNSH, do_BNHT, qinfo, kinfo, stats)
    return jnp.sum(dq_parts, axis=2).astype(q_BNHT.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(call, q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys):
    return _forward(call, q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys)[0]


def _attention_fwd(call, q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys):
    out, lse = _forward(call, q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys)
    return out, (q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys, out, lse)


def _attention_bwd(call, residuals, do_BNHT):
    return (*_backward(call, residuals, do_BNHT), None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _pad(x: Array, axis: int, length: int, value=0) -> Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def attention(
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    query_segments: Array,
    key_segments: Array,
    query_positions: Array,
    key_positions: Array,
    seed: Array | None,
    rate: float,
    half_window: int = 0,
    causal: bool = False,
    interpret: bool = False,
    partition: PartitionSpec | None = None,
    block: int | None = None,
) -> Array:
    """Softmax attention [B, T, N, H] under `AttentionMask`'s rule (segments [B, T] / [B, S],
    positions likewise), dropout at ``rate`` with `keep_bits`' bits from ``seed`` (int32 [2],
    `keep_bits.seed_words`; None with rate 0: no dropout); ``interpret``: Pallas interpret
    mode; ``partition``: the [B, T, N, H] activations' sharding (run under ``shard_map``, rows
    and heads split); ``block``: the query and key block (default: the largest of 512, 256,
    128 that divides the padded length)."""
    batch, length, heads, head_dim = q_BTNH.shape
    keys = keep_bits.head_keys(
        jnp.zeros(2, jnp.int32) if seed is None else seed, batch, heads
    )  # [B, N, 2], from the global row and head indices
    local = functools.partial(
        _local,
        rate=rate if seed is not None else 0.0,
        half_window=half_window,
        causal=causal,
        interpret=interpret,
        block=block,
        words=keep_bits.words_per_query(k_BSNH.shape[1]),
    )
    args = (q_BTNH, k_BSNH, v_BSNH, query_segments, key_segments, query_positions)
    args += (key_positions, keys)
    if partition is None:
        return local(*args)
    batch_axes, head_axes = splash.mesh_axes(partition, batch, heads)
    rows, per_head = PartitionSpec(batch_axes), PartitionSpec(batch_axes, head_axes)
    rows_and_heads = PartitionSpec(batch_axes, None, head_axes)
    return jax.shard_map(
        local,
        in_specs=(*[rows_and_heads] * 3, *[rows] * 4, per_head),
        out_specs=rows_and_heads,
        check_vma=False,  # pallas_call states no replication rule
    )(*args)


def _local(q_BTNH, k_BSNH, v_BSNH, query_segments, key_segments, query_positions,
           key_positions, keys, *, rate, half_window, causal, interpret, block, words):  # fmt: skip
    """`attention` on one device's rows and heads."""
    length, keys_length, head_dim = q_BTNH.shape[1], k_BSNH.shape[1], q_BTNH.shape[3]
    padded_q = -(-length // splash.LANES) * splash.LANES
    padded_k = -(-keys_length // splash.LANES) * splash.LANES
    block_q = block or splash.block_size(padded_q)
    block_k = block or splash.block_size(padded_k)
    heads = q_BTNH.shape[2]
    call = _Call(
        block_q=block_q,
        block_k=block_k,
        heads_per_step=max(
            g for g in range(1, heads + 1) if heads % g == 0 and g * block_q * block_k <= STEP
        ),
        rate=rate,
        half_window=half_window,
        causal=causal,
        words=words,
        interpret=interpret,
    )
    scale = jnp.asarray(1.0 / math.sqrt(head_dim), q_BTNH.dtype)
    q_BNHT = _pad(jnp.transpose(q_BTNH * scale, (0, 2, 3, 1)), 3, padded_q)
    k_BNSH, v_BNSH = (_pad(jnp.transpose(x, (0, 2, 1, 3)), 2, padded_k) for x in (k_BSNH, v_BSNH))
    segments = key_segments.astype(jnp.int32)
    segments = _pad(jnp.where(segments > 0, segments, -1), 1, padded_k, -1)  # padding: none
    kinfo = jnp.stack([segments, _pad(key_positions.astype(jnp.int32), 1, padded_k)], axis=-1)
    qinfo = jnp.stack(
        [_pad(x.astype(jnp.int32), 1, padded_q) for x in (query_segments, query_positions)],
        axis=1,
    )  # [B, 2, T]: segment (0 in padding: sees nothing), position
    out_BNHT = _attention(call, q_BNHT, k_BNSH, v_BNSH, qinfo, kinfo, keys.reshape(-1))
    return jnp.transpose(out_BNHT, (0, 3, 1, 2))[:, :length].astype(q_BTNH.dtype)
