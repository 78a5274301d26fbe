"""Task heads and the public models built on BertModel.

The MLM head runs only at ``masked_positions`` ([B, P]) when they are given, so its
vocabulary projection costs B·P·V instead of B·T·V.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import BertConfig
from bertjax.layers import Dropout
from bertjax.model import (
    BertModel,
    _zeros,
    activation,
    constrain,
    dense,
    gather_rows,
    last_layer_at_rows,
    layer_norm,
)

Array = jax.Array


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
    """Encoder + MLM head (+ NSP/SOP head on the pooled [CLS] when ``next_sentence``).

    Outputs ``mlm_logits`` ([B, P, V] at ``masked_positions``, else [B, T, V]) and the encoder's
    ``sequence_output`` [B, T, H]; with ``sparse_last_layer`` and ``masked_positions`` the last
    layer runs only at the masked positions and [CLS] (MosaicBERT): the same logits, about 70%
    less of that layer's work, and no ``sequence_output``. The pretraining objective sets it.
    """

    cfg: BertConfig
    next_sentence: bool = True
    sparse_last_layer: bool = False

    def setup(self):
        self.bert = BertModel(self.cfg, add_pooler=self.next_sentence)
        self.mlm_head = MaskedLMHead(self.cfg)
        if self.next_sentence:
            self.nsp_head = dense(self.cfg, 2, ("embed", "classes"), "nsp_head")

    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
        masked_positions: Array | None = None,
        deterministic: bool = True,
    ) -> dict:
        sparse = self.sparse_last_layer and masked_positions is not None
        x, pooled = self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            segment_ids,
            deterministic=deterministic,
            output_positions=masked_positions if sparse else None,
        )
        outputs = {}
        if not sparse:  # x is every row's output
            outputs["sequence_output"] = x
            if masked_positions is not None:
                x = gather_rows(x, masked_positions)
        outputs["mlm_logits"] = self.mlm_head(x, self.bert)
        if self.next_sentence:
            outputs["nsp_logits"] = self.nsp_head(pooled)
        return outputs

    def last_layer_rows(self, masked_width: int) -> int | None:
        """Rows per sequence the last layer computes for ``masked_width`` masked positions, or
        None when it computes all (for the FLOP count)."""
        if not (self.sparse_last_layer and last_layer_at_rows(self.cfg)):
            return None
        return masked_width + int(self.next_sentence)


class BertForSequenceClassification(nn.Module):
    """Pooled [CLS] -> dropout -> linear; ``num_labels=1`` is regression."""

    cfg: BertConfig
    num_labels: int = 2

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        cfg = self.cfg
        _, pooled = BertModel(cfg, name="bert")(
            input_ids, token_type_ids, attention_mask, segment_ids, deterministic=deterministic
        )
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        pooled = Dropout(rate)(pooled, deterministic=deterministic)
        return dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(pooled)


class BertForTokenClassification(nn.Module):
    """Per-token logits (NER): sequence output -> dropout -> linear."""

    cfg: BertConfig
    num_labels: int = 2

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        cfg = self.cfg
        x, _ = BertModel(cfg, add_pooler=False, name="bert")(
            input_ids, token_type_ids, attention_mask, segment_ids, deterministic=deterministic
        )
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        x = Dropout(rate)(x, deterministic=deterministic)
        return dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(x)
