"""Word + position + token-type embeddings, and the position ids of (packed) rows."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.layers import Dropout, constrain, dense, layer_norm, normal_init
from bertjax.modeling.position_init import fourier_init, sinusoidal_init
from bertjax.ops import dense as dense_ops

Array = jax.Array


def position_ids(segment_ids: Array | None, batch: int, length: int, offset: int) -> Array:
    """0, 1, 2, ... per row, restarting at each packed segment, plus RoBERTa's offset."""
    index = jnp.arange(length, dtype=jnp.int32)[None, :]
    if segment_ids is None:
        return jnp.broadcast_to(index + offset, (batch, length))
    starts = jnp.concatenate(
        [jnp.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    segment_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return index - segment_start + offset


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout; ALBERT and ELECTRA project
    W -> D. With RoPE there is no position table, with type_vocab_size 0 no token-type table
    (ModernBERT: word embeddings and the norm only)."""

    cfg: BertConfig

    def setup(self):
        cfg = self.cfg
        self.width_axis = "embed" if cfg.embedding_dim == cfg.hidden_size else "factor"
        width = cfg.embedding_dim
        self.word_embeddings = self.param(
            "word_embeddings",
            normal_init(cfg, ("vocab", self.width_axis)),
            (cfg.vocab_size, width),
            cfg.params_dtype,
        )
        if cfg.position_embedding_type == "absolute":  # RoPE rotates q and k instead
            position_init = {
                "normal": nn.initializers.normal(cfg.initializer_range),
                "sinusoidal": sinusoidal_init(cfg.initializer_range),
                "fourier": fourier_init(cfg.initializer_range, cfg.head_dim),
            }[cfg.position_embedding_init]
            self.position_embeddings = self.param(
                "position_embeddings",
                nn.with_logical_partitioning(position_init, ("position", self.width_axis)),
                (cfg.max_position_embeddings, width),
                cfg.params_dtype,
            )
        if cfg.type_vocab_size:
            self.token_type_embeddings = self.param(
                "token_type_embeddings",
                normal_init(cfg, ("types", self.width_axis)),
                (cfg.type_vocab_size, width),
                cfg.params_dtype,
            )
        self.layer_norm = layer_norm(cfg, self.width_axis, "layer_norm")
        self.dropout = Dropout(cfg.embedding_dropout)
        if width != cfg.hidden_size:
            self.projection = dense(cfg, cfg.hidden_size, ("factor", "embed"), "projection")

    def __call__(
        self, input_ids, token_type_ids, positions, deterministic: bool, project: bool = True
    ) -> Array:
        """[B, T, D]; ``project=False``: the [B, T, W] output before ALBERT/ELECTRA's W -> D
        projection (what ELECTRA's generator reads from the embeddings it shares)."""
        dtype = self.cfg.compute_dtype
        x_BTW = jnp.take(self.word_embeddings, input_ids, axis=0).astype(dtype)
        if self.cfg.position_embedding_type == "absolute":
            x_BTW = x_BTW + jnp.take(self.position_embeddings, positions, axis=0).astype(dtype)
        if self.cfg.type_vocab_size:
            x_BTW = x_BTW + jnp.take(self.token_type_embeddings, token_type_ids, axis=0).astype(
                dtype
            )
        x_BTW = self.dropout(self.layer_norm(x_BTW), deterministic=deterministic)
        if not project:
            return constrain(x_BTW, ("act_batch", "act_len", "act_embed"))
        x_BTD = self.projection(x_BTW) if self.cfg.embedding_dim != self.cfg.hidden_size else x_BTW
        return constrain(x_BTD, ("act_batch", "act_len", "act_embed"))

    def attend(self, x_BPW: Array, bias_V: Array | None = None) -> Array:
        """Logits against the word-embedding table (the tied MLM decoder), plus ``bias_V``."""
        table_VW = self.word_embeddings.astype(self.cfg.compute_dtype)
        if bias_V is None:
            bias_V = jnp.zeros((table_VW.shape[0],), table_VW.dtype)
        return dense_ops.tied_decoder(
            x_BPW, table_VW, bias_V.astype(table_VW.dtype), operand_dtype=self.cfg.matmul_dtype
        )
