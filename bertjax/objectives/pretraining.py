"""BERT's pretraining objective: weighted MLM at the masked positions (+ NSP/SOP on [CLS])."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bertjax.modeling.encoder import last_layer_at_rows
from bertjax.modeling.heads import BertForPreTraining
from bertjax.objectives.base import Objective, next_sentence
from bertjax.ops.loss import cross_entropy

Array = jax.Array


def mlm_sums(logits_BPV: Array, batch: dict) -> dict:
    """Weighted MLM cross-entropy and hits at the masked positions, summed."""
    weights_BP = batch["masked_weights"].astype(jnp.float32)
    nll_BP, correct_BP = cross_entropy(logits_BPV, batch["masked_ids"])
    return {
        "mlm_loss": jnp.sum(nll_BP * weights_BP),
        "mlm_correct": jnp.sum(correct_BP * weights_BP),
    }


def mlm_normalizers(batch: dict) -> dict:
    """Denominators over the whole global batch: total mask weight and number of examples."""
    weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    return {
        "mlm_weight": jnp.where(weight > 0, weight, 1.0),
        "examples": jnp.float32(batch["masked_weights"].shape[0]),
    }


@dataclasses.dataclass(frozen=True)
class Pretraining(Objective):
    """BERT's objective: weighted MLM at masked positions (+ NSP/SOP on [CLS])."""

    next_sentence: bool = True
    mlm_weight: float = 1.0
    nsp_weight: float = 1.0
    sparse_last_layer: bool = True

    @classmethod
    def from_config(cls, config):
        loss = config.loss
        if "data" in config and config.data.masking == "pert":
            raise ValueError(
                "config.data.masking='pert' makes PERT's shuffled rows: set "
                "config.loss.objective='pert'"
            )
        for key in ("mlm_weight", "nsp_weight"):
            if loss[key] < 0:
                raise ValueError(f"config.loss.{key}={loss[key]!r}: must be >= 0")
        return cls(
            next_sentence(config),
            float(loss.mlm_weight),
            float(loss.nsp_weight),
            bool(loss.sparse_last_layer),
        )

    def model(self, cfg):
        return BertForPreTraining(
            cfg, next_sentence=self.next_sentence, sparse_last_layer=self.sparse_last_layer
        )

    def loss_sums(self, outputs, batch):
        sums = mlm_sums(outputs["mlm_logits"], batch)
        if self.next_sentence:
            nll_B, correct_B = cross_entropy(outputs["nsp_logits"], batch["next_sentence_label"])
            sums.update(nsp_loss=jnp.sum(nll_B), nsp_correct=jnp.sum(correct_B))
        return sums

    def normalizers(self, batch):
        return mlm_normalizers(batch)

    def total_loss(self, sums, norms):
        """mlm_weight * MLM + nsp_weight * NSP, each a mean under the global normalizers."""
        loss = self.mlm_weight * sums["mlm_loss"] / norms["mlm_weight"]
        if "nsp_loss" in sums:
            loss = loss + self.nsp_weight * sums["nsp_loss"] / norms["examples"]
        return loss

    def metrics(self, sums, norms):
        """mlm_loss, mlm_accuracy (+ nsp_loss, nsp_accuracy)."""
        metrics = {
            "mlm_loss": sums["mlm_loss"] / norms["mlm_weight"],
            "mlm_accuracy": sums["mlm_correct"] / norms["mlm_weight"],
        }
        if "nsp_loss" in sums:
            metrics["nsp_loss"] = sums["nsp_loss"] / norms["examples"]
            metrics["nsp_accuracy"] = sums["nsp_correct"] / norms["examples"]
        return metrics

    def last_layer_rows(self, cfg, masked_width):
        """The masked positions (+ [CLS] with NSP) when the sparse last layer is on."""
        if not (self.sparse_last_layer and last_layer_at_rows(cfg)):
            return None
        return masked_width + int(self.next_sentence)
