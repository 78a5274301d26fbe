"""Elementwise pieces of the encoder, written for speed on XLA:CPU: BERT's exact GELU with a
hand-written backward, and dropout decisions on cheap random bits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

Array = jax.Array


@jax.custom_vjp
def erf_gelu(x: Array) -> Array:
    """BERT's exact GELU, x * Phi(x), with a hand-written backward: the forward keeps Phi(x)
    for the derivative Phi(x) + x phi(x), where autodiff of jax.nn.gelu evaluates erf again."""
    return _erf_gelu_fwd(x)[0]


def _erf_gelu_fwd(x):
    cdf = 0.5 + 0.5 * jax.lax.erf(x * jnp.asarray(2**-0.5, x.dtype))
    return x * cdf, (x, cdf)


def _erf_gelu_bwd(residuals, g):
    x, cdf = residuals
    density = jnp.asarray((2 * np.pi) ** -0.5, x.dtype) * jnp.exp(-0.5 * x * x)
    return (g * (cdf + x * density),)


erf_gelu.defvjp(_erf_gelu_fwd, _erf_gelu_bwd)


def keep_mask(key: Array, shape: tuple, keep_prob: float) -> Array:
    """Boolean dropout mask, True with probability ``keep_prob`` (to 2^-16), from ``key``.

    Threefry-2x32 (`jax.extend.random.threefry_2x32`, keyed by two words drawn from ``key``)
    hashes a counter per pair of 32-bit words and each word decides two elements (its 16-bit
    halves against round(keep_prob * 2^16)): four elements per hash, where
    `jax.random.bernoulli` spends a hash (both its words XOR-ed into one) and a float
    conversion per element (XLA:CPU's threefry is a 5-trip loop over the whole array).
    """
    size = int(np.prod(shape))
    threshold = round(keep_prob * 65536)
    if threshold >= 65536:
        return jnp.ones(shape, bool)
    words = (size + 1) // 2
    pair = jax.random.bits(key, (2,), jnp.uint32)
    hashed = threefry_2x32(pair, jax.lax.iota(jnp.uint32, words + words % 2))
    halves = jax.lax.bitcast_convert_type(hashed, jnp.uint16).reshape(-1)[:size]
    return halves.reshape(shape) < jnp.uint16(threshold)
