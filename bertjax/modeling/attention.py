"""Multi-head self-attention and every path it may take: the CPU fast path
(`bertjax.ops.attention`), the fused `jax.nn.dot_product_attention` (XLA or cuDNN), and the
exact reference with dropout; the attention mask of padded and packed rows."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.layers import constrain, gather_rows, normal_init, zeros_init
from bertjax.modeling.position_init import attention_kernel_init
from bertjax.ops import attention as attention_ops
from bertjax.ops import dense as dense_ops
from bertjax.ops import platform
from bertjax.ops.elementwise import keep_mask

Array = jax.Array


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


def exact_attention(
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    mask: Array,
    keep: Array | None = None,
    rate: float = 0.0,
) -> Array:
    """Softmax attention in fp32 under autodiff: the reference `ops.attention.attention` is
    tested against (``keep``, boolean [B, N, T, S], and ``rate``: the same optional dropout on
    the probabilities), and the model's path off the CPU when dropout is active
    (jax.nn.dot_product_attention has none)."""
    logits_BNTS = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH).astype(jnp.float32)
    logits_BNTS = logits_BNTS / jnp.sqrt(jnp.float32(q_BTNH.shape[-1]))
    probs_BNTS = jax.nn.softmax(jnp.where(mask, logits_BNTS, jnp.finfo(jnp.float32).min), axis=-1)
    if keep is not None:
        probs_BNTS = jnp.where(keep, probs_BNTS / (1.0 - rate), 0.0)
    return jnp.einsum("bnts,bsnh->btnh", probs_BNTS.astype(v_BSNH.dtype), v_BSNH)


class SelfAttention(nn.Module):
    """Multi-head self-attention: on the CPU (attention_implementation None) `ops.attention`,
    with or without dropout; elsewhere the fused `jax.nn.dot_product_attention`, or
    `exact_attention` when dropout is active (the fused op has none). ``rows`` ([B, R]): queries
    only at those positions (keys and values at all): the output is [B, R, D].
    ``layer_index`` (an int, or traced inside a scanned stack) picks the first layer's
    local-attention init (BertConfig.local_attention_offsets)."""

    cfg: BertConfig

    @nn.compact
    def __call__(
        self,
        x_BTD: Array,
        mask: Array,
        deterministic: bool,
        layer_index=0,
        rows: Array | None = None,
    ) -> Array:
        cfg = self.cfg
        heads, head_dim, width = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        dtype = cfg.compute_dtype

        names = ("query", "key", "value")
        kernels = [
            self.param(
                f"{name}_kernel",
                nn.with_logical_partitioning(
                    attention_kernel_init(cfg, name, layer_index), ("embed", "heads", "kv")
                ),
                (width, heads, head_dim),
                cfg.params_dtype,
            )
            for name in names
        ]
        biases = [
            self.param(
                f"{name}_bias", zeros_init(("heads", "kv")), (heads, head_dim), cfg.params_dtype
            )
            for name in names
        ]
        kernels = [kernel.astype(dtype).reshape(width, heads * head_dim) for kernel in kernels]
        x_BTD = x_BTD.astype(dtype)
        if rows is None:
            projected = dense_ops.project(x_BTD, *kernels, operand_dtype=cfg.matmul_dtype)
        else:
            projected = (
                *dense_ops.project(
                    gather_rows(x_BTD, rows), kernels[0], operand_dtype=cfg.matmul_dtype
                ),
                *dense_ops.project(x_BTD, *kernels[1:], operand_dtype=cfg.matmul_dtype),
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
        if cfg.attention_implementation is None and platform.on_cpu():
            chains = attention_ops.cpu_chains(q_BTNH.shape[0])
            ctx_BTNH = attention_ops.attention(q_BTNH, k_BSNH, v_BSNH, mask, keep, rate, chains)
        elif keep is not None:  # dot_product_attention has no dropout: the exact path
            ctx_BTNH = exact_attention(q_BTNH, k_BSNH, v_BSNH, mask, keep, rate)
        else:
            # cuDNN takes the mask as a bias of the full [B, 1, T, S] shape; XLA broadcasts a
            # padding mask's query axis itself.
            queries = q_BTNH.shape[1] if cfg.attention_implementation == "cudnn" else mask.shape[2]
            full_mask = jnp.broadcast_to(mask, (mask.shape[0], 1, queries, k_BSNH.shape[1]))
            ctx_BTNH = jax.nn.dot_product_attention(
                q_BTNH, k_BSNH, v_BSNH, mask=full_mask, implementation=cfg.attention_implementation
            )
        ctx_BTNH = constrain(ctx_BTNH, ("act_batch", "act_len", "act_heads", "act_kv"))
        out_kernel = self.param(
            "output_kernel",
            normal_init(cfg, ("heads", "kv", "embed")),
            (heads, head_dim, width),
            cfg.params_dtype,
        )
        out_bias = self.param("output_bias", zeros_init(("embed",)), (width,), cfg.params_dtype)
        ctx_BTD = ctx_BTNH.reshape(*ctx_BTNH.shape[:-2], heads * head_dim)
        y_BTD = dense_ops.project(
            ctx_BTD,
            out_kernel.astype(dtype).reshape(heads * head_dim, width),
            operand_dtype=cfg.matmul_dtype,
        )[0]
        y_BTD = y_BTD + out_bias.astype(dtype)
        return constrain(y_BTD, ("act_batch", "act_len", "act_embed"))
