"""Multi-head self-attention: projections, RoPE, dropout, and the attention itself by the kernel
`bertjax.modeling.attention_kernels` chooses for its description. The mask of padded and packed
rows is `bertjax.modeling.attention_mask`; both are re-exported here."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.modeling import rotary
from bertjax.modeling.attention_kernels import (
    FLASH_BLOCK,
    FLASH_FROM,
    KERNEL_NAMES,
    KERNELS,
    LOCAL_BLOCK,
    LOCAL_FROM_BLOCKS,
    AttentionSpec,
    Kernel,
    attend,
    choose,
    exact_attention,
)
from bertjax.modeling.attention_mask import AttentionMask, make_attention_mask
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.layers import constrain, gather_rows, output_init, zeros_init
from bertjax.modeling.position_init import attention_kernel_init
from bertjax.ops import dense as dense_ops

__all__ = [
    "FLASH_BLOCK",
    "FLASH_FROM",
    "KERNELS",
    "KERNEL_NAMES",
    "LOCAL_BLOCK",
    "LOCAL_FROM_BLOCKS",
    "AttentionMask",
    "AttentionSpec",
    "Kernel",
    "SelfAttention",
    "attend",
    "choose",
    "exact_attention",
    "make_attention_mask",
]

Array = jax.Array


class SelfAttention(nn.Module):
    """Multi-head self-attention (kernels: `attention_kernels.attend`; causal when
    ``cfg.causal``). ``rows`` ([B, R]): queries only at those
    positions (keys and values at all): the output is [B, R, D]. ``layer_index`` (an int, or
    traced inside a scanned stack) picks the first layer's local-attention init
    (BertConfig.local_attention_offsets); ``half_window`` > 0 makes the layer local, and with
    RoPE queries and keys are rotated by base ``rope_theta``."""

    cfg: BertConfig
    half_window: int = 0
    rope_theta: float = 10000.0

    @nn.compact
    def __call__(
        self,
        x_BTD: Array,
        mask: AttentionMask,
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
            if cfg.attention_bias
            else None
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
            mask = mask.at_rows(rows)
        q_BTNH, k_BSNH, v_BSNH = [
            y.reshape(*y.shape[:-1], heads, head_dim) + (0 if bias is None else bias.astype(dtype))
            for y, bias in zip(projected, biases)
        ]
        if cfg.position_embedding_type == "rope":
            q_BTNH = rotary.rotate(q_BTNH, mask.query_positions, self.rope_theta)
            k_BSNH = rotary.rotate(k_BSNH, mask.key_positions, self.rope_theta)
        q_BTNH, k_BSNH, v_BSNH = [
            constrain(y, ("act_batch", "act_len", "act_heads", "act_kv"))
            for y in (q_BTNH, k_BSNH, v_BSNH)
        ]
        rate = cfg.attention_probs_dropout_prob
        keep = None  # the dropout key: `attend` draws the bits the chosen kernel takes
        if rate > 0 and not deterministic:
            keep = self.make_rng("dropout")
            if not jax.dtypes.issubdtype(keep.dtype, jax.dtypes.prng_key):
                keep = jax.random.wrap_key_data(keep)  # a raw key (jax.random.PRNGKey's)
        spec = AttentionSpec(
            batch=q_BTNH.shape[0],
            query_length=q_BTNH.shape[1],
            key_length=k_BSNH.shape[1],
            heads=heads,
            head_dim=head_dim,
            half_window=self.half_window,
            causal=cfg.causal,
            packed=mask.packed,
            gathered_rows=rows is not None,
            dropout=keep is not None,
            dtype=str(q_BTNH.dtype),
        )
        ctx_BTNH = attend(
            spec, q_BTNH, k_BSNH, v_BSNH, mask, keep, rate, None, cfg.attention_implementation
        )
        ctx_BTNH = constrain(ctx_BTNH, ("act_batch", "act_len", "act_heads", "act_kv"))
        out_kernel = self.param(
            "output_kernel",
            output_init(cfg, ("heads", "kv", "embed")),
            (heads, head_dim, width),
            cfg.params_dtype,
        )
        ctx_BTD = ctx_BTNH.reshape(*ctx_BTNH.shape[:-2], heads * head_dim)
        y_BTD = dense_ops.project(
            ctx_BTD,
            out_kernel.astype(dtype).reshape(heads * head_dim, width),
            operand_dtype=cfg.matmul_dtype,
        )[0]
        if cfg.attention_bias:
            out_bias = self.param("output_bias", zeros_init(("embed",)), (width,), cfg.params_dtype)
            y_BTD = y_BTD + out_bias.astype(dtype)
        return constrain(y_BTD, ("act_batch", "act_len", "act_embed"))
