"""Who may attend whom in padded and packed rows, kept as segments and positions (never a T x S
array until a kernel asks for one)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


def gather_rows(x: Array, rows_BR: Array, axis: int = 1) -> Array:
    """x's entries at per-example positions along ``axis``: [B, ..., T, ...] x [B, R] ->
    [B, ..., R, ...] (an axis of size 1 broadcasts: returned as is)."""
    if x.shape[axis] == 1:
        return x
    shape = [1] * x.ndim
    shape[0], shape[axis] = rows_BR.shape
    return jnp.take_along_axis(x, rows_BR.astype(jnp.int32).reshape(shape), axis=axis)


@struct.dataclass
class AttentionMask:
    """Who may attend whom, without a T x S array: query t sees key s when ``key_segments[s] >
    0`` and ``query_segments[t] == key_segments[s]`` and, in a local layer of half-width h,
    ``|query_positions[t] - key_positions[s]| <= h`` and, when causal, ``key_positions[s] <=
    query_positions[t]``. Packed rows carry their segment ids on both sides; unpadded or padded
    rows query segment 1 and the attention mask as key segments (a padding query sees the real
    keys, as BERT's). Positions restart in each packed segment and are also the RoPE
    positions."""

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

    def dense(self, half_window: int = 0, causal: bool = False) -> Array:
        """Boolean [B, 1, T, S] (padded rows, global and not causal: [B, 1, 1, S])."""
        keys = self.key_segments[:, None, None, :]
        if not self.packed and not half_window and not causal:
            return keys > 0
        visible = (self.query_segments[:, None, :, None] == keys) & (keys > 0)
        offset = self.query_positions[:, None, :, None] - self.key_positions[:, None, None, :]
        if half_window:
            visible = visible & (jnp.abs(offset) <= half_window)
        if causal:
            visible = visible & (offset >= 0)
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
