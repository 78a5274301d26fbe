"""LAMB's trust ratio (You et al. 2020, "Large Batch Optimization for Deep Learning", Alg. 2),
taken per weight matrix even where bertjax stacks several matrices in one leaf.

The reference scales each variable's update u (Adam direction plus decoupled weight decay) by
||w|| / ||u|| (1 where either norm is 0) and leaves some variables out: ALBERT's LAMB
(google-research/albert ``lamb_optimizer.py``, built in ``optimization.py`` with
``exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]``, which its
``exclude_from_layer_adaptation`` defaults to) and NVIDIA apex's FusedLAMB (adaptation only in
parameter groups with weight decay, unless ``use_nvlamb``) give biases and LayerNorm parameters a
ratio of 1. A variable there is one layer's matrix; bertjax keeps a scanned encoder's layers in one
leaf with a leading ``layers`` axis and an MoE layer's experts in one leaf with a leading ``expert``
axis, so the norms here run over each slice of those leading axes: the ratio the reference would
give each layer's / expert's matrix.

Deliberate deviation from ALBERT's code: the Adam moments before the ratio are bias-corrected, as
in the LAMB paper's Algorithm 2 and apex (``bias_correction=True``); ALBERT's TF code omits it.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def block_norms(x: jax.Array, stacked_axes: int) -> jax.Array:
    """L2 norm of each slice over the leading ``stacked_axes`` axes, shaped to broadcast on x."""
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    axes = tuple(range(stacked_axes, x.ndim))
    return jnp.sqrt(jnp.sum(jnp.square(x.astype(dtype)), axis=axes, keepdims=True))


def scale_by_block_trust_ratio(
    adapts: Callable[[tuple], bool], stacked_axes: Callable[[tuple, jax.Array], int]
) -> optax.GradientTransformation:
    """Multiplies each adapted leaf's update by ||w|| / ||u|| per stacked slice (stateless).

    ``adapts(path)``: whether the parameter takes a trust ratio (False: ratio 1).
    ``stacked_axes(path, leaf)``: how many leading axes index separate matrices (0: one matrix).
    """

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("the LAMB trust ratio needs the parameters: call tx.update(g, s, p)")

        def scale(path, update, param):
            if not adapts(path):
                return update
            axes = stacked_axes(path, param)
            param_norm, update_norm = block_norms(param, axes), block_norms(update, axes)
            ratio = jnp.where(
                (param_norm > 0) & (update_norm > 0),
                param_norm / jnp.where(update_norm > 0, update_norm, 1.0),
                1.0,
            )
            return update * ratio.astype(update.dtype)

        return jax.tree_util.tree_map_with_path(scale, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)
