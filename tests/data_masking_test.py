"""Masking statistics and invariants: rates, 80/10/10, whole words, n-grams, diffusion, keys."""

import numpy as np
import pytest

from bertjax.data import keys
from bertjax.data.corruption import masking, similarity

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


class _WordTokenizer:
    """300 words of 1-3 pieces (piece ids 5 + 3w + j: no two words share a piece); "wN" encodes
    to word N's pieces."""

    vocab_size = VOCAB
    special = np.arange(VOCAB) < 5
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"p{i}" for i in range(5, VOCAB)]

    @staticmethod
    def word(w):
        return [5 + 3 * w + j for j in range(1 + w % 3)]

    def encode(self, texts):
        return [np.array(self.word(int(t[1:])), np.int32) for t in texts]


def _word_rows(batch, width, seed=0):
    """Rows of whole words [CLS] w w ... [SEP] w ... [SEP] [PAD]..: (ids, maskable, word starts)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, width), np.int32)
    starts = np.zeros((batch, width), bool)
    for row in range(batch):
        pieces, first = [2], [False]
        limit = rng.integers(width // 2, width)
        while len(pieces) < limit - 4:
            if len(pieces) > limit // 2 and 3 not in pieces:
                pieces.append(3)
                first.append(False)
            word = _WordTokenizer.word(int(rng.integers(300)))
            pieces += word
            first += [True] + [False] * (len(word) - 1)
        pieces.append(3)
        first.append(False)
        ids[row, : len(pieces)], starts[row, : len(first)] = pieces, first
    return ids, ids >= 5, starts


@pytest.fixture(scope="module")
def similar_words(tmp_path_factory):
    # Words 0..99 have two similar words each (same length); every word is in the lexicon.
    path = tmp_path_factory.mktemp("similar") / "similar.tsv"
    lines = [f"w{w}\tw{w + 150} w{w + 153}" for w in range(100)]
    lines += [f"w{w}\t" for w in range(100, 300)]
    path.write_text("\n".join(lines) + "\n")
    return similarity.from_word_file(str(path), _WordTokenizer())


@pytest.mark.parametrize("mode", ["whole_word", "ngram"])
def test_macbert_correction_replaces_whole_words(mode, similar_words):
    ids, maskable, starts = _word_rows(4000, 128)
    spec = masking.MaskSpec(mode=mode, max_predictions=20, ngram_probs=(0.4, 0.3, 0.2, 0.1))
    out = _mask(ids, maskable, starts, spec, similar=similar_words)
    chosen = _chosen(out, 128)
    assert not (out["input_ids"] == MASK).any()  # correction never uses [MASK]
    np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])
    np.testing.assert_array_equal(  # the targets stay the original tokens at their positions
        np.take_along_axis(ids, out["masked_positions"], 1)[out["masked_weights"] > 0],
        out["masked_ids"][out["masked_weights"] > 0],
    )
    lexicon = {tuple(_WordTokenizer.word(w)): w for w in range(300)}
    kinds = {"similar": 0, "random": 0, "kept": 0}
    kinds_without = dict(kinds)
    for row, col in zip(*np.nonzero(chosen & starts)):
        word = (int(ids[row, col]) - 5) // 3
        new = tuple(out["input_ids"][row, col : col + 1 + word % 3].tolist())
        listed = {tuple(_WordTokenizer.word(word + 150)), tuple(_WordTokenizer.word(word + 153))}
        if new == tuple(_WordTokenizer.word(word)):
            kind = "kept"
        elif word < 100 and new in listed:
            kind = "similar"  # wholly ONE listed similar word (a mix of two is no word at all)
        else:
            assert new in lexicon and len(new) == 1 + word % 3, (word, new)  # a random word
            kind = "random"
        (kinds if word < 100 else kinds_without)[kind] += 1
    n, n_without = sum(kinds.values()), sum(kinds_without.values())
    assert n > 5000 and n_without > 10000
    assert abs(kinds["similar"] / n - 0.8) < 0.02
    assert abs(kinds["random"] / n - 0.1) < 0.02 and abs(kinds["kept"] / n - 0.1) < 0.02
    # No similar word: a random word instead (80% + 10%), kept 10%.
    assert abs(kinds_without["random"] / n_without - 0.9) < 0.02
    part = np.array([5, 77, 3001])  # a row masks the same alone as in its batch
    alone = _mask(ids[part], maskable[part], starts[part], spec, index=part, similar=similar_words)
    np.testing.assert_array_equal(alone["input_ids"], out["input_ids"][part])


def test_similarity_tables(tmp_path, similar_words):
    emb = np.zeros((8, 3), np.float32)
    emb[5:] = [[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0]]
    emb[:5] = [[1, 0, 0]] * 5  # specials look like token 5 but must never be proposed
    is_special = np.arange(8) < 5
    table = similarity.from_embeddings(emb, is_special, k=2)
    entry = table.lookup(np.array([[5], [0], [6]]), np.array([1, 1, 1]))
    assert entry[1] == -1 and table.counts[entry[0]] == 2
    assert table.similar[table.first[entry[0]] : table.first[entry[0]] + 2, 0].tolist() == [6, 7]
    assert table.lookup(np.array([[5, 6]]), np.array([2]))[0] == -1  # no multi-piece words
    # Word file: lookups by whole piece sequences; a listed word of another length is dropped.
    tok = _WordTokenizer()
    path = tmp_path / "sim.tsv"
    path.write_text("w1\tw4 w2 w7\nw4\tw1\n")  # w1, w4, w7: 2 pieces; w2: 3 pieces
    table = similarity.from_word_file(str(path), tok)
    pieces = np.array([tok.word(1), tok.word(4), tok.word(7), [tok.word(1)[0], 0]])
    entry = table.lookup(pieces, np.array([2, 2, 2, 1]))
    assert entry[2] == -1 and entry[3] == -1 and table.dropped == 1
    listed = table.similar[table.first[entry[0]] : table.first[entry[0]] + table.counts[entry[0]]]
    assert listed[:, :2].tolist() == [tok.word(4), tok.word(7)]
    assert table.similar[table.first[entry[1]], :2].tolist() == tok.word(1)
    assert table.lexicon_start[3] - table.lexicon_start[2] == 3  # w1, w4, w7 (w2 has 3 pieces)
    assert similar_words.lookup(np.array([tok.word(0)]), np.array([1]))[0] >= 0
    (tmp_path / "bad.tsv").write_text("no tab here\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:1"):
        similarity.from_word_file(str(tmp_path / "bad.tsv"), tok)


def _hf_token_probs(counts, special_ids, mlm_smoothing=0.7):
    """HF's distillation train.py in float64: token_probs = max(counts, 1) ** -mlm_smoothing, 0 for
    special tokens (its distiller then draws positions with torch.multinomial(x_prob / x_prob.sum(),
    n, replacement=False): successive draws proportional to the weights)."""
    token_probs = np.maximum(np.asarray(counts), 1) ** -mlm_smoothing
    for idx in special_ids:
        token_probs[idx] = 0.0
    return token_probs.astype(np.float64)


def _successive_inclusion(w, k):
    """Exact P(position i among k successive draws without replacement, P(j) proportional to w)."""
    w = np.asarray(w, np.float64)

    def rec(remaining, k):
        total = w[remaining].sum()
        out = np.zeros(len(w))
        if k == 0 or total == 0:
            return out
        for j in remaining:
            p = w[j] / total
            out[j] += p
            out += p * rec([i for i in remaining if i != j], k - 1)
        return out

    return rec([i for i in range(len(w)) if w[i] > 0], k)


def test_smoothed_unigram_token_weighting_matches_hf_distillation():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 10**6, VOCAB)
    counts[[7, 9]] = 0
    special = np.arange(VOCAB) < 5
    weights = masking.smoothed_unigram_weights(counts, special, 0.7)
    np.testing.assert_array_equal(weights, _hf_token_probs(counts, range(5)))
    # One row ([CLS] six tokens [SEP] [PAD]) masked under 100k keys: each position's share
    # against the exact law of HF's draw without replacement, for k = 1 and k = 2.
    counts = np.zeros(VOCAB, np.int64)
    row_ids = np.array([2, 10, 11, 12, 13, 14, 15, 3, 0], np.int32)
    counts[10:16] = [1, 3, 10, 100, 1000, 30000]
    weights = masking.smoothed_unigram_weights(counts, special, 0.7)
    n = 100_000
    ids = np.tile(row_ids, (n, 1))
    maskable = ids >= 5
    for rate, k in ((0.15, 1), (0.34, 2)):
        spec = masking.MaskSpec(mode="token", rate=rate, max_predictions=4)
        assert (masking.budget(maskable[:1], spec) == k).all()
        out = masking.mask_batch(
            ids,
            maskable,
            maskable,
            keys.row_keys(0, 0, "mask", np.arange(n)),
            spec,
            mask_id=MASK,
            normal_ids=NORMAL,
            token_weights=weights,
        )
        share = _chosen(out, ids.shape[1]).mean(0)[1:7]
        expected = _successive_inclusion(_hf_token_probs(counts, range(5))[row_ids[1:7]], k)
        np.testing.assert_allclose(share, expected, atol=0.005)
        assert abs(expected[0] - expected[-1]) > 0.1  # rare tokens really are favoured
