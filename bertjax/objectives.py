"""Objectives: what a step computes from a batch. Pretraining (MLM + NSP/SOP) lives here;
other objectives (diffusion, fine-tuning, distillation) subclass `Objective` in their own
modules and are named in `OBJECTIVES`.

Losses are computed as sums plus global normalizers (total mask weight, number of
examples), so k microbatches summed give exactly the loss of the whole batch, and eval
sums/normalizers added over many batches give exact held-out averages.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax import moe
from bertjax.config import BertConfig
from bertjax.heads import BertForPreTraining

Array = jax.Array


def default_loss_config() -> ml_collections.ConfigDict:
    """The ``config.loss`` defaults: BERT's MLM + NSP with equal weights."""
    c = ml_collections.ConfigDict()
    c.mlm_weight = 1.0  # weight of the masked-LM loss in the total
    c.nsp_weight = 1.0  # weight of the next-sentence (NSP/SOP) loss in the total
    c.next_sentence = True  # False when the objective has no sentence pairs: no NSP head or loss
    c.objective = "pretraining"  # what the step optimizes: a name in bertjax.objectives.OBJECTIVES
    # pretraining: the last layer runs only at the masked positions and [CLS], the rows the loss
    # reads (same loss and gradients, less work); False computes every row
    c.sparse_last_layer = True
    return c


def validate_loss_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming an unknown or invalid ``config.loss`` key."""
    known = set(default_loss_config().keys())
    for name in (config.get("objective", "pretraining"),):
        if name not in OBJECTIVES:
            raise ValueError(f"config.loss.objective={name!r}: must be one of {sorted(OBJECTIVES)}")
        known |= set(_objective_class(name).extra_config_keys)
    unknown = sorted(set(config.keys()) - known)
    if unknown:
        raise ValueError(f"unknown config.loss key(s) {unknown}; known keys: {sorted(known)}")
    for key in ("mlm_weight", "nsp_weight"):
        if config.get(key, 1.0) < 0:
            raise ValueError(f"config.loss.{key}={config[key]!r}: must be >= 0")


@jax.custom_vjp
def _nll(logits: Array, labels: Array) -> Array:
    """-log softmax(logits)[label] as logsumexp minus the label's logit (fp32 [..., C] x [...])."""
    return _nll_fwd(logits, labels)[0]


def _nll_fwd(logits, labels):
    top = jnp.max(logits, axis=-1, keepdims=True)
    log_sum_exp = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1)) + top[..., 0]
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return log_sum_exp - label_logit, (logits, labels, log_sum_exp)


def _nll_bwd(residuals, g):
    """(softmax - one_hot(label)) * g in one pass over the logits (autodiff's two terms, a
    scatter-add of the label's and a separate sum, cost two more)."""
    logits, labels, log_sum_exp = residuals
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    probs = jnp.exp(logits - log_sum_exp[..., None])
    return (probs - (index == labels[..., None]).astype(logits.dtype)) * g[..., None], None


_nll.defvjp(_nll_fwd, _nll_bwd)


def cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Per-example fp32 cross-entropy and correctness of the argmax: [..., C] x [...] -> [...].

    The loss has a hand-written backward (`_nll`): on XLA:CPU, log_softmax + take + jnp.argmax
    (a two-value reduction) cost ~50 ms more per BERT-mini step, at 640 masked positions x 30522
    classes. Correct means jnp.argmax's answer (the first position holding the maximum) is the
    label: the label's logit is the maximum and every logit before it is below that, a masked
    max reduction (8 ms at 608 x 30522 on 2 cores, where the first-max index as a min over
    positions took 16 ms).
    """
    logits = logits.astype(jnp.float32)
    labels = labels.astype(jnp.int32)
    nll = _nll(logits, labels)
    logits = jax.lax.stop_gradient(logits)
    top = jnp.max(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    before_label = jnp.max(jnp.where(index < labels[..., None], logits, -jnp.inf), axis=-1)
    return nll, ((label_logit >= top) & (before_label < top)).astype(jnp.float32)


def loss_sums(outputs: dict, batch: dict, next_sentence: bool) -> dict:
    """Unnormalized sums over the (micro)batch: weighted MLM loss/hits, NSP loss/hits."""
    weights_BP = batch["masked_weights"].astype(jnp.float32)
    nll_BP, correct_BP = cross_entropy(outputs["mlm_logits"], batch["masked_ids"])
    sums = {
        "mlm_loss": jnp.sum(nll_BP * weights_BP),
        "mlm_correct": jnp.sum(correct_BP * weights_BP),
    }
    if next_sentence:
        nll_B, correct_B = cross_entropy(outputs["nsp_logits"], batch["next_sentence_label"])
        sums.update(nsp_loss=jnp.sum(nll_B), nsp_correct=jnp.sum(correct_B))
    sums.update(moe.loss_sums(outputs, batch))  # MoE auxiliary losses (empty when dense)
    return sums


def normalizers(batch: dict) -> dict:
    """Denominators over the whole global batch: total mask weight and number of examples."""
    weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    return {
        "mlm_weight": jnp.where(weight > 0, weight, 1.0),
        "examples": jnp.float32(batch["masked_weights"].shape[0]),
    }


def total_loss(sums: dict, norms: dict, config: ml_collections.ConfigDict) -> Array:
    """mlm_weight * MLM + nsp_weight * NSP, each a mean under the global normalizers."""
    loss = config.mlm_weight * sums["mlm_loss"] / norms["mlm_weight"]
    if "nsp_loss" in sums:
        loss = loss + config.nsp_weight * sums["nsp_loss"] / norms["examples"]
    return loss + moe.total_loss_term(sums, norms)  # router losses, weighted by BertConfig fields


def loss_metrics(sums: dict, norms: dict, config: ml_collections.ConfigDict) -> dict:
    """loss, mlm_loss, mlm_accuracy (+ nsp_loss, nsp_accuracy) from whole-batch sums."""
    metrics = {
        "loss": total_loss(sums, norms, config),
        "mlm_loss": sums["mlm_loss"] / norms["mlm_weight"],
        "mlm_accuracy": sums["mlm_correct"] / norms["mlm_weight"],
    }
    if "nsp_loss" in sums:
        metrics["nsp_loss"] = sums["nsp_loss"] / norms["examples"]
        metrics["nsp_accuracy"] = sums["nsp_correct"] / norms["examples"]
    metrics.update(moe.metrics(sums, norms))
    return metrics


class Objective(abc.ABC):
    """What a step computes: the model, its inputs, loss sums and metrics. Frozen and hashable."""

    extra_config_keys: tuple = ()  # config.loss keys this objective adds to the defaults

    @classmethod
    @abc.abstractmethod
    def from_config(cls, loss_config: ml_collections.ConfigDict) -> Objective:
        """The objective described by ``config.loss``."""

    def model(self, cfg: BertConfig) -> nn.Module:
        return BertForPreTraining(cfg, next_sentence=False)

    def init_batch(self, cfg: BertConfig) -> dict:
        """A tiny batch with every key `apply` reads (only shapes/dtypes matter)."""
        length = min(8, cfg.max_position_embeddings - cfg.position_offset)
        return {
            "input_ids": jnp.zeros((1, length), jnp.int32),
            "masked_positions": jnp.zeros((1, 1), jnp.int32),
        }

    def apply(
        self,
        model: nn.Module,
        variables: dict,
        batch: dict,
        rngs,
        deterministic: bool,
        init: bool = False,
    ):
        """Runs the model on a batch (``init=True``: returns ``model.init``'s variables)."""
        args = (
            batch["input_ids"],
            batch.get("token_type_ids"),
            batch.get("attention_mask"),
            batch.get("segment_ids"),
            batch["masked_positions"],
        )
        if init:
            return model.init(rngs, *args, deterministic=deterministic)
        # MoE configs also collect the layers' sown router stats as outputs["moe"].
        return moe.apply_model(model, variables, *args, deterministic=deterministic, rngs=rngs)

    @abc.abstractmethod
    def loss_sums(self, outputs, batch: dict) -> dict:
        """Additive sums over the (micro)batch."""

    def normalizers(self, batch: dict) -> dict:
        return normalizers(batch)

    @abc.abstractmethod
    def total_loss(self, sums: dict, norms: dict) -> jax.Array:
        """The scalar to differentiate, linear in ``sums``."""

    @abc.abstractmethod
    def metrics(self, sums: dict, norms: dict) -> dict:
        """Named scalars from (possibly accumulated) sums and normalizers."""


@dataclasses.dataclass(frozen=True)
class Pretraining(Objective):
    """BERT's objective: weighted MLM at masked positions (+ NSP/SOP on [CLS])."""

    next_sentence: bool = True
    mlm_weight: float = 1.0
    nsp_weight: float = 1.0
    sparse_last_layer: bool = True

    @classmethod
    def from_config(cls, loss_config):
        return cls(
            bool(loss_config.next_sentence),
            float(loss_config.mlm_weight),
            float(loss_config.nsp_weight),
            bool(loss_config.get("sparse_last_layer", True)),
        )

    def model(self, cfg):
        return BertForPreTraining(
            cfg, next_sentence=self.next_sentence, sparse_last_layer=self.sparse_last_layer
        )

    def loss_sums(self, outputs, batch):
        return loss_sums(outputs, batch, self.next_sentence)

    def total_loss(self, sums, norms):
        return total_loss(sums, norms, self)

    def metrics(self, sums, norms):
        return loss_metrics(sums, norms, self)


# name -> "module:class"; an objective module is imported only when a config names it.
OBJECTIVES = {
    "pretraining": "bertjax.objectives:Pretraining",
    "classification": "bertjax.finetune:Classification",
    "token_classification": "bertjax.finetune:TokenClassification",
    "diffusion": "bertjax.diffusion:MaskedDiffusion",
    "distill": "bertjax.distill:DistillObjective",
}


def _objective_class(name: str) -> type:
    module, attr = OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def make_objective(loss_config: ml_collections.ConfigDict) -> Objective:
    """The Objective named by ``config.loss.objective`` (default: pretraining)."""
    validate_loss_config(loss_config)
    return _objective_class(loss_config.get("objective", "pretraining")).from_config(loss_config)
