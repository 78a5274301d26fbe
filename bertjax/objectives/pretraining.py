"""BERT's pretraining objective: weighted MLM at the masked positions (+ NSP/SOP on [CLS]); and
`MaskedLM`, what every objective with an MLM head shares (its corruptions, the unigram MLM bias of
a fresh model, perplexity and the majority baseline of held-out metrics)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.modeling.encoder import last_layer_at_rows
from bertjax.modeling.heads import BertForPreTraining
from bertjax.objectives.base import (
    Objective,
    TokenNLL,
    derived,
    example_rows,
    next_sentence,
    run_setting,
)
from bertjax.ops.loss import cross_entropy

Array = jax.Array

MLM_CORRUPTIONS = ("token", "whole_word", "ngram")  # config.data.masking of an MLM


def init_mlm_bias(state, log_prior: np.ndarray):
    """Sets the MLM decoder bias of a new model to the corpus' log unigram frequencies (a model
    then starts at the unigram loss; a zero bias spends hundreds of Adam steps of ~lr each getting
    there). Works on any mesh and process count; a state without an MLM head is returned as is."""
    head = state.params.get("mlm_head", {})
    if "bias" not in head:
        return state
    bias = head["bias"]
    if bias.shape != log_prior.shape:
        raise ValueError(
            f"unigram prior of shape {log_prior.shape} does not fit the MLM bias "
            f"{bias.shape}: tokenizer and model disagree on the vocabulary size"
        )
    values = np.asarray(log_prior, bias.dtype)
    new_bias = jax.make_array_from_callback(bias.shape, bias.sharding, lambda index: values[index])
    return state.replace(params={**state.params, "mlm_head": {**head, "bias": new_bias}})


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


class MaskedLM(Objective):
    """What objectives with an MLM head share: they train on MLM corruptions, start their MLM
    bias at the log unigram frequencies (``config.mlm_bias_init="unigram"``), and report
    held-out perplexity and the majority baseline (always guessing the most frequent masked
    token: the floor to beat)."""

    corruptions = MLM_CORRUPTIONS
    headline_metrics = ("mlm_accuracy", "majority_baseline", "perplexity")
    # "mlm_loss" is the unsmoothed MLM NLL per masked token (held-out perplexity is its exp)
    token_nll = TokenNLL("mlm_loss")

    mlm_bias_init: str = run_setting("zeros")  # "unigram" | "zeros" (config.mlm_bias_init)

    def prepare_state(self, state, data):
        if self.mlm_bias_init != "unigram":
            return state
        prior = data.unigram_log_prior()
        return state if prior is None else init_mlm_bias(state, prior)

    def example_batch(self, cfg, rows, length, seed):
        """Real-token positions to predict (distinct per row, never [CLS]), their ids, weights
        with empty slots, and a sentence label."""
        batch = example_rows(cfg, rows, length, seed)
        rs = np.random.RandomState(seed + 1)
        slots = max(2, length // 8)
        real = length - length // 4  # every row's real prefix
        positions = np.stack([1 + rs.permutation(real - 1)[:slots] for _ in range(rows)])
        weights = np.ones((rows, slots), np.float32)
        weights[::2, -1] = 0.0
        return dict(
            batch,
            masked_positions=positions.astype(np.int32),
            masked_ids=rs.randint(5, cfg.vocab_size, (rows, slots)).astype(np.int32),
            masked_weights=weights,
            next_sentence_label=rs.randint(0, 2, (rows,)).astype(np.int32),
        )

    def held_out_counts(self, host_batch):
        if "masked_ids" not in host_batch:
            return collections.Counter()
        ids = host_batch["masked_ids"][host_batch["masked_weights"] > 0]
        return collections.Counter(
            {int(t): int(c) for t, c in zip(*np.unique(ids, return_counts=True))}
        )

    def held_out_metrics(self, metrics, counts):
        metrics = super().held_out_metrics(metrics, counts)
        if counts:
            metrics["majority_baseline"] = max(counts.values()) / sum(counts.values())
        return metrics


class Pretraining(MaskedLM):
    """BERT's objective: weighted MLM at masked positions (+ NSP/SOP on [CLS])."""

    objective_name = "pretraining"

    headline_metrics = (*MaskedLM.headline_metrics, "nsp_accuracy")

    next_sentence: bool = derived(True)  # config.loss.next_sentence, or from the sample plan
    mlm_weight: float = 1.0
    nsp_weight: float = 1.0
    sparse_last_layer: bool = True

    def validate(self):
        for key in ("mlm_weight", "nsp_weight"):
            if getattr(self, key) < 0:
                raise ValueError(f"config.loss.{key}={getattr(self, key)!r}: must be >= 0")

    @classmethod
    def from_config(cls, config):
        return cls(**cls.settings(config), next_sentence=next_sentence(config))

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
