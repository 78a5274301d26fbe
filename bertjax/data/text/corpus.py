"""Corpus sources: text files, the built-in CPython corpus and tfds, as (doc_id, sentences) pairs.

A document is a list of sentence strings. Rules for awkward input (all counted in `CorpusStats`
and reported in the store's meta.json):
- an empty or blank-only file is skipped (`empty_files`); a corpus with no documents at all is an
error;
- invalid UTF-8 stops with a ValueError naming the file and line;
- a sentence longer than MAX_SENTENCE_CHARS characters (e.g. a 1 MB line) is cut into pieces of at
  most that length, at the last whitespace before the limit when there is one
  (`long_sentences_split`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from bertjax import paths
from bertjax.data.text import builtin_corpus, corpus_files
from bertjax.data.text.records import decode_line
from bertjax.data.text.sentences import (
    DOCUMENT_IDS,
    HELDOUT_MIN,
    CorpusStats,
    cut_long,
    document_id,
    forced_heldout,
    is_heldout,
    split_sentences,
)

Document = list[str]


def expand_paths(spec: str) -> list[str]:
    """The files of a file corpus, in order (corpus_files.expand: paths, globs, URLs, hf://)."""
    return corpus_files.expand(spec)


def _read_lines(path: str, name: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file; invalid bytes raise naming file, line."""
    with corpus_files.open_file(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = decode_line(raw, name, lineno)
            if lineno == 1:
                line = line.lstrip("\ufeff")
            yield lineno, line.rstrip("\r\n")


def text_document(text: str, stats: CorpusStats) -> Document:
    """A document's sentences from its text: lines, split into sentences, long ones cut."""
    lines = text.split("\n")
    return [p for line in lines for s in split_sentences(line) for p in cut_long(s, stats)]


def _record_texts(path: str, corpus_format: str, text_feature: str, name: str):
    """(record number, text) of a JSON Lines or Parquet file's `text_feature` field."""
    if corpus_format == "jsonl":
        for lineno, line in _read_lines(path, name):
            if line.strip():
                yield lineno, jsonl_text(line, f"{name}:{lineno}", text_feature)
        return
    import pyarrow.parquet as pq

    with corpus_files.open_file(path) as f:
        table = pq.ParquetFile(f)
        check_column(table, text_feature, name)
        row = 0
        for batch in table.iter_batches(columns=[text_feature]):
            for text in batch.column(0).to_pylist():
                row += 1
                yield row, text or ""


def jsonl_text(line: str, where: str, text_feature: str) -> str:
    """The `text_feature` string of a JSON Lines record; bad records name ``where`` they are."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise ValueError(f"{where}: not a JSON object ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_feature), str):
        fields = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(
            f"{where}: no string field {text_feature!r} (config.data.text_feature); "
            f"its fields: {fields}"
        )
    return record[text_feature]


def check_column(table, text_feature: str, name: str) -> None:
    """Stops a Parquet file (a pyarrow ParquetFile) without the column `text_feature`."""
    if text_feature not in table.schema_arrow.names:
        raise ValueError(
            f"{name}: no column {text_feature!r} (config.data.text_feature); "
            f"columns: {table.schema_arrow.names}"
        )


def line_document(line: str, stats: CorpusStats) -> Document:
    """The sentences of a "documents" line."""
    return [p for s in split_sentences(line) for p in cut_long(s, stats)]


def file_documents(
    path: str,
    corpus_format: str,
    stats: CorpusStats,
    text_feature: str = "text",
    name: str | None = None,
) -> Iterator[tuple[str, Document]]:
    """Documents of one file: "sentences" (BERT), "documents" (one per line), "jsonl" or
    "parquet" (one per record, its `text_feature` field). ``name``: what messages call the file
    (its URL, where ``path`` is a local copy)."""
    name = name or path
    corpus_files.check_format(name, corpus_format)
    stats.files += 1
    found = 0
    if corpus_format in ("jsonl", "parquet"):
        for _, text in _record_texts(path, corpus_format, text_feature, name):
            doc = text_document(text, stats)
            if doc:
                found += 1
                yield document_id(text), doc
    elif corpus_format == "documents":
        for _, line in _read_lines(path, name):
            doc = line_document(line, stats)
            if doc:
                found += 1
                yield document_id(line), doc
    else:
        doc: Document = []
        lines: list[str] = []
        for _, line in _read_lines(path, name):
            line = line.strip()
            if line:
                doc.extend(cut_long(line, stats))
                lines.append(line)
            elif doc:
                found += 1
                yield document_id("\n".join(lines)), doc
                doc, lines = [], []
        if doc:
            found += 1
            yield document_id("\n".join(lines)), doc
    if not found:
        stats.empty_files.append(name)


def tfds_documents(
    spec: str, text_feature: str, data_dir: str, stats: CorpusStats
) -> Iterator[tuple[str, Document]]:
    """Documents of `tfds:NAME[:SPLIT]` through tfds.data_source (ArrayRecord, no TensorFlow)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError(
            f"corpus {spec!r} needs tensorflow-datasets: pip install 'bertjax[tfds]'"
        ) from None
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1]:
        raise ValueError(f"corpus {spec!r}: expected 'tfds:NAME' or 'tfds:NAME:SPLIT'")
    name, split = parts[1], (parts[2] if len(parts) == 3 else "train")
    try:
        source = tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
    except Exception as e:  # tfds raises several types for a dataset that is not prepared
        raise FileNotFoundError(
            f"corpus {spec!r}: cannot open tfds dataset {name!r} split {split!r} "
            f"(data_dir={data_dir or 'tfds default'}): {e}"
        ) from e
    stats.files += 1
    for i in range(len(source)):
        example = source[i]
        if text_feature not in example:
            raise ValueError(
                f"corpus {spec!r}: no feature {text_feature!r} (config.data.text_feature); "
                f"available: {sorted(example)}"
            )
        text = example[text_feature]
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        doc = text_document(text, stats)
        if doc:
            yield f"tfds:{name}:{split}#{i}", doc


def iter_documents(
    spec: str,
    corpus_format: str = "sentences",
    *,
    text_feature: str = "text",
    tfds_data_dir: str = "",
    stats: CorpusStats | None = None,
    cache: str | None = None,
) -> Iterator[tuple[str, Document]]:
    """All (doc_id, sentences) of a corpus spec, in a fixed order; counts go into `stats`.
    ``cache``: files on storage (a URL, the Hub) are read from local copies kept there."""
    stats = stats if stats is not None else CorpusStats()
    if spec == "builtin":
        stats.files += 1
        source = builtin_corpus.documents()
    elif spec.startswith("tfds:"):
        source = tfds_documents(spec, text_feature, tfds_data_dir, stats)
    else:
        source = (
            d
            for path in corpus_files.expand(spec)
            for d in file_documents(
                corpus_files.local_file(path, cache) if cache else path,
                corpus_format,
                stats,
                text_feature,
                path,
            )
        )
    for doc_id, doc in source:
        stats.documents += 1
        stats.sentences += len(doc)
        yield doc_id, doc


def describe(spec: str, corpus_format: str, text_feature: str) -> str:
    """A one-line description of a corpus, stored in meta.json and compared on reuse."""
    if spec == "builtin":
        import sys

        return f"builtin (CPython {sys.version.split()[0]})"
    if spec.startswith("tfds:"):
        return f"{spec} feature={text_feature}"
    return f"files {spec} format={corpus_format}"


def config_description(c) -> str:
    """The corpus of a run's ``config.data`` and its held-out fraction, as one line."""
    corpus = describe(c.corpus, c.corpus_format, c.text_feature)
    return f"{corpus} heldout={c.heldout_fraction}"


def config_parts(c) -> dict:
    """What the documents of a run's ``config.data`` and their held-out split are made of, for
    the keys of what is built from them (the token store, a trained tokenizer): the corpus's
    description, its files with their sizes and versions (a local file's modification time, an
    object's generation, a Hub file's commit; none for the built-in corpus and tfds), how
    documents are named and the rule that keeps the held-out split non-empty."""
    builtin = c.corpus == "builtin" or c.corpus.startswith("tfds:")
    return {
        "corpus": config_description(c),
        "document_ids": DOCUMENT_IDS,  # stores named documents by path before: not reused
        "heldout_min": HELDOUT_MIN,
        "files": [] if builtin else corpus_files.sizes(c.corpus),
        "tfds_data_dir": c.tfds_data_dir if c.corpus.startswith("tfds:") else "",
    }


def config_documents(c, stats: CorpusStats | None = None):
    """(doc_id, sentences) of the corpus of a run's ``config.data``, in corpus order (files on
    storage read from local copies in the cache, each fetched once)."""
    return iter_documents(
        c.corpus,
        c.corpus_format,
        text_feature=c.text_feature,
        tfds_data_dir=c.tfds_data_dir,
        stats=stats,
        cache=paths.cache_dir(c.cache_dir),
    )


def forced_document(c) -> tuple[str, ...]:
    """The documents the held-out split of ``config.data``'s corpus keeps besides those its hash
    picks (sentences.forced_heldout: reads the corpus's first documents, up to the second one
    held out)."""
    return forced_heldout((doc_id for doc_id, _ in config_documents(c)), c.heldout_fraction)


def split_documents(c, split: str | None, stats: CorpusStats | None = None, forced=False):
    """(doc_id, sentences) of the corpus of a run's ``config.data``; only one split's documents
    ("train" or "eval") when ``split`` is given. ``forced``: `forced_document`'s answer when the
    caller has it (False: found here)."""
    if split is not None and forced is False:
        forced = forced_document(c)
    for doc_id, doc in config_documents(c, stats):
        if split is None or (split == "eval") == is_heldout(doc_id, c.heldout_fraction, forced):
            yield doc_id, doc
