"""Pretraining losses: weighted sparse MLM cross-entropy and NSP/SOP cross-entropy, in fp32.

Losses are computed as sums plus global normalizers (total mask weight, number of
examples), so k microbatches summed give exactly the loss of the whole batch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

Array = jax.Array


def default_loss_config() -> ml_collections.ConfigDict:
    """The ``config.loss`` defaults: BERT's MLM + NSP with equal weights."""
    c = ml_collections.ConfigDict()
    c.mlm_weight = 1.0  # weight of the masked-LM loss in the total
    c.nsp_weight = 1.0  # weight of the next-sentence (NSP/SOP) loss in the total
    c.next_sentence = True  # False when the objective has no sentence pairs: no NSP head or loss
    return c


def validate_loss_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming an unknown or invalid ``config.loss`` key."""
    known = set(default_loss_config().keys())
    unknown = sorted(set(config.keys()) - known)
    if unknown:
        raise ValueError(f"unknown config.loss key(s) {unknown}; known keys: {sorted(known)}")
    for key in ("mlm_weight", "nsp_weight"):
        if config.get(key, 1.0) < 0:
            raise ValueError(f"config.loss.{key}={config[key]!r}: must be >= 0")


def cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Per-example fp32 cross-entropy and correctness of the argmax: [..., C] x [...] -> [...]."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return nll, correct


def loss_sums(outputs: dict, batch: dict, next_sentence: bool) -> dict:
    """Unnormalized sums over the (micro)batch: weighted MLM loss/hits, NSP loss/hits."""
    weights_BP = batch["masked_weights"].astype(jnp.float32)
    nll_BP, correct_BP = cross_entropy(outputs["mlm_logits"], batch["masked_ids"])
    sums = {"mlm_loss": jnp.sum(nll_BP * weights_BP), "mlm_correct": jnp.sum(correct_BP * weights_BP)}
    if next_sentence:
        nll_B, correct_B = cross_entropy(outputs["nsp_logits"], batch["next_sentence_label"])
        sums.update(nsp_loss=jnp.sum(nll_B), nsp_correct=jnp.sum(correct_B))
    return sums


def normalizers(batch: dict) -> dict:
    """Denominators over the whole global batch: total mask weight and number of examples."""
    weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    return {"mlm_weight": jnp.where(weight > 0, weight, 1.0),
            "examples": jnp.float32(batch["masked_weights"].shape[0])}


def total_loss(sums: dict, norms: dict, config: ml_collections.ConfigDict) -> Array:
    """mlm_weight * MLM + nsp_weight * NSP, each a mean under the global normalizers."""
    loss = config.mlm_weight * sums["mlm_loss"] / norms["mlm_weight"]
    if "nsp_loss" in sums:
        loss = loss + config.nsp_weight * sums["nsp_loss"] / norms["examples"]
    return loss


def loss_metrics(sums: dict, norms: dict, config: ml_collections.ConfigDict) -> dict:
    """loss, mlm_loss, mlm_accuracy (+ nsp_loss, nsp_accuracy) from whole-batch sums."""
    metrics = {"loss": total_loss(sums, norms, config),
               "mlm_loss": sums["mlm_loss"] / norms["mlm_weight"],
               "mlm_accuracy": sums["mlm_correct"] / norms["mlm_weight"]}
    if "nsp_loss" in sums:
        metrics["nsp_loss"] = sums["nsp_loss"] / norms["examples"]
        metrics["nsp_accuracy"] = sums["nsp_correct"] / norms["examples"]
    return metrics
