"""Tokenizer: fixed special ids, word starts, fingerprints, Hugging Face vocabularies."""

import numpy as np
import pytest

from bertjax.data.tokenizer import Tokenizer, train_sentencepiece
from bertjax.data.tokenizer.tokenizer import _starts_word


@pytest.fixture(scope="module")
def spm_path(builtin_spm):
    return builtin_spm


@pytest.fixture(scope="module")
def tok(spm_path):
    return Tokenizer(spm_path)


def test_trained_model_has_fixed_special_ids(tok):
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.pieces[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.vocab_size == 1000
    assert tok.special[:5].all() and not tok.special[5:].any()
    assert set(tok.normal_ids.tolist()) == set(range(5, 1000))


def test_encode_decode_round_trip(tok):
    texts = ["Return the number of items in a container.", "", "x = 1"]
    ids = tok.encode(texts)
    assert [i.dtype for i in ids] == [np.int32] * 3
    assert len(ids[1]) == 0
    assert tok.decode(ids[0]) == texts[0]
    assert not np.isin(ids[0], [0, 2, 3, 4]).any()


def test_word_starts_rules(tok):
    piece = {p: i for i, p in enumerate(tok.pieces)}
    ids = np.array([piece[p] for p in ["▁the", "s", ",", "▁", "s", "▁the", "."]])
    np.testing.assert_array_equal(tok.word_starts(ids), [1, 0, 1, 1, 0, 1, 1])
    # Flat arrays of several texts: each text's first piece starts a word.
    flat = np.array([piece["s"], piece["s"], piece["s"]])
    np.testing.assert_array_equal(tok.word_starts(flat, np.array([1, 2])), [1, 1, 0])
    assert (
        _starts_word("中")
        and _starts_word("(")
        and not _starts_word("ing")
        and not _starts_word("##s")
    )


def test_word_starts_group_pieces_into_whitespace_words(tok):
    text = "The quick brownish foxes jumped over lazy dogs"
    ids = tok.encode([text])[0]
    starts = tok.word_starts(ids)
    words, current = [], ""
    for i, s in zip(ids.tolist(), starts):
        if s and current:
            words.append(current)
            current = ""
        current += tok.pieces[i]
    words.append(current)
    assert [w.replace("▁", "") for w in words] == text.split()


def test_fingerprint_is_stable_and_distinguishes_models(tmp_path, spm_path, tok):
    assert Tokenizer(spm_path).fingerprint() == tok.fingerprint()
    other = train_sentencepiece(
        ["alpha beta gamma delta.", "beta gamma."] * 50,
        str(tmp_path / "other"),
        vocab_size=40,
        model_type="bpe",
    )
    assert Tokenizer(other).fingerprint() != tok.fingerprint()


def test_missing_model_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.model"):
        Tokenizer(str(tmp_path / "nothing.model"))


VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "hello",
    "world",
    "##s",
    ",",
    ".",
    "un",
    "##believ",
    "##able",
]


def _check_wordpiece(tok):
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    [ids] = tok.encode(["Hello worlds, unbelievable."])
    assert [tok.pieces[i] for i in ids] == [
        "hello",
        "world",
        "##s",
        ",",
        "un",
        "##believ",
        "##able",
        ".",
    ]
    np.testing.assert_array_equal(tok.word_starts(ids), [1, 1, 0, 1, 1, 0, 0, 1])
    assert tok.decode(ids).startswith("hello worlds")


def test_hugging_face_vocab_txt(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    tok = Tokenizer(str(path))
    _check_wordpiece(tok)
    assert tok.fingerprint() != Tokenizer(str(path), lowercase=False).fingerprint()


def test_hugging_face_tokenizer_json(tmp_path):
    import tokenizers

    model = tokenizers.models.WordPiece({p: i for i, p in enumerate(VOCAB)}, unk_token="[UNK]")
    hf = tokenizers.Tokenizer(model)
    hf.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    hf.decoder = tokenizers.decoders.WordPiece()
    path = str(tmp_path / "tokenizer.json")
    hf.save(path)
    _check_wordpiece(Tokenizer(path))


def test_a_trained_tokenizer_is_reused_by_what_it_was_trained_on(tmp_path, monkeypatch):
    """Two runs on one corpus file in two workdirs: the second copies the first's model from the
    cache of trained tokenizers (the same bytes, in its own workdir) instead of training it; a
    new vocabulary size, or the file rewritten, trains again."""
    from bertjax import trainer
    from bertjax.data.text import corpus
    from bertjax.data.tokenizer import configured, tokenizer

    documents = [d for _, (_, d) in zip(range(200), corpus.iter_documents("builtin"))]
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    trained, real = [], tokenizer._train
    monkeypatch.setattr(tokenizer, "_train", lambda *a: trained.append(a[1:]) or real(*a))
    config = trainer.default_run_config()
    config.data.update(corpus=str(text), vocab_size=200, cache_dir=str(tmp_path / "cache"))

    def model(workdir: str) -> bytes:
        path = configured.load_tokenizer(config, str(tmp_path / workdir)).path
        assert path == str(tmp_path / workdir / "tokenizer" / "spm.model")
        return open(path, "rb").read()

    first = model("one")
    assert model("two") == first and len(trained) == 1
    config.data.vocab_size = 220
    assert model("three") != first and len(trained) == 2
    text.write_text(text.read_text() + "One more sentence, in a new document.\n")
    model("four")
    assert len(trained) == 3
