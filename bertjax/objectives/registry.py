"""Objectives by name (``config.loss.objective``) and the check of the ``config.loss`` keys."""

from __future__ import annotations

import ml_collections

from bertjax.objectives.base import Objective, default_loss_config
from bertjax.objectives.causal_lm import CausalLM
from bertjax.objectives.diffusion import MaskedDiffusion
from bertjax.objectives.distill import Distillation
from bertjax.objectives.electra import Electra
from bertjax.objectives.embedding import Embedding
from bertjax.objectives.finetune import Classification, TokenClassification
from bertjax.objectives.pert import PermutedLM
from bertjax.objectives.pretraining import Pretraining

OBJECTIVES: dict[str, type[Objective]] = {
    cls.objective_name: cls
    for cls in (
        Pretraining,
        Classification,
        TokenClassification,
        MaskedDiffusion,
        Distillation,
        PermutedLM,
        Electra,
        CausalLM,
        Embedding,
    )
}


def validate_loss_config(loss_config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming an unknown objective or an unknown ``config.loss`` key."""
    name = loss_config.get("objective", "pretraining")
    if name not in OBJECTIVES:
        raise ValueError(f"config.loss.objective={name!r}: must be one of {sorted(OBJECTIVES)}")
    known = set(default_loss_config().keys()) | set(OBJECTIVES[name].extra_config_keys)
    unknown = sorted(set(loss_config.keys()) - known)
    if unknown:
        raise ValueError(f"unknown config.loss key(s) {unknown}; known keys: {sorted(known)}")


def with_objective(
    config: ml_collections.ConfigDict, name: str | None = None
) -> ml_collections.ConfigDict:
    """``config`` (unlocked) made ready for objective ``name`` (default: its own
    ``config.loss.objective``): the name set and the objective's settings added at their defaults
    where ``config.loss`` lacks them, so they can be set (on the command line too) from any
    recipe. Switching away from the recipe's objective drops that objective's own settings the
    new one does not read (validation would refuse them). An unknown name is left as is for
    `validate_loss_config` to name."""
    previous = config.loss.get("objective", "pretraining")
    name = previous if name is None else name
    if name not in OBJECTIVES:
        return config
    chosen = OBJECTIVES[name]
    with config.loss.unlocked():
        config.loss.objective = name
        if name != previous and previous in OBJECTIVES:
            for key in OBJECTIVES[previous].extra_config_keys:
                if key in config.loss and key not in chosen.extra_config_keys:
                    del config.loss[key]
    return chosen.add_settings(config)


def check_corruption(config: ml_collections.ConfigDict) -> None:
    """The objective trains on the run's ``config.data.masking`` (its `corruptions`)."""
    name = config.loss.get("objective", "pretraining")
    wanted = OBJECTIVES[name].corruptions
    if "data" not in config or wanted is None or config.data.masking in wanted:
        return
    masking = config.data.masking
    needs = f"{wanted[0]!r}" if len(wanted) == 1 else f"one of {wanted}"
    users = [n for n, c in OBJECTIVES.items() if c.corruptions and masking in c.corruptions]
    hint = f"; config.data.masking={masking!r} goes with config.loss.objective={users[0]!r}"
    raise ValueError(
        f"config.loss.objective={name!r} needs config.data.masking={needs}, not {masking!r}"
        + (hint if users else "")
    )


def make_objective(config: ml_collections.ConfigDict) -> Objective:
    """The Objective a run config names (``config.loss.objective``, default pretraining), its
    keys and its data corruption checked."""
    validate_loss_config(config.loss)
    check_corruption(config)
    return OBJECTIVES[config.loss.get("objective", "pretraining")].from_config(config)


def headline_metrics(config: ml_collections.ConfigDict) -> tuple:
    """The held-out metrics a run of ``config`` prints at its end (the objective's)."""
    return OBJECTIVES[config.loss.get("objective", "pretraining")].headline_metrics
