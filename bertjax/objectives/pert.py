"""PERT's objective, the permuted language model (Cui, Yang & Liu 2022, arXiv 2203.06906).

The data (config.data.masking = "pert", the objective's one corruption;
bertjax/data/corruption/permutation.py) shuffle a share of the n-gram-selected tokens; at each
selected position the model points at the position of the original token in the shuffled row:
cross-entropy over the row's T positions (the prediction space is the input sequence, not the
vocabulary), weighted by ``masked_weights`` and averaged over the global batch's predictions.
No [MASK] token, no NSP/SOP (the paper uses neither).

The head (`bertjax.modeling.heads.PositionHead`): BERT's MLM transform at the selected rows, then
dot products with every position's final hidden state; padding positions are excluded. The
paper gives the target and the prediction space; the head's exact form is this project's reading
of it (no pretraining code was released). PERT's checkpoint is an ordinary BERT encoder
(``bert``), so fine-tuning starts from it with ``config.init_from`` like any other.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bertjax.modeling.heads import BertForPermutedLM
from bertjax.objectives.base import Objective, example_rows
from bertjax.ops.loss import cross_entropy


class PermutedLM(Objective):
    """PERT: predict, at each selected position, where its original token now is."""

    objective_name = "pert"

    corruptions = ("pert",)
    headline_metrics = ("pert_accuracy",)

    def model(self, cfg):
        return BertForPermutedLM(cfg)

    def init_batch(self, cfg):
        batch = super().init_batch(cfg)
        return {**batch, "attention_mask": jnp.ones_like(batch["input_ids"])}

    def example_batch(self, cfg, rows, length, seed):
        """Selected positions (distinct, real) and where each one's original token went."""
        batch = example_rows(cfg, rows, length, seed)
        rs = np.random.RandomState(seed + 1)
        slots, real = max(2, length // 8), length - length // 4
        positions = np.stack([1 + rs.permutation(real - 1)[:slots] for _ in range(rows)])
        weights = np.ones((rows, slots), np.float32)
        weights[::2, -1] = 0.0
        return dict(
            batch,
            masked_positions=positions.astype(np.int32),
            target_positions=np.stack([rs.permutation(p) for p in positions]).astype(np.int32),
            masked_weights=weights,
        )

    def loss_sums(self, outputs, batch):
        weights_BP = batch["masked_weights"].astype(jnp.float32)
        nll_BP, correct_BP = cross_entropy(outputs["position_logits"], batch["target_positions"])
        return {
            "pert_loss": jnp.sum(nll_BP * weights_BP),
            "pert_correct": jnp.sum(correct_BP * weights_BP),
        }

    def normalizers(self, batch):
        weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
        return {"predictions": jnp.where(weight > 0, weight, 1.0)}

    def total_loss(self, sums, norms):
        return sums["pert_loss"] / norms["predictions"]

    def metrics(self, sums, norms):
        """pert_loss and pert_accuracy (the argmax is the original token's position)."""
        return {
            "pert_loss": sums["pert_loss"] / norms["predictions"],
            "pert_accuracy": sums["pert_correct"] / norms["predictions"],
        }
