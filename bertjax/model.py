"""The BERT-family encoder in Flax Linen: embeddings, attention, layers, encoder, pooler.

Every parameter carries logical axis names (``vocab``, ``embed``, ``factor``, ``heads``,
``kv``, ``mlp``, ``position``, ``types``, ``layers``) and main activations carry
``act_*`` names; `bertjax.sharding` maps them to mesh axes. No layer names a mesh axis.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import products
from bertjax.config import BertConfig
from bertjax.layers import Dropout, erf_gelu, keep_mask
from bertjax.position_init import fourier_init, sinusoidal_init

Array = jax.Array


def activation(name: str):
    """The feed-forward non-linearity named by BertConfig.hidden_act."""
    if name == "gelu":
        return erf_gelu
    if name in ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh"):
        return functools.partial(jax.nn.gelu, approximate=True)
    return {"relu": jax.nn.relu, "silu": jax.nn.silu, "swish": jax.nn.silu, "tanh": jnp.tanh}[name]


def _init(cfg: BertConfig, axes):
    return nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range), axes)


def _zeros(axes):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _ones(axes):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def dense(cfg: BertConfig, features: int, axes: tuple, name: str) -> nn.Dense:
    """A Dense layer with logical names on kernel (in, out) and bias (out,)."""
    return nn.Dense(
        features,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        kernel_init=_init(cfg, axes),
        bias_init=_zeros(axes[-1:]),
        name=name,
        dot_general=functools.partial(products.dense_dot_general, operand_dtype=cfg.matmul_dtype),
    )


def layer_norm(cfg: BertConfig, axis: str, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        scale_init=_ones((axis,)),
        bias_init=_zeros((axis,)),
        name=name,
    )


def constrain(x: Array, axes: tuple) -> Array:
    return nn.with_logical_constraint(x, axes)


def make_attention_mask(
    attention_mask: Array | None, segment_ids: Array | None, batch: int, length: int
) -> Array:
    """Boolean mask broadcastable to [B, N, T, S]: True where a query may attend a key.

    With ``segment_ids`` (packed rows, 0 = padding) attention is block-diagonal, so
    packed sequences never see each other; otherwise keys at padding are masked.
    """
    if segment_ids is not None:
        same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        return same & (segment_ids[:, None, None, :] > 0)
    if attention_mask is None:
        return jnp.ones((batch, 1, 1, length), bool)
    return attention_mask[:, None, None, :] > 0


def gather_rows(x: Array, rows_BR: Array, axis: int = 1) -> Array:
    """x's entries at per-example positions along ``axis``: [B, ..., T, ...] x [B, R] ->
    [B, ..., R, ...] (an axis of size 1 broadcasts: returned as is)."""
    if x.shape[axis] == 1:
        return x
    shape = [1] * x.ndim
    shape[0], shape[axis] = rows_BR.shape
    return jnp.take_along_axis(x, rows_BR.astype(jnp.int32).reshape(shape), axis=axis)


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
    """Word + position + token-type embeddings, LayerNorm, dropout; ALBERT projects E -> H."""

    cfg: BertConfig

    def setup(self):
        cfg = self.cfg
        self.width_axis = "embed" if cfg.embedding_dim == cfg.hidden_size else "factor"
        width = cfg.embedding_dim
        self.word_embeddings = self.param(
            "word_embeddings",
            _init(cfg, ("vocab", self.width_axis)),
            (cfg.vocab_size, width),
            cfg.params_dtype,
        )
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
        self.token_type_embeddings = self.param(
            "token_type_embeddings",
            _init(cfg, ("types", self.width_axis)),
            (cfg.type_vocab_size, width),
            cfg.params_dtype,
        )
        self.layer_norm = layer_norm(cfg, self.width_axis, "layer_norm")
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        if width != cfg.hidden_size:
            self.projection = dense(cfg, cfg.hidden_size, ("factor", "embed"), "projection")

    def __call__(self, input_ids, token_type_ids, positions, deterministic: bool) -> Array:
        dtype = self.cfg.compute_dtype
        x = (
            jnp.take(self.word_embeddings, input_ids, axis=0).astype(dtype)
            + jnp.take(self.position_embeddings, positions, axis=0).astype(dtype)
            + jnp.take(self.token_type_embeddings, token_type_ids, axis=0).astype(dtype)
        )
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        if self.cfg.embedding_dim != self.cfg.hidden_size:
            x = self.projection(x)
        return constrain(x, ("act_batch", "act_len", "act_embed"))

    def attend(self, x: Array, bias: Array | None = None) -> Array:
        """Logits against the word-embedding table (the tied MLM decoder), plus ``bias``."""
        table = self.word_embeddings.astype(self.cfg.compute_dtype)
        if bias is None:
            bias = jnp.zeros((table.shape[0],), table.dtype)
        return products.tied_decoder(
            x, table, bias.astype(table.dtype), operand_dtype=self.cfg.matmul_dtype
        )


class SelfAttention(nn.Module):
    """Multi-head self-attention: on the CPU (attention_implementation None) `products.attention`,
    with or without dropout; elsewhere the fused `jax.nn.dot_product_attention`, or
    `exact_attention` when dropout is active (the fused op has none). ``rows`` ([B, R]): queries
    only at those positions (keys and values at all): the output is [B, R, E]."""

    cfg: BertConfig

    @nn.compact
    def __call__(
        self, x_BTE: Array, mask: Array, deterministic: bool, rows: Array | None = None
    ) -> Array:
        cfg = self.cfg
        heads, head_dim, width = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        dtype = cfg.compute_dtype

        names = ("query", "key", "value")
        kernels = [
            self.param(
                f"{name}_kernel",
                _init(cfg, ("embed", "heads", "kv")),
                (width, heads, head_dim),
                cfg.params_dtype,
            )
            for name in names
        ]
        biases = [
            self.param(f"{name}_bias", _zeros(("heads", "kv")), (heads, head_dim), cfg.params_dtype)
            for name in names
        ]
        kernels = [kernel.astype(dtype).reshape(width, heads * head_dim) for kernel in kernels]
        x_BTE = x_BTE.astype(dtype)
        if rows is None:
            projected = products.project(x_BTE, *kernels, operand_dtype=cfg.matmul_dtype)
        else:
            projected = (
                *products.project(
                    gather_rows(x_BTE, rows), kernels[0], operand_dtype=cfg.matmul_dtype
                ),
                *products.project(x_BTE, *kernels[1:], operand_dtype=cfg.matmul_dtype),
            )
            mask = gather_rows(mask, rows, axis=2)
        q_BTNH, k_BSNH, v_BSNH = [
            constrain(
                y.reshape(*y.shape[:-1], heads, head_dim) + bias.astype(dtype),
                ("act_batch", "act_len", "act_heads", "act_kv"),
            )
            for y, bias in zip(projected, biases)
        ]
        rate = cfg.attention_probs_dropout_prob
        keep = None
        if rate > 0 and not deterministic:
            keep = keep_mask(
                self.make_rng("dropout"),
                (q_BTNH.shape[0], heads, q_BTNH.shape[1], k_BSNH.shape[1]),
                1.0 - rate,
            )
        if cfg.attention_implementation is None and jax.default_backend() == "cpu":
            ctx_BTNH = products.attention(
                q_BTNH, k_BSNH, v_BSNH, mask, keep, rate, products.cpu_chains(q_BTNH.shape[0])
            )
        elif keep is not None:  # dot_product_attention has no dropout: the exact path
            ctx_BTNH = products.exact_attention(q_BTNH, k_BSNH, v_BSNH, mask, keep, rate)
        else:
            # cuDNN takes the mask as a bias of the full [B, 1, T, S] shape; XLA broadcasts a
            # padding mask's query axis itself.
            rows = q_BTNH.shape[1] if cfg.attention_implementation == "cudnn" else mask.shape[2]
            full_mask = jnp.broadcast_to(mask, (mask.shape[0], 1, rows, k_BSNH.shape[1]))
            ctx_BTNH = jax.nn.dot_product_attention(
                q_BTNH, k_BSNH, v_BSNH, mask=full_mask, implementation=cfg.attention_implementation
            )
        ctx_BTNH = constrain(ctx_BTNH, ("act_batch", "act_len", "act_heads", "act_kv"))
        out_kernel = self.param(
            "output_kernel",
            _init(cfg, ("heads", "kv", "embed")),
            (heads, head_dim, width),
            cfg.params_dtype,
        )
        out_bias = self.param("output_bias", _zeros(("embed",)), (width,), cfg.params_dtype)
        ctx_BTD = ctx_BTNH.reshape(*ctx_BTNH.shape[:-2], heads * head_dim)
        y = products.project(
            ctx_BTD,
            out_kernel.astype(dtype).reshape(heads * head_dim, width),
            operand_dtype=cfg.matmul_dtype,
        )[0]
        y = y + out_bias.astype(dtype)
        return constrain(y, ("act_batch", "act_len", "act_embed"))


class FeedForward(nn.Module):
    cfg: BertConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x)
        h = constrain(activation(cfg.hidden_act)(h), ("act_batch", "act_len", "act_mlp"))
        y = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)
        return constrain(y, ("act_batch", "act_len", "act_embed"))


class BertLayer(nn.Module):
    """One transformer layer, post-LN (BERT) or pre-LN. Returns (x, None) so it can be scanned.
    ``rows`` ([B, R]): the layer's output only at those positions, [B, R, H] (its queries,
    residuals and feed-forward run on those rows alone; keys and values on all)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool, rows: Array | None = None):
        cfg = self.cfg
        drop = Dropout(cfg.hidden_dropout_prob)
        attention = SelfAttention(cfg, name="attention")
        mlp = self.feed_forward(cfg, mask)
        attention_norm = layer_norm(cfg, "embed", "attention_norm")
        output_norm = layer_norm(cfg, "embed", "output_norm")
        residual = x if rows is None else gather_rows(x, rows)
        if cfg.pre_layer_norm:
            x = residual + drop(
                attention(attention_norm(x), mask, deterministic, rows), deterministic
            )
            x = x + drop(mlp(output_norm(x)), deterministic)
        else:
            x = attention_norm(
                residual + drop(attention(x, mask, deterministic, rows), deterministic)
            )
            x = output_norm(x + drop(mlp(x), deterministic))
        return constrain(x, ("act_batch", "act_len", "act_embed")), None

    @nn.nowrap
    def feed_forward(self, cfg: BertConfig, mask: Array):
        """The layer's feed-forward block; `bertjax.moe.MoeBertLayer` swaps in experts."""
        return FeedForward(cfg, name="mlp")


_REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def last_layer_at_rows(cfg: BertConfig) -> bool:
    """Whether the Encoder's last layer computes only the requested output rows (see Encoder)."""
    return not cfg.scan_layers and not cfg.num_experts


class Encoder(nn.Module):
    """The layer stack: a Python loop or `nn.scan`; ALBERT groups share one layer's parameters.
    ``rows`` ([B, R]): the output only at those positions, [B, R, H]; in the loop over dense
    layers the last layer computes just those rows (MosaicBERT's trick for the MLM loss: no
    position's output but those reaches it). A scanned stack repeats one layer shape and an MoE
    layer's expert capacity depends on its token count, so those compute every row and gather."""

    cfg: BertConfig

    @nn.compact
    def __call__(
        self, x: Array, mask: Array, deterministic: bool, rows: Array | None = None
    ) -> Array:
        cfg = self.cfg
        groups = cfg.num_groups
        repeats = cfg.num_hidden_layers // groups
        sparse = rows is not None and last_layer_at_rows(cfg)  # last layer at `rows` only

        def layer_type(group):
            layer_cls = BertLayer
            if cfg.num_experts:  # MoE layers are their own module type (bertjax.moe)
                from bertjax.moe import layer_class

                layer_cls = layer_class(cfg, group)
            if cfg.remat != "none":
                layer_cls = nn.remat(
                    layer_cls,
                    policy=_REMAT_POLICIES[cfg.remat],
                    prevent_cse=not cfg.scan_layers,
                    static_argnums=(3,),
                )
            return layer_cls

        if cfg.scan_layers:  # one layer type: BertConfig allows MoE here only in every layer
            block = layer_type(0)
            sown = {"intermediates": 0} if cfg.num_experts else {}  # per-layer MoE stats
            if repeats > 1:  # shared layer applied `repeats` times: broadcast its parameters
                block = nn.scan(
                    block,
                    variable_broadcast="params",
                    variable_axes=sown,
                    split_rngs={"params": False, "dropout": True},
                    in_axes=(nn.broadcast, nn.broadcast),
                    length=repeats,
                )
            stack = nn.scan(
                block,
                variable_axes={"params": 0, **sown},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=groups,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(cfg, name="layers")(x, mask, deterministic)
        else:
            layers = [layer_type(g)(cfg, name=f"layer_{g}") for g in range(groups)]
            for index in range(cfg.num_hidden_layers):
                at_rows = sparse and index == cfg.num_hidden_layers - 1
                x, _ = layers[index // repeats](x, mask, deterministic, rows if at_rows else None)
        if rows is not None and not sparse:  # every row computed: keep the requested ones
            x = gather_rows(x, rows)
        if cfg.pre_layer_norm:
            x = layer_norm(cfg, "embed", "final_norm")(x)
        return x


class BertModel(nn.Module):
    """The bare encoder: (sequence_output [B,T,H], pooled_output [B,H] or None).

    ``output_positions`` ([B, P]): the sequence output only at those positions, [B, P, H], and
    the last layer computes only those rows (plus [CLS] for the pooler): same values there,
    less work (see Encoder)."""

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
        if length > cfg.max_position_embeddings - cfg.position_offset:
            raise ValueError(
                f"sequence length {length} exceeds max_position_embeddings "
                f"{cfg.max_position_embeddings} (position_offset {cfg.position_offset})"
            )
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if positions is None:
            positions = position_ids(segment_ids, batch, length, cfg.position_offset)
        x = self.embeddings(input_ids, token_type_ids, positions, deterministic)
        mask = make_attention_mask(attention_mask, segment_ids, batch, length)
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
