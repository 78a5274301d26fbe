"""Attention with probability dropout by cuDNN's flash attention on NVIDIA GPUs: the scores, their
softmax and the dropout mask never reach HBM (the exact path writes all three in every layer).

`jax.nn.dot_product_attention` takes no dropout; the function below it does. This module calls
**a private JAX module**, `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`
(`PRIVATE`, with the keyword arguments in `ARGUMENTS`): tests/attention_kernels_test.py imports
it and checks those names, so a JAX upgrade that moves or changes it fails there, loudly.

Where the bits come from (XLA's cuDNN graph, jax-cuda12-plugin 0.10): a Philox stream whose seed
is fixed when the step is compiled (`layer_seed`: one per layer, from the Flax module path, so
layers draw different masks) and whose offset XLA advances at every execution of the call, on
each GPU from 0. The backward call regenerates the forward's mask because each executes once
per layer per (micro)batch in the same order. So the bits are not drawn from the step's rng key:
a resumed run draws other masks than an uninterrupted one (statistically the same), and every
GPU of a data-parallel mesh draws the same stream for its own rows. Inside a loop whose backward
runs its iterations in reverse (scanned layers) the two orders differ and the gradients would
be of other masks: `refusal` refuses scanned stacks, and shared (ALBERT) layers, whose repeats
would share one seed.

What is checked without a GPU (tests/attention_kernels_test.py): the call's arguments (rate,
scale, padding, causal, window), a distinct seed per layer, the refusals, and that the step
compiles for `h100-8` with the fused call in it (docs/results/compile.md). Not checked here: the
bits and the numbers cuDNN computes; `benchmarks/step/gpu_checks.py` compares them on a GPU.
"""

from __future__ import annotations

import importlib
import math
import zlib

import jax
import jax.numpy as jnp

PRIVATE = "jax._src.cudnn.fused_attention_stablehlo"
ARGUMENTS = ("q_seqlen", "kv_seqlen", "mask", "scale", "mask_type", "seed", "dropout_rate")
ARGUMENTS += ("sliding_window_length",)


def fused():
    """The private module (import errors surface here and in the test)."""
    return importlib.import_module(PRIVATE)


def _layer():
    """The Flax module whose method is being traced (the attention layer), or None."""
    from flax.linen import module as flax_module

    stack = flax_module._context.module_stack  # noqa: SLF001  (no public accessor)
    return stack[-1] if stack else None


def layer_seed() -> int:
    """A static seed for the layer being traced: a CRC of its Flax module path (0 outside a
    module), so each layer's call draws its own stream and a recompile draws the same."""
    layer = _layer()
    path = "/".join(layer.path) if layer is not None and layer.scope is not None else ""
    return zlib.crc32(path.encode()) & 0x7FFFFFFF


def refusal() -> str | None:
    """Why the layer being traced cannot draw its dropout bits in cuDNN (None: it can)."""
    cfg = getattr(_layer(), "cfg", None)
    if cfg is None:
        return None
    if cfg.scan_layers:
        return "scan_layers=True (the backward loop runs the layers in reverse: other bits)"
    if cfg.num_groups != cfg.num_hidden_layers:
        return "shared layers (num_hidden_groups: every repeat would draw the same bits)"
    return None


def attention(q_BTNH, k_BSNH, v_BSNH, rate, lengths_B=None, causal=False, window=0, mask=None):
    """Softmax attention with probabilities dropped at ``rate`` (kept ones scaled by 1 /
    (1 - rate)), by cuDNN: rows padded at the end by their ``lengths_B`` (``causal``; ``window``:
    keys up to this many positions to the left, 0: all), or a boolean ``mask`` [B, 1, T, S] that
    says everything (packed or gathered rows)."""
    module = fused()
    kinds = module.MaskType
    kwargs = {}
    if mask is not None:
        shape = (q_BTNH.shape[0], 1, q_BTNH.shape[1], k_BSNH.shape[1])
        kwargs.update(mask=jnp.broadcast_to(mask, shape), mask_type=kinds.NO_MASK)
    else:
        kind = kinds.PADDING_CAUSAL if causal else kinds.PADDING
        kwargs.update(q_seqlen=lengths_B, kv_seqlen=lengths_B, mask_type=kind)
        kwargs["sliding_window_length"] = window + 1 if window else None
    return module.dot_product_attention(
        q_BTNH,
        k_BSNH,
        v_BSNH,
        scale=1.0 / math.sqrt(q_BTNH.shape[-1]),
        seed=layer_seed(),
        dropout_rate=float(rate),
        **kwargs,
    )


def lengths(key_segments) -> jax.Array:
    """[B] real tokens of right-padded rows (an `AttentionMask`'s key segments)."""
    return jnp.sum(key_segments > 0, axis=-1).astype(jnp.int32)
