"""Inference batches of texts of mixed lengths: length-sorted buckets of a few compiled shapes, or
packed rows (several texts per row, told apart by segment ids).

Buckets: texts sorted longest first fill batches of ``[rows, length]`` where ``length`` is the
smallest of `BUCKETS` (capped at the model's limit) that holds the batch's first (longest) text
and ``rows = tokens_per_batch // length``, so each bucket length is one compiled shape and a
batch's padding is what its rounding up leaves (at most a third of a row past 64 tokens). Only
the last batch of a call has padding rows.

Packing: texts longest first go into the open row with the least room that holds them (best-fit
decreasing), else open a row of the shortest of a few row lengths that holds them; the rows of
each length form ``[tokens_per_batch // length, length]`` batches, one compiled shape per
length. Attention costs each token its row's length, so short texts in short rows save it
(rows of 128 beside 256 on perldiag: ~15% less model time than 256 alone), and a longer length's
last batch takes a shorter one's part-filled last batch in its empty rows when it fits.

Both are pure functions of the lengths, so the output order is restored from the indices they
return. numpy only: no model here.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import numpy as np

# Row lengths of the compiled shapes: powers of two and their 1.5x between, so padding stays
# under a third of a row and one call compiles at most ~10 shapes.
SEGMENT_TOKENS = 8  # a packed row of L tokens holds at most L // 8 texts (pooling's segments)
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


def packed_batches(
    lengths: Sequence[int],
    tokens_per_batch: int,
    row_lengths: Sequence[int],
    tokens_per_segment: int = SEGMENT_TOKENS,
) -> list[Batch]:
    """Texts packed best-fit decreasing into rows of ``row_lengths`` (texts longer than the
    longest must have been cut), a row of L holding at most L // ``tokens_per_segment`` texts,
    the rows of each length L in batches of ``[tokens_per_batch // L, L]`` (module docstring)."""
    lengths = np.asarray(lengths, np.int64)
    row_lengths = sorted(set(int(n) for n in row_lengths))
    if len(lengths) and lengths.max() > row_lengths[-1]:
        raise ValueError(
            f"a text of {lengths.max()} tokens does not fit a packed row of {row_lengths[-1]}"
        )
    order = np.argsort(-lengths, kind="stable")
    free: list = []  # (room, row) of each row that may take another text, sorted
    length_of, room, count, placed = [], [], [], []  # per row; (text, row, start) per text
    for text in order:
        need = int(lengths[text])
        at = bisect.bisect_left(free, (need, -1))
        if at < len(free):  # the fullest row with room
            row = free.pop(at)[1]
        else:
            row = len(room)
            length_of.append(next(n for n in row_lengths if n >= need))
            room.append(length_of[row])
            count.append(0)
        placed.append((text, row, length_of[row] - room[row]))
        room[row] -= need
        count[row] += 1
        if room[row] and count[row] < length_of[row] // tokens_per_segment:
            bisect.insort(free, (room[row], row))
    rows_of = {n: [r for r in range(len(room)) if length_of[r] == n] for n in row_lengths}
    _spill(rows_of, tokens_per_batch)
    placed = np.asarray(placed, np.int64).reshape(-1, 3)
    batches = []
    for length, rows in rows_of.items():
        per_batch = max(1, tokens_per_batch // length)
        for first in range(0, len(rows), per_batch):
            chosen = rows[first : first + per_batch]
            number = {row: i for i, row in enumerate(chosen)}
            mine = placed[np.isin(placed[:, 1], chosen)]
            rows_in = np.asarray([number[r] for r in mine[:, 1]], np.int64)
            batches.append(Batch((per_batch, length), mine[:, 0], rows_in, mine[:, 2]))
    return batches


def _spill(rows_of: dict, tokens_per_batch: int) -> None:
    """Moves the rows of a length's last, part-filled batch into the empty rows of a longer
    length's last batch when all of them fit there: one call fewer, the same texts."""
    lengths = sorted(rows_of)
    for i, longer in enumerate(lengths):
        for shorter in lengths[:i]:
            per_batch = max(1, tokens_per_batch // longer)
            empty = -len(rows_of[longer]) % per_batch
            tail = len(rows_of[shorter]) % max(1, tokens_per_batch // shorter)
            if 0 < tail <= empty:
                rows_of[longer] += rows_of[shorter][-tail:]
                del rows_of[shorter][-tail:]


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
