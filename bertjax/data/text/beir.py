"""BEIR-format retrieval sets (Thakur et al. 2021): ``corpus.jsonl`` ({"_id", "title", "text"}),
``queries.jsonl`` ({"_id", "text"}) and ``qrels/<split>.tsv`` (query-id, corpus-id, score, with
a header line), in a local directory or under a URL.

A document's text is its title and text joined by a space (as BEIR's dense retrievers embed
it). Only the queries the qrels judge are kept. Each inconsistency stops with one message naming
the file, the line and what to do.
"""

from __future__ import annotations

import dataclasses
import json

from bertjax import paths
from bertjax.data.text.records import decode_line


@dataclasses.dataclass
class BeirSet:
    """Documents and queries by id, and the graded judgements qrels[query_id][doc_id]."""

    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _jsonl(path: str, what: str):
    if not paths.isfile(path):
        raise FileNotFoundError(f"{path} not found: a BEIR directory holds {what}")
    with open(paths.local_copy(path), "rb") as f:
        for number, raw in enumerate(f, start=1):
            line = decode_line(raw, path, number)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {number} is not JSON: {error}") from error
            if not isinstance(record, dict) or "_id" not in record:
                raise ValueError(f"{path} line {number}: expected a JSON object with an '_id'")
            yield number, record


def read_beir(directory: str, split: str = "test") -> BeirSet:
    """The corpus, the judged queries and the qrels of ``split`` under ``directory``."""
    corpus = {}
    corpus_file = paths.join(directory, "corpus.jsonl")
    for number, record in _jsonl(corpus_file, "corpus.jsonl, queries.jsonl and qrels/"):
        text = " ".join(
            str(record.get(key) or "").strip() for key in ("title", "text") if record.get(key)
        )
        if not text:
            raise ValueError(f"{corpus_file} line {number}: document {record['_id']!r} is empty")
        corpus[str(record["_id"])] = text
    queries = {}
    queries_file = paths.join(directory, "queries.jsonl")
    for number, record in _jsonl(queries_file, "corpus.jsonl, queries.jsonl and qrels/"):
        text = str(record.get("text") or "").strip()
        if not text:
            raise ValueError(
                f"{queries_file} line {number}: query {record['_id']!r} has empty text; "
                "remove it or give it text"
            )
        queries[str(record["_id"])] = text
    qrels_file = paths.join(directory, "qrels", f"{split}.tsv")
    if not paths.isfile(qrels_file):
        raise FileNotFoundError(f"{qrels_file} not found: the judgements of split {split!r}")
    qrels: dict[str, dict[str, int]] = {}
    lines = paths.read_text(qrels_file).splitlines()
    for number, line in enumerate(lines, start=1):
        parts = line.rstrip("\n").split("\t")
        if number == 1 and not parts[-1].strip().lstrip("-").isdigit():
            continue  # the header
        if not line.strip():
            continue
        if len(parts) != 3 or not parts[2].strip().lstrip("-").isdigit():
            raise ValueError(f"{qrels_file} line {number}: expected query-id, corpus-id, score")
        query_id, doc_id, score = parts[0].strip(), parts[1].strip(), int(parts[2])
        if doc_id not in corpus:
            raise ValueError(
                f"{qrels_file} line {number}: corpus-id {doc_id!r} is not in {corpus_file}"
            )
        if query_id not in queries:
            raise ValueError(
                f"{qrels_file} line {number}: query-id {query_id!r} is not in {queries_file}"
            )
        qrels.setdefault(query_id, {})[doc_id] = score
    if not qrels:
        raise ValueError(f"{qrels_file} judges no queries")
    return BeirSet(corpus, {q: queries[q] for q in qrels}, qrels)
