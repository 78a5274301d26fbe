"""Chinese: jieba word boundaries aligned to pieces, and whole-word masking of multi-character
words."""

import sys

import jieba  # noqa: E402  (the zh extra; installed for tests)
import ml_collections
import numpy as np
import pytest
from helpers import DOCS

from bertjax.data import default_data_config, make_pipeline
from bertjax.data.corruption import masking
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("zh") / "zh.txt"
    path.write_text("\n\n".join("\n".join(doc) for doc in DOCS * 3) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    sentences = [s for doc in DOCS for s in doc] * 4
    path = train_sentencepiece(
        sentences, str(tmp_path_factory.mktemp("zh_spm") / "tk"), vocab_size=300, language="zh"
    )
    return Tokenizer(path, language="zh")


def _words(tok, ids, starts):
    """Piece texts grouped into words by the start flags."""
    words = []
    for i, s in zip(ids.tolist(), starts):
        piece = tok.pieces[i].replace("▁", "")
        if s or not words:
            words.append(piece)
        else:
            words[-1] += piece
    return words


def test_word_starts_follow_jieba(tok):
    text = "自然语言处理是人工智能的重要方向。"
    [ids] = tok.encode([text])
    starts = tok.word_starts(ids)
    jieba_words = list(jieba.cut(text, HMM=False))
    boundaries = set(np.cumsum([0] + [len(w) for w in jieba_words]).tolist())
    piece_ends = np.cumsum([len(tok.pieces[i].replace("▁", "")) for i in ids.tolist()])
    piece_begins = (
        piece_ends - [len(tok.pieces[i].replace("▁", "")) for i in ids.tolist()]
    ).tolist()
    previous = [None] + [tok.pieces[i] for i in ids.tolist()[:-1]]
    for begin, start, i, before in zip(piece_begins, starts, ids.tolist(), previous):
        # A bare "▁" starts the word that the next piece continues; otherwise jieba decides.
        expected = tok.pieces[i] == "▁" or (begin in boundaries and before != "▁")
        assert start == expected, (tok.pieces[i], begin)
    assert any(len(w) >= 2 for w in _words(tok, ids, starts))
    assert "".join(_words(tok, ids, starts)) == text


def _unmasked_rows(pipeline, step: int) -> dict:
    """This host's rows of batch ``step`` before masking (word starts and maskable included)."""
    located = pipeline._locate_step(step)
    return pipeline.build_rows(located, pipeline.read_rows([located])[0])


def test_chinese_whole_word_masking_masks_multi_character_words_whole(tmp_path, corpus_path, tok):
    config = ml_collections.ConfigDict()
    config.seed, config.batch_size = 0, 16
    config.data = default_data_config()
    config.data.update(
        dict(
            corpus=corpus_path,
            language="zh",
            tokenizer_model=tok.path,
            max_seq_length=48,
            masking="whole_word",
            sample_plan="nsp",
            heldout_fraction=0.0,
            prefetch=0,
            mask_rate=0.3,
            max_predictions=12,
        )
    )
    p = make_pipeline(config, str(tmp_path), process_index=0, process_count=1)
    multi_character = 0
    for step in range(6):
        rows, batch = _unmasked_rows(p, step), p.batch(step)
        for r in range(16):
            maskable = rows["maskable"][r]
            starts = (
                masking._word_starts(maskable[None], rows["word_starts"][r][None])[0] | ~maskable
            )
            word = np.cumsum(starts)
            chosen = np.zeros(48, bool)
            chosen[batch["masked_positions"][r][batch["masked_weights"][r] > 0]] = True
            assert not (chosen & ~maskable).any()
            for w in np.unique(word[chosen]):
                assert chosen[word == w].all()  # the whole word
                text = "".join(
                    p.tokenizer.pieces[i] for i in rows["input_ids"][r][word == w]
                ).replace("▁", "")
                multi_character += len(text) >= 2
    assert multi_character > 50


SIMILAR = {"公园": ["花园", "乐园"], "非常": ["十分", "特别"], "孩子们": ["学生们", "老人们"]}


def test_macbert_correction_on_chinese_rows(tmp_path, corpus_path, tok):
    """A listed word met in real rows becomes ONE of its listed similar words with as many pieces
    (80%), a random lexicon word (10%) or stays (10%); a listed word's SentencePiece spelling
    inside running text (no "▁") is found too."""
    similar = tmp_path / "similar.tsv"
    similar.write_text("".join(f"{w}\t{' '.join(s)}\n" for w, s in SIMILAR.items()), "utf-8")
    config = ml_collections.ConfigDict()
    config.seed, config.batch_size = 0, 16
    config.data = default_data_config()
    config.data.update(
        dict(
            corpus=corpus_path,
            language="zh",
            tokenizer_model=tok.path,
            max_seq_length=48,
            masking="ngram",
            ngram_max=4,
            ngram_weights=(0.4, 0.3, 0.2, 0.1),
            sample_plan="sop",
            heldout_fraction=0.0,
            prefetch=0,
            mask_rate=0.3,
            max_predictions=12,
            correction=True,
            similar_words_file=str(similar),
        )
    )
    p = make_pipeline(config, str(tmp_path), process_index=0, process_count=1)
    lexicon = {w for w, s in SIMILAR.items() for w in [w, *s]}
    outcomes = {"similar": 0, "kept": 0, "random": 0}
    for step in range(30):
        rows, batch = _unmasked_rows(p, step), p.batch(step)
        for r in range(16):
            maskable = rows["maskable"][r]
            starts = (
                masking._word_starts(maskable[None], rows["word_starts"][r][None])[0] | ~maskable
            )
            word = np.cumsum(starts)
            chosen = np.zeros(48, bool)
            chosen[batch["masked_positions"][r][batch["masked_weights"][r] > 0]] = True
            for w in np.unique(word[chosen]):
                pieces = rows["input_ids"][r][word == w]
                text, new = (
                    "".join(p.tokenizer.pieces[i] for i in ids).replace("▁", "")
                    for ids in (pieces, batch["input_ids"][r][word == w])
                )
                if p._similar.lookup(pieces[None], np.array([len(pieces)]))[0] < 0:
                    continue
                if new == text:
                    outcomes["kept"] += 1
                elif new in SIMILAR[text]:
                    outcomes["similar"] += 1
                else:
                    assert new in lexicon, (text, new)  # a random word: never a mix
                    outcomes["random"] += 1
    assert sum(outcomes.values()) >= 15 and outcomes["similar"] >= 0.6 * sum(outcomes.values())


def test_missing_jieba_says_how_to_install(monkeypatch, tok):
    monkeypatch.setitem(sys.modules, "jieba", None)
    with pytest.raises(ImportError, match=r"bertjax\[zh\]"):
        tok.word_starts(tok.encode(["我们喜欢猫。"])[0])
