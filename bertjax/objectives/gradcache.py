"""GradCache (Gao et al. 2021; sentence-transformers' CachedMultipleNegativesRankingLoss): the
gradient of a loss over the whole batch's embeddings, with the encoder run a chunk at a time.

1. Embed every chunk without keeping activations (a `lax.scan` of forward passes).
2. The loss and its gradient with respect to all the embeddings, on the whole batch.
3. Per chunk, re-run the encoder and pull that chunk's embedding gradient back to the parameters
   (a vjp per chunk, scanned), adding up.

Memory holds one chunk's activations; the price is a second forward pass. Chunk ``i`` takes rows
``i, i + n, i + 2n, ...`` (every device's shard feeds each chunk, as the step's microbatches do)
and runs with dropout key ``fold_in(rng, i)`` in both passes, so the two passes see the same
dropout masks and the gradient equals that of one pass over the chunks. cuDNN's attention dropout
draws its bits from no key (`bertjax.ops.cudnn_dropout`): it is refused here, so attention with
dropout takes a kernel that reads the key (the exact path on GPUs).
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.ops import cudnn_dropout

REFUSAL = "GradCache (its two passes over a chunk must draw one mask: only a key-drawn mask does)"


def split_chunks(tree, chunks: int):
    """[B, ...] leaves -> [chunks, B / chunks, ...]; chunk i holds rows i, i + chunks, ..."""

    def split(x):
        if x.shape[0] % chunks:
            raise ValueError(
                f"config.loss.gradcache_chunk_size gives {chunks} chunks, which do not divide "
                f"the batch of {x.shape[0]}"
            )
        x = jnp.swapaxes(x.reshape((x.shape[0] // chunks, chunks) + x.shape[1:]), 0, 1)
        return nn.with_logical_constraint(x, (None, "act_batch") + (None,) * (x.ndim - 2))

    return jax.tree.map(split, tree)


def merge_chunks(tree):
    """The inverse of `split_chunks`."""

    def merge(x):
        x = jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])
        return nn.with_logical_constraint(x, ("act_batch",) + (None,) * (x.ndim - 1))

    return jax.tree.map(merge, tree)


def gradcache_gradients(
    embed: Callable, loss: Callable, params, batch: dict, rng, chunks: int
) -> tuple:
    """(grads, aux) of ``loss(params, embed(params, batch))``, the encoder run chunk by chunk.

    ``embed(params, chunk, rng)`` maps a chunk of the batch to a pytree of embeddings;
    ``loss(params, embeddings)`` returns (scalar, aux) on the whole batch (it may read params
    directly, e.g. a learned temperature)."""
    with cudnn_dropout.refused(REFUSAL):
        return _gradcache_gradients(embed, loss, params, batch, rng, chunks)


def _gradcache_gradients(embed, loss, params, batch: dict, rng, chunks: int) -> tuple:
    parts = split_chunks(batch, chunks)
    indices = jnp.arange(chunks)

    def forward(_, inputs):
        chunk, index = inputs
        return None, jax.lax.stop_gradient(embed(params, chunk, jax.random.fold_in(rng, index)))

    _, embedded = jax.lax.scan(forward, None, (parts, indices))
    embeddings = merge_chunks(embedded)
    grad_fn = jax.grad(loss, argnums=(0, 1), has_aux=True)
    (direct, cotangents), aux = grad_fn(params, embeddings)

    def backward(total, inputs):
        chunk, cotangent, index = inputs
        key = jax.random.fold_in(rng, index)
        _, pull = jax.vjp(lambda p: embed(p, chunk, key), params)
        return jax.tree.map(jnp.add, total, pull(cotangent)[0]), None

    grads, _ = jax.lax.scan(backward, direct, (parts, split_chunks(cotangents, chunks), indices))
    return grads, aux
