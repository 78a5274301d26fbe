"""Optimizers for pretraining: AdamW/LAMB/Adafactor, schedules, LR scaling, layer-wise LR decay.

Built from the ``config.optim`` ConfigDict (see `default_optim_config`). The update chain is
clip -> moment scaling -> decoupled weight decay (kernels and embedding tables only) ->
[LAMB trust ratio, kernels and embedding tables only, per layer / per expert: `lamb`] ->
learning rate (schedule x batch-size scaling) -> layer-wise factors, so the layer-wise factor
multiplies the whole update, weight decay included (as in ELECTRA).

Batch-size scaling: "linear" and "sqrt" change only the learning rate; "sqrt_adam" is Malladi et
al. 2022's square-root rule for Adam ("On the SDEs and Scaling Rules for Adaptive Gradient
Algorithms", NeurIPS), which at kappa = batch / base_batch_size also moves the moment decays and
epsilon: lr * sqrt(kappa), b = 1 - kappa * (1 - b) for b1 and b2, eps / sqrt(kappa).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax.modeling import moe
from bertjax.modeling.bert_config import BertConfig
from bertjax.training.lamb import scale_by_block_trust_ratio

OPTIMIZERS = ("adamw", "lamb", "adafactor")
SCHEDULES = ("linear", "cosine", "constant", "wsd")
LR_SCALINGS = {"none": 0.0, "linear": 1.0, "sqrt": 0.5, "sqrt_adam": 0.5}
# Depth of the parameters above the last layer (heads, pooler, final norm) for layer-wise decay:
# BEiT's L+1 (the top layer gets decay^1) or ELECTRA's L+2 (the top layer gets decay^2).
LAYERWISE_CONVENTIONS = {"beit": 1, "electra": 2}
# Subtrees that sit above the last encoder layer: pooler, MLM/NSP heads, classifiers, final norm.
_EMBEDDINGS = "embeddings"
_ENCODER = "encoder"


def default_optim_config() -> ml_collections.ConfigDict:
    """The ``config.optim`` defaults: AdamW, linear warmup + linear decay (BERT's recipe)."""
    c = ml_collections.ConfigDict()
    c.name = "adamw"  # "adamw" | "lamb" | "adafactor" (adafactor ignores b1, b2, eps)
    c.learning_rate = 1e-4  # base (peak) LR at base_batch_size, before batch-size scaling
    c.base_batch_size = 256  # global batch size at which learning_rate was tuned
    # batch-size rule: "none" | "linear" (Goyal et al. 2017) | "sqrt" (LR only) | "sqrt_adam"
    # (Malladi et al. 2022: LR x sqrt(k), b1/b2 = 1 - k(1 - b), eps / sqrt(k), k = batch/base)
    c.lr_scaling = "none"
    c.schedule = "linear"  # "linear" | "cosine" | "constant" | "wsd" (warmup-stable-decay)
    c.total_steps = 10_000  # steps the schedule spans (decay ends here)
    c.warmup_steps = 0  # warmup length in steps; when > 0 it overrides warmup_fraction
    c.warmup_fraction = 0.01  # warmup length as a fraction of total_steps (used if warmup_steps=0)
    c.decay_fraction = 0.1  # wsd only: final fraction of total_steps that decays linearly
    c.end_lr_fraction = 0.0  # LR at total_steps as a fraction of the peak LR
    c.weight_decay = 0.01  # decoupled weight decay; never applied to biases or LayerNorm
    c.b1 = 0.9  # first-moment decay
    c.b2 = 0.999  # second-moment decay
    c.eps = 1e-6  # added to the RMS denominator
    c.clip_norm = 1.0  # global-norm gradient clipping threshold (0: off)
    c.layerwise_lr_decay = 1.0  # per-layer LR factor decay^(top-depth) (1.0: off)
    # depths for layerwise_lr_decay: "beit" (heads L+1) | "electra" (heads L+2, as its fine-tuning)
    c.layerwise_lr_convention = "beit"
    c.grad_accum_steps = 1  # microbatches per step; the global batch is split k ways in the step
    return c


def _require(ok: bool, key: str, value: Any, need: str) -> None:
    if not ok:
        raise ValueError(f"config.optim.{key}={value!r}: {need}")


def validate_optim_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first invalid ``config.optim`` key."""
    known = set(default_optim_config().keys())
    unknown = sorted(set(config.keys()) - known)
    if unknown:
        raise ValueError(f"unknown config.optim key(s) {unknown}; known keys: {sorted(known)}")
    missing = sorted(known - set(config.keys()))
    if missing:
        raise ValueError(
            f"config.optim is missing key(s) {missing}; start from default_optim_config()"
        )
    c = config
    _require(c.name in OPTIMIZERS, "name", c.name, f"must be one of {OPTIMIZERS}")
    _require(c.schedule in SCHEDULES, "schedule", c.schedule, f"must be one of {SCHEDULES}")
    _require(
        c.lr_scaling in LR_SCALINGS,
        "lr_scaling",
        c.lr_scaling,
        f"must be one of {tuple(LR_SCALINGS)}",
    )
    _require(c.learning_rate > 0, "learning_rate", c.learning_rate, "must be > 0")
    _require(c.base_batch_size > 0, "base_batch_size", c.base_batch_size, "must be > 0")
    _require(c.total_steps > 0, "total_steps", c.total_steps, "must be > 0")
    _require(c.warmup_steps >= 0, "warmup_steps", c.warmup_steps, "must be >= 0")
    _require(
        0.0 <= c.warmup_fraction < 1.0, "warmup_fraction", c.warmup_fraction, "must be in [0, 1)"
    )
    _require(0.0 < c.decay_fraction <= 1.0, "decay_fraction", c.decay_fraction, "must be in (0, 1]")
    _require(
        0.0 <= c.end_lr_fraction <= 1.0, "end_lr_fraction", c.end_lr_fraction, "must be in [0, 1]"
    )
    _require(c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0")
    _require(0.0 <= c.b1 < 1.0, "b1", c.b1, "must be in [0, 1)")
    _require(0.0 <= c.b2 < 1.0, "b2", c.b2, "must be in [0, 1)")
    _require(c.eps > 0, "eps", c.eps, "must be > 0")
    _require(c.clip_norm >= 0, "clip_norm", c.clip_norm, "must be >= 0 (0 disables clipping)")
    _require(
        0.0 < c.layerwise_lr_decay <= 1.0,
        "layerwise_lr_decay",
        c.layerwise_lr_decay,
        "must be in (0, 1] (1.0 disables it)",
    )
    _require(
        c.layerwise_lr_convention in LAYERWISE_CONVENTIONS,
        "layerwise_lr_convention",
        c.layerwise_lr_convention,
        f"must be one of {tuple(LAYERWISE_CONVENTIONS)}",
    )
    _require(
        isinstance(c.grad_accum_steps, int) and c.grad_accum_steps >= 1,
        "grad_accum_steps",
        c.grad_accum_steps,
        "must be an integer >= 1",
    )
    warmup = warmup_steps(c)
    _require(
        warmup < c.total_steps,
        "warmup_steps",
        warmup,
        f"warmup must be shorter than total_steps ({c.total_steps})",
    )
    if c.schedule == "wsd":
        _require(
            warmup + decay_steps(c) <= c.total_steps,
            "decay_fraction",
            c.decay_fraction,
            "warmup plus decay must fit in total_steps",
        )


def warmup_steps(config: ml_collections.ConfigDict) -> int:
    """Warmup length in steps, from warmup_steps or warmup_fraction x total_steps."""
    if config.warmup_steps:
        return int(config.warmup_steps)
    return int(round(config.warmup_fraction * config.total_steps))


def decay_steps(config: ml_collections.ConfigDict) -> int:
    """Length of the final decay phase of the wsd schedule."""
    return max(1, int(round(config.decay_fraction * config.total_steps)))


def learning_rate_scale(config: ml_collections.ConfigDict, global_batch_size: int) -> float:
    """Batch-size LR multiplier (global_batch / base_batch)^p, p = 1 linear, 0.5 sqrt, 0 none."""
    if global_batch_size <= 0:
        raise ValueError(f"global batch size must be > 0, got {global_batch_size!r}")
    return (global_batch_size / config.base_batch_size) ** LR_SCALINGS[config.lr_scaling]


def adam_hyperparameters(
    config: ml_collections.ConfigDict, global_batch_size: int
) -> tuple[float, float, float]:
    """(b1, b2, eps) of the run: as configured, or moved by Malladi et al.'s rule ("sqrt_adam")."""
    if config.lr_scaling != "sqrt_adam":
        return config.b1, config.b2, config.eps
    kappa = global_batch_size / config.base_batch_size
    b1, b2 = 1.0 - kappa * (1.0 - config.b1), 1.0 - kappa * (1.0 - config.b2)
    for key, value in (("b1", b1), ("b2", b2)):
        _require(
            0.0 <= value < 1.0,
            "lr_scaling",
            config.lr_scaling,
            f"batch {global_batch_size} = {kappa:g} x base_batch_size moves {key} to "
            f"1 - {kappa:g} * (1 - {config[key]}) = {value:g}, outside [0, 1): use 'sqrt' or "
            "a base_batch_size closer to the batch",
        )
    return b1, b2, config.eps / kappa**0.5


def make_schedule(config: ml_collections.ConfigDict, global_batch_size: int) -> Callable:
    """Effective LR as a function of the step: scaled peak x warmup x schedule shape."""
    validate_optim_config(config)
    peak = config.learning_rate * learning_rate_scale(config, global_batch_size)
    end = config.end_lr_fraction
    total, warmup, name = config.total_steps, warmup_steps(config), config.schedule
    decay_start = total - decay_steps(config) if name == "wsd" else warmup

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = jnp.minimum(1.0, step / warmup) if warmup else jnp.float32(1.0)
        progress = jnp.clip((step - decay_start) / max(1, total - decay_start), 0.0, 1.0)
        if name == "constant":
            shape = jnp.float32(1.0)
        elif name == "cosine":
            shape = end + (1.0 - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        else:  # linear, wsd: linear from 1 to end over the decay phase
            shape = 1.0 + (end - 1.0) * progress
        return peak * warm * shape

    return schedule


def _names(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", str(k))) for k in path)


def decays_weight(path) -> bool:
    """True for kernels and embedding tables; False for biases and LayerNorm scale/bias."""
    names = _names(path)
    return not (names[-1].endswith("bias") or any("norm" in n for n in names[:-1]))


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


class Optimizer(NamedTuple):
    """The gradient transformation and the effective-LR schedule it follows."""

    tx: optax.GradientTransformation
    learning_rate_fn: Callable


def make_optimizer(
    config: ml_collections.ConfigDict, model_cfg: BertConfig, global_batch_size: int
) -> Optimizer:
    """Builds the update chain described in the module docstring from ``config.optim``."""
    schedule = make_schedule(config, global_batch_size)
    parts = []
    if config.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(config.clip_norm))
    if config.name == "adafactor":
        parts += [optax.scale_by_factored_rms(), optax.clip_by_block_rms(1.0)]
    else:
        b1, b2, eps = adam_hyperparameters(config, global_batch_size)
        parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    if config.weight_decay > 0:
        parts.append(optax.add_decayed_weights(config.weight_decay, mask=weight_decay_mask))
    if config.name == "lamb":  # biases and LayerNorm keep ratio 1, as they skip weight decay
        parts.append(
            scale_by_block_trust_ratio(
                decays_weight, lambda path, leaf: stacked_axes(path, leaf, model_cfg)
            )
        )
    parts.append(optax.scale_by_learning_rate(schedule))
    if config.layerwise_lr_decay != 1.0:
        parts.append(
            scale_by_layerwise_factors(
                model_cfg, config.layerwise_lr_decay, config.layerwise_lr_convention
            )
        )
    return Optimizer(optax.chain(*parts), schedule)
