"""Rotary position embeddings (Su et al. 2021) in the "rotate half" layout of GPT-NeoX and
transformers' ModernBERT: head dimension i is paired with i + H/2 and both are rotated by the
angle position * theta^(-2i/H)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """theta^(-2i/H) for i < H/2, as float32 the way transformers computes them (float32
    exponents, a float32 power and reciprocal): the angles of long rows then round alike."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)


def rotate(x_BTNH: Array, positions_BT: Array, theta: float) -> Array:
    """``x`` rotated by its positions: x * cos + rotate_half(x) * sin, computed in float32 (as
    transformers does) and returned in x's dtype."""
    inverse = jnp.asarray(inverse_frequencies(x_BTNH.shape[-1], theta))
    angles_BTK = positions_BT.astype(jnp.float32)[..., None] * inverse
    angles_BTH = jnp.concatenate([angles_BTK, angles_BTK], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles_BTH), jnp.sin(angles_BTH)
    x = x_BTNH.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).astype(x_BTNH.dtype)
