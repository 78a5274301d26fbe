"""Training pairs for embedding models: (query, positive, [hard negatives]) from JSON Lines or
Parquet files (local or URL), or the built-in pairs made from CPython's documentation.

A JSONL line / Parquet row holds a query, its positive document and optionally a list of hard
negatives (field names configurable). The built-in pairs need no download: a docstring's first
sentence against the rest of it, and a documentation section's heading against its first
paragraph; pairs of the same module (or topic) form a group, whose other positives are that
pair's natural hard negatives. Which pairs are held out is a stable hash of the query (files)
or of the document id (built-in), so the split is the same on every host and run.
"""

from __future__ import annotations

import dataclasses
import json
import re

from bertjax import paths
from bertjax.data.text import builtin_corpus
from bertjax.data.text.sentences import is_heldout

_UNDERLINE = re.compile(r"([*=\-~^])\1+")
MAX_POSITIVE_WORDS = 80  # built-in positives: the first words of the rest of the text


@dataclasses.dataclass(frozen=True)
class Pair:
    """One training example; ``key`` decides its split; ``group`` pairs share hard negatives."""

    query: str
    positive: str
    negatives: tuple[str, ...] = ()
    key: str = ""
    group: str = ""


def _text(value, field: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: field {field!r} must be a non-empty string, got {value!r}")
    return value.strip()


def _pair(record: dict, fields: tuple[str, str, str], where: str) -> Pair:
    query_field, positive_field, negatives_field = fields
    for field, key in ((query_field, "query_field"), (positive_field, "positive_field")):
        if field not in record:
            raise ValueError(
                f"{where} has no {field!r} field (fields: {sorted(record)}); name the field "
                f"with config.pairs.{key}"
            )
    negatives = record.get(negatives_field) or ()
    if isinstance(negatives, str) or not isinstance(negatives, list | tuple):
        raise ValueError(f"{where}: field {negatives_field!r} must be a list of strings")
    query = _text(record[query_field], query_field, where)
    return Pair(
        query,
        _text(record[positive_field], positive_field, where),
        tuple(_text(n, negatives_field, where) for n in negatives),
        key=query,
    )


def read_pairs(
    path: str,
    query_field: str = "query",
    positive_field: str = "positive",
    negatives_field: str = "negatives",
) -> list[Pair]:
    """The pairs of a .jsonl or .parquet file (local or a URL); one message per bad record."""
    if not paths.exists(path):
        raise FileNotFoundError(f"pair file {path!r} does not exist (config.pairs.source)")
    fields = (query_field, positive_field, negatives_field)
    local = paths.local_copy(path)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(local).to_pylist()
        pairs = [_pair(row, fields, f"{path} row {i}") for i, row in enumerate(rows)]
    elif path.endswith((".jsonl", ".json")):
        pairs = []
        with open(local, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path} line {number} is not JSON: {error}") from error
                if not isinstance(record, dict):
                    raise ValueError(f"{path} line {number}: expected a JSON object")
                pairs.append(_pair(record, fields, f"{path} line {number}"))
    else:
        raise ValueError(f"pair file {path!r}: expected a .jsonl or .parquet file")
    if not pairs:
        raise ValueError(f"pair file {path!r} holds no pairs")
    return pairs


def _words(sentences: list[str]) -> str:
    return " ".join(" ".join(sentences).split()[:MAX_POSITIVE_WORDS])


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each underlined section of a pydoc topic."""
    lines = text.split("\n")
    starts = [
        i
        for i in range(len(lines) - 1)
        if lines[i].strip()
        and _UNDERLINE.fullmatch(lines[i + 1].strip())
        and len(lines[i + 1].strip()) == len(lines[i].strip())
    ]
    out = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        out.append((lines[start].strip(), "\n".join(lines[start + 2 : end])))
    return out


def builtin_pairs() -> list[Pair]:
    """Pairs from the built-in corpus, in a fixed order (see the module docstring)."""
    pairs = []
    for doc_id, text in builtin_corpus._raw_documents():
        if doc_id.startswith("topic:"):
            for heading, body in _sections(text):
                sentences = builtin_corpus.text_to_sentences(body)
                if len(heading.split()) >= 1 and sum(len(s.split()) for s in sentences) >= 8:
                    key = f"{doc_id}#{heading}"
                    pairs.append(Pair(heading, _words(sentences), key=key, group=doc_id))
            continue
        sentences = builtin_corpus.text_to_sentences(text)
        if len(sentences) < 2 or len(sentences[0].split()) < 3:
            continue
        if sum(len(s.split()) for s in sentences[1:]) < 8:
            continue
        module = builtin_corpus._module_of(doc_id)
        pairs.append(Pair(sentences[0], _words(sentences[1:]), key=doc_id, group=module))
    return pairs


def split_pairs(pairs: list[Pair], fraction: float) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): a pair is held out when the hash of its key falls below ``fraction``."""
    held = [is_heldout(p.key or p.query, fraction) for p in pairs]
    return [p for p, h in zip(pairs, held) if not h], [p for p, h in zip(pairs, held) if h]
