"""InfoNCE over in-batch negatives (sentence-transformers' MultipleNegativesRankingLoss) and its
Matryoshka form (Kusupati et al. 2022; sentence-transformers' MatryoshkaLoss), as pure functions
of embeddings.

Query i is scored against every document of the batch: all positives, then each slot of hard
negatives (the candidate order of MultipleNegativesRankingLoss); its own positive is column i.

    loss_i = logsumexp_j(scale * sim(q_i, d_j)) - scale * sim(q_i, d_i)

``symmetric`` adds the document->query direction with one softmax per direction averaged in the
denominator (MultipleNegativesRankingLoss(directions=("query_to_doc", "doc_to_query"),
partition_mode="per_direction")). Matryoshka sums ``weight_k * loss`` over the prefix widths, each
prefix L2-normalized first (MatryoshkaLoss's ``shrink``).

Called on the global batch inside the jitted step, the candidate matrix spans every device and
host (the partitioner gathers the documents), as big_vision's SigLIP computes its loss.
Deviation: rows with weight 0 (padding of the last eval batch) are left out of the sums and as
candidates; sentence-transformers has no padding rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.modeling.embedder import l2_normalize

Array = jax.Array

_MASKED = -1e9  # the score of a padding candidate (exp underflows to 0)


def similarity(a_NE: Array, b_ME: Array, kind: str) -> Array:
    """[N, M] cosine ("cos") or dot-product ("dot") similarities, in float32 or wider."""
    dtype = jnp.promote_types(jnp.promote_types(a_NE.dtype, b_ME.dtype), jnp.float32)
    a_NE, b_ME = a_NE.astype(dtype), b_ME.astype(dtype)
    if kind == "cos":
        a_NE, b_ME = l2_normalize(a_NE), l2_normalize(b_ME)
    return a_NE @ b_ME.T


def info_nce(
    query_BE: Array,
    docs_BKE: Array,
    scale,
    weights_B: Array | None = None,
    symmetric: bool = False,
    kind: str = "cos",
) -> tuple[Array, Array]:
    """Per-query loss [B] and top-1 hits [B] (the positive outranks every other candidate).

    ``docs_BKE``: each query's positive (slot 0) and hard negatives (slots 1..K-1)."""
    batch, slots = docs_BKE.shape[0], docs_BKE.shape[1]
    if weights_B is None:
        weights_B = jnp.ones((batch,), jnp.float32)
    real_B = weights_B > 0
    candidates_CE = jnp.swapaxes(docs_BKE, 0, 1).reshape(slots * batch, -1)  # positives first
    scores_BC = scale * similarity(query_BE, candidates_CE, kind)
    scores_BC = jnp.where(jnp.tile(real_B, slots)[None, :], scores_BC, _MASKED)
    positive_B = jnp.diagonal(scores_BC[:, :batch])
    log_z_B = jax.nn.logsumexp(scores_BC, axis=1)
    if symmetric:  # each positive document against every query
        scores_BB = scale * similarity(docs_BKE[:, 0], query_BE, kind)
        scores_BB = jnp.where(real_B[None, :], scores_BB, _MASKED)
        log_z_B = 0.5 * (log_z_B + jax.nn.logsumexp(scores_BB, axis=1))
    hits_B = jnp.argmax(scores_BC, axis=1) == jnp.arange(batch)
    return log_z_B - positive_B, hits_B.astype(jnp.float32)


def matryoshka_info_nce(
    query_BE: Array,
    docs_BKE: Array,
    scale,
    weights_B: Array | None,
    symmetric: bool,
    kind: str,
    dims: tuple[int, ...] = (),
    dim_weights: tuple[float, ...] = (),
) -> tuple[Array, Array]:
    """`info_nce` summed over Matryoshka prefixes (``dims`` empty: the full width only); the hits
    are those of the first prefix."""
    if not dims:
        return info_nce(query_BE, docs_BKE, scale, weights_B, symmetric, kind)
    width = query_BE.shape[-1]
    if max(dims) > width:
        raise ValueError(
            f"config.loss.matryoshka_dims={dims}: wider than the embeddings ({width} wide)"
        )
    weights = dim_weights or (1.0,) * len(dims)
    total, first_hits = 0.0, None
    for dim, weight in zip(dims, weights):
        query, docs = l2_normalize(query_BE[..., :dim]), l2_normalize(docs_BKE[..., :dim])
        loss_B, hits_B = info_nce(query, docs, scale, weights_B, symmetric, kind)
        total = total + weight * loss_B
        first_hits = hits_B if first_hits is None else first_hits
    return total, first_hits
