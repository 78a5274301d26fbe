"""The TPU dropout kernel's own mechanics (bertjax/ops/flash_dropout.py, bertjax/ops/keep_bits.py),
beyond the kernel grid of tests/attention_kernels_test.py (one block of 128 there): the keep-bits
equal their NumPy port bit for bit and keep the rate without correlating neighbours, and a call
split into key and query blocks and sharded over rows and heads (shard_map on CPU devices,
Pallas interpret mode) computes the float64 reference's outputs and gradients with those bits."""

import attention_reference as reference
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.modeling.attention_kernels import AttentionSpec
from bertjax.modeling.attention_mask import AttentionMask
from bertjax.modeling.embeddings import position_ids
from bertjax.ops import flash_dropout, keep_bits

RATE = 0.1


def test_bits_are_the_numpy_ports_and_keep_the_rate_independently():
    seed = keep_bits.seed_words(jax.random.key(7))
    batch, heads, length = 2, 3, 512
    positions = np.stack([np.arange(length), np.r_[np.arange(200), np.arange(length - 200)]])
    keep = np.asarray(keep_bits.dense(seed, jnp.asarray(positions, jnp.int32), length, heads, RATE))
    np.testing.assert_array_equal(keep, reference.hashed_keep(seed, positions, length, heads, RATE))
    assert keep.shape == (batch, heads, length, length)
    # the rate: 1.57 M decisions, standard error 0.00024
    assert abs(keep.mean() - (1 - RATE)) < 0.0015, keep.mean()
    # neighbours do not agree more than chance: the keys a word pairs (s, s + 8), adjacent keys
    # and queries, the next head and row (the first row's unpacked queries: distinct positions)
    x = keep[0].astype(np.float64) - keep[0].mean()
    pairs = {
        "paired keys": (x[..., :, :-8], x[..., :, 8:]),
        "next key": (x[..., :, :-1], x[..., :, 1:]),
        "next query": (x[..., :-1, :], x[..., 1:, :]),
        "next head": (x[:-1], x[1:]),
        "next row": (keep[0, 0] - 0.9, keep[1, 0] - 0.9),
    }
    for name, (a, b) in pairs.items():
        correlation = np.mean(a * b) / np.sqrt(np.mean(a * a) * np.mean(b * b))
        assert abs(correlation) < 0.01, (name, correlation)
    assert (keep != np.asarray(keep_bits.dense(seed + 1, positions, length, heads, RATE))).any()


def test_blocks_and_shards_compute_the_reference_with_the_same_bits():
    """T=256 in blocks of 128 (two key blocks per query block, dQ summed over them), packed
    causal rows, dropout, under shard_map on a (data 2, tensor 2) mesh: each device one row and
    one head, whose bits are still those of its global row and head."""
    batch, length, heads, head_dim = 2, 256, 2, 8
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), jnp.float32)
               for _ in range(3))  # fmt: skip
    segments = np.ones((batch, length), np.int32)
    segments[1, 100:] = 2  # row 1: two packed sequences (across the block boundary), padding
    segments[1, 230:] = 0
    segments = jnp.asarray(segments)
    mask = AttentionMask.build(None, segments, position_ids(segments, batch, length, 0))
    rows = (mask.query_segments, mask.key_segments, mask.query_positions, mask.key_positions)
    seed = keep_bits.seed_words(jax.random.key(11))
    visible = reference.visible(*(np.asarray(a) for a in rows), 0, True)
    seen = visible.any(-1)[:, 0][:, :, None, None]
    cotangent = jnp.asarray(rng.normal(size=q.shape) * seen, jnp.float32)
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    partition = jax.sharding.PartitionSpec("data", None, "tensor", None)

    def sharded(q, k, v):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return flash_dropout.attention(
                q, k, v, *rows, seed, RATE, causal=True, interpret=True, partition=partition,
                block=128,
            )  # fmt: skip

    @jax.jit
    def forward_backward(q, k, v):
        out, pullback = jax.vjp(sharded, q, k, v)
        return out, pullback(cotangent)

    with jax.set_mesh(mesh):
        out, grads = forward_backward(q, k, v)
    spec = AttentionSpec(batch, length, length, heads, head_dim, causal=True, dropout=True)
    keep = reference.hashed_keep(seed, mask.query_positions, length, heads, RATE)
    want, want_grads = reference.attention(spec, q, k, v, visible, keep, RATE, None, cotangent)
    np.testing.assert_allclose(np.where(seen, out, 0), np.where(seen, want, 0), atol=3e-6)
    for which, got, expected in zip("qkv", grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=5e-6, err_msg=which)
