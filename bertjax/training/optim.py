"""Optimizers for pretraining: AdamW/LAMB/Adafactor/StableAdamW, schedules, LR scaling,
layer-wise LR decay.

Built from the ``config.optim`` ConfigDict (see `default_optim_config`). The update chain is
clip -> moment scaling -> decoupled weight decay (kernels and embedding tables only) ->
[LAMB trust ratio, kernels and embedding tables only, per layer / per expert: `lamb`] ->
learning rate (schedule x batch-size scaling) -> layer-wise factors -> [Kahan compensation for
bfloat16/float16 parameters], so the layer-wise factor multiplies the whole update, weight decay
included (as in ELECTRA). StableAdamW (`stable_adamw`, ModernBERT's ``decoupled_stableadamw``)
replaces moment scaling and decay by one link that also divides each tensor's (each stacked
slice's) LR by max(1, RMS of g / sqrt(v_hat)); its weight decay is fully decoupled: per step at
the peak LR, not multiplied by the LR.

Schedules: linear warmup from 0, then a decay to end_lr_fraction over the rest of the run
(linear, cosine, or 1-sqrt: ModernBERT's ``OneMinusSqrtScheduler``, Hägele et al. 2024), constant,
or wsd (stable, then a linear or 1-sqrt tail: ``decay_shape``). Warmup and the wsd tail can be set
in tokens; they become steps when the schedule is built, from the run's ``tokens_before(step)``.
``schedule_clock`` "tokens" runs the shape (the decay's progress, the triangle's x) on the fraction
of the run's tokens consumed instead of the fraction of its steps: under batch-size warmup the two
differ, and cramming's budget-triangle2 and its batch ramp share one clock (the elapsed budget),
so the LR peaks at 75% of the tokens, not at 75% of the steps.

Batch-size scaling: "linear" and "sqrt" change only the learning rate; "sqrt_adam" is Malladi et
al. 2022's square-root rule for Adam ("On the SDEs and Scaling Rules for Adaptive Gradient
Algorithms", NeurIPS), which at kappa = batch / base_batch_size also moves the moment decays and
epsilon: lr * sqrt(kappa), b = 1 - kappa * (1 - b) for b1 and b2, eps / sqrt(kappa). Under
batch-size warmup ``batch_at(step)`` applies the LR rule to each step's batch; "sqrt_adam" cannot
follow it (b1, b2 and eps are fixed when the chain is built).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax.modeling.bert_config import BertConfig
from bertjax.training.lamb import scale_by_block_trust_ratio
from bertjax.training.param_groups import (  # noqa: F401 (re-exported: optim's public names)
    LAYERWISE_CONVENTIONS,
    decays_weight,
    layer_depth,
    layerwise_lr_factors,
    scale_by_layerwise_factors,
    stacked_axes,
    weight_decay_mask,
)
from bertjax.training.stable_adamw import kahan_summation, scale_by_stable_adam

OPTIMIZERS = ("adamw", "lamb", "adafactor", "stableadamw")
SCHEDULES = ("linear", "cosine", "1-sqrt", "constant", "wsd", "triangle")
DECAY_SHAPES = ("linear", "1-sqrt")
SCHEDULE_CLOCKS = ("steps", "tokens")
LR_SCALINGS = {"none": 0.0, "linear": 1.0, "sqrt": 0.5, "sqrt_adam": 0.5}


def default_optim_config() -> ml_collections.ConfigDict:
    """The ``config.optim`` defaults: AdamW, linear warmup + linear decay (BERT's recipe)."""
    c = ml_collections.ConfigDict()
    # "adamw" | "lamb" | "adafactor" (ignores b1, b2, eps) | "stableadamw" (ModernBERT's; it
    # clips each tensor's LR by its update RMS; ModernBERT clips no gradients: clip_norm = 0)
    c.name = "adamw"
    c.learning_rate = 1e-4  # base (peak) LR at base_batch_size, before batch-size scaling
    c.base_batch_size = 256  # global batch size at which learning_rate was tuned
    # batch-size rule: "none" | "linear" (Goyal et al. 2017) | "sqrt" (LR only) | "sqrt_adam"
    # (Malladi et al. 2022: LR x sqrt(k), b1/b2 = 1 - k(1 - b), eps / sqrt(k), k = batch/base)
    c.lr_scaling = "none"
    # "linear" | "cosine" | "1-sqrt" (peak x (end + (1 - end)(1 - sqrt(progress)))) after warmup,
    # "constant" | "wsd" (warmup-stable-decay) | "triangle" (cramming: min(0.25 + x, 4 (1 - x)),
    # x = step / total_steps; its warmup and decay are the triangle's)
    c.schedule = "linear"
    # what the schedule's shape runs on: "steps" (step / total_steps) | "tokens" (the fraction of
    # the run's tokens consumed; differs under batch-size warmup; cramming's clock)
    c.schedule_clock = "steps"
    c.total_steps = 10_000  # steps the schedule spans (decay ends here)
    c.warmup_steps = 0  # warmup length in steps; when > 0 it overrides warmup_fraction
    c.warmup_fraction = 0.01  # warmup length as a fraction of total_steps (used if warmup_steps=0)
    c.warmup_tokens = 0  # warmup length in tokens (0: unused); overrides warmup_steps/_fraction
    c.decay_fraction = 0.1  # wsd only: final fraction of total_steps that decays
    c.decay_tokens = 0  # wsd only: decay length in tokens (0: unused); overrides decay_fraction
    c.decay_shape = "linear"  # wsd only: "linear" | "1-sqrt" decay (Hägele et al. 2024)
    c.end_lr_fraction = 0.0  # LR at total_steps as a fraction of the peak LR
    # decoupled weight decay; never applied to biases or LayerNorm. adamw/lamb/adafactor: scaled
    # by the LR, p -= lr_t * wd * p. stableadamw: fully decoupled, p -= wd * (eta_t / peak) * p with
    # eta_t = lr_t / max(1, RMS), so wd is the decay per step at the peak LR (ModernBERT: 1e-5;
    # optimi: 1e-5 here ~ AdamW's 1e-2 at lr 1e-3)
    c.weight_decay = 0.01
    c.b1 = 0.9  # first-moment decay
    c.b2 = 0.999  # second-moment decay
    c.eps = 1e-6  # added to the RMS denominator
    c.clip_norm = 1.0  # global-norm gradient clipping threshold (0: off)
    c.layerwise_lr_decay = 1.0  # per-layer LR factor decay^(top-depth) (1.0: off)
    # depths for layerwise_lr_decay: "beit" (heads L+1) | "electra" (heads L+2, as its fine-tuning)
    c.layerwise_lr_convention = "beit"
    c.grad_accum_steps = 1  # microbatches per step; the global batch is split k ways in the step
    c.kahan_summation = False  # Kahan-compensated updates of bfloat16/float16 params (any optim.)
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
    choices = {
        "name": OPTIMIZERS,
        "schedule": SCHEDULES,
        "decay_shape": DECAY_SHAPES,
        "schedule_clock": SCHEDULE_CLOCKS,
        "lr_scaling": tuple(LR_SCALINGS),
        "layerwise_lr_convention": tuple(LAYERWISE_CONVENTIONS),
    }
    for key, allowed in choices.items():
        _require(c[key] in allowed, key, c[key], f"must be one of {allowed}")
    integer = lambda n, least: isinstance(n, int) and n >= least  # noqa: E731
    wsd = c.schedule == "wsd"
    checks = (
        ("learning_rate", c.learning_rate > 0, "must be > 0"),
        ("base_batch_size", c.base_batch_size > 0, "must be > 0"),
        ("total_steps", c.total_steps > 0, "must be > 0"),
        ("warmup_steps", c.warmup_steps >= 0, "must be >= 0"),
        ("warmup_fraction", 0.0 <= c.warmup_fraction < 1.0, "must be in [0, 1)"),
        ("warmup_tokens", integer(c.warmup_tokens, 0), "must be an integer >= 0 (0: unused)"),
        ("decay_fraction", 0.0 < c.decay_fraction <= 1.0, "must be in (0, 1]"),
        ("decay_tokens", integer(c.decay_tokens, 0), "must be an integer >= 0 (0: unused)"),
        ("decay_tokens", wsd or not c.decay_tokens, "sets the length of wsd's decay only"),
        ("decay_shape", wsd or c.decay_shape == "linear", "shapes wsd's decay only: see '1-sqrt'"),
        ("end_lr_fraction", 0.0 <= c.end_lr_fraction <= 1.0, "must be in [0, 1]"),
        ("weight_decay", c.weight_decay >= 0, "must be >= 0"),
        ("b1", 0.0 <= c.b1 < 1.0, "must be in [0, 1)"),
        ("b2", 0.0 <= c.b2 < 1.0, "must be in [0, 1)"),
        ("eps", c.eps > 0, "must be > 0"),
        ("clip_norm", c.clip_norm >= 0, "must be >= 0 (0 disables clipping)"),
        ("layerwise_lr_decay", 0.0 < c.layerwise_lr_decay <= 1.0, "must be in (0, 1] (1: off)"),
        ("grad_accum_steps", integer(c.grad_accum_steps, 1), "must be an integer >= 1"),
        ("kahan_summation", isinstance(c.kahan_summation, bool), "must be a bool"),
    )
    for key, ok, need in checks:
        _require(ok, key, c[key], need)
    if not (c.warmup_tokens or c.decay_tokens):  # lengths in tokens: checked by make_schedule
        schedule_phases(c)


def warmup_steps(config: ml_collections.ConfigDict) -> int:
    """Warmup length in steps, from warmup_steps or warmup_fraction x total_steps."""
    if config.warmup_steps:
        return int(config.warmup_steps)
    return int(round(config.warmup_fraction * config.total_steps))


def decay_steps(config: ml_collections.ConfigDict) -> int:
    """Length of the final decay phase of the wsd schedule."""
    return max(1, int(round(config.decay_fraction * config.total_steps)))


def steps_for_tokens(
    tokens: int, tokens_before: Callable[[int], int], total_steps: int
) -> int | None:
    """The first step s in [0, total_steps] with tokens_before(s) >= tokens (None: no such step);
    ``tokens_before(step)``, the tokens consumed before ``step``, must be non-decreasing."""
    step = bisect.bisect_left(range(total_steps + 1), tokens, key=lambda s: int(tokens_before(s)))
    return step if step <= total_steps else None


def schedule_phases(
    config: ml_collections.ConfigDict, tokens_before: Callable[[int], int] | None = None
) -> tuple[int, int]:
    """(warmup steps, first step of the decay). The decay follows the warmup, except wsd's: the
    last decay_fraction of total_steps, or the steps of the last decay_tokens tokens. A length in
    tokens ends at the first step whose tokens_before reaches it (ModernBERT's schedulers compare
    the tokens seen before a step with t_warmup and t_max - t_decay)."""
    total, key = config.total_steps, "warmup_tokens" if config.warmup_tokens else "decay_tokens"
    need = "a length in tokens needs make_schedule(..., tokens_before=f): tokens before a step"
    _require(tokens_before is not None or not config[key], key, config[key], need)
    run = int(tokens_before(total)) if tokens_before is not None else 0
    if config.warmup_tokens:
        key, value = "warmup_tokens", config.warmup_tokens
        warmup = steps_for_tokens(value, tokens_before, total)
    else:
        key, value = "warmup_steps", warmup_steps(config)
        warmup = value
    fits = warmup is not None and warmup < total
    _require(fits, key, value, f"warmup must end before total_steps ({total} steps, {run} tokens)")
    if config.schedule != "wsd":
        return warmup, warmup
    if config.decay_tokens:
        key, value = "decay_tokens", config.decay_tokens
        start = min(steps_for_tokens(max(0, run - value), tokens_before, total), total - 1)
        fits = start >= warmup and value <= run - int(tokens_before(warmup))
    else:  # at least one decay step either way
        key, value = "decay_fraction", config.decay_fraction
        start = total - decay_steps(config)
        fits = start >= warmup
    _require(fits, key, value, "warmup plus decay must fit in total_steps")
    return warmup, start


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


def make_schedule(
    config: ml_collections.ConfigDict,
    global_batch_size: int,
    *,
    tokens_before: Callable[[int], int] | None = None,
    batch_at: Callable[[Any], jax.Array] | None = None,
    tokens_at: Callable[[Any], jax.Array] | None = None,
) -> Callable:
    """Effective LR as a function of the step: scaled peak x warmup x schedule shape.

    ``tokens_before(step)``: tokens consumed before ``step`` (host side, non-decreasing); needed
    for warmup_tokens / decay_tokens, which become steps here. ``batch_at(step)``: the global batch
    of each step under batch-size warmup, jnp-traceable; the LR of step n is then learning_rate x
    (batch_at(n) / base_batch_size)^p x shape(n) instead of using the fixed global_batch_size.
    ``tokens_at(step)``: ``tokens_before`` as a jnp-traceable float, the clock of
    schedule_clock="tokens" (needed by it).
    """
    validate_optim_config(config)
    scale = learning_rate_scale(config, global_batch_size)
    _require(
        batch_at is None or config.lr_scaling != "sqrt_adam",
        "lr_scaling",
        config.lr_scaling,
        "also moves b1, b2 and eps with the batch, which one optax chain cannot do per step: "
        "use 'sqrt' (LR only) with a batch that varies (batch_at), or a fixed batch",
    )
    base_lr, base_batch = config.learning_rate, config.base_batch_size
    power, end, total = LR_SCALINGS[config.lr_scaling], config.end_lr_fraction, config.total_steps
    warmup, decay_start = schedule_phases(config, tokens_before)
    shape_name = config.decay_shape if config.schedule == "wsd" else config.schedule
    _require(
        config.schedule_clock == "steps" or tokens_at is not None,
        "schedule_clock",
        config.schedule_clock,
        "needs make_schedule(..., tokens_at=f): the tokens consumed before a step (the trainer "
        "passes it)",
    )
    if config.schedule_clock == "tokens":
        clock = lambda s: jnp.asarray(tokens_at(s), jnp.float32)  # noqa: E731
    else:
        clock = lambda s: jnp.asarray(s, jnp.float32)  # noqa: E731

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        warm = jnp.minimum(1.0, step / warmup) if warmup else jnp.float32(1.0)
        now, start, end_clock = clock(count), clock(decay_start), clock(total)
        progress = jnp.clip((now - start) / jnp.maximum(end_clock - start, 1.0), 0.0, 1.0)
        if shape_name == "constant":
            shape = jnp.float32(1.0)
        elif shape_name == "cosine":
            shape = end + (1.0 - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        elif shape_name == "1-sqrt":  # ModernBERT's OneMinusSqrtScheduler, alpha_f = end
            shape = end + (1.0 - end) * (1.0 - jnp.sqrt(progress))
        elif shape_name == "triangle":  # cramming's budget-triangle2, x = the elapsed fraction
            x = jnp.clip(now / jnp.maximum(end_clock, 1.0), 0.0, 1.0)
            shape = jnp.minimum(0.25 + x, 4.0 * (1.0 - x))
        else:  # linear, and wsd's linear decay: from 1 to end over the decay phase
            shape = 1.0 + (end - 1.0) * progress
        if batch_at is None:
            peak = base_lr * scale
        else:
            peak = base_lr * (jnp.asarray(batch_at(count), jnp.float32) / base_batch) ** power
        return peak * warm * shape

    return schedule


class Optimizer(NamedTuple):
    """The gradient transformation and the effective-LR schedule it follows."""

    tx: optax.GradientTransformation
    learning_rate_fn: Callable


def make_optimizer(
    config: ml_collections.ConfigDict,
    model_cfg: BertConfig,
    global_batch_size: int,
    *,
    tokens_before: Callable[[int], int] | None = None,
    batch_at: Callable[[Any], jax.Array] | None = None,
    tokens_at: Callable[[Any], jax.Array] | None = None,
) -> Optimizer:
    """Builds the update chain described in the module docstring from ``config.optim``;
    ``tokens_before``, ``batch_at`` and ``tokens_at`` as in `make_schedule`."""
    schedule = make_schedule(
        config,
        global_batch_size,
        tokens_before=tokens_before,
        batch_at=batch_at,
        tokens_at=tokens_at,
    )
    stacked = lambda path, leaf: stacked_axes(path, leaf, model_cfg)  # noqa: E731
    parts = []
    if config.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(config.clip_norm))
    if config.name == "adafactor":
        parts += [optax.scale_by_factored_rms(), optax.clip_by_block_rms(1.0)]
    else:
        b1, b2, eps = adam_hyperparameters(config, global_batch_size)
        if config.name == "stableadamw":  # decay included; max_lr: the peak LR at the batch
            peak = config.learning_rate * learning_rate_scale(config, global_batch_size)
            wd = config.weight_decay
            parts.append(scale_by_stable_adam(b1, b2, eps, wd, peak, decays_weight, stacked))
        else:
            parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    if config.weight_decay > 0 and config.name != "stableadamw":
        parts.append(optax.add_decayed_weights(config.weight_decay, mask=weight_decay_mask))
    if config.name == "lamb":  # biases and LayerNorm keep ratio 1, as they skip weight decay
        parts.append(scale_by_block_trust_ratio(decays_weight, stacked))
    parts.append(optax.scale_by_learning_rate(schedule))
    if config.layerwise_lr_decay != 1.0:
        parts.append(
            scale_by_layerwise_factors(
                model_cfg, config.layerwise_lr_decay, config.layerwise_lr_convention
            )
        )
    if config.kahan_summation:  # last: it returns the exact difference round(p + u) - p
        parts.append(kahan_summation())
    return Optimizer(optax.chain(*parts), schedule)
