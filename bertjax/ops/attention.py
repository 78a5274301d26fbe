"""Softmax attention with a hand-written backward, in independent row chains (XLA:CPU).

`attention` is what the model runs on the CPU (`bertjax.modeling.attention` dispatches); its
reference, `exact_attention`, is the same maths under autodiff.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def attention(
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    mask: Array,
    keep: Array | None = None,
    rate: float = 0.0,
    chains: int = 1,
) -> Array:
    """Softmax attention with a hand-written backward: ``softmax(q k^T / sqrt(H) | mask) v``,
    the probabilities dropped where ``keep`` (boolean, [B, N, T, S]) is False and the rest
    scaled by 1 / (1 - rate), as `exact_attention` with a dropout.

    The products run head-major ([B, N, T, H]: one transpose of q, k, v in and of the context
    out), and the backward is the four products of the softmax's closed-form gradient from the
    saved probabilities. ``chains`` splits the rows into that many independent computations,
    strided (rows c, c + chains, ...) so a row-sharded batch stays local: XLA:CPU runs a batched
    product of 128 x 64 matrices on one core, and independent chains let its executor keep the
    other cores busy (benchmarks/step/attention_cpu.py measures each variant).
    ``mask``: boolean, broadcastable to [B, N, T, S] with a batch axis of 1 or B.
    """
    batch = q_BTNH.shape[0]
    if chains <= 1 or batch % chains:
        return _attention(rate, q_BTNH, k_BSNH, v_BSNH, mask, keep)

    def part(a, c):
        return (
            a
            if a is None or a.shape[0] == 1
            else a.reshape(batch // chains, chains, *a.shape[1:])[:, c]
        )

    outs = [
        _attention(rate, *(part(a, c) for a in (q_BTNH, k_BSNH, v_BSNH, mask, keep)))
        for c in range(chains)
    ]
    return jnp.stack(outs, axis=1).reshape(q_BTNH.shape)


def cpu_chains(batch: int) -> int:
    """How many independent row groups `attention` splits a batch into on the CPU:
    the largest divisor of ``batch`` up to the cores each CPU device has (the cores this process
    may run on over its CPU devices: where calls run side by side on several devices, one chain
    each was faster, docs/results/inference.md 2026-12-05 late; at most 8; measured on 2 cores)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    devices = len(jax.local_devices(backend="cpu"))
    cores = min(max((usable or 1) // devices, 1), 8, batch)
    return max(d for d in range(1, cores + 1) if batch % d == 0)


def _heads_major(a: Array) -> Array:
    return jnp.transpose(a, (0, 2, 1, 3))


def _batched(a: Array, b: Array, a_axis: int, b_axis: int) -> Array:
    """Per (batch, head) product contracting ``a_axis`` of a with ``b_axis`` of b, in fp32 (or
    wider)."""
    return jax.lax.dot_general(
        a,
        b,
        (((a_axis,), (b_axis,)), ((0, 1), (0, 1))),
        preferred_element_type=jnp.promote_types(a.dtype, jnp.float32),
    )


def _dropped(probs: Array, keep: Array | None, rate: float) -> Array:
    return probs if keep is None else jnp.where(keep, probs / (1.0 - rate), 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(rate, q, k, v, mask, keep):
    return _attention_fwd(rate, q, k, v, mask, keep)[0]


def _attention_fwd(rate, q, k, v, mask, keep):
    scale = jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
    q_BNTH, k_BNSH, v_BNSH = _heads_major(q * scale), _heads_major(k), _heads_major(v)
    logits = _batched(q_BNTH, k_BNSH, 3, 3)
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(logits.dtype).min), axis=-1)
    ctx_BNTH = _batched(_dropped(probs, keep, rate).astype(v.dtype), v_BNSH, 3, 2)
    return _heads_major(ctx_BNTH.astype(v.dtype)), (q_BNTH, k_BNSH, v_BNSH, probs, mask, keep)


def _attention_bwd(rate, residuals, g_BTNH):
    q_BNTH, k_BNSH, v_BNSH, probs, mask, keep = residuals
    dtype = q_BNTH.dtype
    g_BNTH = _heads_major(g_BTNH.astype(dtype))
    d_v = _batched(_dropped(probs, keep, rate).astype(dtype), g_BNTH, 2, 2)
    d_probs = _dropped(_batched(g_BNTH, v_BNSH, 3, 3), keep, rate)
    d_logits = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
    d_logits = jnp.where(mask, d_logits, 0.0).astype(dtype)  # fully masked rows: no gradient
    d_q = _batched(d_logits, k_BNSH, 3, 2) * (q_BNTH.shape[-1] ** -0.5)
    d_k = _batched(d_logits, q_BNTH, 2, 2)
    return (
        *(_heads_major(d.astype(dtype)) for d in (d_q, d_k, d_v)),
        _no_gradient(mask),
        _no_gradient(keep),
    )


def _no_gradient(a: Array | None):
    """The cotangent of a boolean input (float0 zeros), or None for an absent one."""
    return None if a is None else np.zeros(a.shape, jax.dtypes.float0)


_attention.defvjp(_attention_fwd, _attention_bwd)
