"""Objectives by name (``config.loss.objective``) and the check of the ``config.loss`` keys."""

from __future__ import annotations

import ml_collections

from bertjax.objectives.base import Objective, default_loss_config
from bertjax.objectives.diffusion import MaskedDiffusion
from bertjax.objectives.distill import Distillation
from bertjax.objectives.electra import Electra
from bertjax.objectives.embedding import Embedding
from bertjax.objectives.finetune import Classification, TokenClassification
from bertjax.objectives.pert import PermutedLM
from bertjax.objectives.pretraining import Pretraining

OBJECTIVES: dict[str, type[Objective]] = {
    "pretraining": Pretraining,
    "classification": Classification,
    "token_classification": TokenClassification,
    "diffusion": MaskedDiffusion,
    "distill": Distillation,
    "pert": PermutedLM,
    "electra": Electra,
    "embedding": Embedding,
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


def make_objective(config: ml_collections.ConfigDict) -> Objective:
    """The Objective a run config names (``config.loss.objective``, default pretraining)."""
    validate_loss_config(config.loss)
    return OBJECTIVES[config.loss.get("objective", "pretraining")].from_config(config)
