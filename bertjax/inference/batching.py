"""Inference batches of texts of mixed lengths: length-sorted buckets of a few compiled shapes, or
packed rows (several texts per row, told apart by segment ids).

Buckets: texts sorted longest first fill batches of ``[rows, length]`` where ``length`` is the
smallest of `BUCKETS` (capped at the model's limit) that holds the batch's first (longest) text
and ``rows = tokens_per_batch // length``, so each bucket length is one compiled shape and a
batch's padding is what its rounding up leaves (at most a third of a row past 64 tokens). Only
the last batch of a call has padding rows.

Packing: texts longest first go into the first row with room among the last `_LOOKBACK` opened
(first-fit decreasing, bounded so planning stays linear) of
``[rows, length]`` batches holding at most ``segments`` texts a row; one compiled shape.

Both are pure functions of the lengths, so the output order is restored from the indices they
return. numpy only: no model here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# Row lengths of the compiled shapes: powers of two and their 1.5x between, so padding stays
# under a third of a row and one call compiles at most ~10 shapes.
_LOOKBACK = 64
BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192)


def bucket_of(length: int, limit: int) -> int:
    """The smallest bucket length that holds ``length`` tokens (``limit`` caps it)."""
    for bucket in BUCKETS:
        if bucket >= length:
            return min(bucket, limit)
    return limit


@dataclasses.dataclass(frozen=True)
class Batch:
    """One model call: ``texts[i]`` goes into row ``rows[i]`` at offset ``starts[i]`` (packed) of
    a ``[shape[0], shape[1]]`` batch; ``texts`` index the caller's list."""

    shape: tuple[int, int]
    texts: np.ndarray
    rows: np.ndarray
    starts: np.ndarray


def bucket_batches(
    lengths: Sequence[int], tokens_per_batch: int, limit: int, max_rows: int | None = None
) -> list[Batch]:
    """Batches of one text a row, longest first, each padded to its bucket length (at most
    ``max_rows`` rows)."""
    lengths = np.minimum(np.asarray(lengths, np.int64), limit)
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        length = bucket_of(int(lengths[order[start]]), limit)
        rows = max(1, tokens_per_batch // length)
        rows = min(rows, max_rows) if max_rows else rows
        texts = order[start : start + rows]
        batches.append(
            Batch((rows, length), texts, np.arange(len(texts)), np.zeros(len(texts), np.int64))
        )
        start += rows
    return batches


def packed_batches(lengths: Sequence[int], rows: int, length: int, segments: int) -> list[Batch]:
    """Batches of ``[rows, length]`` packed first-fit decreasing, at most ``segments`` texts a
    row (texts longer than ``length`` must have been cut)."""
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and lengths.max() > length:
        raise ValueError(f"a text of {lengths.max()} tokens does not fit a packed row of {length}")
    order = np.argsort(-lengths, kind="stable")
    room, count, placed = [], [], []  # per open row: free tokens, texts; (text, row, start)
    for text in order:
        need = int(lengths[text])
        open_rows = range(max(0, len(room) - _LOOKBACK), len(room))
        row = next((r for r in open_rows if room[r] >= need and count[r] < segments), None)
        if row is None:
            row = len(room)
            room.append(length)
            count.append(0)
        placed.append((text, row, length - room[row]))
        room[row] -= need
        count[row] += 1
    placed = np.asarray(placed, np.int64).reshape(-1, 3)
    batches = []
    for first in range(0, len(room), rows):
        chosen = placed[(placed[:, 1] >= first) & (placed[:, 1] < first + rows)]
        batches.append(Batch((rows, length), chosen[:, 0], chosen[:, 1] - first, chosen[:, 2]))
    return batches


def fill(batch: Batch, pieces: Sequence[Sequence[np.ndarray]], pads: Sequence[int]) -> list:
    """The batch's arrays: ``pieces[k][i]`` (text i's ids, types, ...) written at its row and
    offset of array k, padded with ``pads[k]``; also ``segment_ids`` (0: padding; a text's
    number within its row from 1)."""
    shape = batch.shape
    arrays = [np.full(shape, pad, np.int32) for pad in pads]
    segment_ids = np.zeros(shape, np.int32)
    number = np.zeros(shape[0], np.int32)
    for text, row, start in zip(batch.texts, batch.rows, batch.starts):
        n = len(pieces[0][text])
        for array, values in zip(arrays, pieces):
            array[row, start : start + n] = values[text]
        number[row] += 1
        segment_ids[row, start : start + n] = number[row]
    return arrays + [segment_ids]
