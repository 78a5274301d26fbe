"""Text utilities shared by the corpus sources: sentence splitting, cutting over-long sentences
(counted in `CorpusStats`), a document's identity and the held-out split by it.

A document of a file corpus is named by its text (`document_id`), so the same files read from
another folder, a file:// URL, a bucket or the Hub, or converted from JSON Lines to Parquet, give
the same held-out split, the same tokenizer and the same batches (before, its id was its file's
full path and line: moving a corpus moved documents between the splits). The split keeps a
document when a hash of its id falls below the held-out fraction (`is_heldout`); so that a small
corpus never ends with an empty split by chance, `forced_heldout` names more documents when
fewer than HELDOUT_MIN of the first HELDOUT_SCAN documents fall below it."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import re
from collections.abc import Iterable

MAX_SENTENCE_CHARS = 4096
HELDOUT_SCAN = 10_000  # documents the rule that keeps the held-out split non-empty looks at
HELDOUT_MIN = 2  # documents it holds out at least (NSP draws its random segments from another)
DOCUMENT_IDS = "text-blake2b-128"  # how file documents are named (kept in stores and records)
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


def document_id(text: str) -> str:
    """A document's identity from its text: the same wherever the corpus is read from."""
    return "text:" + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _position(doc_id: str) -> float:
    """Where a document's id hashes to in [0, 1)."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def is_heldout(doc_id: str, fraction: float, forced=()) -> bool:
    """Whether a document belongs to the eval split: a stable hash of its id below `fraction`,
    or one of the documents `forced_heldout` named (``forced``)."""
    return _position(doc_id) < fraction or doc_id in (forced or ())


def forced_heldout(doc_ids: Iterable[str], fraction: float) -> tuple[str, ...]:
    """The documents the eval split keeps besides those of `is_heldout`: when ``fraction`` > 0
    and fewer than HELDOUT_MIN of the first HELDOUT_SCAN of ``doc_ids`` (a corpus's, in its
    order) hash below it, those of them whose hashes are smallest, as many as it takes, leaving
    at least one document to train on (with 0.02, a corpus of 115 documents held out none about
    one time in ten); () when enough do."""
    if fraction <= 0:
        return ()
    held, seen, others = 0, 0, []
    for doc_id in doc_ids:
        if is_heldout(doc_id, fraction):
            held += 1
            if held >= HELDOUT_MIN:
                return ()
        else:
            others.append((_position(doc_id), doc_id))
        seen += 1
        if seen == HELDOUT_SCAN:
            break
    wanted = min(HELDOUT_MIN - held, len(others) - 1)
    return tuple(sorted(doc_id for _, doc_id in heapq.nsmallest(max(wanted, 0), others)))
