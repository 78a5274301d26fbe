"""Banded local and blocked global attention (bertjax/ops/blocked_attention.py) against a masked
dense reference: a float64 numpy softmax attention for the outputs, autodiff of the dense
`exact_attention` for the gradients, on packed rows with padding, blocks that do not divide T."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.modeling.attention import AttentionMask, exact_attention
from bertjax.modeling.embeddings import position_ids
from bertjax.ops import blocked_attention as blocked

B, T, N, H = 2, 50, 2, 8


def _np_attention(q, k, v, visible):
    """float64 softmax(q k^T / sqrt(H)) v over the visible keys ([B, 1, T, S] boolean)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(visible, logits, -1e300)  # a row with no visible key: uniform, unused
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs, v)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32) for _ in range(3))
    segments = np.ones((B, T), np.int32)
    segments[1, 30:] = 2  # row 1: two packed sequences, then padding
    segments[1, 45:] = 0
    segments = jnp.asarray(segments)
    mask = AttentionMask.build(None, segments, position_ids(segments, B, T, 0))
    real = np.asarray(segments)[:, :, None, None] > 0
    cotangent = jnp.asarray(rng.normal(size=(B, T, N, H)) * real, jnp.float32)
    return q, k, v, mask, real, cotangent


def _local(mask, half_window):
    def run(q, k, v):
        return blocked.local_attention(
            q, k, v, mask.query_segments, mask.key_segments, mask.key_positions, half_window, 8
        )

    return run


def _flash(mask, half_window):
    def run(q, k, v):
        return blocked.flash_attention(
            q,
            k,
            v,
            mask.query_segments,
            mask.key_segments,
            mask.query_positions,
            mask.key_positions,
            half_window,
            block=16,
        )

    return run


@pytest.mark.parametrize(
    "path,half_window", [("local", 5), ("local", 8), ("flash", 0), ("flash", 5)]
)
def test_blocked_attention_equals_the_masked_dense_reference(inputs, path, half_window):
    q, k, v, mask, real, cotangent = inputs
    run = {"local": _local, "flash": _flash}[path](mask, half_window)
    visible = np.asarray(mask.dense(half_window))
    out = np.asarray(jax.jit(run)(q, k, v))
    want = _np_attention(q, k, v, visible)
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, want, 0), atol=2e-6)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * cotangent)

    dense = jnp.asarray(visible)
    ours = jax.jit(jax.grad(loss(run), argnums=(0, 1, 2)))(q, k, v)
    exact = loss(lambda q, k, v: exact_attention(q, k, v, dense))
    theirs = jax.jit(jax.grad(exact, argnums=(0, 1, 2)))(q, k, v)
    for got, reference in zip(ours, theirs):
        np.testing.assert_allclose(got, reference, atol=3e-6)


def test_local_attention_needs_a_block_as_wide_as_its_half_window(inputs):
    q, k, v, mask, _, _ = inputs
    with pytest.raises(ValueError, match="narrower than the half-window"):
        blocked.local_attention(
            q, k, v, mask.query_segments, mask.key_segments, mask.key_positions, 9, 8
        )
