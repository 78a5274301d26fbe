"""Similar-token tables for MacBERT correction masking: from a word list or from embeddings.

A table is (ids [V, K] int32, counts [V] int32): row v lists counts[v] tokens similar to token v.
"""

from __future__ import annotations

import numpy as np

from bertjax.data.tokenizer import Tokenizer

MAX_SIMILAR = 32


def _to_table(similar: dict[int, list[int]], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    width = max([len(v) for v in similar.values()] + [1])
    table = np.zeros((vocab_size, width), np.int32)
    counts = np.zeros(vocab_size, np.int32)
    for token, others in similar.items():
        table[token, : len(others)] = others
        counts[token] = len(others)
    return table, counts


def from_word_file(path: str, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Reads `word<TAB>similar1 similar2 …` lines; words and similar words that tokenize to the same
    number of pieces map piece by piece (others are skipped)."""
    similar: dict[int, list[int]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if "\t" not in line:
                raise ValueError(f"{path}:{lineno}: expected 'word<TAB>similar1 similar2 ...'")
            word, rest = line.rstrip("\n").split("\t", 1)
            word_ids = tokenizer.encode([word.strip()])[0]
            for other in rest.split():
                other_ids = tokenizer.encode([other])[0]
                if len(other_ids) != len(word_ids):
                    continue
                for a, b in zip(word_ids.tolist(), other_ids.tolist()):
                    bucket = similar.setdefault(a, [])
                    if (
                        a != b
                        and b not in bucket
                        and not tokenizer.special[b]
                        and len(bucket) < MAX_SIMILAR
                    ):
                        bucket.append(b)
    return _to_table({k: v for k, v in similar.items() if v}, tokenizer.vocab_size)


def from_embeddings(
    embeddings: np.ndarray, special: np.ndarray, k: int = 10, chunk: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest tokens of every token by cosine similarity (specials excluded)."""
    emb = np.asarray(embeddings, np.float32)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    vocab = len(emb)
    k = min(k, vocab - 1 - int(special.sum()))
    table = np.zeros((vocab, max(k, 1)), np.int32)
    counts = np.where(special, 0, max(k, 0)).astype(np.int32)
    for lo in range(0, vocab, chunk):
        scores = emb[lo : lo + chunk] @ emb.T
        scores[:, special] = -np.inf
        scores[np.arange(len(scores)), np.arange(lo, lo + len(scores))] = -np.inf
        top = (
            np.argpartition(-scores, k, axis=1)[:, :k] if k > 0 else np.zeros((len(scores), 0), int)
        )
        best = np.take_along_axis(scores, top, 1)
        table[lo : lo + chunk, :k] = np.take_along_axis(top, np.argsort(-best, 1, kind="stable"), 1)
    return table, counts


def load(path: str, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """A similarity table from a .npy embedding matrix [V, D] or a word-list TSV file."""
    if path.endswith(".npy"):
        embeddings = np.load(path, allow_pickle=False)
        if embeddings.ndim != 2 or len(embeddings) != tokenizer.vocab_size:
            raise ValueError(
                f"{path}: embedding matrix of shape {embeddings.shape} does not match the "
                "tokenizer's "
                f"vocabulary of {tokenizer.vocab_size}"
            )
        return from_embeddings(embeddings, tokenizer.special)
    return from_word_file(path, tokenizer)
