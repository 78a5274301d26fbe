"""Text utilities shared by the corpus sources: sentence splitting, cutting over-long sentences
(counted in `CorpusStats`), and the held-out split by document id."""

from __future__ import annotations

import dataclasses
import hashlib
import re

MAX_SENTENCE_CHARS = 4096
# A sentence ends after . ! ? followed by whitespace, or right after Chinese 。！？；
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])")


@dataclasses.dataclass
class CorpusStats:
    """What a pass over a corpus saw and skipped; stored in the store's meta.json."""

    files: int = 0
    documents: int = 0
    sentences: int = 0
    empty_files: list[str] = dataclasses.field(default_factory=list)
    long_sentences_split: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def split_sentences(text: str) -> list[str]:
    """Splits text into sentences on English .!? (+ space) and Chinese 。！？； punctuation."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def cut_long(sentence: str, stats: CorpusStats | None = None) -> list[str]:
    """Cuts a sentence over MAX_SENTENCE_CHARS at whitespace (or hard) into bounded pieces."""
    if len(sentence) <= MAX_SENTENCE_CHARS:
        return [sentence]
    if stats is not None:
        stats.long_sentences_split += 1
    pieces = []
    while len(sentence) > MAX_SENTENCE_CHARS:
        cut = sentence.rfind(" ", MAX_SENTENCE_CHARS // 2, MAX_SENTENCE_CHARS + 1)
        cut = cut if cut > 0 else MAX_SENTENCE_CHARS
        pieces.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    if sentence:
        pieces.append(sentence)
    return [p for p in pieces if p]


def is_heldout(doc_id: str, fraction: float) -> bool:
    """Whether a document belongs to the eval split: a stable hash of its id, below `fraction`."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < fraction
