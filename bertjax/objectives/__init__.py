"""What a step optimizes: objectives, each declared by `Objective` (base.py).

base               the Objective interface, config.loss defaults, MoE losses added in one place
registry           objectives by name (config.loss.objective)
pretraining        MLM (+ NSP/SOP)
finetune           sequence / token classification, the init_from encoder (+ fgm: FGM)
warm_start         pretraining from a model (init_from), copied or tiled into a larger one
distill            DistilBERT's distillation from a frozen teacher
diffusion          LLaDA-style masked diffusion (+ diffusion_sampling: generation)
pert               PERT's permuted language model: predict where each original token now is
electra            ELECTRA's replaced-token detection: generator MLM + discriminator in one step
causal_lm          causal LM (next-token CE) on the same encoder under a causal mask
embedding          contrastive embedding training (+ contrastive: InfoNCE / Matryoshka,
                   gradcache: GradCache)

The task data and metrics the objectives train and score with live in bertjax/tasks/.
"""

from bertjax.objectives.base import Objective, default_loss_config
from bertjax.objectives.registry import (
    OBJECTIVES,
    headline_metrics,
    make_objective,
    validate_loss_config,
    with_objective,
)

__all__ = [
    "OBJECTIVES",
    "Objective",
    "default_loss_config",
    "headline_metrics",
    "make_objective",
    "validate_loss_config",
    "with_objective",
]
