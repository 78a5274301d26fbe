"""Tokenizer: SentencePiece (trained here or loaded) or a Hugging Face vocab, with word starts.

Trained SentencePiece models have fixed special ids: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
Word starts (for whole-word and n-gram masking): in English a piece starts a word when it begins
with "▁" (SentencePiece) / does not begin with "##" (WordPiece), or is punctuation, a CJK
character or a special token; a bare "▁" piece starts the word that the next piece continues.
In Chinese (language="zh") word boundaries come from jieba, aligned to the pieces by characters.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from bertjax import paths

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_CJK = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u3000-\u303f\uff00-\uffef]"
)
# Names a loaded vocabulary may use for each special token, first match wins.
_ALIASES = {
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "mask": ("[MASK]", "<mask>"),
}


def _starts_word(piece: str) -> bool:
    """Whether a non-special piece starts a word by its spelling alone (English rules)."""
    if piece.startswith(("▁", "Ġ")):
        return True
    if piece.startswith("##"):
        return False
    first = piece[0]
    return unicodedata.category(first)[0] in "PS" or bool(_CJK.match(first))


def _jieba():
    try:
        import jieba
    except ImportError:
        raise ImportError(
            "language='zh' needs jieba for word boundaries: pip install 'bertjax[zh]'"
        ) from None
    jieba.setLogLevel(60)
    return jieba


def _hf_pieces(hf) -> tuple[list[str], list[bool]]:
    """Every id's piece of a Hugging Face tokenizer (added tokens included; ids a file leaves
    unused get an empty piece) and whether it is special: the file's own special flags, or, in a
    file that declares none, bertjax's names and <...> pieces."""
    vocab = hf.get_vocab(with_added_tokens=True)
    pieces = [""] * (max(vocab.values(), default=-1) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    declared = {i for i, token in hf.get_added_tokens_decoder().items() if token.special}
    special = [
        i in declared
        or p in SPECIALS
        or (not declared and len(p) > 2 and p.startswith("<") and p.endswith(">"))
        for i, p in enumerate(pieces)
    ]
    return pieces, special


def _sentencepiece(path: str, data: bytes) -> spm.SentencePieceProcessor:
    """The SentencePiece model in ``data``; a file that is not one whole (truncated, emptied,
    overwritten) stops with one line naming it rather than SentencePiece's internal error."""
    try:
        if not data:
            raise RuntimeError("the file is empty")
        return spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as error:
        raise ValueError(
            f"tokenizer file {path!r} ({len(data)} bytes) is not a whole SentencePiece model "
            f"({' '.join(str(error).split())[:120]}): it was cut short or overwritten; delete it "
            "and rerun (bertjax trains or copies it again), or give the original file"
        ) from None


class Tokenizer:
    """Encodes text to ids and marks word starts; SentencePiece or Hugging Face vocabularies."""

    def __init__(
        self, path: str, *, language: str = "en", lowercase: bool = True, num_threads: int = 0
    ):
        """Loads a SentencePiece `.model`, an HF `vocab.txt` or an HF `tokenizer.json`: a local
        path or a URL (file://, gs://, s3://; copied once into the local cache)."""
        path = paths.resolve(path)  # ~ expanded, file:// made local, before it is looked for
        if not paths.exists(path) or paths.isdir(path):
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist")
        path = paths.local_copy(path)
        if language not in ("en", "zh"):
            raise ValueError(f"language={language!r}: must be 'en' or 'zh'")
        self.path, self.language, self.lowercase = path, language, lowercase
        self.num_threads = num_threads or min(8, os.cpu_count() or 1)
        with open(path, "rb") as f:
            self._bytes = f.read()
        self._sp = self._hf = None
        self._dropped_sections = False
        if path.endswith(".model"):
            self._sp = _sentencepiece(path, self._bytes)
            pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
            special = [self._sp.is_control(i) or self._sp.is_unknown(i) for i in range(len(pieces))]
        else:
            self._hf = self._load_hf(path)
            pieces, special = _hf_pieces(self._hf)
        self.pieces = pieces
        ids = {name: self._find(aliases, pieces) for name, aliases in _ALIASES.items()}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids["pad"],
            ids["unk"],
            ids["cls"],
            ids["sep"],
            ids["mask"],
        )
        special = np.asarray(special, bool)
        special[[self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]] = True
        self.special = special  # [V] bool: never masked, never drawn as a random replacement
        self.normal_ids = np.flatnonzero(~special).astype(np.int32)
        wordpiece = self._hf is not None and any(p.startswith("##") for p in pieces)
        table = np.array(
            [
                s or (not p.startswith("##") if wordpiece else _starts_word(p)) if p else True
                for p, s in zip(pieces, special)
            ],
            bool,
        )
        self._start_table = table
        self._bare_id = pieces.index("▁") if "▁" in pieces else -1
        self._refuse_padding()

    def _refuse_padding(self) -> None:
        """Stops on a tokenizer that pads or cuts texts itself: its [PAD] ids would be stored and
        attended to as words (bertjax pads and cuts rows itself)."""
        probe = ["a", "a b c d e f g h"]
        short, long = self.encode(probe)
        if self.pad_id in short or self.pad_id in long or len(short) >= len(long):
            raise ValueError(
                f"tokenizer {self.path!r} pads or cuts texts itself (encoding {probe!r} gave "
                f"{short.tolist()[:12]} and {long.tolist()[:12]}, [PAD] is {self.pad_id}): "
                "remove its padding/truncation settings, or give another tokenizer "
                "(config.data.hf_vocab / config.data.tokenizer_model)"
            )

    def _load_hf(self, path: str):
        import tokenizers

        if path.endswith(".json"):
            try:
                hf = tokenizers.Tokenizer.from_file(path)
            except Exception as error:  # not JSON, an unknown model type, ...
                raise ValueError(f"cannot read tokenizer file {path!r}: {error}") from error
            # What a pipeline once did with the file (pad every text to 128, cut at 128) is not
            # part of the vocabulary: bertjax pads and cuts rows itself.
            self._dropped_sections = hf.padding is not None or hf.truncation is not None
            hf.no_padding()
            hf.no_truncation()
            return hf
        from tokenizers.implementations import BertWordPieceTokenizer

        return BertWordPieceTokenizer(path, lowercase=self.lowercase, strip_accents=self.lowercase)

    def _find(self, aliases: Sequence[str], pieces: list[str]) -> int:
        for alias in aliases:
            if alias in pieces:
                return pieces.index(alias)
        if self._sp is not None:  # SentencePiece's own pad/unk/bos/eos ids, when they exist
            own = {
                "[PAD]": self._sp.pad_id(),
                "[UNK]": self._sp.unk_id(),
                "[CLS]": self._sp.bos_id(),
                "[SEP]": self._sp.eos_id(),
            }.get(aliases[0], -1)
            if own >= 0:
                return own
        raise ValueError(
            f"tokenizer {self.path!r} has no {aliases[0]} token (looked for {list(aliases)}); "
            "train one with bertjax or add the token to the vocabulary"
        )

    def hf_json(self) -> str | None:
        """The Hugging Face tokenizer in `tokenizers`' JSON form, padding and truncation off (a
        vocab.txt's with its case handling); None for a SentencePiece model."""
        if self._hf is None:
            return None
        return getattr(self._hf, "_tokenizer", self._hf).to_str()

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def fingerprint(self) -> str:
        """A stable hash of the model/vocab bytes (plus case handling for vocab.txt, and a mark
        when a tokenizer.json's padding/truncation sections were dropped)."""
        h = hashlib.sha256(self._bytes)
        if self._hf is not None and not self.path.endswith(".json"):
            h.update(b"lowercase=%d" % self.lowercase)
        if self._dropped_sections:  # stores written before they were dropped are never reused
            h.update(b"no padding, no truncation")
        return h.hexdigest()[:16]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids concatenated (int32) and each text's length; multi-threaded."""
        texts = list(texts)
        if self._sp is not None:
            rows = self._sp.encode(texts, out_type=int, num_threads=self.num_threads)
        else:
            rows = [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]
        lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
        flat = np.fromiter((i for r in rows for i in r), np.int32, int(lengths.sum()))
        return flat, lengths

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Ids of each text (no special tokens added), as int32 arrays."""
        flat, lengths = self.encode_flat(texts)
        return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of ids (special tokens dropped)."""
        ids = [int(i) for i in ids if not self.special[int(i)] or int(i) == self.unk_id]
        return self._sp.decode(ids) if self._sp is not None else self._hf.decode(ids)

    def word_starts(self, ids: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """Bool flags, True where a piece starts a word; `lengths` splits flat ids into texts."""
        ids = np.asarray(ids)
        if self.language == "zh":
            lengths = np.array([len(ids)]) if lengths is None else lengths
            parts = np.split(ids, np.cumsum(lengths)[:-1]) if len(lengths) else []
            return np.concatenate([self._zh_starts(p) for p in parts] or [np.zeros(0, bool)])
        starts = self._start_table[ids]
        if self._bare_id >= 0 and len(ids) > 1:
            starts[1:] &= (
                ids[:-1] != self._bare_id
            )  # "▁" + "word": the bare ▁ starts it, "word" continues
            starts |= self.special[ids]
        if lengths is not None and len(lengths):  # each text's first piece starts a word
            starts[np.cumsum(lengths)[:-1][lengths[1:] > 0]] = True
        if len(ids):
            starts[0] = True
        return starts

    def _zh_starts(self, ids: np.ndarray) -> np.ndarray:
        """Word starts of one text from jieba, aligned to pieces by character offsets."""
        texts = []
        for i in ids.tolist():
            piece = "" if self.special[i] and i != self.unk_id else self.pieces[i]
            if piece.startswith("##"):
                piece = piece[2:]
            elif (
                self._hf is not None
                and texts
                and not (_CJK.match(piece[:1]) and _CJK.match(texts[-1][-1:]))
            ):
                piece = " " + piece  # WordPiece drops spaces: restore them between non-CJK words
            texts.append(piece.replace("▁", " "))
        lengths = np.fromiter((len(t) for t in texts), np.int64, len(texts))
        begins = np.cumsum(lengths) - lengths
        leading = np.fromiter(
            (len(t) - len(t.lstrip(" ")) if t.strip(" ") else 0 for t in texts),
            np.int64,
            len(texts),
        )
        word_begins, position = [], 0
        for word in _jieba().cut("".join(texts), HMM=False):
            word_begins.append(position)
            position += len(word)
        word_index = np.searchsorted(
            np.asarray(word_begins, np.int64), begins + leading, side="right"
        )
        starts = np.ones(len(ids), bool)
        starts[1:] = word_index[1:] != word_index[:-1]
        starts |= self.special[ids]
        if self._bare_id >= 0 and len(ids) > 1:
            starts[1:] &= ids[:-1] != self._bare_id
        return starts


def _train(
    sentences: Iterable[str], tmp: str, vocab_size: int, model_type: str, language: str
) -> None:
    """Trains into tmp/spm.model. The model is handed back in memory, not written under a
    model_prefix: SentencePiece keeps that prefix (a path under the workdir) in the model, so the
    same sentences gave a tokenizer of another fingerprint in every workdir."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        hard_vocab_limit=False,
        character_coverage=0.9995 if language == "zh" else 1.0,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        user_defined_symbols=["[MASK]"],
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        max_sentence_length=1 << 16,
        num_threads=min(8, os.cpu_count() or 1),
        minloglevel=2,
    )
    with open(os.path.join(tmp, "spm.model"), "wb") as f:
        f.write(model.getvalue())


def train_sentencepiece(
    sentences: Iterable[str],
    directory: str,
    *,
    vocab_size: int,
    model_type: str = "unigram",
    language: str = "en",
    seed: int = 0,
) -> str:
    """Trains a SentencePiece model with the fixed special ids into `directory`; returns the .model
    path.

    Written into `directory.tmp-<pid>`, synced to disk and renamed, so a half-trained or
    half-written model is never found (a kill leaves that temporary directory, which is never
    read; a power cut leaves the model whole or none).
    """
    final = os.path.join(directory, "spm.model")
    if os.path.isfile(final):
        return final
    tmp = f"{directory.rstrip(os.sep)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    spm.set_random_generator_seed(seed)
    raised: list[BaseException] = []  # what the sentences raised, which SentencePiece wraps

    def read(sentences):
        try:
            yield from sentences
        except BaseException as error:  # a corpus error, a signal: raised as itself below
            raised.append(error)
            raise

    try:
        _train(read(sentences), tmp, vocab_size, model_type, language)
    except RuntimeError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if raised:
            raise raised[0] from None
        raise ValueError(
            f"SentencePiece training for {directory!r} failed with "
            f"config.data.vocab_size={vocab_size}: "
            f"{error}. Change config.data.vocab_size (or use a bigger corpus)"
        ) from error
    paths.publish_directory(tmp, directory)  # or another process finished first: its model
    if not os.path.isfile(final):
        raise FileExistsError(
            f"{directory!r} exists but has no spm.model: delete it so the tokenizer can be trained"
        )
    return final
