"""Attention-dropout keep-bits that a kernel regenerates instead of storing: a counter-based hash
of (seed, batch row, head, query position, key index), computed the same way inside a Pallas
kernel's blocks (`bertjax.ops.flash_dropout`), as a dense JAX array here (`dense`) and by the
NumPy port in tests/attention_reference.py, so a check against the exact path feeds it the
very bits the kernel drew.

The bits, in 32-bit unsigned arithmetic (wrapping), for a call with N heads over S keys:

- seed: two words ``s0, s1`` drawn from the layer's dropout key (`seed_words`);
- per batch row b and head n, ``u = b * N + n``: ``k1 = mix(mix(u ^ s0) + s1)``,
  ``k2 = mix(k1 ^ 0x9E3779B9)``, where ``mix`` is the lowbias32 finalizer (x ^= x >> 16;
  x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16: full avalanche);
- one 32-bit word decides two elements, keys s and s + 8 of each aligned group of 16 keys:
  word ``w = 8 * (s // 16) + s % 8`` of ``W = 8 * ceil(S / 16)`` words per query; for query
  position t the counter ``c = t * W + w + k1`` hashes to ``h = keyed(c, k2)``: lowbias32 with
  ``k2`` xored in before its second multiply (so no two (b, n) streams are shifted copies);
- key s takes the low 16 bits of h when ``s % 16 < 8``, the high 16 bits otherwise, and is kept
  when they are below ``round(keep_prob * 65536)``: keep probability to 2^-16, as
  `bertjax.ops.elementwise.keep_mask`.

Queries are named by their position (`AttentionMask.query_positions`, which restart in each
packed sequence): two queries of one row share a position only in different packed sequences,
which never see the same key, so every (query, key) pair a softmax weighs gets its own bits.
Pairing keys 8 apart puts a word's two halves in the same lane of two sublane tiles whichever
way a kernel lays out its [keys, queries] or [queries, keys] block: no shuffles.

Why not the TPU's own generator (`pltpu.prng_seed` / `prng_random_bits`, ~free on the chip): no
CPU reproduces it. In jax 0.10, Pallas's interpret mode raises on it (``interpret=True``: no CPU
lowering for ``prng_seed``) or returns zeros (``pltpu.InterpretParams``), so a test could not see
which elements a TPU dropped. The hash costs ~8 vector-ALU operations per score in the forward
and ~13 in the backward (two decisions per 10-operation hash, plus select), read from libtpu's
compiled schedule (benchmarks/compile/tpu_attention_schedule.py; docs/results/compile.md).

These are not the exact path's bits (it draws `keep_mask` from the same key: a different
generator, the same distribution). A kernel choice therefore changes which elements drop, not
how many nor their scaling; a test that compares a kernel with the exact path hands both these.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MIX1, MIX2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
GOLDEN = 0x9E3779B9  # k2's offset from k1
GROUP = 16  # keys per group: a word decides keys s and s + 8
HALF = 65536  # a decision is a 16-bit number below round(keep_prob * HALF)


def _int32(value: int) -> np.int32:
    """A 32-bit pattern as the int32 it is in a kernel (arithmetic wraps alike)."""
    return np.int32(value - (1 << 32) if value >= 1 << 31 else value)


def _shift(x: Array, bits: int) -> Array:
    return jax.lax.shift_right_logical(x, jnp.asarray(bits, x.dtype))


def mix(x: Array, key: Array | None = None) -> Array:
    """lowbias32 of int32 ``x`` (bit patterns), ``key`` xored in before its second multiply."""
    x = x ^ _shift(x, 16)
    x = x * _int32(MIX1)
    x = x ^ _shift(x, 15)
    if key is not None:
        x = x ^ key
    x = x * _int32(MIX2)
    return x ^ _shift(x, 16)


def words_per_query(key_length: int) -> int:
    """W: hash words per query row of ``key_length`` keys (two keys a word)."""
    return GROUP // 2 * -(-key_length // GROUP)


def threshold(rate: float) -> int:
    """A 16-bit half keeps its element when below this: round((1 - rate) * 2^16)."""
    return round((1.0 - rate) * HALF)


def seed_words(key: Array) -> Array:
    """The two seed words (int32 [2]) drawn from a layer's dropout key."""
    return jax.lax.bitcast_convert_type(jax.random.bits(key, (2,), jnp.uint32), jnp.int32)


def head_keys(seed: Array, batch: int, heads: int) -> Array:
    """(k1, k2) of every batch row and head: int32 [B, N, 2] (module docstring)."""
    u = jnp.arange(batch * heads, dtype=jnp.int32).reshape(batch, heads)
    k1 = mix(mix(u ^ seed[0]) + seed[1])
    k2 = mix(k1 ^ _int32(GOLDEN))
    return jnp.stack([k1, k2], axis=-1)


def word_counters(query_positions: Array, key_start: int, keys: int, words: int) -> Array:
    """The counters (before k1) of the words of ``keys`` keys from ``key_start`` (a multiple of
    16): int32 [keys / 2, T] (word rows by key, queries in lanes) for positions [1, T]."""
    rows = key_start // 2 + jax.lax.broadcasted_iota(jnp.int32, (keys // 2, 1), 0)
    return query_positions * words + rows


def halves(h: Array) -> Array:
    """[K / 2, T] words -> [K, T] 16-bit decisions by key: in each group of 16 keys, keys 0-7
    take the low halves of their group's 8 word rows, keys 8-15 the high halves."""
    rows, lanes = h.shape
    low = (h & 0xFFFF).reshape(rows // 8, 1, 8, lanes)
    high = _shift(h, 16).reshape(rows // 8, 1, 8, lanes)
    return jnp.concatenate([low, high], axis=1).reshape(2 * rows, lanes)


def dense(seed: Array, query_positions: Array, key_length: int, heads: int, rate: float) -> Array:
    """The keep mask these bits make, boolean [B, N, T, S], for query positions [B, T] (what a
    kernel drawing them keeps; the exact path is fed this to compute the same dropout)."""
    batch, length = query_positions.shape
    padded = -(-key_length // GROUP) * GROUP
    words = words_per_query(key_length)
    keys = head_keys(seed, batch, heads)  # [B, N, 2]
    counters = word_counters(query_positions[:, None, None, :], 0, padded, words)  # [B,1,S/2,T]
    h = mix(counters + keys[..., 0, None, None], keys[..., 1, None, None])  # [B, N, S/2, T]
    decisions = jax.vmap(jax.vmap(halves))(h)  # [B, N, S, T]
    keep = decisions < threshold(rate)
    return jnp.swapaxes(keep, -1, -2)[..., :key_length]
