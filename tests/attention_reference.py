"""Softmax attention written out again in float64 numpy, outputs and gradients, for
tests/attention_kernels_test.py: every `AttentionSpec` feature is read here or where the test
builds its inputs (`kernels_test._inputs`), and the test checks that none is left unread.

Forward, per row b and head n (S keys; K = N / kv_groups key/value heads, head n reads K-head
n // kv_groups): s = q k^T / sqrt(H); l = c tanh(s / c) when soft_cap c > 0; l += bias; keys the
mask hides (segments, padding, the local window, causal order) get no weight; p = softmax(l);
dropout: p' = keep * p / (1 - rate); out = p' v. Backward of <out, g>: dv = p'^T g, dp' = g v^T,
dp = keep * dp' / (1 - rate), dl = p (dp - sum(dp p)), ds = dl (1 - tanh^2(s / c)) with the cap,
dq = ds k / sqrt(H), dk = ds^T q / sqrt(H); a K-head's gradients sum over the heads it serves.

`hashed_keep`: the keep-bits of bertjax/ops/keep_bits.py (the flash_dropout kernel's) written out
again from its docstring, in 64-bit NumPy integers masked to 32 bits.
"""

import numpy as np


def visible(segments_q, segments_k, positions_q, positions_k, half_window, causal):
    """[B, 1, T, S]: the mask rule (bertjax.modeling.attention_mask.AttentionMask) again."""
    sq, sk = segments_q[:, None, :, None], segments_k[:, None, None, :]
    offset = positions_q[:, None, :, None] - positions_k[:, None, None, :]
    seen = (sq == sk) & (sk > 0)
    if half_window:
        seen &= np.abs(offset) <= half_window
    if causal:
        seen &= offset >= 0
    return seen


def attention(spec, q, k, v, visible_BNTS, keep, rate, bias, cotangent):
    """(out, (dq, dk, dv)) in float64: ``spec``'s attention of q [B, T, N, H], k and v
    [B, S, K, H] and the gradients of <out, cotangent> (module docstring)."""
    q, k, v, g = (np.asarray(a, np.float64) for a in (q, k, v, cotangent))
    groups = spec.kv_groups
    k_all, v_all = (np.repeat(a, groups, axis=2) for a in (k, v))
    scale = 1.0 / np.sqrt(spec.head_dim)
    s = np.einsum("btnh,bsnh->bnts", q, k_all) * scale
    cap = spec.soft_cap
    logits = cap * np.tanh(s / cap) if cap else s
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    logits = np.where(visible_BNTS, logits, -1e300)  # a row that sees nothing: uniform, unused
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dropped = p
    if keep is not None:
        keep = np.asarray(keep)
        dropped = np.where(keep, p / (1.0 - rate), 0.0)
    out = np.einsum("bnts,bsnh->btnh", dropped, v_all)

    dv_all = np.einsum("bnts,btnh->bsnh", dropped, g)
    d_dropped = np.einsum("btnh,bsnh->bnts", g, v_all)
    dp = d_dropped if keep is None else np.where(keep, d_dropped / (1.0 - rate), 0.0)
    dl = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    ds = dl * (1.0 - np.tanh(s / cap) ** 2) if cap else dl
    dq = np.einsum("bnts,bsnh->btnh", ds, k_all) * scale
    dk_all = np.einsum("bnts,btnh->bsnh", ds, q) * scale

    def per_kv_head(d):  # [B, S, N, H] -> [B, S, K, H]: summed over each K-head's queries
        b, length, _, h = d.shape
        return d.reshape(b, length, -1, groups, h).sum(axis=3)

    return out, (dq, per_kv_head(dk_all), per_kv_head(dv_all))


_WORD = 0xFFFFFFFF


def _lowbias32(x, key=None):
    """lowbias32 of uint64 arrays holding 32-bit words, ``key`` xored in before the second
    multiply (keep_bits.mix)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _WORD
    x ^= x >> 15
    if key is not None:
        x ^= key
    x = (x * 0x846CA68B) & _WORD
    return x ^ (x >> 16)


def hashed_keep(seed, query_positions, key_length, heads, rate):
    """Boolean [B, N, T, S]: keep_bits' decisions for int32 seed words [2] and query positions
    [B, T] (element by element, from its docstring's definition)."""
    s0, s1 = (int(w) & _WORD for w in np.asarray(seed))
    positions = np.asarray(query_positions).astype(np.uint64)
    batch, length = positions.shape
    u = np.arange(batch * heads, dtype=np.uint64).reshape(batch, heads, 1, 1)
    k1 = _lowbias32((_lowbias32(u ^ s0) + s1) & _WORD)
    k2 = _lowbias32(k1 ^ 0x9E3779B9)
    words = 8 * -(-key_length // 16)
    s = np.arange(key_length, dtype=np.uint64)
    word = 8 * (s // 16) + s % 8
    counter = (positions[:, None, :, None] * words + word + k1) & _WORD  # [B, N, T, S]
    h = _lowbias32(counter, k2)
    half = np.where(s % 16 < 8, h & 0xFFFF, h >> 16)
    return half < round((1.0 - rate) * 65536)
