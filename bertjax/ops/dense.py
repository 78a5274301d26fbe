"""The encoder's dense products, with hand-written backward passes.

`project` serves every Dense layer (through nn.Dense's ``dot_general`` hook), the Q/K/V and
attention-output projections; `tied_decoder` the MLM decoder against the word-embedding table.
Both take an optional operand dtype (BertConfig.matmul_dtype): bf16 products that accumulate in
the activations' dtype. Why each backward is written by hand, and what it saved, is in
docs/results/step.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from bertjax.ops import platform

Array = jax.Array


def project(x: Array, *kernels: Array, operand_dtype=None) -> tuple:
    """``x @ kernel`` for each 2-D kernel, [..., I] -> [..., O_k]; on XLA:CPU with a hand-written
    backward, elsewhere the plain products under autodiff (GPU/TPU GEMMs read a transposed
    operand directly, and XLA fuses around them).

    The kernels' gradients contract over all rows of x (tokens): XLA:CPU hands such products
    to Eigen after a slow transpose of whichever operand autodiff put first, often the wider
    one. Here the narrower operand is transposed, once for all kernels that share x (Q/K/V
    share one transpose), and the product is a plain row-major one; the optimization barrier
    keeps XLA from folding the transpose back into the product.

    ``operand_dtype`` (BertConfig.matmul_dtype), when given, is the dtype the products read
    (x, kernels and, in the backward, the output gradients are cast to it) while they accumulate
    and return in x's dtype (the kernels' gradients in the kernels' dtype): bfloat16 products
    with float32 activations, as a TPU computes float32 matmuls at default precision.
    """
    operand = None if operand_dtype is None else jnp.dtype(operand_dtype)
    if platform.on_cpu():
        return _project(operand, x, *kernels)
    return tuple(_dot(x, kernel, ((x.ndim - 1,), (0,)), x.dtype, operand) for kernel in kernels)


def _dot(a: Array, b: Array, contract: tuple, out_dtype, operand) -> Array:
    """A 2-operand product over ((a's axes), (b's axes)), read in ``operand`` dtype if given.
    On the CPU it accumulates in float32 (or wider) and rounds to ``out_dtype`` after: XLA:CPU
    runs a product with a bfloat16 result as a float32 product of upcast operands, ~6x slower
    than bfloat16 operands into a float32 result (docs/results/inference.md, 2026-12-05 late)."""
    if operand is not None:
        a, b = a.astype(operand), b.astype(operand)
    accumulate = jnp.promote_types(out_dtype, jnp.float32) if platform.on_cpu() else out_dtype
    y = jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=accumulate)
    return y.astype(out_dtype)


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
    x_RI = x.reshape(-1, width)
    x_IR = None
    d_x, d_kernels = None, []
    for kernel, kernel_dtype, g in zip(kernels, kernel_dtypes, grads):
        if operand is not None:
            g = g.astype(operand)
        g_RO = g.reshape(-1, g.shape[-1])
        d = _dot(g, kernel, ((g.ndim - 1,), (1,)), x_dtype, None)
        d_x = d if d_x is None else d_x + d
        if width <= kernel.shape[1]:  # transpose x (shared): [I, R] @ [R, O]
            if x_IR is None:
                x_IR = jax.lax.optimization_barrier(x_RI.T)
            d_kernel = _dot(x_IR, g_RO, ((1,), (0,)), kernel_dtype, None)
        else:  # transpose the narrower gradient: ([O, R] @ [R, I]).T
            g_OR = jax.lax.optimization_barrier(g_RO.T)
            d_kernel = jax.lax.optimization_barrier(
                _dot(g_OR, x_RI, ((1,), (0,)), kernel_dtype, None)
            ).T
        d_kernels.append(d_kernel)
    return (d_x, *d_kernels)


_project.defvjp(_project_fwd, _project_bwd)


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


def tied_decoder(x: Array, table_VW: Array, bias_V: Array, operand_dtype=None) -> Array:
    """``x @ table.T + bias`` over the vocabulary, [..., W] -> [..., V]; on XLA:CPU with a
    hand-written backward (elsewhere autodiff's): the table's gradient as one [V, R] x [R, W]
    product and the bias's as ones x [R, V] (R = rows of x, W = embedding width). XLA:CPU's own
    transpose of the einsum reduced the bias gradient over rows and re-laid the logits gradient out.

    ``operand_dtype`` (BertConfig.matmul_dtype): the logits and x's gradient are products read
    in that dtype, accumulated in x's; the table's gradient stays a product in x's dtype (in
    bfloat16 XLA:CPU runs that [V, R] x [R, W] shape slower than in float32).
    """
    operand = None if operand_dtype is None else jnp.dtype(operand_dtype)
    if platform.on_cpu():
        return _tied_decoder(operand, x, table_VW, bias_V)
    return _dot(x, table_VW, ((x.ndim - 1,), (1,)), x.dtype, operand) + bias_V


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tied_decoder(operand, x, table_VW, bias_V):
    return _dot(x, table_VW, ((x.ndim - 1,), (1,)), x.dtype, operand) + bias_V


def _tied_decoder_fwd(operand, x, table_VW, bias_V):
    table = table_VW if operand is None else table_VW.astype(operand)
    return _tied_decoder(operand, x, table_VW, bias_V), (x, table, jnp.zeros((0,), table_VW.dtype))


def _tied_decoder_bwd(operand, residuals, g):
    x, table_VW, table_dtype = residuals
    table_dtype = table_dtype.dtype
    g_RV = g.reshape(-1, g.shape[-1])
    x_RW = x.reshape(-1, x.shape[-1])
    d_x = _dot(g, table_VW, ((g.ndim - 1,), (0,)), x.dtype, operand)
    d_table = (g_RV.T @ x_RW).astype(table_dtype)
    d_bias = jnp.ones((g_RV.shape[0],), g.dtype) @ g_RV
    return d_x, d_table, d_bias


_tied_decoder.defvjp(_tied_decoder_fwd, _tied_decoder_bwd)
