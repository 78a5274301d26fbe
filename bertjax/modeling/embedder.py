"""Sentence embeddings from the one encoder: pooling as sentence-transformers' Pooling module
computes it, optional L2 normalization (its Normalize module), and an optional learned logit
scale for contrastive training (CLIP's ``logit_scale``).

Pooling modes (sentence-transformers' names): "cls" (the first real token), "mean" (over real
tokens), "max", "mean_sqrt_len_tokens" (sum / sqrt(length)), "lasttoken" (the last real token);
several modes are concatenated in the order given.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.encoder import BertModel

Array = jax.Array

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "lasttoken")
MAX_LOGIT_SCALE = 100.0  # CLIP clips its learned scale at 100


def check_pooling(pooling: tuple[str, ...], where: str = "pooling") -> tuple[str, ...]:
    """``pooling`` as a tuple of known modes; a clear error otherwise."""
    modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if not modes or unknown:
        raise ValueError(f"{where}={pooling!r}: each mode must be one of {POOLING_MODES}")
    return modes


def pool(sequence_BTD: Array, attention_mask_BT: Array | None, modes: tuple[str, ...]) -> Array:
    """[B, T, D] token vectors -> [B, len(modes) * D] in float32 or wider (padding excluded)."""
    x = sequence_BTD.astype(jnp.promote_types(sequence_BTD.dtype, jnp.float32))
    if attention_mask_BT is None:
        attention_mask_BT = jnp.ones(x.shape[:2], jnp.int32)
    real_BT = attention_mask_BT.astype(x.dtype)
    length_B1 = jnp.maximum(jnp.sum(real_BT, axis=1, keepdims=True), 1e-9)
    out = []
    for mode in modes:
        if mode == "cls":
            first_B = jnp.argmax(attention_mask_BT, axis=1)
            out.append(jnp.take_along_axis(x, first_B[:, None, None], axis=1)[:, 0])
        elif mode == "lasttoken":
            last_B = jnp.maximum(jnp.sum(attention_mask_BT > 0, axis=1) - 1, 0)
            out.append(jnp.take_along_axis(x, last_B[:, None, None], axis=1)[:, 0])
        elif mode == "max":
            out.append(jnp.max(jnp.where(real_BT[..., None] > 0, x, -jnp.inf), axis=1))
        else:
            total_BD = jnp.sum(x * real_BT[..., None], axis=1)
            scale = length_B1 if mode == "mean" else jnp.sqrt(length_B1)
            out.append(total_BD / scale)
    return jnp.concatenate(out, axis=-1) if len(out) > 1 else out[0]


PACKABLE_POOLING = ("cls", "mean", "mean_sqrt_len_tokens", "lasttoken")


def pool_packed(sequence_BTD: Array, segment_ids_BT: Array, segments: int, modes) -> Array:
    """`pool` of each packed text: [B, T, D] with segment ids 1..``segments`` (0: padding) ->
    [B, segments, len(modes) * D]; a segment absent from a row gives zeros. Modes: those of
    `PACKABLE_POOLING` (max needs a [B, S, T, D] array: pool padded rows instead)."""
    x = sequence_BTD.astype(jnp.promote_types(sequence_BTD.dtype, jnp.float32))
    x = jnp.where(segment_ids_BT[..., None] > 0, x, 0.0)  # padding rows may be NaN (no keys)
    one_hot_BTS = (segment_ids_BT[..., None] == jnp.arange(1, segments + 1)).astype(x.dtype)
    length_BS = jnp.sum(one_hot_BTS, axis=1)
    out = []
    for mode in modes:
        if mode in ("cls", "lasttoken"):
            index_T = jnp.arange(x.shape[1], dtype=x.dtype)[None, :, None]
            if mode == "cls":  # first token: the smallest position of the segment
                at_BS = jnp.argmin(jnp.where(one_hot_BTS > 0, index_T, jnp.inf), axis=1)
            else:
                at_BS = jnp.argmax(jnp.where(one_hot_BTS > 0, index_T, -1.0), axis=1)
            picked = jnp.take_along_axis(x, at_BS[..., None], axis=1)
            out.append(picked * (length_BS > 0)[..., None])
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            total_BSD = jnp.einsum("btd,bts->bsd", x, one_hot_BTS)
            length = jnp.maximum(length_BS, 1e-9)[..., None]
            out.append(total_BSD / (length if mode == "mean" else jnp.sqrt(length)))
        else:
            raise ValueError(f"pooling {mode!r} is not computed on packed rows")
    return jnp.concatenate(out, axis=-1) if len(out) > 1 else out[0]


def l2_normalize(x: Array, eps: float = 1e-12) -> Array:
    """x / max(||x||, eps) along the last axis (torch's F.normalize)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


class BertForEmbedding(nn.Module):
    """Encoder -> pooling (-> L2 normalization): ``[B, T]`` ids to ``[B, E]`` float32 vectors.

    With ``learn_scale`` the module also holds ``logit_scale`` (log of the contrastive scale,
    initialised at log ``scale_init``); `learned_scale` reads it (clipped at 100).

    Example::

        cfg = bertjax.BertConfig.preset("tiny", vocab_size=1000)
        model = BertForEmbedding(cfg, pooling=("mean",), normalize=True)
        ids = jnp.ones((2, 16), jnp.int32)
        params = model.init(jax.random.key(0), ids)["params"]
        vectors_BE = model.apply({"params": params}, ids, jnp.ones_like(ids))
    """

    cfg: BertConfig
    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    learn_scale: bool = False
    scale_init: float = 20.0

    def setup(self):
        self.bert = BertModel(self.cfg, add_pooler=False)
        if self.learn_scale:
            self.param(
                "logit_scale",
                nn.with_logical_partitioning(
                    nn.initializers.constant(math.log(self.scale_init)), ()
                ),
                (),
                jnp.float32,
            )

    def __call__(
        self,
        input_ids: Array,
        attention_mask: Array | None = None,
        token_type_ids: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        sequence_BTD, _ = self.bert(
            input_ids, token_type_ids, attention_mask, deterministic=deterministic
        )
        vectors = pool(sequence_BTD, attention_mask, self.pooling)
        return l2_normalize(vectors) if self.normalize else vectors


def learned_scale(params: dict) -> Array:
    """The learned contrastive scale of `BertForEmbedding` params, exp(logit_scale) clipped at
    100."""
    return jnp.minimum(jnp.exp(params["logit_scale"]), MAX_LOGIT_SCALE)
