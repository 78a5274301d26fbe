"""Task heads and the public models built on BertModel.

The MLM head runs only at ``masked_positions`` ([B, P]) when they are given, so its
vocabulary projection costs B·P·V instead of B·T·V.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.config import BertConfig
from bertjax.layers import Dropout
from bertjax.model import BertModel, _zeros, activation, constrain, dense, layer_norm

Array = jax.Array


def gather_positions(x_BTH: Array, positions_BP: Array) -> Array:
    """Rows of ``x`` at the given per-example positions: [B,T,H] x [B,P] -> [B,P,H]."""
    return jnp.take_along_axis(x_BTH, positions_BP[:, :, None].astype(jnp.int32), axis=1)


class MaskedLMHead(nn.Module):
    """Transform (dense, activation, LayerNorm) then the decoder tied to the word embeddings."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BPH: Array, bert: BertModel) -> Array:
        cfg = self.cfg
        width_axis = "embed_out" if cfg.embedding_dim == cfg.hidden_size else "factor"
        h = dense(cfg, cfg.embedding_dim, ("embed", width_axis), "transform")(x_BPH)
        h = layer_norm(cfg, width_axis, "layer_norm")(activation(cfg.hidden_act)(h))
        bias = self.param("bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.params_dtype)
        logits_BPV = bert.attend(h, bias)
        return constrain(logits_BPV, ("act_batch", "act_len", "act_vocab"))


class BertForPreTraining(nn.Module):
    """Encoder + MLM head (+ NSP/SOP head on the pooled [CLS] when ``next_sentence``)."""

    cfg: BertConfig
    next_sentence: bool = True

    def setup(self):
        self.bert = BertModel(self.cfg, add_pooler=self.next_sentence)
        self.mlm_head = MaskedLMHead(self.cfg)
        if self.next_sentence:
            self.nsp_head = dense(self.cfg, 2, ("embed", "classes"), "nsp_head")

    def __call__(self, input_ids: Array, token_type_ids: Optional[Array] = None,
                 attention_mask: Optional[Array] = None, segment_ids: Optional[Array] = None,
                 masked_positions: Optional[Array] = None, deterministic: bool = True) -> dict:
        sequence_output, pooled = self.bert(input_ids, token_type_ids, attention_mask,
                                            segment_ids, deterministic=deterministic)
        x = sequence_output if masked_positions is None else gather_positions(
            sequence_output, masked_positions)
        outputs = {"mlm_logits": self.mlm_head(x, self.bert), "sequence_output": sequence_output}
        if self.next_sentence:
            outputs["nsp_logits"] = self.nsp_head(pooled)
        return outputs


class BertForSequenceClassification(nn.Module):
    """Pooled [CLS] -> dropout -> linear; ``num_labels=1`` is regression."""

    cfg: BertConfig
    num_labels: int = 2

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Optional[Array] = None,
                 attention_mask: Optional[Array] = None, segment_ids: Optional[Array] = None,
                 deterministic: bool = True) -> Array:
        cfg = self.cfg
        _, pooled = BertModel(cfg, name="bert")(input_ids, token_type_ids, attention_mask,
                                                segment_ids, deterministic=deterministic)
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        pooled = Dropout(rate)(pooled, deterministic=deterministic)
        return dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(pooled)


class BertForTokenClassification(nn.Module):
    """Per-token logits (NER): sequence output -> dropout -> linear."""

    cfg: BertConfig
    num_labels: int = 2

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Optional[Array] = None,
                 attention_mask: Optional[Array] = None, segment_ids: Optional[Array] = None,
                 deterministic: bool = True) -> Array:
        cfg = self.cfg
        x, _ = BertModel(cfg, add_pooler=False, name="bert")(
            input_ids, token_type_ids, attention_mask, segment_ids, deterministic=deterministic)
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        x = Dropout(rate)(x, deterministic=deterministic)
        return dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(x)
