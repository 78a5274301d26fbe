"""Deterministic initialisers for position embeddings and attention: sinusoidal and "fourier"
position tables, and first-layer heads that start on fixed relative offsets."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bertjax.modeling.bert_config import BertConfig


def sinusoidal_init(std: float):
    """Initializer of a [positions, width] table: interleaved sin/cos rows (Vaswani et al. 2017)
    with wavelengths up to 10000, scaled to standard deviation `std`."""

    def init(key, shape, dtype=jnp.float32):
        del key
        positions, width = shape
        freqs = 1.0 / (10000.0 ** (np.arange(0, width, 2) / width))
        angles = np.arange(positions)[:, None] * freqs[None, :]
        table = np.zeros((positions, width))
        table[:, 0::2] = np.sin(angles)
        table[:, 1::2] = np.cos(angles[:, : width // 2])
        return jnp.asarray(table * (std * np.sqrt(2.0)), dtype)

    return init


def fourier_frequencies(head_dim: int) -> np.ndarray:
    """The head_dim/2 angular frequencies pi*(i+1/2)/(head_dim/2) of the "fourier" position init:
    for integer 0 < |d| < head_dim their cosines sum to 0, so those rows are orthogonal."""
    pairs = head_dim // 2
    return np.pi * (np.arange(pairs) + 0.5) / pairs


def fourier_init(std: float, head_dim: int):
    """Initializer of a [positions, width] table: row t holds (cos w_i t, sin w_i t) pairs in its
    first head_dim columns and zeros after, scaled so a row is as long as a normal(std) row."""

    def init(key, shape, dtype=jnp.float32):
        del key
        positions, width = shape
        angles = np.arange(positions)[:, None] * fourier_frequencies(head_dim)[None, :]
        table = np.zeros((positions, width))
        table[:, 0:head_dim:2] = np.cos(angles)
        table[:, 1:head_dim:2] = np.sin(angles)
        return jnp.asarray(table * (std * np.sqrt(width / (head_dim // 2))), dtype)

    return init


def local_attention_rows(cfg: BertConfig) -> dict[str, np.ndarray]:
    """The first head_dim rows of the first layer's query and key kernels ([H, heads, H], for
    the first len(offsets) heads) that make head h attend to relative offset
    ``cfg.local_attention_offsets[h]`` at init.

    With "fourier" position rows p_t (cos/sin of w_i t in the first head_dim columns) the query
    kernel maps those columns to the head by g*I and the key kernel by g*R(d), R rotating each
    (cos, sin) pair back by w_i d; then q_t . k_s = g^2 |p|^2 [s == t + d] for |s - t - d| <
    head_dim.
    The gain g makes that logit about ``cfg.local_attention_logit`` after the embedding LayerNorm
    (where word, position and type rows of equal length each hold about a third of the width).
    Untrained BERT attends almost uniformly and learns positional heads late (on the built-in corpus
    its layer-0 heads were still uniform after 3000 steps): this gives it n-gram context from step
    0.
    """
    offsets = cfg.local_attention_offsets
    head_dim = cfg.head_dim
    omega = fourier_frequencies(head_dim)
    gain = np.sqrt(cfg.local_attention_logit * np.sqrt(head_dim) / (cfg.hidden_size / 3.0))
    query = np.zeros((head_dim, len(offsets), head_dim))
    key = np.zeros((head_dim, len(offsets), head_dim))
    cos_col, sin_col = np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)
    for head, offset in enumerate(offsets):
        c, s = np.cos(omega * offset), np.sin(omega * offset)
        query[cos_col, head, cos_col] = gain
        query[sin_col, head, sin_col] = gain
        # k = (cos w(s-d), sin w(s-d)) = R(-w d) (cos ws, sin ws)
        key[cos_col, head, cos_col], key[sin_col, head, cos_col] = gain * c, gain * s
        key[cos_col, head, sin_col], key[sin_col, head, sin_col] = -gain * s, gain * c
    return {"query": query, "key": key}


def attention_kernel_init(cfg: BertConfig, which: str, layer_index):
    """Initializer of a layer's ``which`` ("query", "key", "value") kernel [D, N, H]: BERT's
    normal init, and in layer 0 (``layer_index`` may be traced, as inside a scanned stack) the
    query/key rows of `local_attention_rows` when ``cfg.local_attention_offsets`` is set."""
    normal = nn.initializers.normal(cfg.initializer_range)
    if not cfg.local_attention_offsets or which not in ("query", "key"):
        return normal
    rows = local_attention_rows(cfg)[which]

    def init(key, shape, dtype=jnp.float32):
        kernel = normal(key, shape, dtype)
        local = kernel.at[: rows.shape[0], : rows.shape[1]].set(jnp.asarray(rows, dtype))
        return jnp.where(jnp.asarray(layer_index) == 0, local, kernel)

    return init
