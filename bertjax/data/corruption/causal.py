"""Causal-LM rows: next-token targets at every position, optional input masking.

A causal batch keeps the MLM batch keys so every objective's batch has one shape: with
``masking="causal"`` the slots are all T positions (``masked_positions`` = 0..T-1),
``masked_ids[t]`` is the token at t + 1 (the target of position t), and ``masked_weights[t]`` is 1
where position t is real and t + 1 is a real token of the same row or packed segment: every real
token predicts the next one; the last real token of a row or segment predicts nothing, so packed
samples never predict across their boundary.

Input masking (``config.data.input_mask_rate``, 0 = off): each maskable input token (real, not
[CLS]/[SEP]/[PAD]) becomes [MASK] with that probability, drawn from the row's key as every other
mask, while the targets stay the original next tokens: the input-noise regulariser Gao et al. 2025
("What Makes Diffusion Language Models Super Data Learners?") found to carry most of diffusion's
multi-epoch advantage, applied to an autoregressive model.
"""

from __future__ import annotations

import numpy as np

from bertjax.data import keys as keys_lib

_INPUT_MASK = 101  # the hash stream of input-mask decisions (apart from masking.py's streams)


def causal_batch(
    input_ids: np.ndarray,
    segments: np.ndarray,
    maskable: np.ndarray,
    row_keys: np.ndarray,
    rate: float,
    mask_id: int,
) -> dict[str, np.ndarray]:
    """input_ids (masked at ``rate``) and the next-token slots [B,T] of one batch.

    ``segments`` [B,T]: 0 at padding, equal positive ids within one row or packed segment (the
    attention mask of unpacked rows, ``segment_ids`` of packed ones)."""
    batch, width = input_ids.shape
    targets = np.zeros_like(input_ids, dtype=np.int32)
    targets[:, :-1] = input_ids[:, 1:]
    has_next = np.zeros((batch, width), bool)
    has_next[:, :-1] = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    new_ids = input_ids.astype(np.int32, copy=True)
    if rate > 0:
        chosen = maskable & (keys_lib.uniform(row_keys, width, _INPUT_MASK) < rate)
        new_ids[chosen] = mask_id
    return {
        "input_ids": new_ids,
        "masked_positions": np.broadcast_to(
            np.arange(width, dtype=np.int32), (batch, width)
        ).copy(),
        "masked_ids": np.where(has_next, targets, 0).astype(np.int32),
        "masked_weights": has_next.astype(np.float32),
        "mask_ratio": np.full(batch, rate, np.float32),
    }
