"""Sample plans: NSP/SOP statistics and invariants, RoBERTa full/doc sentences, truncation."""

import numpy as np
import pytest

from bertjax.data import keys
from bertjax.data.plans import samples
from bertjax.data.store.memmap import Store, prepare_store
from bertjax.data.text import corpus
from bertjax.data.text import sentences as text
from bertjax.data.tokenizer import Tokenizer


def _store(directory, tok, spec):
    stats = text.CorpusStats()
    prepare_store(
        str(directory),
        tok,
        corpus.iter_documents(spec, stats=stats),
        heldout_fraction=0.0,
        corpus_description=spec,
        stats=stats,
    )
    return Store(str(directory), "train", tok)


@pytest.fixture(scope="module")
def tok(builtin_spm):
    return Tokenizer(builtin_spm)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tok):
    return _store(tmp_path_factory.mktemp("samples") / "store", tok, "builtin")


def _doc_of(store, token_positions):
    sentence = np.searchsorted(store.sentences[:, 0], token_positions, side="right") - 1
    return np.searchsorted(store.documents, sentence, side="right") - 1


def _plans(store, objective, length=128, epochs=4, short_seq_prob=0.1):
    return [
        samples.make_plan(store, objective, length, short_seq_prob, keys.generator(0, e, "plan"))
        for e in range(epochs)
    ]


@pytest.mark.parametrize("length,short_seq_prob", [(128, 0.1), (128, 1.0), (512, 0.1)])
def test_nsp_labels_stay_balanced_with_lone_sentence_pairs(store, length, short_seq_prob):
    # Short targets make many one-sentence chunks, each with a random B (as BERT): the chunks
    # after them pay the excess back, so labels stay at 50%.
    plans = _plans(store, "nsp", length=length, epochs=3, short_seq_prob=short_seq_prob)
    label = np.concatenate([p.label for p in plans])
    assert abs(label.mean() - 0.5) < 0.02, label.mean()
    # Before truncation no sentence is split between A and B: A ends, B starts at sentence edges.
    sampler = samples._PairSampler(
        store, length - 3, short_seq_prob, keys.generator(0, 0, "plan"), "nsp"
    )
    for doc in range(store.num_documents):
        sampler.document(doc)
    a0, a1, b0, b1, label = np.asarray(sampler.rows).T
    assert np.isin(a1, store.sentences[:, 1]).all() and np.isin(b0, store.sentences[:, 0]).all()
    first = np.searchsorted(store.sentences[:, 0], a0)
    lone = a1 == store.sentences[first, 1]  # A is one sentence ...
    lone &= a1 - a0 >= length - 3  # ... that fills the row alone
    assert lone.sum() > 0 and (label[lone] == 1).all()
    assert 0 <= sampler.owed < 0.01 * sampler.lone  # (nearly) all the excess was paid back


def test_nsp_labels_are_balanced_and_random_b_is_never_from_a_document(store):
    plans = _plans(store, "nsp")
    label = np.concatenate([p.label for p in plans])
    assert abs(label.mean() - 0.5) < 0.02, label.mean()
    for plan in plans:
        assert (plan.lengths() <= 128).all()
        assert ((plan.a_end > plan.a_start) & (plan.b_end > plan.b_start)).all()
        doc_a, doc_b = _doc_of(store, plan.a_start), _doc_of(store, plan.b_start)
        np.testing.assert_array_equal(doc_a, _doc_of(store, plan.a_end - 1))
        np.testing.assert_array_equal(doc_b, _doc_of(store, plan.b_end - 1))
        is_random = plan.label == 1
        assert (doc_a[is_random] != doc_b[is_random]).all()
        assert (doc_a[~is_random] == doc_b[~is_random]).all()
        assert (plan.b_start[~is_random] >= plan.a_end[~is_random]).all()
    one_sentence_docs = int(np.sum(np.diff(store.documents) == 1))
    assert plans[0].skipped["single_sentence_documents"] == one_sentence_docs > 0
    assert not np.array_equal(plans[0].a_start, plans[1].a_start)


def test_nsp_plan_is_a_pure_function_of_the_generator_seed(store):
    a, b = _plans(store, "nsp", epochs=1)[0], _plans(store, "nsp", epochs=1)[0]
    for name in ("a_start", "a_end", "b_start", "b_end", "label"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_short_seq_prob_makes_shorter_samples(store):
    [long_plan] = _plans(store, "nsp", length=512, epochs=1, short_seq_prob=0.0)
    [short_plan] = _plans(store, "nsp", length=512, epochs=1, short_seq_prob=1.0)
    assert short_plan.lengths().mean() < 0.8 * long_plan.lengths().mean()
    assert len(short_plan) > 1.2 * len(long_plan)


def test_sop_swaps_half_and_keeps_both_segments_in_one_document(store):
    plans = _plans(store, "sop")
    label = np.concatenate([p.label for p in plans])
    assert abs(label.mean() - 0.5) < 0.02, label.mean()
    for plan in plans:
        assert (plan.lengths() <= 128).all()
        np.testing.assert_array_equal(_doc_of(store, plan.a_start), _doc_of(store, plan.b_start))
        swapped = plan.label == 1
        assert (plan.a_end[~swapped] <= plan.b_start[~swapped]).all()
        assert (plan.b_end[swapped] <= plan.a_start[swapped]).all()


def test_truncation_matches_the_one_token_at_a_time_rule():
    rng = np.random.default_rng(0)
    cols = tuple(np.array(v) for v in ([0, 0, 0], [100, 30, 30], [0, 0, 0], [10, 28, 30]))
    a0, a1, b0, b1 = samples._truncate(cols, np.array([50, 50, 57]), rng)
    np.testing.assert_array_equal(a1 - a0, [40, 25, 29])
    np.testing.assert_array_equal(b1 - b0, [10, 25, 28])
    n = 20_000
    a0, a1, _, _ = samples._truncate(
        (np.zeros(n, int), np.full(n, 100), np.zeros(n, int), np.ones(n, int)), 51, rng
    )
    assert abs(a0.mean() / 50 - 0.5) < 0.01  # each cut token comes off the front half the time
    np.testing.assert_array_equal(a1 - a0, 50)


def test_full_sentences_cover_the_corpus_and_cross_documents_with_sep(store, tok):
    [plan] = _plans(store, "full_sentences", epochs=1)
    assert (
        (plan.lengths() <= 128).all()
        and (plan.label == 0).all()
        and (plan.b_end == plan.b_start).all()
    )
    covered = np.zeros(len(store.tokens), bool)
    for b, e in zip(plan.a_start, plan.a_end):
        assert not covered[b:e].any()
        covered[b:e] = True
    in_sentence = np.zeros(len(store.tokens), bool)
    for b, e in store.sentences:
        in_sentence[b:e] = True
    assert covered[in_sentence].all()  # every sentence token is in exactly one row
    crossing = [
        (b, e) for b, e in zip(plan.a_start, plan.a_end) if (store.tokens[b:e] == tok.sep_id).any()
    ]
    assert len(crossing) > 100
    assert plan.lengths().mean() > 0.75 * 128  # rows are nearly full


def test_doc_sentences_never_cross_documents(store, tok):
    [plan] = _plans(store, "doc_sentences", epochs=1)
    assert (plan.lengths() <= 128).all()
    np.testing.assert_array_equal(_doc_of(store, plan.a_start), _doc_of(store, plan.a_end - 1))
    assert all(
        not (store.tokens[b:e] == tok.sep_id).any() for b, e in zip(plan.a_start, plan.a_end)
    )
    [mlm] = _plans(store, "mlm", epochs=1, short_seq_prob=0.5)
    assert len(mlm) > len(plan) and (mlm.lengths() <= 128).all()


def test_one_sentence_documents_under_nsp(tmp_path, tok):
    path = tmp_path / "one.txt"
    path.write_text("\n\n".join(f"Lonely sentence number {i}." for i in range(30)) + "\n")
    s = _store(tmp_path / "store", tok, str(path))
    plan = samples.make_plan(s, "nsp", 64, 0.1, keys.generator(0, 0, "plan"))
    assert len(plan) == 0 and plan.skipped["single_sentence_documents"] == 30
    # One document (a small held-out split, a piece of a sharded store's eval part): BERT's ten
    # draws of another document all draw it, and its random B comes from the same document.
    single = tmp_path / "single.txt"
    single.write_text("\n".join(f"Sentence {i} of the only document here." for i in range(40)))
    s = _store(tmp_path / "store2", tok, str(single))
    plan = samples.make_plan(s, "nsp", 32, 0.0, keys.generator(0, 0, "p"))
    assert len(plan) > 4 and 0 < plan.label.mean() < 1
    random_b = plan.label == 1
    assert (plan.b_start[random_b] >= 0).all() and (plan.b_end[random_b] <= len(s.tokens)).all()
    assert (plan.b_start[~random_b] >= plan.a_end[~random_b]).all()  # the real next sentences


def test_a_lone_sentence_reaching_the_target_gets_a_random_next_segment(tmp_path, tok):
    path = tmp_path / "long.txt"
    words = " ".join(f"w{i}" for i in range(400))
    path.write_text(f"{words}\nThen a short one.\n\nAnother document.\nHas two sentences.\n")
    s = _store(tmp_path / "store", tok, str(path))
    plan = samples.make_plan(s, "nsp", 64, 0.0, keys.generator(0, 0, "plan"))
    first_end = s.sentences[0, 1]
    from_long = plan.a_start < first_end
    assert from_long.sum() == 1 and (plan.lengths() <= 64).all()
    # As BERT: A is the long sentence (cut to fit), B a random segment of the other document.
    assert plan.label[from_long][0] == 1 and plan.b_start[from_long][0] >= s.sentences[2, 0]


def _pert_figure_row(tokens, a, b, width, cls_id, sep_id, pad_id):
    """The input of PERT's README figure (ymcui/PERT pics/pert.png), built as BERT's
    create_instances_from_document writes a pair: [CLS] A [SEP] B [SEP], segment ids 0 up to the
    first [SEP] and 1 over B and its [SEP], padded."""
    ids = [cls_id, *tokens[a[0] : a[1]], sep_id, *tokens[b[0] : b[1]], sep_id]
    types = [0] * (a[1] - a[0] + 2) + [1] * (b[1] - b[0] + 1)
    pad = width - len(ids)
    return ids + [pad_id] * pad, types + [0] * pad


def test_pairs_are_sop_pairs_in_order_as_pert_s_rows(store, tok):
    """sample_plan "pairs" (PERT): SOP's pairs with every swap undone, label 0; its rows are the
    figure's [CLS] A [SEP] B [SEP] with B's segment embedding."""
    from bertjax.data.plans import rows

    sop, pairs = _plans(store, "sop", epochs=1)[0], _plans(store, "pairs", epochs=1)[0]
    swapped = sop.label == 1
    np.testing.assert_array_equal(pairs.a_start, np.where(swapped, sop.b_start, sop.a_start))
    np.testing.assert_array_equal(pairs.b_end, np.where(swapped, sop.a_end, sop.b_end))
    assert (pairs.label == 0).all() and (pairs.a_end <= pairs.b_start).all()
    assert (pairs.b_end > pairs.b_start).all()  # every row has a B
    chosen = np.arange(0, len(pairs), max(1, len(pairs) // 20))
    cols = tuple(c[chosen] for c in (pairs.a_start, pairs.a_end, pairs.b_start, pairs.b_end))
    special = (tok.cls_id, tok.sep_id, tok.pad_id)
    out = rows.pair_rows(store.tokens, store.word_starts, tok.special, cols, 128, special)
    tokens = np.asarray(store.tokens)
    for i, k in enumerate(chosen):
        a, b = (pairs.a_start[k], pairs.a_end[k]), (pairs.b_start[k], pairs.b_end[k])
        ids, types = _pert_figure_row(tokens.tolist(), a, b, 128, *special)
        assert out["input_ids"][i].tolist() == ids and out["token_type_ids"][i].tolist() == types
