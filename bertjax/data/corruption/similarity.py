"""Similar-word tables for MacBERT's "MLM as correction": from a word list or from embeddings.

MacBERT (Cui et al. 2020, §3) replaces a selected *word* by one similar word. A table maps a word,
spelled as its sequence of pieces, to its similar words spelled the same way, and keeps a lexicon
of known words to draw random words from. Lookups are vectorized: a word is found by a hash of its
pieces (then compared piece by piece), so a batch's selected words are looked up at once.

Similar words of another length: a replacement must keep the row's length and leave the predicted
tokens at their positions, so only similar words with exactly as many pieces as the word are kept
(the others are dropped when the file is read and counted in `SimilarWords.dropped`).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from bertjax.data import keys as keys_lib
from bertjax.data.tokenizer import Tokenizer

MAX_SIMILAR = 32  # similar words kept per word


@dataclasses.dataclass(frozen=True)
class SimilarWords:
    """Words as piece sequences (padded with -1 to `width`), their similar words, a lexicon."""

    hashes: np.ndarray  # [W] uint64, sorted: hash of each word's pieces
    words: np.ndarray  # [W, width] int32 pieces of each word
    first: np.ndarray  # [W] int64 row of the word's first similar word in `similar`
    counts: np.ndarray  # [W] int32 similar words of each word (>= 1)
    similar: np.ndarray  # [S, width] int32 pieces of the similar words (same length as their word)
    lexicon: np.ndarray  # [R, width] int32 words a random replacement draws from, by length
    lexicon_start: np.ndarray  # [width + 2] int64: n-piece words are lexicon[start[n]:start[n+1]]
    dropped: int = 0  # similar words dropped for having another number of pieces than their word

    @property
    def width(self) -> int:
        return self.words.shape[1]

    def lookup(self, pieces: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Table row of each word ([N, L] pieces, [N] lengths), -1 where the word is not listed."""
        pieces = _pad(pieces, lengths, self.width)
        fits = lengths <= self.width
        h = word_hash(pieces, np.minimum(lengths, self.width))
        row = np.minimum(np.searchsorted(self.hashes, h), max(len(self.hashes) - 1, 0))
        if not len(self.hashes):
            return np.full(len(lengths), -1, np.int64)
        found = fits & (self.hashes[row] == h) & (self.words[row] == pieces).all(1)
        return np.where(found, row, -1)

    def choose(self, entry: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One similar word of each table row `entry` (-1: none), chosen by `draws` in [0, 1):
        (pieces [N, width], whether the word has one)."""
        if not len(self.counts):
            return np.full((len(entry), self.width), -1, np.int32), np.zeros(len(entry), bool)
        row = np.maximum(entry, 0)
        count = np.where(entry >= 0, self.counts[row], 0)
        pick = self.first[row] + np.minimum((draws * count).astype(np.int64), count - 1)
        return self.similar[np.maximum(pick, 0)], count > 0

    def random_words(self, lengths: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A lexicon word of each length, chosen by `draws` in [0, 1): (pieces [N, width], whether
        the lexicon has a word of that length)."""
        n = np.minimum(lengths, self.width + 1)
        lo, hi = self.lexicon_start[n], self.lexicon_start[np.minimum(n + 1, self.width + 1)]
        has = (hi > lo) & (lengths <= self.width)
        pick = np.minimum(lo + (draws * (hi - lo)).astype(np.int64), max(len(self.lexicon) - 1, 0))
        if not len(self.lexicon):
            return np.full((len(lengths), self.width), -1, np.int32), has
        return self.lexicon[pick], has


def _pad(pieces: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """[N, width] pieces with -1 at and after each length (cut or padded)."""
    out = np.full((len(lengths), width), -1, np.int32)
    w = min(width, pieces.shape[1])
    out[:, :w] = pieces[:, :w]
    out[np.arange(width)[None, :] >= lengths[:, None]] = -1
    return out


def word_hash(pieces: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint64 hash of each row's first `lengths` pieces (the rest ignored)."""
    h = keys_lib.mix(np.asarray(lengths, np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    with np.errstate(over="ignore"):
        for j in range(pieces.shape[1]):
            step = keys_lib.mix(h ^ (pieces[:, j].astype(np.uint64) * np.uint64(0x100000001B3)))
            h = np.where(j < lengths, step, h)
    return h


def _build(similar: dict[tuple, list[tuple]], lexicon: set, dropped: int = 0) -> SimilarWords:
    """Packs {word: [similar words]} (tuples of piece ids) and a lexicon into a SimilarWords."""
    similar = {w: s for w, s in similar.items() if s}
    width = max([len(w) for w in similar] + [len(w) for w in lexicon] + [1])
    words = sorted(similar)
    padded = np.full((len(words), width), -1, np.int32)
    for i, w in enumerate(words):
        padded[i, : len(w)] = w
    lengths = np.fromiter((len(w) for w in words), np.int64, len(words))
    hashes = word_hash(padded, lengths)
    order = np.argsort(hashes, kind="stable")
    words = [words[i] for i in order]
    counts = np.fromiter((len(similar[w]) for w in words), np.int32, len(words))
    flat = [s for w in words for s in similar[w]]
    table = np.full((len(flat), width), -1, np.int32)
    for i, s in enumerate(flat):
        table[i, : len(s)] = s
    by_length = sorted(lexicon, key=lambda w: (len(w), w))
    lex = np.full((len(by_length), width), -1, np.int32)
    for i, w in enumerate(by_length):
        lex[i, : len(w)] = w
    sizes = np.bincount([len(w) for w in by_length], minlength=width + 2)[: width + 2]
    return SimilarWords(
        hashes=hashes[order],
        words=padded[order],
        first=(np.cumsum(counts) - counts).astype(np.int64),
        counts=counts,
        similar=table,
        lexicon=lex,
        lexicon_start=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        dropped=dropped,
    )


def _spellings(tokenizer: Tokenizer, piece_ids: dict, text: str) -> list[tuple]:
    """The piece sequences a word takes: alone (a text's start), and inside running text without
    a word-initial "▁" (SentencePiece in languages written without spaces, e.g. Chinese)."""
    ids = tuple(int(i) for i in tokenizer.encode([text])[0])
    if not ids:
        return []
    out = [ids]
    first = tokenizer.pieces[ids[0]]
    if first == "▁" and len(ids) > 1:
        out.append(ids[1:])
    elif first.startswith("▁") and len(first) > 1 and first[1:] in piece_ids:
        out.append((piece_ids[first[1:]], *ids[1:]))
    return out


def from_word_file(path: str, tokenizer: Tokenizer) -> SimilarWords:
    """Reads `word<TAB>similar1 similar2 …` lines (e.g. from a synonym toolkit such as Synonyms,
    which MacBERT used). Each spelling of a word lists the similar words spelled the same way with
    as many pieces; every word and similar word joins the lexicon of random words."""
    similar: dict[tuple, list[tuple]] = {}
    lexicon: set[tuple] = set()
    dropped = 0
    piece_ids = {piece: i for i, piece in enumerate(tokenizer.pieces)}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if "\t" not in line:
                raise ValueError(f"{path}:{lineno}: expected 'word<TAB>similar1 similar2 ...'")
            word, rest = line.rstrip("\n").split("\t", 1)
            spellings = _spellings(tokenizer, piece_ids, word.strip())
            others = [_spellings(tokenizer, piece_ids, other) for other in rest.split()]
            for variant, spelled in enumerate(spellings):
                lexicon.add(spelled)
                bucket = similar.setdefault(spelled, [])
                for other in others:
                    if variant >= len(other):
                        continue
                    candidate = other[variant]
                    lexicon.add(candidate)
                    if len(candidate) != len(spelled):
                        dropped += 1
                    elif (
                        candidate != spelled
                        and candidate not in bucket
                        and not tokenizer.special[list(candidate)].any()
                        and len(bucket) < MAX_SIMILAR
                    ):
                        bucket.append(candidate)
    lexicon = {w for w in lexicon if not tokenizer.special[list(w)].any()}
    if dropped:
        logging.getLogger(__name__).info(
            "%s: %d similar words dropped (another number of pieces than their word)", path, dropped
        )
    return _build(similar, lexicon, dropped)


def from_embeddings(
    embeddings: np.ndarray, special: np.ndarray, k: int = 10, chunk: int = 1024
) -> SimilarWords:
    """The k nearest pieces of every piece by cosine similarity (specials excluded): one-piece
    words only (an embedding matrix knows no multi-piece words; those fall back to random words);
    no lexicon (a random word is then random pieces)."""
    emb = np.asarray(embeddings, np.float32)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    vocab = len(emb)
    k = max(min(k, vocab - 1 - int(special.sum())), 0)
    similar: dict[tuple, list[tuple]] = {}
    for lo in range(0, vocab, chunk):
        scores = emb[lo : lo + chunk] @ emb.T
        scores[:, special] = -np.inf
        scores[np.arange(len(scores)), np.arange(lo, lo + len(scores))] = -np.inf
        if k == 0:
            break
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        best = np.take_along_axis(scores, top, 1)
        top = np.take_along_axis(top, np.argsort(-best, 1, kind="stable"), 1)
        for i, row in enumerate(top.tolist(), lo):
            if not special[i]:
                similar[(i,)] = [(j,) for j in row]
    return _build(similar, set())


def load(path: str, tokenizer: Tokenizer) -> SimilarWords:
    """A similarity table from a .npy embedding matrix [V, D] or a word-list TSV file."""
    if path.endswith(".npy"):
        embeddings = np.load(path, allow_pickle=False)
        if embeddings.ndim != 2 or len(embeddings) != tokenizer.vocab_size:
            raise ValueError(
                f"{path}: embedding matrix of shape {embeddings.shape} does not match the "
                f"tokenizer's vocabulary of {tokenizer.vocab_size}"
            )
        return from_embeddings(embeddings, tokenizer.special)
    return from_word_file(path, tokenizer)
