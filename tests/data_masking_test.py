"""Masking statistics and invariants: rates, 80/10/10, whole words, n-grams, diffusion, keys."""

import numpy as np
import pytest

from bertjax.data import keys, masking, similarity

MASK, VOCAB = 4, 1000
NORMAL = np.arange(5, VOCAB, dtype=np.int32)


def _rows(batch, width, seed=0):
    """Synthetic rows: [CLS] A [SEP] B [SEP] [PAD]..., random pieces, ~70% of them start words."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(width // 3, width + 1, batch)
    t = np.arange(width)[None, :]
    real = t < lengths[:, None]
    ids = np.where(real, rng.integers(5, VOCAB, (batch, width)), 0).astype(np.int32)
    rows = np.arange(batch)
    ids[:, 0], ids[rows, lengths // 2], ids[rows, lengths - 1] = 2, 3, 3
    maskable = real & (ids >= 5)
    return ids, maskable, rng.random((batch, width)) < 0.7


def _mask(ids, maskable, starts, spec, epoch=0, index=None, similar=None):
    index = np.arange(len(ids)) if index is None else index
    row_keys = keys.row_keys(0, epoch, "mask", index)
    return masking.mask_batch(
        ids, maskable, starts, row_keys, spec, mask_id=MASK, normal_ids=NORMAL, similar=similar
    )


def _chosen(out, width):
    chosen = np.zeros((len(out["masked_positions"]), width), bool)
    rows, slots = np.nonzero(out["masked_weights"])
    chosen[rows, out["masked_positions"][rows, slots]] = True
    return chosen


def test_token_masking_rate_and_80_10_10():
    ids, maskable, starts = _rows(3000, 128)
    out = _mask(ids, maskable, starts, masking.MaskSpec(mode="token", max_predictions=20))
    chosen = _chosen(out, 128)
    assert abs(chosen.sum() / maskable.sum() - 0.15) < 0.005
    np.testing.assert_array_equal(
        chosen.sum(1), masking.budget(maskable, masking.MaskSpec(max_predictions=20))
    )
    assert not (chosen & ~maskable).any()  # never [CLS]/[SEP]/[PAD]
    new = out["input_ids"][chosen]
    original = ids[chosen]
    assert abs((new == MASK).mean() - 0.8) < 0.01
    assert abs(((new != MASK) & (new != original)).mean() - 0.1) < 0.01
    assert abs((new == original).mean() - 0.1) < 0.01
    np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])
    np.testing.assert_array_equal(
        np.take_along_axis(ids, out["masked_positions"], 1)[out["masked_weights"] > 0],
        out["masked_ids"][out["masked_weights"] > 0],
    )
    padding = out["masked_weights"] == 0
    assert (out["masked_positions"][padding] == 0).all() and (out["masked_ids"][padding] == 0).all()
    assert (out["mask_ratio"] == 1).all() and out["masked_positions"].dtype == np.int32


def test_a_row_masks_the_same_in_any_batch_and_differently_per_epoch():
    ids, maskable, starts = _rows(64, 128)
    for mode in ("token", "whole_word", "ngram", "diffusion"):
        spec = masking.MaskSpec(
            mode=mode,
            max_predictions=128 if mode == "diffusion" else 20,
            ngram_probs=(0.6, 0.3, 0.1),
        )
        full = _mask(ids, maskable, starts, spec)
        part = np.array([40, 3, 17])
        alone = _mask(ids[part], maskable[part], starts[part], spec, index=part)
        for key in ("input_ids", "masked_positions", "masked_ids", "mask_ratio"):
            np.testing.assert_array_equal(full[key][part], alone[key], err_msg=f"{mode} {key}")
        other_epoch = _mask(ids, maskable, starts, spec, epoch=1)
        assert (other_epoch["masked_positions"] != full["masked_positions"]).any(1).mean() > 0.9, (
            mode
        )


def _words(maskable, starts):
    """Word id per maskable token (a maskable token after a non-maskable one starts a word)."""
    word_start = masking._word_starts(maskable, starts)
    return np.where(maskable, np.cumsum(word_start, 1), -1)


def test_whole_word_masking_never_masks_part_of_a_word():
    ids, maskable, starts = _rows(2000, 128)
    out = _mask(ids, maskable, starts, masking.MaskSpec(mode="whole_word", max_predictions=20))
    chosen = _chosen(out, 128)
    words = _words(maskable, starts)
    for row in range(len(ids)):
        masked_words = np.unique(words[row][chosen[row]])
        assert (chosen[row] == np.isin(words[row], masked_words)).all()
    k = masking.budget(maskable, masking.MaskSpec(max_predictions=20))
    assert (chosen.sum(1) <= k).all() and abs(chosen.sum() / maskable.sum() - 0.15) < 0.01
    assert not (chosen & ~maskable).any()


ALBERT_NGRAMS = (6 / 11, 3 / 11, 2 / 11)  # ALBERT: p(n) proportional to 1/n, n <= 3
MACBERT_NGRAMS = (0.4, 0.3, 0.2, 0.1)  # MacBERT (and PERT): 40/30/20/10% for 1..4 words


@pytest.mark.parametrize("probs", [ALBERT_NGRAMS, MACBERT_NGRAMS])
@pytest.mark.parametrize("width,predictions", [(128, 20), (512, 20), (512, 80)])
def test_ngram_span_lengths_follow_the_configured_distribution(probs, width, predictions):
    # BERT-128 and ALBERT's T=512/P=20 (where the budget binds in almost every row), and BERT's
    # 512 phase with slack (P=80).
    ids, maskable, starts = _rows(3000 if width == 128 else 1000, width)
    spec = masking.MaskSpec(mode="ngram", max_predictions=predictions, ngram_probs=probs)
    row_keys = keys.row_keys(0, 0, "mask", np.arange(len(ids)))
    chosen, words_per_span, _ = masking.select(maskable, starts, row_keys, spec)
    lengths = words_per_span[words_per_span > 0]
    measured = np.bincount(lengths, minlength=len(probs) + 1)[1:] / len(lengths)
    np.testing.assert_allclose(measured, probs, atol=0.02)
    k = masking.budget(maskable, spec)
    assert (chosen.sum(1) <= predictions).all() and not (chosen & ~maskable).any()
    assert 0.9 * k.sum() <= chosen.sum() <= 1.01 * k.sum()  # a few tokens fewer than k at most
    words = _words(maskable, starts)
    for row in range(50):  # spans are whole words
        assert (chosen[row] == np.isin(words[row], np.unique(words[row][chosen[row]]))).all()


def test_ngram_draw_of_n_before_the_budget():
    ids, maskable, starts = _rows(2000, 128)
    row_keys = keys.row_keys(0, 0, "mask", np.arange(len(ids)))
    for probs in (ALBERT_NGRAMS, MACBERT_NGRAMS):
        unit_start, words = masking._ngram_units(
            maskable, masking._word_starts(maskable, starts), row_keys, np.array(probs)
        )
        drawn = np.bincount(words[unit_start], minlength=len(probs) + 1)[1:] / unit_start.sum()
        np.testing.assert_allclose(drawn, probs, atol=0.02)


def test_diffusion_masks_each_token_with_the_row_ratio():
    ids, maskable, starts = _rows(2000, 128)
    out = _mask(ids, maskable, starts, masking.MaskSpec(mode="diffusion", diffusion_eps=0.05))
    ratio = out["mask_ratio"]
    assert ratio.dtype == np.float32 and ratio.min() >= 0.05 and ratio.max() < 1.0
    assert abs(ratio.mean() - 0.525) < 0.02
    assert out["masked_positions"].shape == (2000, 128)
    chosen = _chosen(out, 128)
    assert not (chosen & ~maskable).any() and (out["input_ids"][chosen] == MASK).all()
    expected = (ratio * maskable.sum(1)).sum()
    assert abs(chosen.sum() / expected - 1) < 0.01
    np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])


def test_macbert_correction_uses_similar_tokens_then_random():
    ids, maskable, starts = _rows(2000, 128)
    table = np.zeros((VOCAB, 2), np.int32)
    counts = np.zeros(VOCAB, np.int32)
    has_similar = np.arange(VOCAB) % 2 == 0  # even ids have two similar tokens: id + 1 and id + 3
    table[has_similar] = (
        np.stack([np.arange(VOCAB) + 1, np.arange(VOCAB) + 3], 1)[has_similar] % VOCAB
    )
    counts[has_similar] = 2
    out = _mask(
        ids,
        maskable,
        starts,
        masking.MaskSpec(mode="whole_word", max_predictions=20),
        similar=(table, counts),
    )
    chosen = _chosen(out, 128)
    new, original = out["input_ids"][chosen], ids[chosen]
    assert not (new == MASK).any()  # correction never uses [MASK]
    even = original % 2 == 0
    similar_used = (new == (original + 1) % VOCAB) | (new == (original + 3) % VOCAB)
    assert abs(similar_used[even].mean() - 0.8) < 0.02
    assert similar_used[~even].mean() < 0.01  # no similar token: random instead
    assert abs((new == original)[~even].mean() - 0.1) < 0.02


def test_similarity_tables(tmp_path):
    emb = np.zeros((8, 3), np.float32)
    emb[5:] = [[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0]]
    emb[:5] = [[1, 0, 0]] * 5  # specials look like token 5 but must never be proposed
    is_special = np.arange(8) < 5
    table, counts = similarity.from_embeddings(emb, is_special, k=2)
    assert table[5].tolist() == [6, 7] and counts[5] == 2 and counts[0] == 0

    class FakeTokenizer:
        vocab_size, special = 8, is_special

        def encode(self, texts):
            return [
                np.array([{"cat": 5, "dog": 6, "big": 7}.get(w, 1) for w in t.split()])
                for t in texts
            ]

    path = tmp_path / "sim.tsv"
    path.write_text("cat\tdog big\ndog\tcat\n")
    table, counts = similarity.from_word_file(str(path), FakeTokenizer())
    assert (
        table[5, :2].tolist() == [6, 7] and counts[5] == 2 and table[6, 0] == 5 and counts[7] == 0
    )
    (tmp_path / "bad.tsv").write_text("no tab here\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:1"):
        similarity.from_word_file(str(tmp_path / "bad.tsv"), FakeTokenizer())
