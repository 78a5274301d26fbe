"""The layer stack and the bare encoder: feed-forward, transformer layer (post-LN BERT or pre-LN),
the Encoder (a loop or `nn.scan`, ALBERT sharing, remat, MoE layers) and BertModel (embeddings,
encoder, pooler)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.attention import AttentionMask, SelfAttention
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.embeddings import Embeddings, position_ids
from bertjax.modeling.layers import Dropout, activation, constrain, dense, gather_rows, layer_norm
from bertjax.modeling.moe import MoeFeedForward

Array = jax.Array


class FeedForward(nn.Module):
    """The feed-forward block. "mlp": Dense D -> F, activation, Dense F -> D. "glu" (GeGLU with
    gelu): Dense D -> 2F split into input and gate, activation(input) * gate, dropout
    (``mlp_dropout``, here as in ModernBERT), Dense F -> D."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BTD: Array, deterministic: bool = True) -> Array:
        cfg = self.cfg
        glu = cfg.mlp_type == "glu"
        width = cfg.intermediate_size * (2 if glu else 1)
        h_BTF = dense(cfg, width, ("embed", "mlp"), "intermediate", cfg.mlp_bias)(x_BTD)
        if glu:
            h_BTF, gate_BTF = jnp.split(h_BTF, 2, axis=-1)
            h_BTF = activation(cfg.hidden_act)(h_BTF) * gate_BTF
            h_BTF = Dropout(cfg.mlp_dropout)(h_BTF, deterministic)
        else:
            h_BTF = activation(cfg.hidden_act)(h_BTF)
        h_BTF = constrain(h_BTF, ("act_batch", "act_len", "act_mlp"))
        y_BTD = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output", cfg.mlp_bias, True)(h_BTF)
        return constrain(y_BTD, ("act_batch", "act_len", "act_embed"))


class BertLayer(nn.Module):
    """One transformer layer, post-LN (BERT) or pre-LN; ``moe``: its feed-forward is
    `MoeFeedForward` (same parameter path ``mlp``). Returns (x, None) so it can be scanned.
    ``rows`` ([B, R]): the layer's output only at those positions, [B, R, D] (its queries,
    residuals and feed-forward run on those rows alone; keys and values on all).
    ``half_window`` > 0: local attention; ``rope_theta``: its RoPE base; ``attention_norm``
    False: pre-LN without the attention norm (ModernBERT's first layer)."""

    cfg: BertConfig
    moe: bool = False
    half_window: int = 0
    rope_theta: float = 10000.0
    attention_norm: bool = True

    @nn.compact
    def __call__(
        self,
        x: Array,
        mask: AttentionMask,
        deterministic: bool,
        layer_index=0,
        rows: Array | None = None,
    ):
        cfg = self.cfg
        drop = Dropout(cfg.hidden_dropout_prob)
        attention = SelfAttention(cfg, self.half_window, self.rope_theta, name="attention")
        if self.moe:
            experts = MoeFeedForward(cfg, name="mlp")

            def feed_forward(h):  # MoE layers always run every row (see last_layer_at_rows)
                return experts(h, mask.tokens())
        else:
            dense_mlp = FeedForward(cfg, name="mlp")

            def feed_forward(h):
                return dense_mlp(h, deterministic)

        if cfg.mlp_type == "glu" and not self.moe:  # its dropout is inside
            mlp = feed_forward
        else:
            mlp_drop = drop
            if cfg.mlp_dropout != cfg.hidden_dropout_prob:
                mlp_drop = Dropout(cfg.mlp_dropout, name="mlp_dropout")

            def mlp(h):
                return mlp_drop(feed_forward(h), deterministic)

        attention_norm = layer_norm(cfg, "embed", "attention_norm")
        output_norm = layer_norm(cfg, "embed", "output_norm")
        residual = x if rows is None else gather_rows(x, rows)

        def attend(h):
            return drop(attention(h, mask, deterministic, layer_index, rows), deterministic)

        if cfg.pre_layer_norm:
            x = residual + attend(attention_norm(x) if self.attention_norm else x)
            x = x + mlp(output_norm(x))
        else:
            x = attention_norm(residual + attend(x))
            x = output_norm(x + mlp(x))
        return constrain(x, ("act_batch", "act_len", "act_embed")), None


_REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def layer_kinds(cfg: BertConfig) -> list[dict]:
    """Each distinct layer's (ALBERT group's) kind: `BertLayer`'s fields after ``cfg``, read the
    same way by the scanned and the unscanned stack."""
    return [
        dict(
            moe=cfg.is_moe_layer(g),
            half_window=cfg.attention_window(g),
            rope_theta=cfg.layer_rope_theta(g),
            attention_norm=g > 0 or cfg.first_attention_norm,
        )
        for g in range(cfg.num_groups)
    ]


# The sparse last layer's row count R is rounded up (the extra rows repeat row 0 and are dropped
# after the layer): XLA:GPU (jax-cuda12-plugin 0.10.2) finds no tile sizes for the products of
# gathered rows [B, R, D] flattened to [B R, D] (jax#34010) unless 16 divides R, and, at larger
# R, 64: BERT-base at 32 rows x 77 positions a GPU (bf16[2464,768]) and ALBERT-base at 512 x 21
# (24 refused too) compile at 80 and 32; ModernBERT-base's 8192-token phase at 72 rows x 2480
# (the attention's output projection of the transposed context, bf16[178560,768]) compiles at
# 2496, not at 2480. A multiple of 64 for every R would run BERT-base's seq512 last layer at 128
# rows a sequence instead of 80; above LARGE_ROWS it adds at most a quarter, at 2480 0.6%.
ROW_MULTIPLE = 16
LARGE_ROW_MULTIPLE = 64
LARGE_ROWS = 256


def padded_row_count(rows: int) -> int:
    """The rows the sparse last layer runs for ``rows`` requested ones (see ROW_MULTIPLE)."""
    multiple = ROW_MULTIPLE if rows <= LARGE_ROWS else LARGE_ROW_MULTIPLE
    return -(-rows // multiple) * multiple


def pad_rows(rows_BR: Array) -> Array:
    """``rows`` with its count rounded up by `padded_row_count`, by repeats of its first row (a
    real position: every padded row is an ordinary query, then dropped)."""
    extra = padded_row_count(rows_BR.shape[1]) - rows_BR.shape[1]
    if not extra:
        return rows_BR
    return jnp.concatenate([rows_BR, jnp.repeat(rows_BR[:, :1], extra, axis=1)], axis=1)


def last_layer_at_rows(cfg: BertConfig) -> bool:
    """Whether the Encoder's last layer computes only the requested output rows (see Encoder)."""
    return not cfg.scan_layers and not cfg.num_experts


class Encoder(nn.Module):
    """The layer stack: a Python loop or `nn.scan`; ALBERT groups share one layer's parameters.
    ``rows`` ([B, R]): the output only at those positions, [B, R, D]; in the loop over dense
    layers the last layer computes just those rows (MosaicBERT's trick for the MLM loss: no
    position's output but those reaches it). A scanned stack repeats one layer shape and an MoE
    layer's expert capacity depends on its token count, so those compute every row and gather."""

    cfg: BertConfig

    @nn.compact
    def __call__(
        self, x: Array, mask: AttentionMask, deterministic: bool, rows: Array | None = None
    ) -> Array:
        cfg = self.cfg
        groups = cfg.num_groups
        repeats = cfg.num_hidden_layers // groups
        sparse = rows is not None and last_layer_at_rows(cfg)  # last layer at `rows` only
        layer_cls = BertLayer
        if cfg.remat != "none":
            layer_cls = nn.remat(
                layer_cls,
                policy=_REMAT_POLICIES[cfg.remat],
                prevent_cse=not cfg.scan_layers,
                static_argnums=(3,),  # deterministic (self counts as 0)
            )

        kinds = layer_kinds(cfg)
        if cfg.scan_layers:  # one layer repeated: BertConfig rejects stacks of several kinds
            if any(kind != kinds[0] for kind in kinds):
                raise ValueError(
                    f"BertConfig.scan_layers=True repeats one layer, but the layers differ: {kinds}"
                )
            block = layer_cls
            sown = {"intermediates": 0} if cfg.num_experts else {}  # per-layer MoE stats
            if repeats > 1:  # shared layer applied `repeats` times: broadcast its parameters
                block = nn.scan(
                    block,
                    variable_broadcast="params",
                    variable_axes=sown,
                    split_rngs={"params": False, "dropout": True},
                    in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
                    length=repeats,
                )
            stack = nn.scan(
                block,
                variable_axes={"params": 0, **sown},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast, 0),
                length=groups,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            layer_indices = jnp.arange(groups)  # the first layer's init differs (local heads)
            x, _ = stack(cfg, **kinds[0], name="layers")(x, mask, deterministic, layer_indices)
        else:
            layers = [layer_cls(cfg, **kind, name=f"layer_{g}") for g, kind in enumerate(kinds)]
            for index in range(cfg.num_hidden_layers):
                group = index // repeats
                if sparse and index == cfg.num_hidden_layers - 1:  # padded rows, then dropped
                    x, _ = layers[group](x, mask, deterministic, group, pad_rows(rows))
                    x = x[:, : rows.shape[1]]
                else:
                    x, _ = layers[group](x, mask, deterministic, group)
        if rows is not None and not sparse:  # every row computed: keep the requested ones
            x = gather_rows(x, rows)
        if cfg.pre_layer_norm:
            x = layer_norm(cfg, "embed", "final_norm")(x)
        return x


def check_length(cfg: BertConfig, length: int) -> None:
    """A clear error for rows longer than the model's positions."""
    if length > cfg.max_position_embeddings - cfg.position_offset:
        raise ValueError(
            f"sequence length {length} exceeds max_position_embeddings "
            f"{cfg.max_position_embeddings} (position_offset {cfg.position_offset})"
        )


class BertModel(nn.Module):
    """The bare encoder: (sequence_output [B, T, D], pooled_output [B, D] or None).

    ``output_positions`` ([B, P]): the sequence output only at those positions, [B, P, D], and
    the last layer computes only those rows (plus [CLS] for the pooler): same values there,
    less work (see Encoder).

    Args:
      cfg: the BertConfig (the module's only configuration).
      add_pooler: build the tanh pooler on [CLS].

    Returns:
      ``(sequence_output, pooled_output)`` from ``__call__(input_ids, token_type_ids=None,
      attention_mask=None, segment_ids=None, positions=None, deterministic=True,
      output_positions=None)``.

    Example::

        cfg = bertjax.BertConfig.preset("tiny", vocab_size=1000)
        model = bertjax.BertModel(cfg)
        ids = jnp.ones((2, 16), jnp.int32)
        params = model.init(jax.random.key(0), ids)["params"]
        sequence_BTD, pooled_BD = model.apply({"params": params}, ids)
    """

    cfg: BertConfig
    add_pooler: bool = True

    def setup(self):
        self.embeddings = Embeddings(self.cfg)
        self.encoder = Encoder(self.cfg)
        if self.add_pooler:
            self.pooler = dense(self.cfg, self.cfg.hidden_size, ("embed", "embed_out"), "pooler")

    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
        positions: Array | None = None,
        deterministic: bool = True,
        output_positions: Array | None = None,
    ):
        cfg = self.cfg
        batch, length = input_ids.shape
        check_length(cfg, length)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if positions is None:
            positions = position_ids(segment_ids, batch, length, cfg.position_offset)
        x = self.embeddings(input_ids, token_type_ids, positions, deterministic)
        mask = AttentionMask.build(attention_mask, segment_ids, positions)
        rows = output_positions
        if rows is not None and self.add_pooler:  # [CLS] first, for the pooler
            rows = jnp.concatenate([jnp.zeros((batch, 1), rows.dtype), rows], axis=1)
        x = self.encoder(x, mask, deterministic, rows)
        pooled = None
        if self.add_pooler:
            pooled = jnp.tanh(self.pooler(x[:, 0]))
            if output_positions is not None:
                x = x[:, 1:]
        return x, pooled

    def attend(self, x: Array, bias: Array | None = None) -> Array:
        return self.embeddings.attend(x, bias)
