"""Masked diffusion language modelling (LLaDA / MDLM) on the BERT encoder.

Forward process (Nie et al. 2025, "Large Language Diffusion Models"; Sahoo et al. 2024, MDLM):
each row draws t ~ U(eps, 1) and every maskable token becomes [MASK] with probability t (the data
pipeline does this with `masking="diffusion"` and returns t as `mask_ratio`). The encoder predicts
all masked tokens at once, with no causal mask. The loss

    L = 1/(B·L) · Σ_rows 1/t · Σ_masked -log p(x_i | x_t)

upper-bounds the negative log-likelihood per token (ELBO); L here is the number of real tokens of
the batch (Σ attention_mask), which is LLaDA's B·L on full rows and is not diluted by padding.
Conditional (SFT) batches carry `answer_mask` [B,T]: the prompt is never masked and each row's sum
is divided by its answer length, then averaged over rows (LLaDA's SFT loss).

Metrics: `loss`; `mlm_loss`/`mlm_accuracy` (cross-entropy and argmax accuracy on masked tokens);
`nll_bound`, Σ (1/t)·CE / Σ maskable tokens, the per-token NLL bound in nats (exact over the eval
set because eval batches are fixed and sums add). Sampling lives in `diffusion_sampling.py`;
`add_diffusion_config` turns a run config into a diffusion one.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.objectives.base import example_rows, real_tokens
from bertjax.objectives.pretraining import MaskedLM
from bertjax.ops.loss import cross_entropy

Array = jax.Array


def maskable_tokens(input_ids: Array, attention_mask: Array, cfg) -> Array:
    """Per row: real tokens that are not [PAD]/[UNK]/[CLS]/[SEP] ([MASK]s count: they were
    maskable)."""
    special = [
        i
        for i in (cfg.pad_token_id, cfg.unk_token_id, cfg.cls_token_id, cfg.sep_token_id)
        if i is not None
    ]
    fixed = jnp.isin(input_ids, jnp.asarray(special, jnp.int32))
    return jnp.sum((attention_mask > 0) & ~fixed, axis=-1).astype(jnp.float32)


def add_diffusion_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Turns a pretraining run config into a masked-diffusion one: the objective, its masking and
    single-segment FULL-SENTENCES rows, set together (the trainer checks they agree)."""
    MaskedDiffusion.add_config(config)
    # every maskable position at rate t ~ U(eps, 1) per row
    (config.data.masking,) = MaskedDiffusion.corruptions
    config.data.sample_plan = "full_sentences"  # one segment per row, no sentence label
    return config


class MaskedDiffusion(MaskedLM):
    """LLaDA's masked-diffusion loss (1/t-weighted masked CE); SFT with `answer_mask` batches.
    Its model inputs: the encoder + MLM head at `masked_positions` (all T positions, weight 0
    where unmasked), no token types."""

    objective_name = "diffusion"

    corruptions = ("diffusion",)
    headline_metrics = (*MaskedLM.headline_metrics, "nll_bound")
    input_names = ("input_ids", "attention_mask", "segment_ids", "masked_positions")

    def example_batch(self, cfg, rows, length, seed):
        """Every position a prediction slot, masked at rate t per row."""
        batch = example_rows(cfg, rows, length, seed)
        rs = np.random.RandomState(seed + 1)
        t = (0.05 + 0.9 * rs.rand(rows)).astype(np.float32)
        masked = (rs.rand(rows, length) < t[:, None]) & (batch["attention_mask"] > 0)
        masked[:, 0] = False
        return dict(
            batch,
            input_ids=np.where(masked, cfg.mask_token_id or 0, batch["input_ids"]).astype(np.int32),
            masked_positions=np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)),
            masked_ids=batch["input_ids"],
            masked_weights=masked.astype(np.float32),
            mask_ratio=t,
        )

    def train_flops_per_sequence(self, cfg, seq_len, masked_per_sequence, masked_width, count):
        """The encoder plus the MLM head at all ``seq_len`` positions: every position is a
        prediction slot (`masked_positions` is 0..T-1), whatever the row's mask rate t; counting
        only the masked ones, as MLM does, would undercount the head by 1/t."""
        return count(cfg, seq_len, float(seq_len), None)

    def apply(self, model, variables, batch, rngs, deterministic):
        outputs = super().apply(model, variables, batch, rngs, deterministic)
        if "answer_mask" in batch:
            outputs["bound_tokens"] = jnp.sum(batch["answer_mask"], -1).astype(jnp.float32)
        else:
            outputs["bound_tokens"] = maskable_tokens(
                batch["input_ids"], real_tokens(batch), model.cfg
            )
        return outputs

    def loss_sums(self, outputs, batch):
        """Additive sums: 1/t-weighted CE (per-row scaled in SFT), plain CE, hits, bound tokens."""
        weights_BP = batch["masked_weights"].astype(jnp.float32)
        if "answer_mask" in batch:  # only answer tokens ever count, whatever the batch lists
            answer_BP = jnp.take_along_axis(batch["answer_mask"], batch["masked_positions"], 1)
            weights_BP = weights_BP * answer_BP.astype(jnp.float32)
        nll_BP, correct_BP = cross_entropy(outputs["mlm_logits"], batch["masked_ids"])
        t_B = batch["mask_ratio"].astype(jnp.float32)
        bound_B = jnp.sum(nll_BP * weights_BP, -1) / t_B
        row_scale_B = jnp.ones_like(t_B)
        if "answer_mask" in batch:
            row_scale_B = 1.0 / jnp.maximum(outputs["bound_tokens"], 1.0)
        return {
            "diffusion_loss": jnp.sum(bound_B * row_scale_B),
            "nll_bound": jnp.sum(bound_B),
            "bound_tokens": jnp.sum(outputs["bound_tokens"]),
            "mlm_loss": jnp.sum(nll_BP * weights_BP),
            "mlm_correct": jnp.sum(correct_BP * weights_BP),
            "mlm_weight": jnp.sum(weights_BP),
        }

    def normalizers(self, batch):
        """Whole-batch denominators: real tokens (pretraining) or rows (SFT)."""
        if "answer_mask" in batch:
            loss_norm = jnp.float32(batch["input_ids"].shape[0])
        else:
            loss_norm = jnp.sum(real_tokens(batch).astype(jnp.float32))
        return {
            "loss_norm": jnp.maximum(loss_norm, 1.0),
            "examples": jnp.float32(batch["input_ids"].shape[0]),
        }

    def total_loss(self, sums, norms):
        return sums["diffusion_loss"] / norms["loss_norm"]

    def metrics(self, sums, norms):
        weight = jnp.maximum(sums["mlm_weight"], 1.0)
        return {
            "nll_bound": sums["nll_bound"] / jnp.maximum(sums["bound_tokens"], 1.0),
            "mlm_loss": sums["mlm_loss"] / weight,
            "mlm_accuracy": sums["mlm_correct"] / weight,
            "mask_fraction": sums["mlm_weight"] / jnp.maximum(sums["bound_tokens"], 1.0),
        }


def sft_batch(
    tokenizer, pairs: Sequence[tuple[str, str]], length: int, *, seed: int, eps: float = 1e-3
) -> dict[str, np.ndarray]:
    """Conditional batch from (prompt, answer) texts: `[CLS] prompt [SEP] answer [SEP] [SEP]…`.

    The answer region (everything after the prompt's [SEP], its end-of-text [SEP]s included, as
    LLaDA pads answers with EOS) is `answer_mask`; each of its tokens is masked with probability
    t ~ U(eps, 1) drawn per row from `seed`. The prompt is never masked.
    """
    if not pairs:
        raise ValueError("sft_batch: no (prompt, answer) pairs given")
    prompts = tokenizer.encode([p for p, _ in pairs])
    answers = tokenizer.encode([a for _, a in pairs])
    batch = len(pairs)
    ids = np.full((batch, length), tokenizer.sep_id, np.int32)
    answer_mask = np.zeros((batch, length), np.int32)
    for row, (prompt, answer) in enumerate(zip(prompts, answers)):
        start = len(prompt) + 2
        if start + len(answer) + 1 > length:
            raise ValueError(
                f"sft_batch: pair {row} needs {start + len(answer) + 1} tokens "
                f"(prompt {len(prompt)}, answer {len(answer)}, 3 specials) > length={length}"
            )
        ids[row, 0] = tokenizer.cls_id
        ids[row, 1 : start - 1] = prompt
        ids[row, start : start + len(answer)] = answer
        answer_mask[row, start:] = 1
    rng = np.random.default_rng(seed)
    t = (eps + (1.0 - eps) * rng.random(batch)).astype(np.float32)
    masked = (answer_mask > 0) & (rng.random((batch, length)) < t[:, None])
    return {
        "input_ids": np.where(masked, tokenizer.mask_id, ids).astype(np.int32),
        "attention_mask": np.ones((batch, length), np.int32),
        "answer_mask": answer_mask,
        "masked_positions": np.broadcast_to(
            np.arange(length, dtype=np.int32), (batch, length)
        ).copy(),
        "masked_ids": ids,
        "masked_weights": masked.astype(np.float32),
        "mask_ratio": t,
    }


def unigram_entropy(tokens: np.ndarray, special: np.ndarray) -> float:
    """Entropy in nats/token of the unigram distribution of the non-special tokens."""
    counts = np.bincount(np.asarray(tokens, np.int64), minlength=len(special))[: len(special)]
    counts = counts[~special].astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
