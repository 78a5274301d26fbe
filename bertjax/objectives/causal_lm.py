"""Causal language modelling on the one configured encoder (GPT's next-token objective).

The same BERT/ModernBERT stack with ``BertConfig.causal`` on (every attention kernel serves it:
no query sees a later key, nor another packed segment), the MLM head (tied decoder) at every
position, and next-token cross-entropy over every real token:

    L = Σ_rows Σ_t w_t · -log p(x_{t+1} | x_≤t) / Σ w_t

with w_t = 1 where t is real and t + 1 a real token of the same row or packed segment (the last
real token of each row/segment predicts nothing). The rows come from the same sample plans as
every objective with ``config.data.masking="causal"`` (bertjax/data/corruption/causal.py):
``masked_ids`` holds each position's next token and ``masked_weights`` the w_t, so held-out
``clm_loss`` summed over fixed eval batches is the exact NLL per predicted token, in nats.
``input_mask_rate`` (a data setting) replaces a share of the *inputs* by [MASK] while the targets
stay the original next tokens (Gao et al. 2025, "What Makes Diffusion Language Models Super Data
Learners?": random input masking is what makes multi-epoch training data-efficient); held-out rows
are never masked.

The objective turns ``causal`` on in the model it builds, so one run config serves a CLM phase
followed by an MLM phase (configs/clm_mlm_tiny.py): the MLM phase's model is bidirectional again.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.data.corruption.causal import causal_batch
from bertjax.modeling.heads import BertForPreTraining
from bertjax.objectives.base import TokenNLL, example_rows
from bertjax.objectives.pretraining import MaskedLM
from bertjax.ops.loss import cross_entropy

Array = jax.Array


def add_clm_config(config):
    """Turns a pretraining run config into a causal-LM one: the objective and its rows (no MLM
    selection: each position's target is the next token), set together."""
    CausalLM.add_config(config)
    (config.data.masking,) = CausalLM.corruptions
    return config


class CausalLM(MaskedLM):
    """Next-token cross-entropy under a causal mask, the LM head at every position. As every
    objective with an MLM head it may start the head's bias at the unigram log frequencies
    (``config.mlm_bias_init``); the majority baseline is that of the next tokens."""

    objective_name = "clm"

    corruptions = ("causal",)
    headline_metrics = ("clm_loss", "clm_accuracy", "clm_perplexity", "majority_baseline")
    # "clm_loss" is the unsmoothed next-token NLL per predicted token (the held-out
    # clm_perplexity is its exp; MaskedLM's "perplexity" of mlm_loss does not apply)
    token_nll = TokenNLL("clm_loss", perplexity="clm_perplexity")
    # the encoder under the causal mask; the head at every position (no masked_positions)
    input_names = ("input_ids", "token_type_ids", "attention_mask", "segment_ids")

    def model(self, cfg):
        return BertForPreTraining(cfg.replace(causal=True), next_sentence=False)

    def loss_sums(self, outputs, batch):
        """Summed next-token NLL and hits, weighted by the positions that have a next token."""
        weights_BT = batch["masked_weights"].astype(jnp.float32)
        nll_BT, correct_BT = cross_entropy(outputs["mlm_logits"], batch["masked_ids"])
        return {
            "clm_loss": jnp.sum(nll_BT * weights_BT),
            "clm_correct": jnp.sum(correct_BT * weights_BT),
        }

    def normalizers(self, batch):
        """The global batch's predicted tokens (Σ w_t)."""
        weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
        return {"clm_weight": jnp.maximum(weight, 1.0)}

    def total_loss(self, sums, norms):
        return sums["clm_loss"] / norms["clm_weight"]

    def metrics(self, sums, norms):
        """clm_loss (NLL per predicted token, nats), clm_accuracy, clm_perplexity."""
        loss = sums["clm_loss"] / norms["clm_weight"]
        return {
            "clm_loss": loss,
            "clm_accuracy": sums["clm_correct"] / norms["clm_weight"],
            "clm_perplexity": jnp.exp(loss),
        }

    def example_batch(self, cfg, rows, length, seed):
        """Random padded rows made causal (data/corruption/causal.py), 10% of the inputs masked."""
        batch = example_rows(cfg, rows, length, seed)
        real = batch["attention_mask"]
        keys = np.arange(rows, dtype=np.uint64) + np.uint64(seed)
        corrupted = causal_batch(
            batch["input_ids"], real, real > 0, keys, 0.1, cfg.mask_token_id or 0
        )
        return {**batch, **corrupted}

    def train_flops_per_sequence(self, cfg, seq_len, masked_per_sequence, masked_width, count):
        """The encoder plus the LM head at all ``seq_len`` positions (what the step computes)."""
        return count(cfg, seq_len, float(seq_len), None)
