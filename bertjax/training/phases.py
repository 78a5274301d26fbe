"""Multi-phase runs: a list of phases in one config, each starting from the previous one's end.

``config.phase_order`` names the phases in ``config.phases`` in the order they run; each phase
(`phase`) says how long it is (``steps``, or ``tokens``: rows x row length, converted to steps by
the phase's batch plan) and what it changes (``set``: any run-config keys, e.g. the row length,
the mask rate, the batch size or batch warmup, the LR schedule, the RoPE bases). A phase's run
config is the base config with its ``set`` applied; its data are keyed by ``seed + 7919 i`` (phase
i shuffles and masks its own way; the model is initialised once, in the first phase). The step
counter runs on across phases, so a checkpoint's step says which phase it is in: `train.py`
runs the phases in order and resumes mid-phase. With ``reset_time`` (ModernBERT's phases) the
LR schedule and batch warmup count from the phase's first step (the optimizer's schedule count is
reset there; its moments carry over); without it the schedule runs on, spanning every step so
far (a phase may also name its schedule's span: ``set.optim.total_steps``). Phases may not
change the parameter shapes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax.data.plans.batch_plan import BatchPlan
from bertjax.training.metrics import train_flops_per_sequence

# Model fields that shape parameters: a phase may not change them (its checkpoint must restore).
_SHAPE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "embedding_size",
    "num_hidden_groups",
    "type_vocab_size",
    "position_embedding_type",
    "mlp_type",
    "attention_bias",
    "mlp_bias",
    "norm_bias",
    "head_bias",
    "decoder_bias",
    "scan_layers",
    "num_experts",
)
DATA_SEED_STRIDE = 7919


def phase(steps: int = 0, tokens: int = 0, reset_time: bool = True, **changes) -> ml_collections:
    """One entry of ``config.phases``: its length (``steps`` or ``tokens``), whether its schedule
    restarts (``reset_time``), and the run-config keys it changes (nested dicts, e.g.
    ``data={"max_seq_length": 512}``)."""
    c = ml_collections.ConfigDict()
    c.steps = steps  # optimizer steps of the phase (0: from tokens)
    c.tokens = tokens  # tokens of the phase, rows x row length (used when steps is 0)
    c.reset_time = reset_time  # the LR schedule and batch warmup count from the phase's start
    c.set = ml_collections.ConfigDict(changes)  # run-config keys the phase changes
    return c


@dataclasses.dataclass(frozen=True)
class Phase:
    """A phase of a run: its run config, and the global steps [start, end) it covers."""

    name: str
    index: int
    config: ml_collections.ConfigDict
    start: int
    end: int
    reset_time: bool = True


def _apply(config: ml_collections.ConfigDict, changes, where: str) -> None:
    for key, value in changes.items():
        if key not in config:
            raise ValueError(f"{where}.{key}: the run config has no key {key!r}")
        if isinstance(value, ml_collections.ConfigDict | dict) and isinstance(
            config[key], ml_collections.ConfigDict
        ):
            _apply(config[key], value, f"{where}.{key}")
        else:
            config[key] = value


def _shape(config) -> dict:
    model = config.get("model", {})
    shape = {k: model.get(k) for k in _SHAPE_FIELDS}
    if model.get("position_embedding_type", "absolute") == "absolute":
        shape["max_position_embeddings"] = model.get("max_position_embeddings")
    return shape


def plan_phases(config: ml_collections.ConfigDict) -> list[Phase]:
    """The phases of a run config, or one phase spanning ``num_train_steps`` when it has none."""
    order = tuple(config.get("phase_order", ()))
    if not order:
        return [Phase("run", 0, config, 0, int(config.num_train_steps))]
    unknown = [name for name in order if name not in config.phases]
    if unknown or len(set(order)) != len(order):
        raise ValueError(
            f"config.phase_order={order}: each name once, from config.phases "
            f"({sorted(config.phases.keys())})"
        )
    phases, start = [], 0
    base_shape = _shape(config)
    for index, name in enumerate(order):
        entry = config.phases[name]
        c = config.copy_and_resolve_references()
        c.unlock()
        _apply(c, entry.set, f"config.phases.{name}.set")
        if _shape(c) != base_shape:
            changed = {k: v for k, v in _shape(c).items() if base_shape.get(k) != v}
            raise ValueError(
                f"config.phases.{name} changes parameter shapes {changed}: phases share one model"
            )
        length = int(c.data.max_seq_length) if "data" in c else 1
        steps = int(entry.steps)
        if not steps:
            if not entry.tokens:
                raise ValueError(f"config.phases.{name}: give steps or tokens")
            rows = -(-int(entry.tokens) // length)
            steps = BatchPlan.from_config(c, length).steps_for_samples(rows)
        c.seed = int(config.seed) + DATA_SEED_STRIDE * index
        c.num_train_steps = steps
        chosen = entry.set.get("optim", {}).get("total_steps")  # a span the phase names wins
        c.optim.total_steps = chosen or (steps if entry.reset_time else start + steps)
        c.phase_order, c.phases = (), ml_collections.ConfigDict()
        phases.append(Phase(name, index, c, start, start + steps, bool(entry.reset_time)))
        start += steps
    return phases


def restart_schedule(opt_state):
    """``opt_state`` with its LR-schedule counts at 0 (a phase with reset_time starts); the
    moments and Adam's bias-correction counts carry over."""

    def reset(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.zeros_like(node.count))
        return node

    return jax.tree.map(
        reset, opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState)
    )


def apply_flop_budget(config: ml_collections.ConfigDict, model_cfg, objective):
    """``config`` with its length set by ``config.budget_flops`` (cramming's budget, counted in
    the trainer's training FLOPs instead of wall time, so the run stays a pure function of its
    config): ``num_train_steps`` (and the schedule's ``total_steps``) is the first step count
    whose FLOPs reach the budget, and with ``batch_warmup.budget_fraction`` the batch warmup
    spans that share of the budget's tokens. Unchanged when budget_flops is 0."""
    budget = float(config.get("budget_flops", 0.0))
    if not budget:
        return config
    if config.get("phase_order"):
        raise ValueError(
            "config.budget_flops sets one run's length: it does not combine with phases"
        )
    length = int(config.data.max_seq_length)
    masked = float(config.data.mask_rate) * length
    per_sequence = objective.train_flops_per_sequence(
        model_cfg, length, masked, int(config.data.max_predictions), train_flops_per_sequence
    )
    rows = int(-(-budget // per_sequence))
    config = config.copy_and_resolve_references()
    fraction = float(config.batch_warmup.get("budget_fraction", 0.0))
    if fraction:
        config.batch_warmup.tokens = int(fraction * rows * length)
    steps = BatchPlan.from_config(config, length).steps_for_samples(rows)
    config.num_train_steps = config.optim.total_steps = steps
    return config
