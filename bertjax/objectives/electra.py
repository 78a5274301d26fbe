"""ELECTRA's replaced-token detection (Clark et al. 2020; google-research/electra
run_pretraining.py): a small generator trained as an MLM on the masked input, replacements
sampled from its softmax, and a discriminator trained to tell, at every real token, whether it
was replaced; both in one step.

    loss = mlm_weight * MLM(generator) + discriminator_weight * BCE(discriminator)

MLM is the weighted mean cross-entropy at the masked positions (the data pipeline's masking, as
for BERT); BCE the sigmoid cross-entropy at every real token (attention mask or packed segment),
label 1 where the corrupted token differs from the original (a sampled token that equals the
original is real), averaged over the real tokens of the global batch. ELECTRA's weights are
1 and 50. The sample uses the step's rng and carries no gradient: the generator learns only from
its MLM loss, the shared embeddings from both. Eval batches sample with a fixed key, so held-out
metrics are reproducible.

Deviations from the reference: the denominators are the weight sums (ELECTRA adds 1e-6); the
held-out AUC is computed from 256 logit bins (ELECTRA's ``tf.metrics.auc`` from 200 probability
thresholds) so it adds up exactly over eval batches, and over real tokens only: ELECTRA's logged
``disc_auc`` (run_pretraining.py: labels x input_mask against probs x input_mask) counts every
padding position as an original token scored 0, below any real one, which raises it on padded
rows. Compare bertjax's ``rtd_auc`` with ELECTRA's logs only on unpadded rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from bertjax.modeling.electra import ElectraForPreTraining, generator_config
from bertjax.modeling.encoder import last_layer_at_rows
from bertjax.objectives.base import real_tokens
from bertjax.objectives.pretraining import MaskedLM, mlm_normalizers, mlm_sums

Array = jax.Array

AUC_BINS = 256  # logit bins of the additive AUC estimate
AUC_RANGE = 12.0  # bins cover logits in [-12, 12]; outside values fall in the end bins
_EVAL_SAMPLE_KEY = 0  # the fixed sampling key of eval steps (no rng there)


def add_electra_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Turns a `default_run_config()` into an ELECTRA one (call before the config is locked):
    the objective and its keys at `Electra`'s defaults (the paper's values), model_type
    "electra" (exports as Hugging Face ELECTRA), ELECTRA's classifier head for fine-tuning
    (classifier_pooling "first") and ELECTRA's masking (85% [MASK], 15% kept, no random
    tokens)."""
    Electra.add_config(config)
    config.model.model_type = "electra"
    # fine-tuning's head: ELECTRA's (first token -> classifier), not BERT's pooler, which a
    # discriminator never trains; "electra_hf" (HF's head) is the one that exports
    config.model.classifier_pooling = "first"
    config.data.mask_token_prob = 0.85
    config.data.random_token_prob = 0.0
    return config


def auc_histograms(logits_BT: Array, labels_BT: Array, weights_BT: Array) -> tuple[Array, Array]:
    """Weighted counts of replaced (positive) and original (negative) tokens per logit bin."""
    width = 2 * AUC_RANGE / AUC_BINS
    bins_BT = jnp.clip(jnp.floor((logits_BT + AUC_RANGE) / width), 0, AUC_BINS - 1)
    bins_BT = bins_BT.astype(jnp.int32)
    zeros = jnp.zeros((AUC_BINS,), jnp.float32)
    positive = zeros.at[bins_BT].add(labels_BT * weights_BT)
    negative = zeros.at[bins_BT].add((1.0 - labels_BT) * weights_BT)
    return positive, negative


def auc_from_histograms(positive: Array, negative: Array) -> Array:
    """P(a replaced token's logit > an original one's), ties within a bin counted half."""
    below = jnp.cumsum(negative) - negative
    pairs = jnp.sum(positive) * jnp.sum(negative)
    wins = jnp.sum(positive * (below + 0.5 * negative))
    return jnp.where(pairs > 0, wins / jnp.maximum(pairs, 1.0), 0.5)


class Electra(MaskedLM):
    """Generator MLM + discriminator replaced-token detection (see the module docstring)."""

    objective_name = "electra"

    headline_metrics = (*MaskedLM.headline_metrics, "rtd_accuracy", "rtd_auc")
    input_names = (*MaskedLM.input_names, "masked_ids", "masked_weights")
    rng_dependent_metrics = (  # the replacements are sampled with the step's rng
        "loss",
        "sampled_accuracy",
        "rtd_loss",
        "rtd_accuracy",
        "rtd_precision",
        "rtd_recall",
        "rtd_auc",
        "replaced_fraction",
    )

    # generator width, heads and feed-forward as a fraction of the discriminator's (Table 6)
    generator_hidden_size: float = 0.25
    generator_layers: float = 1.0  # generator layers as a fraction of the discriminator's
    mlm_weight: float = 1.0  # generator MLM loss weight (ELECTRA's gen_weight)
    discriminator_weight: float = 50.0  # replaced-token BCE weight (ELECTRA's lambda)
    sparse_last_layer: bool = True

    def validate(self):
        for key in ("mlm_weight", "discriminator_weight"):
            if getattr(self, key) < 0:
                raise ValueError(f"config.loss.{key}={getattr(self, key)!r}: must be >= 0")
        for key in ("generator_hidden_size", "generator_layers"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"config.loss.{key}={getattr(self, key)!r}: must be in (0, 1]")

    @classmethod
    def from_config(cls, config):
        if "model" in config and config.model.get("model_type") != "electra":
            raise ValueError(
                f"config.loss.objective='electra' needs config.model.model_type='electra', got "
                f"{config.model.get('model_type')!r} (bertjax.objectives.electra."
                "add_electra_config sets both)"
            )
        return cls(**cls.settings(config))

    def generator_cfg(self, cfg):
        """The generator's BertConfig for discriminator config ``cfg``."""
        return generator_config(cfg, self.generator_hidden_size, self.generator_layers)

    def model(self, cfg):
        return ElectraForPreTraining(cfg, self.generator_cfg(cfg), self.sparse_last_layer)

    def init_batch(self, cfg):
        batch = super().init_batch(cfg)
        one = jnp.ones((1, 1), jnp.int32)
        return {**batch, "masked_ids": one, "masked_weights": one.astype(jnp.float32)}

    def init(self, model, rngs, batch):
        return super().init(model, {**rngs, "sample": rngs["params"]}, batch)

    def apply(self, model, variables, batch, rngs, deterministic):
        """The model's outputs; the replacements are sampled with the step's rng (folded), or a
        fixed key in eval steps."""
        key = rngs["dropout"] if rngs else jax.random.key(_EVAL_SAMPLE_KEY)
        rngs = {**(rngs or {}), "sample": jax.random.fold_in(key, 1)}
        return super().apply(model, variables, batch, rngs, deterministic)

    def loss_sums(self, outputs, batch):
        sums = mlm_sums(outputs["mlm_logits"], batch)
        weights_BP = batch["masked_weights"].astype(jnp.float32)
        sampled_BP = outputs["sampled_ids"] == batch["masked_ids"]
        sums["sampled_correct"] = jnp.sum(sampled_BP * weights_BP)
        real_BT = real_tokens(batch)
        logits_BT = outputs["rtd_logits"].astype(jnp.float32)
        labels_BT = outputs["rtd_labels"].astype(jnp.float32)
        # sigmoid cross-entropy: log(1 + e^x) - z x (tf.nn.sigmoid_cross_entropy_with_logits)
        bce_BT = jnp.logaddexp(0.0, logits_BT) - labels_BT * logits_BT
        predicted_BT = (logits_BT > 0).astype(jnp.float32)
        positive, negative = auc_histograms(logits_BT, labels_BT, real_BT)
        sums.update(
            rtd_loss=jnp.sum(bce_BT * real_BT),
            rtd_correct=jnp.sum((predicted_BT == labels_BT) * real_BT),
            rtd_replaced=jnp.sum(labels_BT * real_BT),
            rtd_predicted=jnp.sum(predicted_BT * real_BT),
            rtd_true_positives=jnp.sum(predicted_BT * labels_BT * real_BT),
            rtd_auc_positive=positive,
            rtd_auc_negative=negative,
        )
        return sums

    def normalizers(self, batch):
        tokens = jnp.sum(real_tokens(batch))
        return {**mlm_normalizers(batch), "tokens": jnp.where(tokens > 0, tokens, 1.0)}

    def total_loss(self, sums, norms):
        """mlm_weight * MLM + discriminator_weight * BCE, each a mean under global normalizers."""
        mlm = sums["mlm_loss"] / norms["mlm_weight"]
        rtd = sums["rtd_loss"] / norms["tokens"]
        return self.mlm_weight * mlm + self.discriminator_weight * rtd

    def metrics(self, sums, norms):
        """The generator's mlm_loss, mlm_accuracy and sampled_accuracy (its sample is the
        original); the discriminator's rtd_loss, rtd_accuracy, rtd_precision, rtd_recall and
        rtd_auc over real tokens; replaced_fraction (1 - it is the all-original baseline)."""
        return {
            "mlm_loss": sums["mlm_loss"] / norms["mlm_weight"],
            "mlm_accuracy": sums["mlm_correct"] / norms["mlm_weight"],
            "sampled_accuracy": sums["sampled_correct"] / norms["mlm_weight"],
            "rtd_loss": sums["rtd_loss"] / norms["tokens"],
            "rtd_accuracy": sums["rtd_correct"] / norms["tokens"],
            "rtd_precision": sums["rtd_true_positives"] / jnp.maximum(sums["rtd_predicted"], 1.0),
            "rtd_recall": sums["rtd_true_positives"] / jnp.maximum(sums["rtd_replaced"], 1.0),
            "rtd_auc": auc_from_histograms(sums["rtd_auc_positive"], sums["rtd_auc_negative"]),
            "replaced_fraction": sums["rtd_replaced"] / norms["tokens"],
        }

    def last_layer_rows(self, cfg, masked_width):
        """The generator's last layer at the masked positions (the discriminator's at every
        row)."""
        if not (self.sparse_last_layer and last_layer_at_rows(self.generator_cfg(cfg))):
            return None
        return masked_width

    def train_flops_per_sequence(self, cfg, seq_len, masked_per_sequence, masked_width, count):
        """The generator (MLM head at the masked positions, sparse last layer) plus the
        discriminator (every row) and its head (dense D -> D and D -> 1 at every token)."""
        generator = self.generator_cfg(cfg)
        rows = None if masked_width is None else self.last_layer_rows(cfg, masked_width)
        head = 6 * seq_len * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size)
        return (
            count(generator, seq_len, masked_per_sequence, rows) + count(cfg, seq_len, 0.0) + head
        )
