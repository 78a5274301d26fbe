"""Inference batching: every text exactly once, few shapes, packed texts never overlap, and
`inference.apply_sorted` gives each text its own row back in input order."""

import numpy as np
import pytest

from bertjax.inference import batching as length_batches
from bertjax.inference import sorted_apply as inference

LENGTHS = np.random.default_rng(0).integers(1, 300, size=500)


def test_buckets_hold_each_text_once_in_a_few_shapes():
    batches = length_batches.bucket_batches(LENGTHS, 2048, 256)
    texts = np.concatenate([b.texts for b in batches])
    assert sorted(texts.tolist()) == list(range(len(LENGTHS)))
    assert len({b.shape for b in batches}) <= 9
    for b in batches:
        assert b.shape[0] * b.shape[1] <= 2048 and len(b.texts) <= b.shape[0]
        assert np.all(np.minimum(LENGTHS[b.texts], 256) <= b.shape[1])
        assert b.shape[1] == length_batches.bucket_of(int(LENGTHS[b.texts].max()), 256)
    assert sum(b.shape[0] < len(b.texts) for b in batches) == 0


def _check_packed(batches, lengths, tokens_per_batch):
    """Every text once, in a row of its batch, never overlapping another, at most a text per 8
    tokens of a row; the batches' shapes."""
    seen = []
    for b in batches:
        assert b.shape == (tokens_per_batch // b.shape[1], b.shape[1])
        used = np.zeros(b.shape, int)
        for text, row, start in zip(b.texts, b.rows, b.starts):
            used[row, start : start + lengths[text]] += 1
        assert used.max() <= 1 and np.bincount(b.rows).max() <= b.shape[1] // 8
        seen += b.texts.tolist()
    assert sorted(seen) == list(range(len(lengths)))


def test_packed_rows_never_overlap():
    lengths = np.minimum(LENGTHS, 128)
    batches = length_batches.packed_batches(lengths, 1024, [128], tokens_per_segment=32)
    _check_packed(batches, lengths, 1024)
    assert {b.shape for b in batches} == {(8, 128)}
    assert max(np.bincount(b.rows).max() for b in batches) == 4  # the cap: 128 // 32 a row
    assert sum(lengths) / (len(batches) * 8 * 128) > 0.9  # little padding


def test_short_texts_go_to_short_rows_and_a_last_batch_spills_into_a_longer_one():
    """Rows of 128 and 256: a text over 128 opens a row of 256, the short texts fill those rows'
    room first (best fit), then rows of 128; the 128s' last batch, part-filled, moves into the
    empty rows of the 256s' last batch when it fits there."""
    lengths = np.asarray([200] * 3 + [100] * 9 + [40] * 3)
    batches = length_batches.packed_batches(lengths, 1024, [128, 256])
    _check_packed(batches, lengths, 1024)
    # 3 rows of 256 (200 + 40 each: the 40s take the room of the 256s, not of the 128s, where
    # they fit too), 9 rows of 128 (100 each): one batch of 4 x 256 and one of 8 x 128, the 9th
    # row of 128 moved into the 256s' empty 4th row
    assert [b.shape for b in batches] == [(8, 128), (4, 256)]
    long_rows = batches[1]
    assert sorted(lengths[long_rows.texts].tolist()) == [40, 40, 40, 100, 200, 200, 200]
    with pytest.raises(ValueError, match="a text of 300 tokens does not fit a packed row of 256"):
        length_batches.packed_batches([300], 1024, [128, 256])


def test_apply_sorted_restores_input_order():
    ids = [np.arange(n, dtype=np.int32) + 1 for n in np.minimum(LENGTHS[:50], 256)]
    types = [np.zeros(len(x), np.int32) for x in ids]

    def fn(input_ids, token_types, mask):  # a row's sum and its real length
        return np.stack([input_ids.sum(axis=1), mask.sum(axis=1)], axis=1)

    out = inference.apply_sorted(fn, ids, types, 0, 256, tokens_per_batch=1024)
    assert [tuple(o) for o in out] == [(x.sum(), len(x)) for x in ids]
    tags = inference.apply_sorted(lambda i, t, m: i * 2, ids, types, 0, 256, per_token=True)
    assert all(np.array_equal(t, x * 2) for t, x in zip(tags, ids))
