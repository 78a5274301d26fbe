"""The encoder's dense products, with hand-written backward passes.

`project` serves every Dense layer (through nn.Dense's ``dot_general`` hook), the Q/K/V and
attention-output projections; `tied_decoder` the MLM decoder against the word-embedding table.
Both take an optional operand dtype (BertConfig.matmul_dtype): bf16 products that accumulate in
the activations' dtype. `attention` is the softmax attention the model runs on the CPU, with a
hand-written backward; `exact_attention` the same maths under autodiff.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def project(x: Array, *kernels: Array, operand_dtype=None) -> tuple:
    """``x @ kernel`` for each 2-D kernel, [..., K] -> [..., N_i], with a hand-written backward.

    The kernels' gradients contract over all rows of x (tokens): XLA:CPU hands such products
    to Eigen after a transpose of whichever operand autodiff put first, often the wider one
    (its transposes run at ~1 GB/s: 16 ms for a [4096, 1024] fp32 gradient). Here the narrower
    operand is transposed, once for all kernels that share x, and the product is a plain
    row-major one; the optimization barrier keeps XLA from folding the transpose back into the
    product. BERT-mini's step: Q/K/V share one transpose of x. On GPU/TPU the kernel gradient
    is the plain transposed-operand product, as autodiff writes it.

    ``operand_dtype`` (BertConfig.matmul_dtype), when given, is the dtype the products read
    (x, kernels and, in the backward, the output gradients are cast to it) while they accumulate
    and return in x's dtype (the kernels' gradients in the kernels' dtype): bfloat16 products
    with float32 activations, as a TPU computes float32 matmuls at default precision.
    """
    operand = None if operand_dtype is None else jnp.dtype(operand_dtype)
    return _project(operand, x, *kernels)


def _dot(a: Array, b: Array, contract: tuple, out_dtype, operand) -> Array:
    """A 2-operand product over ((a's axes), (b's axes)), read in ``operand`` dtype if given."""
    if operand is not None:
        a, b = a.astype(operand), b.astype(operand)
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _project(operand, x, *kernels):
    return tuple(_dot(x, kernel, ((x.ndim - 1,), (0,)), x.dtype, operand) for kernel in kernels)


def _project_fwd(operand, x, *kernels):
    saved = [a if operand is None else a.astype(operand) for a in (x, *kernels)]
    # the dtypes to return in, carried as empty arrays (residuals must be arrays)
    dtypes = [jnp.zeros((0,), a.dtype) for a in (x, *kernels)]
    return _project(operand, x, *kernels), (saved[0], tuple(saved[1:]), dtypes)


def _project_bwd(operand, residuals, grads):
    x, kernels, dtypes = residuals
    x_dtype, kernel_dtypes = dtypes[0].dtype, [d.dtype for d in dtypes[1:]]
    width = x.shape[-1]
    x_RK = x.reshape(-1, width)
    x_KR = None
    d_x, d_kernels = None, []
    for kernel, kernel_dtype, g in zip(kernels, kernel_dtypes, grads):
        if operand is not None:
            g = g.astype(operand)
        g_RN = g.reshape(-1, g.shape[-1])
        d = _dot(g, kernel, ((g.ndim - 1,), (1,)), x_dtype, None)
        d_x = d if d_x is None else d_x + d
        if not _transpose_explicitly():  # GPU/TPU: their GEMMs read a transposed operand
            d_kernel = _dot(x_RK, g_RN, ((0,), (0,)), kernel_dtype, None)
        elif width <= kernel.shape[1]:  # transpose x (shared): [K, R] @ [R, N]
            if x_KR is None:
                x_KR = jax.lax.optimization_barrier(x_RK.T)
            d_kernel = _dot(x_KR, g_RN, ((1,), (0,)), kernel_dtype, None)
        else:  # transpose the narrower gradient: ([N, R] @ [R, K]).T
            g_NR = jax.lax.optimization_barrier(g_RN.T)
            d_kernel = jax.lax.optimization_barrier(
                _dot(g_NR, x_RK, ((1,), (0,)), kernel_dtype, None)
            ).T
        d_kernels.append(d_kernel)
    return (d_x, *d_kernels)


_project.defvjp(_project_fwd, _project_bwd)


def _transpose_explicitly() -> bool:
    """Whether project's backward transposes an operand itself: on XLA:CPU (see project);
    accelerators' matmuls take either operand transposed, and a barrier would only cost them a
    materialised copy."""
    return jax.default_backend() == "cpu"


def dense_dot_general(
    lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, operand_dtype=None
):
    """nn.Dense's product through `project` (its one case: lhs's last axis with rhs's first)."""
    if (
        precision is None
        and preferred_element_type is None
        and rhs.ndim == 2
        and dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ()))
    ):
        return project(lhs, rhs, operand_dtype=operand_dtype)[0]
    return jax.lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )


def tied_decoder(x: Array, table_VE: Array, bias_V: Array, operand_dtype=None) -> Array:
    """``x @ table.T + bias`` over the vocabulary, [..., E] -> [..., V], with a hand-written
    backward: the table's gradient as one [V, R] x [R, E] product and the bias's as ones x
    [R, V] (R = rows of x). XLA:CPU's own transpose of the einsum reduced the bias gradient over
    rows and re-laid the logits gradient out, ~100 ms of a 950 ms BERT-mini step.

    ``operand_dtype`` (BertConfig.matmul_dtype): the logits and x's gradient are products read
    in that dtype, accumulated in x's; the table's gradient stays a product in x's dtype (in
    bfloat16 XLA:CPU runs that [V, R] x [R, E] shape slower than in float32).
    """
    operand = None if operand_dtype is None else jnp.dtype(operand_dtype)
    return _tied_decoder(operand, x, table_VE, bias_V)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tied_decoder(operand, x, table_VE, bias_V):
    return _dot(x, table_VE, ((x.ndim - 1,), (1,)), x.dtype, operand) + bias_V


def _tied_decoder_fwd(operand, x, table_VE, bias_V):
    table = table_VE if operand is None else table_VE.astype(operand)
    return _tied_decoder(operand, x, table_VE, bias_V), (x, table, jnp.zeros((0,), table_VE.dtype))


def _tied_decoder_bwd(operand, residuals, g):
    x, table_VE, table_dtype = residuals
    table_dtype = table_dtype.dtype
    g_RV = g.reshape(-1, g.shape[-1])
    x_RE = x.reshape(-1, x.shape[-1])
    d_x = _dot(g, table_VE, ((g.ndim - 1,), (0,)), x.dtype, operand)
    d_table = (g_RV.T @ x_RE).astype(table_dtype)
    d_bias = jnp.ones((g_RV.shape[0],), g.dtype) @ g_RV
    return d_x, d_table, d_bias


_tied_decoder.defvjp(_tied_decoder_fwd, _tied_decoder_bwd)


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
    other cores busy (BERT-mini's four layers on 2 cores, forward + backward: 88 ms for
    autodiff of exact_attention, 76 ms here with one chain, 66 ms with two).
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
    the largest divisor of ``batch`` up to the cores this process may run on (at most 8;
    measured on 2 cores only)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = min(usable or 1, 8, batch)
    return max(d for d in range(1, cores + 1) if batch % d == 0)


def exact_attention(
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    mask: Array,
    keep: Array | None = None,
    rate: float = 0.0,
) -> Array:
    """Softmax attention in fp32, autodiff's backward: what `attention` computes (``keep`` and
    ``rate`` the same optional dropout on the probabilities); the model's path off the CPU
    when dropout is active (jax.nn.dot_product_attention has none)."""
    logits = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH).astype(jnp.float32)
    logits = logits / jnp.sqrt(jnp.float32(q_BTNH.shape[-1]))
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", _dropped(probs, keep, rate).astype(v_BSNH.dtype), v_BSNH)


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
