"""Chinese: jieba word boundaries aligned to pieces, and whole-word masking of multi-character
words."""

import sys

import jieba  # noqa: E402  (the zh extra; installed for tests)
import ml_collections
import numpy as np
import pytest

from bertjax.data import default_data_config, make_pipeline, masking
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece

# A small corpus written for this test: documents separated by blank lines, one sentence per line.
DOCS = [
    [
        "今天早上我们去公园散步。",
        "天气非常好，阳光照在湖面上。",
        "很多老人在树下打太极拳。",
        "孩子们在草地上放风筝。",
    ],
    [
        "我的朋友在北京大学学习计算机科学。",
        "他每天晚上都在图书馆看书。",
        "周末他喜欢和同学一起踢足球。",
    ],
    [
        "自然语言处理是人工智能的重要方向。",
        "机器翻译可以帮助人们理解外国文字。",
        "语音识别技术已经进入普通家庭。",
        "研究人员正在训练更大的语言模型。",
    ],
    ["这家餐厅的饺子非常好吃。", "服务员热情地介绍今天的特色菜。", "我们点了红烧肉和青菜豆腐汤。"],
    ["春天来了，山上的花都开了。", "农民开始在田里种水稻。", "小鸟在屋檐下建造新的鸟窝。"],
    ["火车站里人来人往，非常热闹。", "乘客们拿着行李排队上车。", "列车准时离开了城市。"],
    [
        "老师在黑板上写下今天的作业。",
        "学生们认真地记在笔记本上。",
        "下课以后大家一起讨论数学问题。",
    ],
    ["妈妈在厨房里准备晚饭。", "爸爸下班回家以后帮忙洗碗。", "全家人坐在一起看电视新闻。"],
    [
        "这座城市的博物馆收藏了很多古代文物。",
        "游客可以看到精美的瓷器和书法作品。",
        "讲解员详细介绍了历史背景。",
    ],
    ["冬天的北方经常下雪。", "孩子们在院子里堆雪人。", "大家穿着厚厚的衣服去上班。"],
    ["科学家发现了一种新的植物。", "这种植物可以在沙漠里生长。", "它的种子能够保存很多年。"],
    [
        "我们公司明年计划开发新的软件产品。",
        "工程师们正在设计用户界面。",
        "市场部门负责调查客户需求。",
    ],
]


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
        rows = p._rows(p._split, 48, step * 16, 16, step * 16, "mask")
        batch = p.batch(step)
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
        rows, batch = p._rows(p._split, 48, step * 16, 16, step * 16, "mask"), p.batch(step)
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
