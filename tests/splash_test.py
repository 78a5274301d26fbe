"""The TPU splash-attention path (bertjax/ops/splash.py), run in Pallas interpret mode on the CPU,
against the dense `exact_attention` at every row with a visible key: outputs and the gradients
w.r.t. q, k and v, on padded and packed rows, global and local layers, and a length that is not a
multiple of the kernel's 128-row blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.modeling.attention import AttentionMask, exact_attention
from bertjax.modeling.embeddings import position_ids
from bertjax.ops import splash

B, N, H = 2, 2, 64


def _batch(kind: str, length: int):
    """q, k, v [B, T, N, H] and the `AttentionMask` of padded or packed rows."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(B, length, N, H)), jnp.float32) for _ in range(3))
    if kind == "padded":  # row 1: trailing padding
        attention_mask = np.ones((B, length), np.int32)
        attention_mask[1, length * 3 // 4 :] = 0
        attention_mask = jnp.asarray(attention_mask)
        positions = position_ids(None, B, length, 0)
        mask = AttentionMask.build(attention_mask, None, positions)
    else:  # row 1: two packed sequences, then padding
        segments = np.ones((B, length), np.int32)
        segments[1, length * 3 // 8 :] = 2
        segments[1, length * 3 // 4 :] = 0
        segments = jnp.asarray(segments)
        mask = AttentionMask.build(None, segments, position_ids(segments, B, length, 0))
    return q, k, v, mask


def _real_rows(mask: AttentionMask, half_window: int, length: int) -> np.ndarray:
    """[B, T] True at the query rows that see at least one key."""
    visible = np.asarray(mask.dense(half_window)).any(-1)[:, 0]  # [B, T] or [B, 1]
    return np.broadcast_to(visible, (B, length))


CASES = [
    ("padded", 256, 0),
    ("padded", 256, 16),
    ("packed", 256, 0),
    ("packed", 256, 16),
    ("packed", 200, 16),  # padded inside up to 256
]


@pytest.mark.parametrize("kind,length,half_window", CASES)
def test_outputs_match_dense_reference(kind, length, half_window):
    q, k, v, mask = _batch(kind, length)
    out = jax.jit(
        lambda q, k, v: splash.attention(
            q, k, v, mask.query_segments, mask.key_segments, half_window, interpret=True
        )
    )(q, k, v)
    ref = exact_attention(q, k, v, mask.dense(half_window))
    assert out.shape == (B, length, N, H) and out.dtype == jnp.float32
    assert np.isfinite(np.asarray(out)).all()  # rows with no visible key too
    real = _real_rows(mask, half_window, length)
    if kind == "packed":
        assert not real.all()  # the padding queries of row 1 see nothing
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,length,half_window", CASES)
def test_gradients_match_dense_reference(kind, length, half_window):
    q, k, v, mask = _batch(kind, length)
    real = _real_rows(mask, half_window, length)
    rng = np.random.default_rng(1)
    cotangent = jnp.asarray(rng.normal(size=(B, length, N, H)) * real[:, :, None, None])
    cotangent = cotangent.astype(jnp.float32)

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v) * cotangent)

    grads = jax.jit(
        jax.grad(
            loss(
                lambda q, k, v: splash.attention(
                    q, k, v, mask.query_segments, mask.key_segments, half_window, interpret=True
                )
            ),
            argnums=(0, 1, 2),
        )
    )(q, k, v)
    dense = mask.dense(half_window)
    refs = jax.grad(loss(lambda q, k, v: exact_attention(q, k, v, dense)), argnums=(0, 1, 2))(
        q, k, v
    )
    for name, grad, ref in zip("qkv", grads, refs):
        grad, ref = np.asarray(grad), np.asarray(ref)
        scale = np.abs(ref).max()
        np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6 * scale, err_msg=name)


def test_sharded_call_matches_dense_reference_forward_and_backward():
    """Under ``shard_map`` on a (data 2, tensor 2) mesh of CPU devices (rows and heads split, as
    on a TPU slice): packed local causal rows, outputs and gradients equal the dense path."""
    q, k, v, mask = _batch("packed", 256)
    half_window = 16
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    partition = jax.sharding.PartitionSpec("data", None, "tensor", None)
    real = _real_rows(mask, half_window, 256)
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape) * real[:, :, None, None])
    cotangent = cotangent.astype(jnp.float32)

    def sharded(q, k, v):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return splash.attention(
                q, k, v, mask.query_segments, mask.key_segments, half_window,
                interpret=True, causal=True, partition=partition,
            )  # fmt: skip

    def loss_and_output(attend):
        return lambda q, k, v: (jnp.sum(attend(q, k, v) * cotangent), attend(q, k, v))

    step = jax.value_and_grad(loss_and_output(sharded), argnums=(0, 1, 2), has_aux=True)
    with jax.set_mesh(mesh):
        (_, out), grads = jax.jit(step)(q, k, v)
    dense = mask.dense(half_window, True)
    exact = loss_and_output(lambda q, k, v: exact_attention(q, k, v, dense))
    (_, ref), refs = jax.value_and_grad(exact, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], rtol=1e-5, atol=1e-6)
    for name, grad, want in zip("qkv", grads, refs):
        want = np.asarray(want)
        np.testing.assert_allclose(
            np.asarray(grad), want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=name
        )


def test_batch_axes_that_do_not_divide_the_batch_are_dropped_and_said(caplog):
    """Inside shard_map each device attends over its rows: of (data=2, fsdp=4), the axes that
    divide the batch, the most devices possible; a batch of 1 (the init) replicates silently."""
    mesh = jax.sharding.AbstractMesh((2, 4), ("data", "fsdp"))
    axes = ("data", "fsdp")
    with jax.sharding.use_abstract_mesh(mesh), caplog.at_level("WARNING"):
        assert splash._dividing(axes, 16, "batch") == axes  # 8 devices divide 16 rows
        assert caplog.records == []
        assert splash._dividing(axes, 12, "batch") == ("fsdp",)  # 4 divides 12, 8 does not
        assert "not split over ['data']" in caplog.records[-1].getMessage()
        assert splash._dividing(axes, 6, "batch") == ("data",)
        assert "4 times its share" in caplog.records[-1].getMessage()  # fsdp's 4 left out
        caplog.clear()
        assert splash._dividing(axes, 1, "batch") is None  # the init's one row: nothing said
        assert caplog.records == []
