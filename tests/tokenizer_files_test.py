"""Tokenizer files as the hub writes them: WordPiece, SentencePiece/Unigram and byte-level BPE
tokenizer.json files with padding, truncation and post-processor sections, read by bertjax as
transformers' AutoTokenizer reads them (equal ids on awkward texts); and the guard rails that stop
a tokenizer that pads, or [PAD] ids inside a text, before they reach a store.

No Unigram or byte-level BPE tokenizer.json ships in a package on the registry this machine
reaches (the WordPiece one does: tests/real_checkpoint_test.py), so these two are written here by
the `tokenizers` library in the hub's shape: XLM-R's (Metaspace, <s> </s> <pad> <unk> <mask>,
NFKC) and ModernBERT's (byte-level BPE with [CLS] [SEP] [PAD] [MASK] [UNK] added after the
vocabulary), each with the padding and truncation sections hub files carry."""

import json

import numpy as np
import pytest
import tokenizers
from helpers import assert_tokenizes_as
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertjax.data.store import memmap as store_lib
from bertjax.data.tokenizer import Tokenizer

AWKWARD = [
    "Crème brûlée à São Paulo: ÉCOLE naïve, Straße, İstanbul.",
    "中文分词：北京大学的学生。日本語のテキスト、한국어 문장",
    "Emoji 👩‍💻🚀 and symbols ∑∫√ ≠ ≤ ½ ™ © — “quotes” ‘too’",
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "  spaces\t\ttabs\n\nnewlines   and\u00a0non-breaking\u200bzero-width  ",
    "<s> <mask> [CLS] [MASK] written out",
    "",
    " ".join(["The interpreter reads every line of this long text again."] * 60),
]


def _corpus():
    from pydoc_data.topics import topics

    return [line for text in topics.values() for line in text.splitlines() if line.strip()]


def _hub_sections(tok: tokenizers.Tokenizer, pad: str, cls: str, sep: str) -> None:
    """What a hub file carries beside the vocabulary: a fixed padding, a truncation at 128 and
    a [CLS] A [SEP] (B [SEP]) template."""
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )
    tok.enable_padding(length=128, pad_id=tok.token_to_id(pad), pad_token=pad)
    tok.enable_truncation(max_length=128)


def _unigram(directory) -> str:
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(tokenizers.Regex(" {2,}"), " ")]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=2000, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer)
    _hub_sections(tok, "<pad>", "<s>", "</s>")
    path = str(directory / "unigram.json")
    tok.save(path)
    return path


def _byte_level_bpe(directory) -> str:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    # As ModernBERT's file: BERT's specials added after the BPE vocabulary (and unused ids).
    tok.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    _hub_sections(tok, "[PAD]", "[CLS]", "[SEP]")
    path = str(directory / "bpe.json")
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer_files")
    return {"unigram": _unigram(directory), "byte_level_bpe": _byte_level_bpe(directory)}


def _auto(path, **specials):
    import transformers

    return transformers.PreTrainedTokenizerFast(tokenizer_file=path, **specials)


SPECIALS = {
    "unigram": dict(
        bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
        pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
    ),
    "byte_level_bpe": dict(
        cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]",
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", ["unigram", "byte_level_bpe"])
def test_ids_equal_autotokenizer_for_each_kind(files, kind):
    """The file pads to 128 and cuts at 128; bertjax's ids and rows equal AutoTokenizer's with
    padding to 256 and longest-first truncation at 256, and the file's special flags say what is
    special."""
    assert json.load(open(files[kind]))["padding"]["strategy"] == {"Fixed": 128}
    ours = Tokenizer(files[kind])
    reference = _auto(files[kind], **SPECIALS[kind])
    expected = assert_tokenizes_as(ours, reference, AWKWARD, ("input_ids", "attention_mask"), kind)
    assert len(expected[-1]) > 128
    declared = {t["id"] for t in json.load(open(files[kind]))["added_tokens"] if t["special"]}
    assert set(np.flatnonzero(ours.special).tolist()) == declared
    assert set(reference.all_special_ids) <= declared
    assert ours.vocab_size == len(reference)


def test_a_tokenizer_that_pads_is_refused(files, monkeypatch):
    """Were the file's padding kept (as bertjax once kept it), loading stops naming the file."""
    original = Tokenizer._load_hf

    def keeps_padding(self, path):
        hf = original(self, path)
        hf.enable_padding(length=128, pad_id=hf.token_to_id("[PAD]"), pad_token="[PAD]")
        return hf

    monkeypatch.setattr(Tokenizer, "_load_hf", keeps_padding)
    with pytest.raises(ValueError, match="bpe.json.*pads or cuts texts itself"):
        Tokenizer(files["byte_level_bpe"])


def test_pad_ids_inside_a_text_stop_the_store_and_shares_are_counted(files):
    """A text holding the pad token stops the store, naming the tokenizer and the text; the [UNK]
    and special-token shares of what is stored are counted and reported."""
    tok = Tokenizer(files["byte_level_bpe"])
    with pytest.raises(ValueError, match=r"bpe\.json.*\[PAD\].*'padded \[PAD\] text'"):
        store_lib.encode_chunk(tok, [["fine text"], ["padded [PAD] text"]])
    *_, counts = store_lib.encode_chunk(tok, [["a [MASK] and [CLS] here", "plain"]])
    assert counts["special_tokens"] == 2 and counts["unk_tokens"] == 0
    shares = {"tokens": 1010, "documents": 10, "unk_tokens": 50, "special_tokens": 0}
    line, suspicious = store_lib.token_shares(shares)  # 50 of 1000 text tokens
    assert suspicious and line.startswith("5.000% [UNK], 0.000% other special")
    assert not store_lib.token_shares(dict(shares, unk_tokens=5))[1]
    assert store_lib.token_shares({"tokens": 10, "documents": 1}) == ("", False)
