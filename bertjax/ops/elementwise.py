"""Elementwise pieces of the encoder: BERT's exact GELU (with a hand-written backward on XLA:CPU)
and dropout decisions on cheap random bits (the key's own generator)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

from bertjax.ops import keep_bits, platform

Array = jax.Array


def erf_gelu(x: Array) -> Array:
    """BERT's exact GELU, x * Phi(x). On XLA:CPU with a hand-written backward (the forward keeps
    Phi(x) for the derivative Phi(x) + x phi(x), where autodiff of jax.nn.gelu evaluates erf
    again); elsewhere jax.nn.gelu under autodiff, which XLA fuses into its neighbours, with
    nothing of it saved for the backward but its input (`jax.checkpoint`): autodiff kept erf's
    intermediates, and XLA:GPU wrote two [B, T, F] residuals a layer to HBM and read them back
    (BERT-base seq128 on h100-8; benchmarks/results.md), where recomputing them is free."""
    if platform.on_cpu():
        return _erf_gelu(x)
    return _gelu_from_input(x)


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
def _gelu_from_input(x: Array) -> Array:
    return jax.nn.gelu(x, approximate=False)


@jax.custom_vjp
def _erf_gelu(x: Array) -> Array:
    return _erf_gelu_fwd(x)[0]


def _erf_gelu_fwd(x):
    cdf = 0.5 + 0.5 * jax.lax.erf(x * jnp.asarray(2**-0.5, x.dtype))
    return x * cdf, (x, cdf)


def _erf_gelu_bwd(residuals, g):
    x, cdf = residuals
    density = jnp.asarray((2 * np.pi) ** -0.5, x.dtype) * jnp.exp(-0.5 * x * x)
    return (g * (cdf + x * density),)


_erf_gelu.defvjp(_erf_gelu_fwd, _erf_gelu_bwd)


def hashed_words(key: Array, shape: tuple) -> Array:
    """uint32 words of ``shape`` from a counter hash keyed by two words drawn from ``key``:
    lowbias32 (`bertjax.ops.keep_bits.mix`) of each word's index along the last axis, keyed per
    row (the leading axes' flat index) as `keep_bits.head_keys` keys a (row, head): k1 =
    mix(mix(row ^ s0) + s1), k2 = mix(k1 ^ golden), word = mix(column + k1, k2). Plain integer
    ops on iotas, so the compiler fuses them into their consumer and partitions them with it."""
    columns = jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    return jax.lax.bitcast_convert_type(_hash(key, shape, columns), jnp.uint32)


def hashed_halves(key: Array, shape: tuple) -> Array:
    """The 16-bit halves of `hashed_words` of ``shape`` with its last axis halved (rounded up),
    one an element (int32 in [0, 2^16)): element j of a row takes word j // 2's low half when j
    is even, its high half when odd, the order `jax.lax.bitcast_convert_type` to uint16 gives.
    Shifts per element, not that bitcast: XLA does not fuse a bitcast to a narrower type into
    its consumer, so the words went through HBM (BERT-base seq128 on h100-8: 23 s32
    [32, 128, 384] arrays a step); this hashes each word twice, in the consumer's own code."""
    index = jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    words = _hash(key, (*shape[:-1], (shape[-1] + 1) // 2), index >> 1)
    return jax.lax.shift_right_logical(words, (index & 1) << 4) & 0xFFFF


def _hash(key: Array, shape: tuple, columns: Array) -> Array:
    """mix(columns + k1, k2) (int32) with (k1, k2) of each row of ``shape``'s leading axes."""
    seed = keep_bits.seed_words(key)
    rows = jnp.zeros((*shape[:-1], 1), jnp.int32)
    stride = 1
    for axis in reversed(range(len(shape) - 1)):
        rows = rows + jax.lax.broadcasted_iota(jnp.int32, (*shape[:-1], 1), axis) * stride
        stride *= shape[axis]
    if stride >= 1 << 31:
        raise ValueError(f"keep_mask: {stride} rows of random words is more than 2^31")
    k1 = keep_bits.mix(keep_bits.mix(rows ^ seed[0]) + seed[1])
    k2 = keep_bits.mix(k1 ^ keep_bits._int32(keep_bits.GOLDEN))  # noqa: SLF001
    return keep_bits.mix(columns + k1, k2)


def keep_mask(key: Array, shape: tuple, keep_prob: float) -> Array:
    """Boolean dropout mask, True with probability ``keep_prob`` (to 2^-16), from ``key``.

    Each 32-bit random word decides two elements (its 16-bit halves against
    round(keep_prob * 2^16)), where `jax.random.bernoulli` spends a word and a float conversion
    per element. On XLA:CPU (one device's array) the words come from one flat counter: for a
    threefry key (JAX's default), Threefry-2x32 hashes a counter per pair of words
    (`jax.extend.random.threefry_2x32`, keyed by two words drawn from ``key``: four elements per
    hash; XLA:CPU's threefry is a 5-trip loop over the whole array); for ``rbg``/``unsafe_rbg``
    keys, `jax.random.bits` of that key. Elsewhere the words are drawn in the mask's own shape
    (the last axis halved), which partitions with the activations: a flat counter split in two
    and reshaped would make the compiler move random bits between devices (all-to-alls and
    collective-permutes in a data-parallel step), for nothing. For a threefry key they come from
    a counter hash there, each element's half of its word taken by shifts (`hashed_halves`),
    which the compiler fuses into the dropout itself: JAX's threefry on a GPU is a kernel of its
    own, and a bitcast of words to 16-bit halves is not fused, so either way the u32 words went
    through HBM (BERT-base seq128 on h100-8: [32, 128, 384] x3 a layer;
    docs/results/compile.md).
    """
    size = int(np.prod(shape))
    threshold = round(keep_prob * 65536)
    if threshold >= 65536:
        return jnp.ones(shape, bool)
    if not platform.on_cpu() and shape:
        last = shape[-1]
        words = (*shape[:-1], (last + 1) // 2)
        if str(jax.random.key_impl(key)) == "threefry2x32":
            return hashed_halves(key, shape) < threshold
        bits = jax.random.bits(key, words, jnp.uint32)
        halves = jax.lax.bitcast_convert_type(bits, jnp.uint16)  # [..., last/2, 2]
        halves = halves.reshape(*shape[:-1], -1)[..., :last]
        return halves < jnp.uint16(threshold)
    words = (size + 1) // 2
    words += words % 2
    if str(jax.random.key_impl(key)) == "threefry2x32":
        pair = jax.random.bits(key, (2,), jnp.uint32)
        bits = threefry_2x32(pair, jax.lax.iota(jnp.uint32, words))
    else:
        bits = jax.random.bits(key, (words,), jnp.uint32)
    halves = jax.lax.bitcast_convert_type(bits, jnp.uint16).reshape(-1)[:size]
    return halves.reshape(shape) < jnp.uint16(threshold)
