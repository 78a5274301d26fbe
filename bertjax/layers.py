"""Elementwise pieces of the encoder, written for speed on XLA:CPU: BERT's exact GELU with a
hand-written backward, and dropout on cheap random bits."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

Array = jax.Array


@jax.custom_vjp
def erf_gelu(x: Array) -> Array:
    """BERT's exact GELU, x * Phi(x), with a hand-written backward: the forward keeps Phi(x)
    for the derivative Phi(x) + x phi(x), where autodiff of jax.nn.gelu evaluates erf again
    (BERT-mini's feed-forward forward + backward: 74.5 -> 71 ms per layer on 2 cores)."""
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
    conversion per element. On XLA:CPU, whose threefry is a 5-trip loop over the whole array,
    BERT-mini's nine [32, 128, 256] hidden dropouts: 62 ms (bernoulli) -> 10 ms.
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


class Dropout(nn.Module):
    """Inverted dropout (as nn.Dropout) on `keep_mask`'s bits; rng collection "dropout"."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0:
            return jnp.zeros_like(x)
        keep = keep_mask(self.make_rng("dropout"), x.shape, 1.0 - self.rate)
        return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros((), x.dtype))
