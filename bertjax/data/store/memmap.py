"""Token store: a corpus tokenized once into memory-mapped arrays on disk, per split.

Layout of a store directory (meta.json is written last; a store without it is never used):
  meta.json                 tokenizer fingerprint, corpus, counts, skip counts
  <split>/tokens.bin        uint16 (vocab < 65536) or uint32; each document's tokens then one [SEP]
  <split>/word_starts.bin   uint8, 1 where a token starts a word
  <split>/sentences.bin     int64 [S, 2] token range [start, end) of each sentence
  <split>/documents.bin     int64 [D + 1] sentence offsets of each document
The [SEP] after each document is the RoBERTa FULL-SENTENCES document separator; sentence ranges
never include it. The store is written streaming (bounded memory) into DIR.tmp-<pid> and renamed.
"""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing
import os
import shutil
from collections.abc import Iterable

import numpy as np

from bertjax.data.text.sentences import DOCUMENT_IDS, CorpusStats, is_heldout
from bertjax.data.tokenizer import Tokenizer

FORMAT_VERSION = 1
SPLITS = ("train", "eval")
CHUNK_CHARS = 1 << 20  # documents are tokenized in chunks of about this many characters
UNK_WARNING = 0.01  # a store whose text is more [UNK] than this is reported as a likely mistake

_worker_tokenizer: Tokenizer | None = None


def _token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 65536 else np.uint32


def encode_chunk(tokenizer: Tokenizer, docs: list[list[str]]):
    """Tokenizes documents: (tokens with a [SEP] after each doc, word starts, sentence lengths, doc
    sizes, counts: empty sentences/documents dropped, [UNK] and other special tokens in the text).

    A [PAD] inside a text stops the job: its tokenizer pads (or maps text to [PAD]), and such
    ids would be stored, and trained on, as words."""
    sentences = [s for d in docs for s in d]
    flat, lengths = tokenizer.encode_flat(sentences)
    padded = np.flatnonzero(flat == tokenizer.pad_id)
    if len(padded):
        sentence = int(np.searchsorted(np.cumsum(lengths), padded[0], side="right"))
        raise ValueError(
            f"tokenizer {tokenizer.path!r} returned [PAD] (id {tokenizer.pad_id}) inside a text "
            f"({len(padded)} times in this chunk; first in {sentences[sentence][:80]!r}): a "
            "tokenizer that pads, or text holding the pad token, would be stored as words; fix "
            "the tokenizer given in config.data.hf_vocab / config.data.tokenizer_model, or the text"
        )
    starts = tokenizer.word_starts(flat, lengths)
    doc_of_sentence = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    keep = lengths > 0  # a sentence that tokenizes to nothing is dropped
    lengths, doc_of_sentence = lengths[keep], doc_of_sentence[keep]
    doc_sizes = np.bincount(doc_of_sentence, minlength=len(docs))
    doc_token_ends = np.cumsum(
        np.bincount(doc_of_sentence, weights=lengths, minlength=len(docs))
    ).astype(np.int64)
    doc_token_ends = doc_token_ends[doc_sizes > 0]
    tokens = np.insert(flat, doc_token_ends, tokenizer.sep_id)
    starts = np.insert(starts, doc_token_ends, True).astype(np.uint8)
    unknown = int((flat == tokenizer.unk_id).sum())
    counts = {
        "empty_sentences_dropped": int((~keep).sum()),
        "empty_documents_dropped": int((doc_sizes == 0).sum()),
        "unk_tokens": unknown,
        "special_tokens": int(tokenizer.special[flat].sum()) - unknown,
    }
    return tokens, starts, lengths, doc_sizes[doc_sizes > 0], counts


def token_shares(counts: dict) -> tuple[str, bool]:
    """One line on a store split's [UNK] and special-token shares, and whether [UNK] is common
    enough to suspect the tokenizer (a vocabulary of another language or case is mostly [UNK]);
    ("", False) for a store written before they were counted."""
    if "unk_tokens" not in counts:
        return "", False
    text = max(1, counts["tokens"] - counts["documents"])  # the [SEP] between documents aside
    unk, special = counts["unk_tokens"] / text, counts["special_tokens"] / text
    line = f"{unk:.3%} [UNK], {special:.3%} other special tokens in the text"
    if unk <= UNK_WARNING:
        return line, False
    return f"{line}: over {UNK_WARNING:.0%} [UNK], is the tokenizer the one for this corpus?", True


def _init_worker(path: str, language: str, lowercase: bool):
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer(path, language=language, lowercase=lowercase, num_threads=1)


def _encode_in_worker(args):
    split, docs = args
    return split, encode_chunk(_worker_tokenizer, docs)


class _SplitWriter:
    """Appends encoded chunks of one split to its files."""

    def __init__(self, directory: str, dtype):
        os.makedirs(directory)
        self.dtype = dtype
        self.files = {
            name: open(os.path.join(directory, f"{name}.bin"), "wb")
            for name in ("tokens", "word_starts", "sentences", "documents")
        }
        self.files["documents"].write(np.zeros(1, np.int64).tobytes())
        self.tokens = self.sentences = self.documents = 0
        self.counts = collections.Counter()

    def write(self, chunk):
        tokens, starts, lengths, doc_sizes, counts = chunk
        self.files["tokens"].write(tokens.astype(self.dtype).tobytes())
        self.files["word_starts"].write(starts.tobytes())
        # Sentence starts: cumulative lengths plus one [SEP] for every document that ended before.
        doc_index = np.repeat(np.arange(len(doc_sizes)), doc_sizes)
        begin = self.tokens + np.cumsum(lengths) - lengths + doc_index
        self.files["sentences"].write(
            np.stack([begin, begin + lengths], 1).astype(np.int64).tobytes()
        )
        self.files["documents"].write(
            (self.sentences + np.cumsum(doc_sizes)).astype(np.int64).tobytes()
        )
        self.tokens += len(tokens)
        self.sentences += len(lengths)
        self.documents += len(doc_sizes)
        self.counts.update(counts)

    def close(self) -> dict:
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {
            "documents": self.documents,
            "sentences": self.sentences,
            "tokens": self.tokens,
            **{key: int(value) for key, value in self.counts.items()},
        }


def _chunks(documents: Iterable[tuple[str, list[str]]], heldout_fraction: float, progress, forced):
    """(split, [docs]) chunks of about CHUNK_CHARS characters, in corpus order per split."""
    pending = {split: [] for split in SPLITS}
    size = collections.Counter()
    for doc_id, doc in documents:
        split = "eval" if is_heldout(doc_id, heldout_fraction, forced) else "train"
        pending[split].append(doc)
        size[split] += sum(len(s) for s in doc)
        progress.update(1)
        if size[split] >= CHUNK_CHARS:
            yield split, pending[split]
            pending[split], size[split] = [], 0
    for split in SPLITS:
        if pending[split]:
            yield split, pending[split]


def prepare_store(
    directory: str,
    tokenizer: Tokenizer,
    documents: Iterable[tuple[str, list[str]]],
    *,
    heldout_fraction: float,
    corpus_description: str,
    stats: CorpusStats,
    num_workers: int = 0,
    forced_heldout=(),
) -> dict:
    """Tokenizes a corpus into a store at `directory` (atomically); returns its meta.
    ``forced_heldout``: documents held out besides those their hash picks (sentences.py)."""
    from tqdm.auto import tqdm

    directory = directory.rstrip(os.sep)
    tmp = f"{directory}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    dtype = _token_dtype(tokenizer.vocab_size)
    writers = {split: _SplitWriter(os.path.join(tmp, split), dtype) for split in SPLITS}
    progress = tqdm(desc=f"tokenizing into {directory}", unit="doc", disable=None)
    chunks = _chunks(documents, heldout_fraction, progress, forced_heldout)
    try:
        if num_workers > 0:
            ctx = multiprocessing.get_context("spawn")  # fork is unsafe once JAX's threads exist
            init = (tokenizer.path, tokenizer.language, tokenizer.lowercase)
            with ctx.Pool(num_workers, initializer=_init_worker, initargs=init) as pool:
                window = (
                    collections.deque()
                )  # at most 2 chunks per worker in flight: bounded memory
                for item in chunks:
                    window.append(pool.apply_async(_encode_in_worker, (item,)))
                    if len(window) >= 2 * num_workers:
                        split, chunk = window.popleft().get()
                        writers[split].write(chunk)
                while window:
                    split, chunk = window.popleft().get()
                    writers[split].write(chunk)
        else:
            for split, docs in chunks:
                writers[split].write(encode_chunk(tokenizer, docs))
        counts = {split: w.close() for split, w in writers.items()}
    except BaseException:
        for w in writers.values():
            for f in w.files.values():
                f.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        progress.close()
    if counts["train"]["documents"] == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        empty = f" (empty files skipped: {stats.empty_files})" if stats.empty_files else ""
        raise ValueError(f"corpus {corpus_description!r} yielded no training documents{empty}")
    meta = {
        "format_version": FORMAT_VERSION,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "tokenizer_path": os.path.abspath(tokenizer.path),
        "language": tokenizer.language,
        "vocab_size": tokenizer.vocab_size,
        "sep_id": tokenizer.sep_id,
        "token_dtype": np.dtype(dtype).name,
        "corpus": corpus_description,
        "heldout_fraction": heldout_fraction,
        "document_ids": DOCUMENT_IDS,
        "forced_heldout": list(forced_heldout),
        "splits": counts,
        "corpus_stats": stats.as_dict(),
        "complete": True,
    }
    with open(os.path.join(tmp, "meta.json"), "w") as f:  # written last: marks the store complete
        json.dump(meta, f, indent=1)
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    try:
        os.replace(tmp, directory)
    except OSError:  # another process finished the same store first
        shutil.rmtree(tmp, ignore_errors=True)
        return read_meta(directory)
    logging.getLogger(__name__).info(
        "prepared store %s: %s; train: %s",
        directory,
        json.dumps({"splits": counts, "corpus_stats": stats.as_dict()}),
        token_shares(counts["train"])[0],
    )
    return meta


def read_meta(directory: str) -> dict:
    """The meta of a complete store; an error naming the directory otherwise."""
    path = os.path.join(directory, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        meta = {}
    if not meta.get("complete") or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"token store {directory!r} is incomplete or from another bertjax version "
            f"({path} missing or unreadable); delete the directory to rebuild it"
        )
    return meta


def _load(path: str, dtype, shape_tail=()):
    """A read-only memmap of a .bin file (an empty array when the file is empty)."""
    itemsize = np.dtype(dtype).itemsize * int(np.prod(shape_tail, dtype=np.int64))
    count = os.path.getsize(path) // itemsize
    if count == 0:
        return np.zeros((0, *shape_tail), dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count, *shape_tail))


class Store:
    """One split of a token store, memory-mapped read-only."""

    def __init__(
        self,
        directory: str,
        split: str,
        tokenizer: Tokenizer,
        corpus_description: str | None = None,
    ):
        """Opens `directory/split`; the tokenizer (and corpus, if given) must match the store's
        meta."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: must be one of {SPLITS}")
        self.meta = meta = read_meta(directory)
        if (
            meta["tokenizer_fingerprint"] != tokenizer.fingerprint()
            or meta["language"] != tokenizer.language
        ):
            raise ValueError(
                f"token store {directory!r} was built with tokenizer "
                f"{meta['tokenizer_fingerprint']} "
                f"(language={meta['language']}, {meta['tokenizer_path']}) but the tokenizer now "
                "in use is "
                f"{tokenizer.fingerprint()} (language={tokenizer.language}, {tokenizer.path}); "
                "delete the store "
                "directory to rebuild it with this tokenizer, or use a different workdir"
            )
        if corpus_description is not None and meta["corpus"] != corpus_description:
            raise ValueError(
                f"token store {directory!r} holds corpus {meta['corpus']!r}, not "
                f"{corpus_description!r}; "
                "delete the store directory to rebuild it, or use a different workdir"
            )
        base = os.path.join(directory, split)
        self.directory, self.split = directory, split
        self.tokens = _load(os.path.join(base, "tokens.bin"), np.dtype(meta["token_dtype"]))
        self.word_starts = _load(os.path.join(base, "word_starts.bin"), np.uint8)
        self.sentences = _load(os.path.join(base, "sentences.bin"), np.int64, (2,))
        documents = _load(os.path.join(base, "documents.bin"), np.int64)
        self.documents = documents if len(documents) else np.zeros(1, np.int64)

    @property
    def fingerprint(self) -> str:
        """A stable hash of the store's meta (tokenizer, corpus, counts): changes when the data
        does, not when the same store is opened from another place."""
        import hashlib

        meta = {k: v for k, v in self.meta.items() if k != "tokenizer_path"}
        return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1

    def document_sentences(self, doc: int) -> tuple[int, int]:
        """Sentence index range [first, last + 1) of document `doc`."""
        return int(self.documents[doc]), int(self.documents[doc + 1])

    def shard_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """([1] documents, [1] tokens): a local store is one shard (data/plans/piece_plans.py)."""
        return np.array([self.num_documents]), np.array([len(self.tokens)])

    def piece_index(self, shard: int, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Documents first..end-1: (their sentence offsets from 0 [n + 1], their sentences'
        token ranges [S, 2])."""
        documents = np.asarray(self.documents[first : end + 1], np.int64)
        sentences = np.asarray(self.sentences[documents[0] : documents[-1]], np.int64)
        return documents - documents[0], sentences.reshape(-1, 2)

    def piece_indexes(self, pieces) -> list[tuple[np.ndarray, np.ndarray]]:
        """`piece_index` of each (shard, first, end) of ``pieces``."""
        return [self.piece_index(*piece) for piece in pieces]

    def close(self, timeout_s: float | None = None) -> None:
        """Nothing to stop: a memory map has no threads or cache of its own (ShardedStore's
        interface)."""

    def token_counts(self, max_tokens: int | None = None, chunk: int = 1 << 24) -> np.ndarray:
        """[V] int64 occurrences of each token id: of every token, or (``max_tokens``) of an
        evenly strided sample of at most that many."""
        vocab = self.meta["vocab_size"]
        stride = max(1, -(-len(self.tokens) // max_tokens)) if max_tokens else 1
        tokens = self.tokens[::stride] if stride > 1 else self.tokens
        counts = np.zeros(vocab, np.int64)
        for lo in range(0, len(tokens), chunk):
            counts += np.bincount(np.asarray(tokens[lo : lo + chunk]), minlength=vocab)[:vocab]
        return counts
