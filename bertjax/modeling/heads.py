"""Task heads and the public models built on BertModel.

The MLM head runs only at ``masked_positions`` ([B, P]) when they are given, so its
vocabulary projection costs B·P·V instead of B·T·V.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.encoder import BertModel
from bertjax.modeling.layers import (
    Dropout,
    activation,
    constrain,
    dense,
    gather_rows,
    layer_norm,
    zeros_init,
)

Array = jax.Array


def transform(cfg: BertConfig, width: int, axes: tuple, x: Array, output: bool = True) -> Array:
    """The heads' transform (inside a compact module): dense, activation, LayerNorm (BERT's MLM
    transform; ModernBERT's prediction head, with its own bias and activation choices).
    ``output``: the dense takes `output_init` (ModernBERT's classifier head) instead of
    `normal_init` (its MLM head under init_scheme "modernbert")."""
    h = dense(cfg, width, axes, "transform", cfg.head_bias, output=output)(x)
    return layer_norm(cfg, axes[-1], "layer_norm")(activation(cfg.head_activation)(h))


class MaskedLMHead(nn.Module):
    """Transform (dense, activation, LayerNorm) then the decoder tied to the word embeddings,
    with a bias unless ``decoder_bias`` is False. The transform's dense starts at
    initializer_range (ModernBERT's training code, FlexBertPredictionHead: an "in" module), or at
    initializer_range / sqrt(2 L) under init_scheme "modernbert_hf" (HF's _init_weights)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BPD: Array, bert: BertModel) -> Array:
        cfg = self.cfg
        width_axis = "embed_out" if cfg.embedding_dim == cfg.hidden_size else "factor"
        hf_init = cfg.init_scheme == "modernbert_hf"
        h_BPW = transform(cfg, cfg.embedding_dim, ("embed", width_axis), x_BPD, output=hf_init)
        bias_V = None
        if cfg.decoder_bias:
            shape = (cfg.vocab_size,)
            bias_V = self.param("bias", zeros_init(("vocab",)), shape, cfg.params_dtype)
        logits_BPV = bert.attend(h_BPW, bias_V)
        return constrain(logits_BPV, ("act_batch", "act_len", "act_vocab"))


class BertForPreTraining(nn.Module):
    """Encoder + MLM head (+ NSP/SOP head on the pooled [CLS] when ``next_sentence``).

    Outputs ``mlm_logits`` ([B, P, V] at ``masked_positions``, else [B, T, V]), the encoder's
    ``sequence_output`` [B, T, D] and ``nsp_logits`` [B, 2]; with ``sparse_last_layer`` and
    ``masked_positions`` the last layer runs only at the masked positions and [CLS] (MosaicBERT):
    the same logits, most of that layer's work saved, and no ``sequence_output``. The
    pretraining objective sets it.

    Args:
      cfg: the encoder's BertConfig (the module's only configuration).
      next_sentence: build the pooler and the NSP/SOP head.
      sparse_last_layer: the last layer computes only the masked positions (and [CLS]).

    Call arguments: ``input_ids`` [B, T]; optional ``token_type_ids``, ``attention_mask`` (or
    ``segment_ids`` for packed rows) [B, T], ``masked_positions`` [B, P]; ``deterministic``
    (False: dropout, with a ``dropout`` rng).

    Returns:
      A dict: ``mlm_logits``, ``sequence_output`` and (``next_sentence``) ``nsp_logits``.

    Example::

        cfg = bertjax.BertConfig.preset("tiny", vocab_size=1000)
        model = bertjax.BertForPreTraining(cfg)
        ids = jnp.ones((2, 16), jnp.int32)
        params = model.init(jax.random.key(0), ids)["params"]
        out = model.apply({"params": params}, ids, attention_mask=jnp.ones_like(ids))
        out["mlm_logits"].shape  # (2, 16, 1000)
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
        self._check_heads()
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

    def _check_heads(self) -> None:
        """One clear error when the params lack a head this model applies (a checkpoint saved
        without it: a base-model or task-model save, a RoBERTa MLM without NSP)."""
        if self.is_initializing():
            return
        params = self.variables.get("params", {})
        if "mlm_head" not in params:
            raise ValueError(
                "these params have no MLM head (mlm_head): a base-model or task-model save; run "
                "the encoder with bertjax.BertModel(cfg) on params['bert']"
            )
        if self.next_sentence and "nsp_head" not in params:
            raise ValueError(
                "these params have no NSP/SOP head (nsp_head), as RoBERTa and MLM-only checkpoints:"
                " use bertjax.BertForPreTraining(cfg, next_sentence=False)"
            )


def pool(cfg: BertConfig, sequence_BTD: Array, attention_mask: Array | None) -> Array:
    """ModernBERT's pooling: the [CLS] row, or the mean over real tokens ("mean")."""
    if cfg.classifier_pooling == "cls":
        return sequence_BTD[:, 0]
    if attention_mask is None:
        return jnp.mean(sequence_BTD, axis=1)
    weights = attention_mask.astype(sequence_BTD.dtype)[..., None]
    return jnp.sum(sequence_BTD * weights, axis=1) / jnp.sum(weights, axis=1)


class _Classifier(nn.Module):
    """Encoder -> dropout -> linear over ``num_labels``, on the pooled [CLS] or on every token.
    With ``classifier_pooling`` "cls"/"mean" (ModernBERT) the pooled row (or every token) goes
    through the head's transform (``head``: dense, activation, LayerNorm) instead of BERT's
    tanh pooler. ELECTRA's heads have no pooler: "first" is google-research/electra's
    (classification_tasks.py: the first token's output, dropout, linear; no layer a pretrained
    discriminator lacks), "electra_hf" HF's ElectraClassificationHead (first token, dropout,
    ``electra_head`` dense, GELU, dropout, linear), which converts to and from
    ElectraForSequenceClassification. Per token both are dropout and linear, as HF's
    ElectraForTokenClassification."""

    cfg: BertConfig
    num_labels: int = 2
    per_token = False

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
        pooling = cfg.classifier_pooling
        modern = pooling in ("cls", "mean")
        add_pooler = pooling == "pooler" and not self.per_token
        sequence, pooled = BertModel(cfg, add_pooler=add_pooler, name="bert")(
            input_ids, token_type_ids, attention_mask, segment_ids, deterministic=deterministic
        )
        x = sequence if self.per_token else pooled
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        if modern:
            if not self.per_token:
                x = pool(cfg, sequence, attention_mask)
            x = PredictionHead(cfg, name="head")(x)
        elif pooling in ("first", "electra_hf") and not self.per_token:
            x = sequence[:, 0]
            if pooling == "electra_hf":
                x = Dropout(rate)(x, deterministic=deterministic)
                h = dense(cfg, cfg.hidden_size, ("embed", "embed_out"), "electra_head")(x)
                x = activation("gelu")(h)
        x = Dropout(rate)(x, deterministic=deterministic)
        return dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(x)


class PredictionHead(nn.Module):
    """ModernBERT's prediction head of its task models: dense, activation, LayerNorm."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return transform(self.cfg, self.cfg.hidden_size, ("embed", "embed_out"), x)


class BertForSequenceClassification(_Classifier):
    """Pooled [CLS] -> dropout -> linear: logits [B, num_labels]; ``num_labels=1`` is regression.

    Args:
      cfg: the encoder's BertConfig (``classifier_pooling``: BERT's pooler, [CLS] or the mean).
      num_labels: classes (1: a regression score).

    Call arguments: ``input_ids`` [B, T]; optional ``token_type_ids``, ``attention_mask`` or
    ``segment_ids`` [B, T]; ``deterministic``.

    Returns:
      Logits [B, num_labels].

    Example::

        cfg = bertjax.BertConfig.preset("tiny", vocab_size=1000)
        model = bertjax.BertForSequenceClassification(cfg, num_labels=3)
        ids = jnp.ones((2, 16), jnp.int32)
        params = model.init(jax.random.key(0), ids)["params"]
        logits_BL = model.apply({"params": params}, ids, attention_mask=jnp.ones_like(ids))
    """


class BertForTokenClassification(_Classifier):
    """Per-token logits (NER): sequence output -> dropout -> linear, [B, T, num_labels]."""

    per_token = True


class PositionHead(nn.Module):
    """PERT's head: BERT's MLM transform (dense, activation, LayerNorm) at the predicted rows, then
    scores against every position's output: logits [B, P, T] over the input sequence (padding
    gets -1e9)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BPD: Array, sequence_BTD: Array, real_BT: Array | None) -> Array:
        cfg = self.cfg
        h_BPD = dense(cfg, cfg.hidden_size, ("embed", "embed_out"), "transform")(x_BPD)
        h_BPD = layer_norm(cfg, "embed_out", "layer_norm")(activation(cfg.hidden_act)(h_BPD))
        logits_BPT = jnp.einsum("bpd,btd->bpt", h_BPD, sequence_BTD).astype(jnp.float32)
        if real_BT is not None:
            logits_BPT = jnp.where(real_BT[:, None, :] > 0, logits_BPT, -1e9)
        return constrain(logits_BPT, ("act_batch", "act_len", None))


class BertForPermutedLM(nn.Module):
    """Encoder + PERT's position head (Cui et al. 2022): at each of ``masked_positions`` ([B, P])
    logits over the row's T positions, ``position_logits`` [B, P, T]. The encoder is ``bert``
    without a pooler, as in `BertForPreTraining`, so fine-tuning loads it like any other.

    Example::

        cfg = bertjax.BertConfig.preset("tiny", vocab_size=1000)
        model = BertForPermutedLM(cfg)
        ids, where = jnp.ones((2, 16), jnp.int32), jnp.zeros((2, 3), jnp.int32)
        params = model.init(jax.random.key(0), ids, masked_positions=where)["params"]
        out = model.apply({"params": params}, ids, masked_positions=where)
        out["position_logits"].shape  # (2, 3, 16)
    """

    cfg: BertConfig

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
        masked_positions: Array | None = None,
        deterministic: bool = True,
    ) -> dict:
        x_BTD, _ = BertModel(self.cfg, add_pooler=False, name="bert")(
            input_ids, token_type_ids, attention_mask, segment_ids, deterministic=deterministic
        )
        x_BPD = gather_rows(x_BTD, masked_positions)
        logits = PositionHead(self.cfg, name="position_head")(x_BPD, x_BTD, attention_mask)
        return {"position_logits": logits, "sequence_output": x_BTD}
