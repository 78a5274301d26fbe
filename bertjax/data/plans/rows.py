"""Rows from plans: gathers store tokens into fixed-width `[CLS] A [SEP] B [SEP]` rows, optionally
packed.

Everything is vectorized over the batch: one fancy-index gather from the memory-mapped store.
Besides the batch keys, rows carry `word_starts` and `maskable` (real, non-special tokens) for
masking.
"""

from __future__ import annotations

import numpy as np

from bertjax.data.store.shard_reader import Column


def pair_layout(cols: tuple[np.ndarray, ...], width: int) -> dict[str, np.ndarray]:
    """Where each position of the rows `[CLS] A [SEP] (B [SEP])` of ``cols`` (a_start, a_end,
    b_start, b_end) reads: ``source`` [R, width] store positions, and the masks of A, B, [SEP]."""
    a0, a1, b0, b1 = (np.asarray(c, np.int64)[:, None] for c in cols)
    la, lb = a1 - a0, b1 - b0
    t = np.arange(width, dtype=np.int64)[None, :]
    in_a = (t >= 1) & (t <= la)
    in_b = (t >= la + 2) & (t < la + 2 + lb)
    sep = (t == la + 1) | ((lb > 0) & (t == la + 2 + lb))
    # Special and padding positions gather the row's own first token (then overwrite it), so a
    # sharded store reads no block but the row's.
    source = np.where(in_a, a0 + t - 1, np.where(in_b, b0 + t - la - 2, a0))
    return {"source": source, "text": in_a | in_b, "in_b": in_b, "sep": sep, "after_a": t > la + 1}


def read_sources(tokens, word_starts, sources: list[np.ndarray]) -> list[tuple]:
    """(token ids, word starts) at each of ``sources``: a sharded store reads the blocks of all
    of them at once (`Column.gather_many`), a local store indexes its memmaps."""
    if isinstance(tokens, Column):
        return tokens.gather_many(sources)
    return [(tokens[s], word_starts[s]) for s in sources]


def pair_rows(
    tokens: np.ndarray,
    word_starts: np.ndarray,
    special: np.ndarray,
    cols: tuple[np.ndarray, ...],
    width: int,
    ids: tuple[int, int, int],
    gathered: tuple[np.ndarray, np.ndarray] | None = None,
    layout: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Rows `[CLS] A [SEP] (B [SEP])` padded to `width`; cols = (a_start, a_end, b_start, b_end);
    ``gathered``: the (token ids, word starts) at the sources of ``layout`` (`pair_layout`'s),
    read already."""
    cls_id, sep_id, pad_id = ids
    layout = layout if layout is not None else pair_layout(cols, width)
    text, sep = layout["text"], layout["sep"]
    if gathered is None:
        gathered = read_sources(tokens, word_starts, [layout["source"]])[0]
    token_ids, starts = gathered
    input_ids = np.where(text, token_ids, pad_id).astype(np.int32)
    input_ids[sep] = sep_id
    input_ids[:, 0] = cls_id
    real = text | sep
    real[:, 0] = True
    return {
        "input_ids": input_ids,
        "token_type_ids": (layout["in_b"] | (sep & layout["after_a"])).astype(np.int32),
        "attention_mask": real.astype(np.int32),
        "word_starts": text & (starts > 0),
        # Document [SEP]s stored inside FULL-SENTENCES segments are special too.
        "maskable": text & ~special[input_ids],
    }


def pack(
    lengths: np.ndarray, order: np.ndarray, width: int, open_rows: int = 8
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First-fit packing of samples (taken in `order`) into rows of `width`, with a few rows open at
    once.

    Returns (row_starts, samples, offsets): row r holds plan samples
    samples[row_starts[r]:row_starts[r+1]],
    sample samples[i] beginning at offsets[i]. Rows are numbered in the order they are closed.
    """
    rows: list[list[int]] = []  # closed rows, as lists of sample ids
    open_members: list[list[int]] = []
    open_fill: list[int] = []
    for sample, length in zip(order.tolist(), lengths[order].tolist()):
        for i, fill in enumerate(open_fill):
            if fill + length <= width:
                open_members[i].append(sample)
                open_fill[i] += length
                break
        else:
            if len(open_members) == open_rows:  # close the fullest row
                i = int(np.argmax(open_fill))
                rows.append(open_members.pop(i))
                open_fill.pop(i)
            open_members.append([sample])
            open_fill.append(length)
    rows.extend(open_members)
    samples = np.fromiter((s for r in rows for s in r), np.int64)
    sizes = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    row_starts = np.concatenate([[0], np.cumsum(sizes)])
    sample_lengths = lengths[samples]
    before = np.cumsum(sample_lengths) - sample_lengths  # tokens before each sample, over all rows
    offsets = before - np.repeat(before[row_starts[:-1]], sizes)
    return row_starts, samples, offsets


def packed_rows(
    tokens,
    word_starts,
    special,
    cols,
    width: int,
    ids,
    row_of_sample: np.ndarray,
    offsets: np.ndarray,
    num_rows: int,
    gathered: tuple[np.ndarray, np.ndarray] | None = None,
    layout: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Several samples per row at `offsets`; `segment_ids` 1, 2, … per sample, 0 on padding."""
    single = pair_rows(tokens, word_starts, special, cols, width, ids, gathered, layout)
    lengths = single["attention_mask"].sum(1)
    t = np.arange(width)[None, :]
    inside = t < lengths[:, None]
    target = (row_of_sample[:, None] * width + offsets[:, None] + t)[inside]
    first = np.ones(len(row_of_sample), np.int64)
    first[1:] = row_of_sample[1:] != row_of_sample[:-1]
    segment = (
        np.arange(len(row_of_sample))
        - np.maximum.accumulate(np.where(first == 1, np.arange(len(first)), 0))
        + 1
    )
    out = {}
    for key, value in single.items():
        filled = np.zeros((num_rows, width), value.dtype)
        if key == "input_ids":
            filled[:] = ids[2]
        filled.reshape(-1)[target] = value[inside]
        out[key] = filled
    segment_ids = np.zeros((num_rows, width), np.int32)
    segment_ids.reshape(-1)[target] = np.broadcast_to(segment[:, None], inside.shape)[inside]
    out["segment_ids"] = segment_ids
    return out
