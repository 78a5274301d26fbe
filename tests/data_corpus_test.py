"""Corpus sources: file formats, bad input, the built-in corpus and the held-out split."""

import hashlib
import subprocess
import sys

import pytest

from bertjax.data.text import corpus
from bertjax.data.text import sentences as text


def _write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)


def test_sentences_format_splits_documents_on_blank_lines(tmp_path):
    path = _write(tmp_path / "a.txt", "First one.\nSecond one.\n\n\n  \nOther doc.\n")
    docs = list(corpus.iter_documents(path, "sentences"))
    assert [d for _, d in docs] == [["First one.", "Second one."], ["Other doc."]]
    assert docs[0][0] != docs[1][0]


def test_documents_format_splits_english_and_chinese_sentences(tmp_path):
    path = _write(tmp_path / "a.txt", "Hi there. How are you? Fine!\n我喜欢猫。你呢？很好；再见\n")
    docs = [d for _, d in corpus.iter_documents(path, "documents")]
    assert docs == [
        ["Hi there.", "How are you?", "Fine!"],
        ["我喜欢猫。", "你呢？", "很好；", "再见"],
    ]


def test_glob_is_sorted_and_comma_lists_work(tmp_path):
    _write(tmp_path / "b.txt", "B.\n")
    _write(tmp_path / "a.txt", "A.\n")
    docs = [d for _, d in corpus.iter_documents(str(tmp_path / "*.txt"))]
    assert docs == [["A."], ["B."]]
    both = f"{tmp_path / 'b.txt'},{tmp_path / 'a.txt'}"
    assert [d for _, d in corpus.iter_documents(both)] == [["B."], ["A."]]


def test_missing_file_and_empty_glob_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        list(corpus.iter_documents(str(tmp_path / "nope.txt")))
    with pytest.raises(FileNotFoundError, match=r"matched no files"):
        list(corpus.iter_documents(str(tmp_path / "*.none")))
    with pytest.raises(ValueError, match="is a directory"):
        list(corpus.iter_documents(str(tmp_path)))


def test_empty_and_blank_only_files_are_skipped_and_counted(tmp_path):
    empty = _write(tmp_path / "empty.txt", "")
    blank = _write(tmp_path / "blank.txt", "\n  \n\t\n")
    good = _write(tmp_path / "good.txt", "Only sentence.\n")
    stats = text.CorpusStats()
    docs = list(corpus.iter_documents(f"{empty},{blank},{good}", stats=stats))
    assert [d for _, d in docs] == [["Only sentence."]]
    assert stats.empty_files == [empty, blank]
    assert stats.files == 3 and stats.documents == 1


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.txt", b"fine line\n\nstill fine\nbroken \xff\xfe here\n")
    with pytest.raises(ValueError, match=r"bad\.txt line 4: invalid UTF-8"):
        list(corpus.iter_documents(path))


def test_one_megabyte_line_is_cut_at_whitespace(tmp_path):
    words = " ".join(f"word{i}" for i in range(150_000))  # ~1.1 MB, no sentence punctuation
    path = _write(tmp_path / "long.txt", words + "\n")
    stats = text.CorpusStats()
    [(_, doc)] = list(corpus.iter_documents(path, stats=stats))
    assert stats.long_sentences_split == 1
    assert max(len(s) for s in doc) <= text.MAX_SENTENCE_CHARS
    assert " ".join(doc) == words  # nothing lost: cuts are at spaces
    hard = text.cut_long("x" * 10_000)
    assert [len(p) for p in hard] == [4096, 4096, 1808]


def test_builtin_corpus_is_large_and_identical_in_a_fresh_python():
    docs = list(corpus.iter_documents("builtin"))
    text = "\n".join(s for _, d in docs for s in d)
    assert len(docs) > 500 and len(text) > 1_000_000  # ~1,000 documents, ~1.2 MB of prose
    assert len({i for i, _ in docs}) == len(docs)
    digest = hashlib.sha256(repr(docs).encode()).hexdigest()
    code = (
        "import hashlib; from bertjax.data.text import corpus; "
        "print(hashlib.sha256(repr(list(corpus.iter_documents('builtin'))).encode()).hexdigest())"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == digest


def test_heldout_split_is_stable_and_about_the_fraction():
    ids = [f"doc-{i}" for i in range(20_000)]
    held = [i for i in ids if text.is_heldout(i, 0.02)]
    assert 0.017 < len(held) / len(ids) < 0.023
    assert held == [i for i in ids if text.is_heldout(i, 0.02)]
    assert set(held) <= {i for i in ids if text.is_heldout(i, 0.05)}
