"""Multi-head self-attention and every path it may take: the CPU fast path
(`bertjax.ops.attention`), the fused `jax.nn.dot_product_attention` (XLA or cuDNN), and the
exact reference with dropout; the attention mask of padded and packed rows."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from bertjax.modeling import rotary
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.layers import constrain, gather_rows, output_init, zeros_init
from bertjax.modeling.position_init import attention_kernel_init
from bertjax.ops import attention as attention_ops
from bertjax.ops import blocked_attention as blocked
from bertjax.ops import dense as dense_ops
from bertjax.ops import platform, splash
from bertjax.ops.elementwise import keep_mask

Array = jax.Array


@struct.dataclass
class AttentionMask:
    """Who may attend whom, without a T x S array: query t sees key s when ``key_segments[s] >
    0`` and ``query_segments[t] == key_segments[s]`` and, in a local layer of half-width h,
    ``|query_positions[t] - key_positions[s]| <= h``. Packed rows carry their segment ids on
    both sides; unpadded or padded rows query segment 1 and the attention mask as key segments
    (a padding query sees the real keys, as BERT's). Positions restart in each packed segment
    and are also the RoPE positions."""

    query_segments: Array  # [B, T] int32
    key_segments: Array  # [B, S] int32, 0: padding (never attended)
    query_positions: Array  # [B, T] int32
    key_positions: Array  # [B, S] int32
    packed: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def build(
        cls, attention_mask: Array | None, segment_ids: Array | None, positions: Array
    ) -> AttentionMask:
        """From a batch's ``attention_mask`` or packed ``segment_ids`` and the row positions."""
        batch, length = positions.shape
        positions = positions.astype(jnp.int32)
        if segment_ids is not None:
            segments = segment_ids.astype(jnp.int32)
            return cls(segments, segments, positions, positions, packed=True)
        keys = (
            jnp.ones((batch, length), jnp.int32)
            if attention_mask is None
            else (attention_mask > 0).astype(jnp.int32)
        )
        return cls(jnp.ones((batch, length), jnp.int32), keys, positions, positions)

    def tokens(self) -> Array:
        """[B, S] True at real tokens."""
        return self.key_segments > 0

    def at_rows(self, rows_BR: Array) -> AttentionMask:
        """The mask of queries at ``rows`` only (the keys unchanged)."""
        return self.replace(
            query_segments=gather_rows(self.query_segments, rows_BR),
            query_positions=gather_rows(self.query_positions, rows_BR),
        )

    def dense(self, half_window: int = 0) -> Array:
        """Boolean [B, 1, T, S] (padded rows without a window: [B, 1, 1, S])."""
        keys = self.key_segments[:, None, None, :]
        if not self.packed and not half_window:
            return keys > 0
        visible = (self.query_segments[:, None, :, None] == keys) & (keys > 0)
        if half_window:
            distance = self.query_positions[:, None, :, None] - self.key_positions[:, None, None, :]
            visible = visible & (jnp.abs(distance) <= half_window)
        return visible


def make_attention_mask(
    attention_mask: Array | None, segment_ids: Array | None, batch: int, length: int
) -> Array:
    """Boolean mask broadcastable to [B, N, T, S]: True where a query may attend a key.

    With ``segment_ids`` (packed rows, 0 = padding) attention is block-diagonal, so
    packed sequences never see each other; otherwise keys at padding are masked.
    """
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return AttentionMask.build(attention_mask, segment_ids, positions).dense()


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


# Where the CPU leaves the dense path (benchmarks/attention_cpu.py --long; results.md): local
# layers take the banded path in blocks of max(half-window, LOCAL_BLOCK) rows from
# LOCAL_FROM_BLOCKS blocks on, global layers the blocked one from FLASH_FROM keys, in key blocks
# of FLASH_BLOCK (the quiet table in results.md: banded beats dense from T=512; blocked takes
# less memory from T=1024 but is only faster from T=4096, and this path is for speed).
LOCAL_BLOCK = 64
LOCAL_FROM_BLOCKS = 4
FLASH_FROM = 4096
FLASH_BLOCK = 256


def attend(
    cfg: BertConfig,
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    mask: AttentionMask,
    half_window: int,
    aligned: bool,
    keep: Array | None = None,
) -> Array:
    """Softmax attention by the path the platform and shapes call for: on the CPU (no
    attention_implementation) banded local attention, blocked global attention at long rows,
    else `ops.attention` on a dense mask; on a TPU the Pallas splash kernel; elsewhere
    `jax.nn.dot_product_attention` (padded rows by their lengths, read as right-padded, as the
    pipeline and transformers pad; packed rows by a mask; local layers by its window), or
    `exact_attention` when dropout is active. ``aligned``: queries are every row (not gathered).
    Probability dropout (``keep``) always takes a dense path: T x S memory."""
    rate = cfg.attention_probs_dropout_prob
    length = k_BSNH.shape[1]
    if cfg.attention_implementation is None and platform.on_cpu():
        chains = attention_ops.cpu_chains(q_BTNH.shape[0])
        block = max(half_window, LOCAL_BLOCK)
        if keep is None and half_window and aligned and length >= LOCAL_FROM_BLOCKS * block:
            return blocked.local_attention(
                q_BTNH,
                k_BSNH,
                v_BSNH,
                mask.query_segments,
                mask.key_segments,
                mask.key_positions,
                half_window,
                block,
                chains,
            )
        if keep is None and length >= FLASH_FROM:
            return blocked.flash_attention(
                q_BTNH,
                k_BSNH,
                v_BSNH,
                mask.query_segments,
                mask.key_segments,
                mask.query_positions,
                mask.key_positions,
                half_window,
                FLASH_BLOCK,
            )
        dense = mask.dense(half_window)
        return attention_ops.attention(q_BTNH, k_BSNH, v_BSNH, dense, keep, rate, chains)
    if keep is not None:  # dot_product_attention has no dropout: the exact path
        return exact_attention(q_BTNH, k_BSNH, v_BSNH, mask.dense(half_window), keep, rate)
    if cfg.attention_implementation is None and platform.on_tpu() and aligned:
        return splash.attention(
            q_BTNH, k_BSNH, v_BSNH, mask.query_segments, mask.key_segments, half_window
        )
    window = (half_window, half_window) if half_window and aligned else None
    kwargs = {}
    if mask.packed or not aligned:
        dense = mask.dense(0 if window else half_window)
        kwargs["mask"] = jnp.broadcast_to(dense, (dense.shape[0], 1, q_BTNH.shape[1], length))
    else:
        lengths = jnp.sum(mask.key_segments > 0, axis=-1).astype(jnp.int32)
        kwargs.update(query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    return jax.nn.dot_product_attention(
        q_BTNH,
        k_BSNH,
        v_BSNH,
        local_window_size=window,
        implementation=cfg.attention_implementation,
        **kwargs,
    )


class SelfAttention(nn.Module):
    """Multi-head self-attention (paths: `attend`). ``rows`` ([B, R]): queries only at those
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
        keep = None
        if rate > 0 and not deterministic:
            keep = keep_mask(
                self.make_rng("dropout"),
                (q_BTNH.shape[0], heads, q_BTNH.shape[1], k_BSNH.shape[1]),
                1.0 - rate,
            )
        ctx_BTNH = attend(cfg, q_BTNH, k_BSNH, v_BSNH, mask, self.half_window, rows is None, keep)
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
