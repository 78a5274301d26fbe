"""Attention that never holds a T x S array: banded local attention and blocked (flash-style)
global attention, both with hand-written backward passes.

Who may attend whom is given by segment ids and positions instead of a mask: query t sees key s
when ``key_segments[s] > 0``, ``query_segments[t] == key_segments[s]`` and, with a half-window
h > 0, ``|query_positions[t] - key_positions[s]| <= h`` (transformers' ModernBERT sliding window:
``local_attention // 2`` either side, inclusive) and, when causal, ``key_positions[s] <=
query_positions[t]``. Unpacked rows pass query segments of 1 and the attention mask as key
segments.

`local_attention` (queries aligned with keys, T == S): the rows are cut into blocks of ``block``
(>= h) positions; block i attends to blocks i-1, i, i+1 only, through `ops.attention.attention`
(its hand-written backward, its row chains). Time and memory grow as T x 3 block.

`flash_attention` (any queries, e.g. the gathered rows of a sparse last layer): keys in blocks
of ``block``, an online softmax over them (Dao et al. 2022), the log-sum-exp saved; the
backward recomputes each block's probabilities. Peak memory grows as T x block.

A query row with no visible key gets no gradient (as the dense paths give none through its
logits) and, unlike the dense paths, sends none to the values either.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.ops import attention as attention_ops

Array = jax.Array
_NEG = float(np.finfo(np.float32).min)


def _pad_rows(a: Array, length: int) -> Array:
    """``a`` ([B, S, ...]) zero-padded along axis 1 to ``length``."""
    pad = [(0, 0)] * a.ndim
    pad[1] = (0, length - a.shape[1])
    return jnp.pad(a, pad)


def _visible(q_seg, q_pos, k_seg, k_pos, half_window: int, causal: bool = False) -> Array:
    """[B, 1, T, S] boolean: which keys each query sees (module docstring)."""
    ok = (q_seg[:, None, :, None] == k_seg[:, None, None, :]) & (k_seg[:, None, None, :] > 0)
    offset = q_pos[:, None, :, None] - k_pos[:, None, None, :]
    if half_window:
        ok = ok & (jnp.abs(offset) <= half_window)
    if causal:
        ok = ok & (offset >= 0)
    return ok


def local_attention(
    q_BTNH: Array,
    k_BTNH: Array,
    v_BTNH: Array,
    query_segments: Array,
    key_segments: Array,
    positions: Array,
    half_window: int,
    block: int,
    chains: int = 1,
    causal: bool = False,
) -> Array:
    """Banded attention of aligned queries and keys (module docstring); ``positions`` [B, T]
    serve both; ``block`` >= ``half_window``."""
    if block < half_window:
        raise ValueError(f"local_attention: block {block} is narrower than the half-window")
    batch, length, heads, head_dim = q_BTNH.shape
    blocks = -(-length // block)
    padded = blocks * block

    def by_block(a):  # [B, T, ...] -> [B * blocks, block, ...]
        a = _pad_rows(a, padded)
        return a.reshape(batch * blocks, block, *a.shape[2:])

    def windows(a):  # [B, T, ...] -> [B * blocks, 3 block, ...]: blocks i-1, i, i+1
        a = _pad_rows(
            jnp.pad(a, [(0, 0), (block, 0)] + [(0, 0)] * (a.ndim - 2)), padded + 2 * block
        )
        a = a.reshape(batch, blocks + 2, block, *a.shape[2:])
        joined = jnp.concatenate([a[:, :-2], a[:, 1:-1], a[:, 2:]], axis=2)
        return joined.reshape(batch * blocks, 3 * block, *a.shape[3:])

    mask = _visible(
        by_block(query_segments),
        by_block(positions),
        windows(key_segments),
        windows(positions),
        half_window,
        causal,
    )
    ctx = attention_ops.attention(
        by_block(q_BTNH), windows(k_BTNH), windows(v_BTNH), mask, chains=chains
    )
    return ctx.reshape(batch, padded, heads, head_dim)[:, :length]


def flash_attention(
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    query_segments: Array,
    key_segments: Array,
    query_positions: Array,
    key_positions: Array,
    half_window: int = 0,
    block: int = 512,
    causal: bool = False,
) -> Array:
    """Softmax attention over keys in blocks, online softmax, hand-written backward (module
    docstring); ``half_window`` 0 attends globally."""
    length = k_BSNH.shape[1]
    block = min(block, length)
    padded = -(-length // block) * block
    k_BSNH, v_BSNH, key_segments, key_positions = (
        _pad_rows(a, padded) for a in (k_BSNH, v_BSNH, key_segments, key_positions)
    )
    return _flash(
        half_window,
        block,
        causal,
        q_BTNH,
        k_BSNH,
        v_BSNH,
        query_segments,
        key_segments,
        query_positions,
        key_positions,
    )


def _heads_major(a: Array) -> Array:
    return jnp.transpose(a, (0, 2, 1, 3))


def _key_blocks(a: Array, block: int) -> Array:
    """[B, S, ...] -> [S / block, B, block, ...] (the scan axis first)."""
    a = a.reshape(a.shape[0], a.shape[1] // block, block, *a.shape[2:])
    return jnp.moveaxis(a, 1, 0)


def _scores(q_BNTH, k_BNKH, visible):
    s = jnp.einsum("bnth,bnkh->bntk", q_BNTH, k_BNKH, preferred_element_type=jnp.float32)
    return jnp.where(visible, s, _NEG)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _flash(half_window, block, causal, q, k, v, q_seg, k_seg, q_pos, k_pos):
    return _flash_fwd(half_window, block, causal, q, k, v, q_seg, k_seg, q_pos, k_pos)[0]


def _flash_fwd(half_window, block, causal, q, k, v, q_seg, k_seg, q_pos, k_pos):
    scale = jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
    q_BNTH = _heads_major(q * scale)
    k_blocks, v_blocks = _key_blocks(k, block), _key_blocks(v, block)  # [J, B, K, N, H]
    seg_blocks, pos_blocks = _key_blocks(k_seg, block), _key_blocks(k_pos, block)
    batch, heads, length, head_dim = q_BNTH.shape

    def step(carry, xs):
        m, total, acc = carry
        k_BKNH, v_BKNH, seg_BK, pos_BK = xs
        visible = _visible(q_seg, q_pos, seg_BK, pos_BK, half_window, causal)
        s = _scores(q_BNTH, _heads_major(k_BKNH), visible)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        correction = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        total = total * correction + jnp.sum(p, axis=-1)
        pv = jnp.einsum(
            "bntk,bnkh->bnth",
            p.astype(v.dtype),
            _heads_major(v_BKNH),
            preferred_element_type=jnp.float32,
        )
        return (m_new, total, acc * correction[..., None] + pv), None

    init = (
        jnp.full((batch, heads, length), _NEG, jnp.float32),
        jnp.zeros((batch, heads, length), jnp.float32),
        jnp.zeros((batch, heads, length, head_dim), jnp.float32),
    )
    (m, total, acc), _ = jax.lax.scan(step, init, (k_blocks, v_blocks, seg_blocks, pos_blocks))
    out = _heads_major((acc / total[..., None]).astype(v.dtype))
    lse = m + jnp.log(total)
    return out, (q, k, v, q_seg, k_seg, q_pos, k_pos, out, lse)


def _flash_bwd(half_window, block, causal, residuals, g):
    q, k, v, q_seg, k_seg, q_pos, k_pos, out, lse = residuals
    scale = q.shape[-1] ** -0.5
    q_BNTH = _heads_major(q * jnp.asarray(scale, q.dtype))
    g_BNTH = _heads_major(g.astype(jnp.float32))
    delta = jnp.sum(g_BNTH * _heads_major(out.astype(jnp.float32)), axis=-1)  # [B, N, T]
    k_blocks, v_blocks = _key_blocks(k, block), _key_blocks(v, block)  # [J, B, K, N, H]
    seg_blocks, pos_blocks = _key_blocks(k_seg, block), _key_blocks(k_pos, block)

    def step(d_q, xs):
        k_BKNH, v_BKNH, seg_BK, pos_BK = xs
        visible = _visible(q_seg, q_pos, seg_BK, pos_BK, half_window, causal)
        k_BNKH, v_BNKH = _heads_major(k_BKNH), _heads_major(v_BKNH)
        s = _scores(q_BNTH, k_BNKH, visible)
        p = jnp.where(visible, jnp.exp(s - lse[..., None]), 0.0)
        d_v = jnp.einsum("bntk,bnth->bnkh", p, g_BNTH)
        d_p = jnp.einsum("bnth,bnkh->bntk", g_BNTH, v_BNKH.astype(jnp.float32))
        d_s = p * (d_p - delta[..., None])
        d_q = d_q + jnp.einsum("bntk,bnkh->bnth", d_s, k_BNKH.astype(jnp.float32))
        d_k = jnp.einsum("bntk,bnth->bnkh", d_s, q_BNTH.astype(jnp.float32))
        return d_q, (_heads_major(d_k), _heads_major(d_v))

    d_q, (d_k, d_v) = jax.lax.scan(
        step, jnp.zeros(q_BNTH.shape, jnp.float32), (k_blocks, v_blocks, seg_blocks, pos_blocks)
    )

    def unblock(d):  # [J, B, K, N, H] -> [B, S, N, H]
        d = jnp.moveaxis(d, 0, 1)
        return d.reshape(d.shape[0], -1, *d.shape[3:])

    return (
        _heads_major(d_q * scale).astype(q.dtype),
        unblock(d_k).astype(k.dtype),
        unblock(d_v).astype(v.dtype),
        *(np.zeros(a.shape, jax.dtypes.float0) for a in (q_seg, k_seg, q_pos, k_pos)),
    )


_flash.defvjp(_flash_fwd, _flash_bwd)
