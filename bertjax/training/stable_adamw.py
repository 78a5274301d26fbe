"""StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
vision-language models", arXiv 2304.13013) as ModernBERT trains with it, and Kahan-compensated
updates for low-precision parameters.

ModernBERT's ``decoupled_stableadamw`` (AnswerDotAI/ModernBERT ``main.py::build_optimizer``,
``src/optimizer.py``) is optimi's StableAdamW with ``decouple_lr=True`` and ``max_lr`` = the
configured (peak) LR. Per tensor, at step t with scheduled LR lr_t:

    m_hat, v_hat   bias-corrected Adam moments of g_t (b1, b2)
    RMS_t  = sqrt(mean(g_t^2 / max(v_hat, eps^2)))        (over the tensor)
    eta_t  = lr_t / max(1, RMS_t)                          (update clipping, per tensor)
    p     <- p * (1 - (eta_t / lr_max) * wd) - eta_t * m_hat / (sqrt(v_hat) + eps)

so the weight decay is "fully decoupled": ``wd`` is the decay per step at the peak LR, not a
coefficient multiplied by the LR as in AdamW (optimi's docs: wd 1e-5 fully decoupled ~ AdamW 1e-2
at lr 1e-3). ModernBERT's decay is also divided by the clipping factor max(1, RMS_t), since it
uses eta_t; Wortsman et al.'s reference gist (``StableAdamWUnfused``) decays with the unclipped
LR, p *= 1 - lr_t * wd. This module follows ModernBERT.

`scale_by_stable_adam` returns (m_hat / (sqrt(v_hat) + eps) + (wd / lr_max) * p) / max(1, RMS_t)
and the chain's ``scale_by_learning_rate`` multiplies it by -lr_t, which is exactly the update
above. The decay term is added only where ``decays(path)`` holds (bertjax's `decays_weight`:
kernels and embedding tables; ModernBERT: every tensor except ndim <= 1 and ``*.bias``, the same
set for its architecture, also where bertjax stacks the 1-D LayerNorm scales of scanned layers).
A leaf that stacks several matrices (a scanned encoder's layers axis, an MoE expert axis) takes
one RMS per slice of those leading axes, the RMS the reference would compute for each layer's /
expert's tensor, as bertjax's LAMB does.

`kahan_summation` is a separate, last link of any chain: for bfloat16/float16 parameters it keeps
the rounding error of each parameter update in a buffer of the parameter's dtype (as optimi does)
and returns the update ``round(p + u + c) - p`` in float32. The whole update goes through it,
decay included (optimi multiplies the low-precision parameter by its decay factor directly).
``optax.apply_updates`` adds a low-precision parameter and a float32 update in float32 and casts
back, which gives ``round(p + u + c)`` exactly: that value is the float32 sum p + (u + c) rounded
to the parameter dtype, so its difference from p is exact in float32, except where the new value
exceeds 2^16 |p|, and there the float32 rounding error stays far below half a bfloat16 ulp of the
result (checked on random and adversarial cases in tests/optim_modern_test.py). Cast to bfloat16
the update would not be exact in general (it can need more than bfloat16's 8 significant bits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class ScaleByStableAdamState(NamedTuple):
    """Step count and the (not bias-corrected) moments, stored in each parameter's dtype."""

    count: jax.Array
    mu: Any
    nu: Any


def _compute_dtype(dtype) -> jnp.dtype:
    return jnp.promote_types(dtype, jnp.float32)


def scale_by_stable_adam(
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    max_learning_rate: float,
    decays: Callable[[tuple], bool],
    stacked_axes: Callable[[tuple, jax.Array], int],
) -> optax.GradientTransformation:
    """StableAdamW's direction, decay and per-tensor LR clipping, before the learning rate.

    ``decays(path)``: whether the leaf takes weight decay. ``stacked_axes(path, leaf)``: how many
    leading axes index separate tensors (one RMS each; 0: the whole leaf is one tensor).
    Moments are stored in the parameter dtype (as ``optax.scale_by_adam`` does); the arithmetic
    and the returned update are at least float32.
    """
    decay_per_lr = weight_decay / max_learning_rate

    def init_fn(params):
        zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.asarray(p).dtype)  # noqa: E731
        return ScaleByStableAdamState(
            jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params)
        )

    def update_fn(updates, state, params=None):
        if params is None and weight_decay > 0:
            raise ValueError("StableAdamW's weight decay needs the parameters: tx.update(g, s, p)")
        count = optax.safe_increment(state.count)
        if params is None:
            params = updates  # read only for weight decay, which needs the real ones

        def step(path, grad, mu, nu, param):
            dtype = _compute_dtype(grad.dtype)
            t = count.astype(dtype)
            g = grad.astype(dtype)
            mu = b1 * mu.astype(dtype) + (1 - b1) * g
            nu = b2 * nu.astype(dtype) + (1 - b2) * g * g
            mu_hat, nu_hat = mu / (1 - b1**t), nu / (1 - b2**t)
            over = tuple(range(stacked_axes(path, grad), grad.ndim))
            rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(nu_hat, eps**2), axis=over, keepdims=True))
            direction = mu_hat / (jnp.sqrt(nu_hat) + eps)
            if weight_decay > 0 and decays(path):
                direction = direction + decay_per_lr * param.astype(dtype)
            return direction / jnp.maximum(1.0, rms), mu, nu

        out = jax.tree_util.tree_map_with_path(step, updates, state.mu, state.nu, params)
        treedef = jax.tree.structure(updates)
        leaves = treedef.flatten_up_to(out)
        new_updates, mu, nu = (treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(3))
        cast = lambda new, old: new.astype(old.dtype)  # noqa: E731
        mu, nu = jax.tree.map(cast, mu, state.mu), jax.tree.map(cast, nu, state.nu)
        return new_updates, ScaleByStableAdamState(count, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


class KahanState(NamedTuple):
    """Per-leaf rounding error not yet applied: parameter-shaped for bfloat16/float16
    parameters, a float32 scalar 0 placeholder for the others."""

    compensation: Any


def _low_precision(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32


def kahan_summation() -> optax.GradientTransformation:
    """Kahan-compensated parameter updates for low-precision parameters; must come last in the
    chain (a later scaling would break the exactness described in the module docstring)."""

    def init_fn(params):
        def zeros(p):
            p = jnp.asarray(p)
            return jnp.zeros_like(p) if _low_precision(p.dtype) else jnp.zeros((), jnp.float32)

        return KahanState(jax.tree.map(zeros, params))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("Kahan summation needs the parameters: call tx.update(g, s, p)")

        def one(update, compensation, param):
            if not _low_precision(param.dtype):
                return update, compensation
            wide = param.astype(jnp.float32)
            total = update.astype(jnp.float32) + compensation.astype(jnp.float32)
            applied = (wide + total).astype(param.dtype).astype(jnp.float32) - wide
            return applied, (total - applied).astype(compensation.dtype)

        out = jax.tree.map(one, updates, state.compensation, params)
        treedef = jax.tree.structure(updates)
        leaves = treedef.flatten_up_to(out)
        applied = treedef.unflatten([leaf[0] for leaf in leaves])
        compensation = treedef.unflatten([leaf[1] for leaf in leaves])
        return applied, KahanState(compensation)

    return optax.GradientTransformation(init_fn, update_fn)
