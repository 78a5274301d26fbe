"""Which parameters get what: weight-decay masks, the stacked axes of scanned layers and MoE
experts (per-slice trust ratios and update clipping), and layer-wise LR decay factors.

Paths are flax parameter paths; a leaf's depth counts embeddings as 0, layer i as i + 1 and
everything above the encoder as L + 1 (BEiT's convention) or L + 2 (ELECTRA's).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax

from bertjax.modeling import moe
from bertjax.modeling.bert_config import BertConfig

# Depth of the parameters above the last layer (heads, pooler, final norm) for layer-wise decay:
# BEiT's L+1 (the top layer gets decay^1) or ELECTRA's L+2 (the top layer gets decay^2).
LAYERWISE_CONVENTIONS = {"beit": 1, "electra": 2}
_EMBEDDINGS = "embeddings"
_ENCODER = "encoder"


def _names(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", str(k))) for k in path)


def decays_weight(path) -> bool:
    """True for kernels and embedding tables; False for biases, LayerNorm scale/bias and a learned
    contrastive temperature (``logit_scale``, which CLIP also leaves undecayed)."""
    names = _names(path)
    if names[-1].endswith("bias") or names[-1] == "logit_scale":
        return False
    return not any("norm" in n for n in names[:-1])


def weight_decay_mask(params) -> Any:
    """Pytree of bools: which leaves receive weight decay."""
    return jax.tree_util.tree_map_with_path(lambda p, _: decays_weight(p), params)


def stacked_axes(path, leaf, model_cfg: BertConfig) -> int:
    """How many leading axes of a leaf index separate weight matrices: a scanned stack's layers
    axis (``encoder/layers``), then an MoE feed-forward's expert axis (`moe.EXPERT_PARAMS`)."""
    names, shape = _names(path), np.shape(leaf)
    axes = []
    if _ENCODER in names and names[names.index(_ENCODER) + 1 :][:1] == ("layers",):
        axes.append(("layers", model_cfg.num_groups))
    if model_cfg.num_experts and names[-2:-1] == ("mlp",) and names[-1] in moe.EXPERT_PARAMS:
        axes.append(("expert", model_cfg.num_experts))
    for i, (name, size) in enumerate(axes):
        if len(shape) <= i or shape[i] != size:
            raise ValueError(
                f"parameter {'/'.join(names)} has shape {shape}: expected its axis {i} to be "
                f"the {name} axis of size {size}"
            )
    return len(axes)


def layer_depth(path, model_cfg: BertConfig, convention: str = "beit"):
    """Depth of a parameter: embeddings 0, layer i i+1, everything above the encoder (heads,
    pooler, final norm) L+1 ("beit") or L+2 ("electra"); an array for scanned stacks.

    BEiT (``get_num_layer_for_vit``) puts the heads at L+1; ELECTRA's ``_get_layer_lrs``
    (google-research/electra model/optimization.py) at L+2, one more decay step below the top layer.
    An ALBERT group serves layers g*r .. (g+1)*r-1 (r = L/G) and takes the depth of the deepest
    one, (g+1)*r: its gradient sums over all its uses, the top use sits nearest the loss, and
    with G = L this is exactly per-layer decay.
    """
    names = _names(path)
    layers = model_cfg.num_hidden_layers
    top = layers + LAYERWISE_CONVENTIONS[convention]
    repeats = layers // model_cfg.num_groups
    if _EMBEDDINGS in names:
        return 0
    if _ENCODER in names:
        child = names[names.index(_ENCODER) + 1]
        if child == "layers":  # scanned: leading axis indexes the groups
            return (np.arange(model_cfg.num_groups) + 1) * repeats
        if child.startswith("layer_") and child[len("layer_") :].isdigit():
            return (int(child[len("layer_") :]) + 1) * repeats
        if child == "final_norm":
            return top
        raise ValueError(f"layer-wise LR decay: no depth rule for parameter {'/'.join(names)}")
    return top


def layerwise_lr_factors(
    params, model_cfg: BertConfig, decay: float, convention: str = "beit"
) -> Any:
    """Per-leaf LR factors decay^(top-depth), top = L+1 ("beit") or L+2 ("electra"); stacked
    leaves get a [G,1,...] array."""
    top = model_cfg.num_hidden_layers + LAYERWISE_CONVENTIONS[convention]

    def factor(path, leaf):
        depth = layer_depth(path, model_cfg, convention)
        if isinstance(depth, np.ndarray):
            values = np.asarray(decay, np.float64) ** (top - depth)
            if np.shape(leaf)[0] != depth.shape[0]:
                raise ValueError(
                    f"stacked parameter {'/'.join(_names(path))} has leading axis "
                    f"{np.shape(leaf)[0]}, expected num_groups={depth.shape[0]}"
                )
            return values.astype(np.float32).reshape((-1,) + (1,) * (np.ndim(leaf) - 1))
        return np.float32(decay ** (top - depth))

    return jax.tree_util.tree_map_with_path(factor, params)


def scale_by_layerwise_factors(
    model_cfg: BertConfig, decay: float, convention: str = "beit"
) -> optax.GradientTransformation:
    """Multiplies each update by its layer-wise LR factor (stateless)."""

    def update_fn(updates, state, params=None):
        del params
        factors = layerwise_lr_factors(updates, model_cfg, decay, convention)
        return jax.tree.map(lambda u, f: u * f.astype(u.dtype), updates, factors), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)
