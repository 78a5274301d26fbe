"""Pretraining from a pretrained model (``config.init_from``): a bertjax workdir/checkpoint or a
Hugging Face directory, its weights copied into the new model, or with ``config.init_tiling``
centre-tiled into a larger shape (ModernBERT-large from -base: bertjax/interop/tiling.py).

Used by the pretraining objectives' `prepare_state` (a fresh state only: a resumed run keeps its
checkpoint). The optimizer starts afresh; a parameter the source lacks keeps its fresh init (said
in one log line); a shape that differs without tiling is an error naming the parameter.
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from bertjax.interop.pretrained import PretrainedSource
from bertjax.interop.tiling import tile_params


def _host(tree):
    """A pytree of (possibly sharded, multi-host) arrays as host numpy."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
    return jax.tree.map(np.asarray, jax.device_get(tree))


def _copy(source_params: dict, fresh: dict, where: str) -> dict:
    """``fresh`` with every leaf the source has at the same path (same shape) replaced."""
    flat = {
        jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(source_params)
    }
    kept = []

    def take(path, leaf):
        key = jax.tree_util.keystr(path)
        if key not in flat:
            kept.append(key)
            return leaf
        value = np.asarray(flat[key])
        if value.shape != leaf.shape:
            raise ValueError(
                f"config.init_from={where!r}: {key} has shape {value.shape}, the model "
                f"{leaf.shape}; set config.init_tiling=True to tile it into the larger shape"
            )
        return value

    out = jax.tree_util.tree_map_with_path(take, fresh)
    if kept:
        logging.info("init_from %s: fresh init kept for %s", where, kept)
    return out


def warm_start(state, path: str, model_cfg, tiling: bool = False):
    """``state`` (fresh) with the parameters of the model at ``path`` (see the module docstring)."""
    source = PretrainedSource(path, "config.init_from")
    source_params = source.params(scan_layers=model_cfg.scan_layers and not tiling)
    fresh = _host(state.params)
    if tiling:
        values = tile_params(source.model_config(), source_params, model_cfg, fresh)
    else:
        values = _copy(source_params, fresh, path)
    params = jax.tree.map(
        lambda value, leaf: jax.device_put(np.asarray(value, leaf.dtype), leaf.sharding),
        values,
        state.params,
    )
    logging.info("init_from %s: %s", path, "tiled into the larger model" if tiling else "copied")
    return state.replace(params=params)


def with_source_tokenizer(config):
    """``config`` with the init_from model's tokenizer as the data's when none is configured
    (its vocabulary is the model's); unchanged otherwise."""
    if not config.get("init_from") or "data" not in config:
        return config
    if config.data.tokenizer_model or config.data.hf_vocab:
        return config
    source = PretrainedSource(config.init_from, "config.init_from")
    local = source.tokenizer_file()
    config = config.copy_and_resolve_references()
    if local.endswith(".model"):
        config.data.tokenizer_model = local
    else:
        config.data.hf_vocab = local
    return config
