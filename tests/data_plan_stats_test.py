"""Per-piece sentence plans (bertjax/data/plans/piece_plans.py) keep the statistics of the
whole-store plans of samples.py on the same corpus: NSP's random-B share, SOP's swap share, the
row-length distribution (BERT's short sequences included), pad fraction and mean row length, packed
rows' fill; and the random B of NSP comes from the same piece."""

import ml_collections
import numpy as np
import pytest

from bertjax.data import default_data_config, keys
from bertjax.data.plans import piece_plans, samples
from bertjax.data.store.memmap import Store, prepare_store
from bertjax.data.text import corpus
from bertjax.data.text import sentences as text
from bertjax.data.tokenizer import Tokenizer

LENGTH, EPOCHS, PIECE_TOKENS, COPIES = 128, 3, 1 << 16, 4
PLANS = ("nsp", "sop", "pairs", "full_sentences", "doc_sentences", "mlm", "packed")


@pytest.fixture(scope="module")
def store(tmp_path_factory, builtin_spm):
    """The built-in corpus, four times over (~1.8 M tokens: 27 pieces of 2^16 tokens, 2 windows)."""
    root = tmp_path_factory.mktemp("plan_stats")
    # Documents of up to ~2k tokens: one huge document drawing a short target (mlm, nsp) makes
    # hundreds of short rows, so on the whole corpus one plan's shares vary by several points from
    # seed to seed, the whole-store plan's as much as the per-piece one's.
    docs = [doc for _, doc in corpus.iter_documents("builtin") if sum(map(len, doc)) < 8000]
    path = root / "corpus.txt"
    path.write_text("\n\n".join("\n".join(doc) for doc in docs * COPIES) + "\n")
    stats = text.CorpusStats()
    tok = Tokenizer(builtin_spm)
    prepare_store(
        str(root / "store"),
        tok,
        corpus.iter_documents(str(path), stats=stats),
        heldout_fraction=0.0,
        corpus_description=str(path),
        stats=stats,
    )
    return Store(str(root / "store"), "train", tok)


def _data_config(plan, piece_tokens=PIECE_TOKENS):
    c = default_data_config()
    c.sample_plan, c.pack_rows = ("full_sentences", True) if plan == "packed" else (plan, False)
    c.piece_tokens = piece_tokens
    return c


def plan_statistics(lengths, labels, fill=None) -> dict:
    """Shares and means of one plan's rows (``fill``: packed rows' tokens, else lengths)."""
    lengths = np.asarray(lengths, np.float64)
    fill = lengths if fill is None else np.asarray(fill, np.float64)
    out = {"rows": len(fill), "mean_length": fill.mean(), "pad_fraction": 1 - fill.mean() / LENGTH}
    out["label_share"] = float(np.mean(labels)) if len(labels) else 0.0
    for low, high in ((0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.95), (0.95, 1.01)):
        out[f"length_{low:g}_{high:g}"] = float(
            np.mean((fill >= low * LENGTH) & (fill < high * LENGTH))
        )
    return out


def whole_store(store, plan):
    """Today's plan over every sentence of the store, epochs 0..EPOCHS-1."""
    c = _data_config(plan)
    lengths, labels, fill = [], [], []
    for epoch in range(EPOCHS):
        rng = keys.generator(0, epoch, "plan")
        p = samples.make_plan(store, c.sample_plan, LENGTH, c.short_seq_prob, rng)
        lengths.append(p.lengths())
        labels.append(p.label)
        if c.pack_rows:
            from bertjax.data.plans import rows

            starts, packed, _ = rows.pack(p.lengths(), rng.permutation(len(p)), LENGTH)
            fill.append(np.add.reduceat(p.lengths()[packed], starts[:-1]))
    return plan_statistics(np.concatenate(lengths), np.concatenate(labels),
                           np.concatenate(fill) if fill else None)  # fmt: skip


def per_piece(store, plan, piece_tokens=PIECE_TOKENS):
    """The rows of epochs 0..EPOCHS-1 as the pipeline reads them, per piece."""
    c = _data_config(plan, piece_tokens)
    split = piece_plans.PieceSplit(store, c, seed=0, purpose="train")
    lengths, labels, fill = [], [], []
    for epoch in range(EPOCHS):
        e = split.epoch(LENGTH, epoch)
        cols, row_of, _ = e.samples(np.arange(len(e)))
        p = samples.Plan(*cols[:4], cols[4])
        lengths.append(p.lengths())
        labels.append(p.label)
        fill.append(np.bincount(row_of, weights=p.lengths(), minlength=len(e)))
    return split, plan_statistics(np.concatenate(lengths), np.concatenate(labels),
                                  np.concatenate(fill) if c.pack_rows else None)  # fmt: skip


@pytest.mark.parametrize("plan", PLANS)
def test_per_piece_plans_keep_the_whole_store_statistics(store, plan):
    split, got = per_piece(store, plan)
    assert len(split.pieces) > piece_plans.WINDOW  # more than one window of pieces
    want = whole_store(store, plan)
    for key in want:
        if key == "rows":  # an epoch is about one pass: the units per piece are calibrated
            assert abs(got[key] / want[key] - 1) < 0.05, (got[key], want[key])
        elif key == "mean_length":
            assert abs(got[key] / want[key] - 1) < 0.01, (key, got[key], want[key])
        else:
            assert abs(got[key] - want[key]) < 0.01, (key, got[key], want[key])
    if plan == "nsp":
        assert abs(got["label_share"] - 0.5) < 0.02
    if plan == "sop":
        assert abs(got["label_share"] - 0.5) < 0.02


def test_random_b_comes_from_another_document_of_the_same_piece(store):
    split = piece_plans.PieceSplit(store, _data_config("nsp"), seed=0, purpose="train")
    e = split.epoch(LENGTH, 0)
    positions = np.arange(0, len(e), 7)
    piece, _ = e.locate(positions)
    (a0, a1, b0, b1, label), _, _ = e.samples(positions)
    sentence_doc = np.repeat(np.arange(store.num_documents), np.diff(store.documents))

    def doc(token):
        return sentence_doc[np.searchsorted(store.sentences[:, 0], token, side="right") - 1]

    first = np.asarray([split.pieces.locate(int(p))[1] for p in piece])
    end = np.asarray([split.pieces.locate(int(p))[2] for p in piece])
    for column in (a0, b0, b1 - 1):
        assert ((doc(column) >= first) & (doc(column) < end)).all()
    random = label == 1
    assert random.mean() > 0.4 and (doc(a0)[random] != doc(b0)[random]).all()
    assert (doc(a0)[~random] == doc(b0)[~random]).all()


def test_a_piece_of_one_huge_document_is_refused_naming_token_windows(builtin_spm):
    class Huge:  # a store of one 2^30-token document: its piece would be the whole document
        directory, split = "gs://bucket/store", "train"

        def shard_counts(self):
            return np.array([1, 5]), np.array([1 << 30, 1 << 20])

    config = ml_collections.ConfigDict({"sample_plan": "nsp", "piece_tokens": 1 << 20})
    with pytest.raises(ValueError, match="shard 0 .*sample_plan='token_windows'"):
        piece_plans.PieceSplit(Huge(), config, seed=0, purpose="train")
