"""A larger model initialised from a smaller one's weights: ModernBERT's center tiling.

ModernBERT-large started from ModernBERT-base this way (answerdotai/ModernBERT
``src/bert_layers/model.py::init_model_from_pretrained``, mode ``tile_weights_from_middle``;
the docstring there calls it "Gopher layer scaling and Phi-style weight tiling"):

- large layer i takes small layer ``round(i * L_small / L_large)`` (Python's round: 22 -> 28
  repeats layers 2, 6, 9, 13, 16 and 20);
- every tensor holds the small one at its centre and the small one's wrapped repeats around it:
  ``new[r, c] = old[(r - o_r) mod s_r, (c - o_c) mod s_c]`` with ``o = (large - small) // 2``
  per axis (`tile_tensor`); no rescaling;
- pieces ModernBERT fuses are tiled one by one: its Wqkv as Q, K and V (ours are separate), the
  GLU ``Wi`` as its input half and its gate half;
- the vocabulary stays: word embeddings grow along their width only and the MLM decoder bias is
  copied;
- the encoder's final norm is not tiled: it keeps the large model's fresh init (ones), as
  ``init_model_from_pretrained`` tiles the embeddings' norm and every layer's but never
  ``final_norm``.

Example::

    small_cfg = bertjax.BertConfig.preset("modernbert-base")
    large_cfg = bertjax.BertConfig.preset("modernbert-large")
    large_params = tile_params(small_cfg, small_params, large_cfg, fresh_large_params)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import numpy as np

from bertjax.modeling.bert_config import BertConfig

_LAYER_KEY = re.compile(r"layer_(\d+)$")
# Parameters ModernBERT's init_model_from_pretrained leaves at the large model's init.
_NOT_TILED = ("encoder/final_norm",)
# Tables whose rows are ids (tokens, positions, types): only their width may grow.
_EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def layer_map(small_layers: int, large_layers: int) -> list[int]:
    """The small layer each large layer starts from: ModernBERT's ``round(i * L_small /
    L_large)`` (Python's round), capped at the last layer: beyond twice the depth the formula's
    last index rounds up to L_small, a layer that does not exist (4 -> 12 would end in 4)."""
    return [
        min(round(i * small_layers / large_layers), small_layers - 1) for i in range(large_layers)
    ]


def tile_tensor(old: np.ndarray, shape: tuple) -> np.ndarray:
    """``old`` centred in a tensor of ``shape`` (offset (new - old) // 2 per axis), the rest
    filled by wrapping: the closed form of ModernBERT's ``tile_weight`` centre-then-wrap loops
    (``initialization.py::_tile_1d``/``_tile_2d``), any rank."""
    old = np.asarray(old)
    if old.ndim != len(shape) or any(n < s for s, n in zip(old.shape, shape)):
        raise ValueError(f"cannot tile a {old.shape} tensor into {tuple(shape)}")
    index = [(np.arange(n) - (n - s) // 2) % s for s, n in zip(old.shape, shape)]
    return old[np.ix_(*index)] if old.ndim else old.copy()


def _growths(small: BertConfig, large: BertConfig) -> set:
    """The (small, large) axis sizes tiling may grow between: the model width D, the embedding
    width W, the feed-forward width F and the attention width N*H."""
    return {
        (small.hidden_size, large.hidden_size),
        (small.embedding_dim, large.embedding_dim),
        (small.intermediate_size, large.intermediate_size),
        (
            small.num_attention_heads * small.head_dim,
            large.num_attention_heads * large.head_dim,
        ),
    }


def _tile_leaf(path: str, old, new, growths: set, glu: bool) -> np.ndarray:
    """One parameter: ``old`` (small model) tiled to the shape of ``new`` (large model)."""
    old, new = np.asarray(old), np.asarray(new)
    if old.shape == new.shape:
        return old.astype(new.dtype)
    keys = path.split("/")
    name, parent = keys[-1], keys[-2] if len(keys) > 1 else ""
    if old.ndim != new.ndim:
        raise ValueError(f"{path}: cannot tile a {old.shape} tensor into {new.shape}")
    # The pieces tiled as ModernBERT tiles them, as (small, large) pairs of matrices or vectors.
    if parent == "attention" and name.endswith("_kernel"):
        # ModernBERT tiles each of its Q/K/V [N*H, D] blocks (and Wo) as one matrix: the
        # heads are flattened, so [D, N, H] -> [D, N*H] (output [N, H, D] -> [N*H, D]).
        if name == "output_kernel":
            pieces = [(old.reshape(-1, old.shape[-1]), new.reshape(-1, new.shape[-1]))]
        else:
            pieces = [(old.reshape(old.shape[0], -1), new.reshape(new.shape[0], -1))]
    elif parent == "attention" and name.endswith("_bias") and name != "output_bias":
        pieces = [(old.reshape(-1), new.reshape(-1))]  # [N, H] -> [N*H]
    elif glu and keys[-3:-1] == ["mlp", "intermediate"]:
        # [D, 2F] = [input | gate] (bias [2F]): each half tiled on its own, as ModernBERT's Wi.
        pieces = list(zip(np.split(old, 2, axis=-1), np.split(new, 2, axis=-1)))
    else:
        pieces = [(old, new)]
    for small, large in pieces:
        for axis, (s, n) in enumerate(zip(small.shape, large.shape)):
            fixed = name in _EMBEDDING_TABLES and axis == 0  # vocabulary, positions, types
            if s != n and (fixed or (s, n) not in growths):
                raise ValueError(
                    f"{path}: {old.shape} in the small model and {new.shape} in the large one: "
                    f"tiling cannot grow {s} to {n} (it keeps the vocabulary, positions, labels "
                    "and experts and grows only the D, W, F and N*H widths)"
                )
    tiled = [tile_tensor(small, large.shape) for small, large in pieces]
    return np.concatenate(tiled, axis=-1).reshape(new.shape).astype(new.dtype)


def _layers(node: Mapping, prefix: str) -> list | None:
    """A layer stack's per-layer subtrees (``layer_i`` keys, or a scanned ``layers`` subtree
    unstacked along its leading axis), or None when ``node`` holds no stack."""
    if isinstance(node.get("layers"), Mapping):
        stacked = _map(np.asarray, node["layers"])  # one host copy, then views per layer
        count = _leaves(stacked)[0][1].shape[0]
        return [_map(lambda x, i=i: x[i], stacked) for i in range(count)]
    found = {int(m.group(1)): key for key in node if (m := _LAYER_KEY.match(str(key)))}
    if not found:
        return None
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"{prefix}: layer keys {sorted(found.values())} skip an index")
    return [node[found[i]] for i in range(len(found))]


def _leaves(node, prefix: str = "") -> list:
    """[(path, leaf)] of a nested mapping, paths joined with "/"."""
    if not isinstance(node, Mapping):
        return [(prefix, node)]
    out = []
    for key, value in node.items():
        out.extend(_leaves(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


def _map(fn, node):
    return {k: _map(fn, v) for k, v in node.items()} if isinstance(node, Mapping) else fn(node)


def tile_params(
    small_cfg: BertConfig, small_params: Mapping, large_cfg: BertConfig, large_params: Mapping
) -> dict:
    """``large_params``' tree (plain nested dicts of numpy or jax arrays) with every parameter
    the small model has tiled from ``small_params`` (ModernBERT's center tiling; module
    docstring). Leaves the small model lacks (a fresh head, layer 0's attention norm) and the
    encoder's final norm keep ``large_params``' values and are logged; the result is numpy, in
    ``large_params``' dtypes. Loop or scanned (``layers``) stacks on either side.

    Raises ValueError naming the parameter when its shapes cannot be tiled: a different
    vocabulary, position table or label count, a smaller width, or a different mlp_type."""
    if small_cfg.vocab_size != large_cfg.vocab_size:
        table = next((p for p, _ in _leaves(large_params) if p.endswith("word_embeddings")), "")
        raise ValueError(
            f"{table or 'word_embeddings'}: the vocabularies differ ({small_cfg.vocab_size} vs "
            f"{large_cfg.vocab_size}); center tiling keeps the vocabulary (as ModernBERT's)"
        )
    if small_cfg.mlp_type != large_cfg.mlp_type:
        raise ValueError(
            f"mlp_type differs ({small_cfg.mlp_type!r} vs {large_cfg.mlp_type!r}): the "
            "feed-forward kernels cannot be tiled into each other"
        )
    growths = _growths(small_cfg, large_cfg)
    glu = large_cfg.mlp_type == "glu"
    kept: list[str] = []  # in the large tree only: the large init stays
    unused: list[str] = []  # in the small tree only

    def tile_tree(small, large, prefix: str):
        if prefix.endswith(_NOT_TILED):
            small = None
        if small is None:
            kept.extend(f"{prefix}/{p}" if p else prefix for p, _ in _leaves(large))
            return _map(np.asarray, large)
        if isinstance(small, Mapping) != isinstance(large, Mapping):
            raise ValueError(f"{prefix}: a subtree in one model and a tensor in the other")
        if not isinstance(large, Mapping):
            return _tile_leaf(prefix, small, large, growths, glu)
        tiled_stack = {}
        large_stack, small_stack = _layers(large, prefix), _layers(small, prefix)
        stack_keys = set()
        if large_stack is not None:
            if small_stack is None:
                raise ValueError(f"{prefix}: the small model has no layer stack here")
            mapping = layer_map(len(small_stack), len(large_stack))
            tiled = [
                tile_tree(small_stack[j], large_stack[i], f"{prefix}/layer_{i}")
                for i, j in enumerate(mapping)
            ]
            if "layers" in large:  # scanned: stack the layers again
                tiled_stack = {"layers": _stack(tiled)}
            else:
                tiled_stack = {f"layer_{i}": layer for i, layer in enumerate(tiled)}
            stack_keys = {k for k in {*large, *small} if k == "layers" or _LAYER_KEY.match(k)}
        out = {}
        for key, value in large.items():
            if key in stack_keys:
                out[key] = tiled_stack[key]
            else:
                out[key] = tile_tree(small.get(key), value, f"{prefix}/{key}" if prefix else key)
        unused.extend(
            f"{prefix}/{key}" if prefix else key
            for key in small
            if key not in large and key not in stack_keys
        )
        return out

    result = tile_tree(small_params, large_params, "")
    if kept:
        logging.info(
            "tile_params: %d parameter(s) the small model lacks keep the large init: %s",
            len(kept),
            ", ".join(kept),
        )
    if unused:
        logging.info("tile_params: small-model parameters the large one lacks: %s", unused)
    return result


def _stack(layers: list) -> dict:
    """Per-layer trees stacked along a new leading axis (a scanned stack's layout)."""
    first = layers[0]
    if isinstance(first, Mapping):
        return {k: _stack([layer[k] for layer in layers]) for k in first}
    return np.stack(layers)
