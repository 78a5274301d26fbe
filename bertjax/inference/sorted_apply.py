"""Run a jitted model over texts of mixed lengths fast: length-sorted buckets of a few compiled
shapes (batching.py), calls dispatched ahead so the host fills the next batch
while the device runs, results put back in input order; `windows` streams any number of texts
with bounded memory.

Example::

    outputs = sorted_apply.apply_sorted(fn, ids, types, pad_id=0, limit=512)
    # fn(input_ids [B, T], token_type_ids [B, T], attention_mask [B, T]) -> [B, ...]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import jax
import numpy as np

from bertjax.inference import batching

# measured on CPU (benchmarks/inference/predict_throughput.py): 2k-8k is flat
TOKENS_PER_BATCH = 4096
WINDOW = 8192  # texts read, sorted and written back at a time (bounds host memory)


def windows(items: Iterable, size: int = WINDOW) -> Iterator[list]:
    """``items`` in lists of at most ``size`` (the last shorter)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def apply_sorted(
    fn: Callable,
    ids: Sequence[np.ndarray],
    types: Sequence[np.ndarray],
    pad_id: int,
    limit: int,
    tokens_per_batch: int = TOKENS_PER_BATCH,
    max_rows: int | None = None,
    per_token: bool = False,
) -> list[np.ndarray]:
    """``fn``'s output row of each text, in input order (``per_token``: its first len(ids[i])
    positions). Texts are batched longest first into bucket shapes (at most ``max_rows`` rows);
    padding rows see one token so no softmax is empty, and are dropped."""
    lengths = [len(x) for x in ids]
    pending = []
    for batch in batching.bucket_batches(lengths, tokens_per_batch, limit, max_rows):
        input_ids, token_types, segments = batching.fill(batch, (ids, types), (pad_id, 0))
        mask = (segments > 0).astype(np.int32)
        mask[len(batch.texts) :, 0] = 1
        pending.append((batch, fn(input_ids, token_types, mask)))  # dispatched, not awaited
    results: list = [None] * len(ids)
    for batch, out in pending:
        out = jax.tree.map(np.asarray, out)  # an array or a tuple of arrays, [B, ...] each
        for row, text in zip(batch.rows, batch.texts):
            end = lengths[text] if per_token else None
            results[text] = jax.tree.map(lambda x, r=row, e=end: x[r, :e] if e else x[r], out)
    return results
