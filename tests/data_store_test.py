"""Token store: layout, atomic writes, multi-process equality, mismatch errors."""

import json
import os

import numpy as np
import pytest

from bertjax.data.store import memmap as store_lib
from bertjax.data.store.memmap import Store, prepare_store
from bertjax.data.text import corpus
from bertjax.data.text import sentences as text
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece

TEXT = """The cat sat on the mat.
It was a sunny day.
Nothing else happened.

A second document starts here.
It has two sentences.

Third document, one sentence.
"""


@pytest.fixture(scope="module")
def tok(builtin_spm):
    return Tokenizer(builtin_spm)


def _prepare(directory, tok, spec, *, heldout=0.0, workers=0, fmt="sentences"):
    stats = text.CorpusStats()
    docs = corpus.iter_documents(spec, fmt, stats=stats)
    return prepare_store(
        str(directory),
        tok,
        docs,
        heldout_fraction=heldout,
        corpus_description=spec,
        stats=stats,
        num_workers=workers,
    )


def test_layout_round_trips_sentences_with_a_sep_after_each_document(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text(TEXT)
    meta = _prepare(tmp_path / "store", tok, str(path))
    s = Store(str(tmp_path / "store"), "train", tok, str(path))
    assert s.tokens.dtype == np.uint16 and meta["token_dtype"] == "uint16"
    assert meta["splits"]["train"] == {
        "documents": 3,
        "sentences": 6,
        "tokens": len(s.tokens),
        "empty_sentences_dropped": 0,
        "empty_documents_dropped": 0,
        "unk_tokens": 0,
        "special_tokens": 0,
    }
    docs = [d for _, d in corpus.iter_documents(str(path))]
    for d, doc in enumerate(docs):
        first, last = s.document_sentences(d)
        assert [tok.decode(s.tokens[b:e]) for b, e in s.sentences[first:last]] == doc
        assert s.tokens[s.sentences[last - 1, 1]] == tok.sep_id  # the document separator
        assert not np.isin(
            s.tokens[s.sentences[first, 0] : s.sentences[last - 1, 1]], tok.sep_id
        ).any()
    assert s.tokens[-1] == tok.sep_id and len(s.word_starts) == len(s.tokens)
    np.testing.assert_array_equal(s.word_starts[s.sentences[:, 0]], 1)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_worker_processes_write_the_same_store(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(store_lib, "CHUNK_CHARS", 20_000)  # many chunks, so order matters
    _prepare(tmp_path / "one", tok, "builtin", heldout=0.05)
    _prepare(tmp_path / "two", tok, "builtin", heldout=0.05, workers=2)
    for split in ("train", "eval"):
        for name in ("tokens", "word_starts", "sentences", "documents"):
            a = (tmp_path / "one" / split / f"{name}.bin").read_bytes()
            assert a == (tmp_path / "two" / split / f"{name}.bin").read_bytes(), (split, name)
    meta = json.loads((tmp_path / "one" / "meta.json").read_text())
    assert meta["splits"]["eval"]["documents"] > 0.03 * meta["corpus_stats"]["documents"]


def test_tokenizer_mismatch_names_both_fingerprints_and_the_store(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text(TEXT)
    _prepare(tmp_path / "store", tok, str(path))
    other = Tokenizer(train_sentencepiece([TEXT] * 20, str(tmp_path / "tk"), vocab_size=60))
    with pytest.raises(ValueError) as e:
        Store(str(tmp_path / "store"), "train", other)
    message = str(e.value)
    assert (
        tok.fingerprint() in message
        and other.fingerprint() in message
        and str(tmp_path / "store") in message
    )
    assert "delete the store" in message
    with pytest.raises(ValueError, match="holds corpus"):
        Store(str(tmp_path / "store"), "train", tok, "some other corpus")


def test_store_without_meta_is_never_used(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text(TEXT)
    _prepare(tmp_path / "store", tok, str(path))
    os.remove(tmp_path / "store" / "meta.json")
    with pytest.raises(ValueError, match="incomplete"):
        Store(str(tmp_path / "store"), "train", tok)


def test_failure_midway_leaves_nothing_behind(tmp_path, tok):
    good = tmp_path / "a.txt"
    good.write_text(TEXT)
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"ok\n\x80oops\n")
    with pytest.raises(ValueError, match=r"b\.txt line 2: invalid UTF-8"):
        _prepare(tmp_path / "store", tok, f"{good},{bad}")
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt"]  # no store, no DIR.tmp-<pid>


def test_only_empty_files_is_an_error_naming_them(tmp_path, tok):
    (tmp_path / "e.txt").write_text("")
    (tmp_path / "b.txt").write_text("\n\n   \n")
    with pytest.raises(ValueError, match=r"no training documents.*b\.txt.*e\.txt"):
        _prepare(tmp_path / "store", tok, str(tmp_path / "*.txt"))
    assert not os.path.exists(tmp_path / "store")


def test_one_megabyte_line_is_stored_in_bounded_sentences(tmp_path, tok):
    path = tmp_path / "long.txt"
    path.write_text(" ".join(f"word{i}" for i in range(150_000)) + "\n\nShort doc.\n")
    meta = _prepare(tmp_path / "store", tok, str(path))
    s = Store(str(tmp_path / "store"), "train", tok)
    assert meta["corpus_stats"]["long_sentences_split"] == 1
    assert meta["splits"]["train"]["documents"] == 2
    assert s.sentences.shape[0] > 250
    assert (s.sentences[:, 1] - s.sentences[:, 0]).max() < 4096
