"""Writing a sharded store (bertjax/data/store/shard_format.py): the units of work, one unit into
shards, and the manifest, with no engine in sight; bertjax/data/store/beam_prepare.py runs them on
Apache Beam.

A unit of work ("item") is one input file, or a block of documents of the built-in corpus or of
a tfds dataset. Its shards are cut at about `shard_bytes` of data; it ends by writing
items/<item>.json, the list of its shards. A rerun of a killed job skips every item whose record
is there and whose shards have their recorded size and SHA-256, and does not rewrite a shard
file that already holds the same bytes; only the manifest, assembled from all records in item
order, marks the store complete.
"""

from __future__ import annotations

import itertools
import json

import numpy as np

from bertjax import paths
from bertjax.data.store import shard_format as fmt
from bertjax.data.store.memmap import CHUNK_CHARS, SPLITS, encode_chunk
from bertjax.data.text import corpus as corpus_lib
from bertjax.data.text import corpus_files
from bertjax.data.text.sentences import DOCUMENT_IDS, CorpusStats, forced_heldout, is_heldout

DOCS_PER_BLOCK = 1000  # documents per item of the built-in corpus and tfds datasets
# What `encode_chunk` counts, summed per item record and per split in the manifest.
COUNTS = ("empty_sentences_dropped", "empty_documents_dropped", "unk_tokens", "special_tokens")


def expand_urls(spec: str) -> list[str]:
    """Comma-separated paths, globs or URLs (file://, gs://, s3://, hf://) → the corpus's files
    (corpus_files.expand), local ones as absolute paths (workers may run elsewhere)."""
    found: list[str] = []
    for part in corpus_files.parts(spec):
        found.extend(corpus_files.expand(part if paths.is_url(part) else paths.resolve(part)))
    return found


def work_items(c) -> list[dict]:
    """The units of work of corpus config ``c`` (config.data), numbered in corpus order."""
    if c.corpus == "builtin" or c.corpus.startswith("tfds:"):
        docs = corpus_lib.iter_documents(
            c.corpus, c.corpus_format, text_feature=c.text_feature, tfds_data_dir=c.tfds_data_dir
        )
        total = sum(1 for _ in docs)
        starts = range(0, total, DOCS_PER_BLOCK)
        return [
            {"index": i, "source": c.corpus, "start": s, "stop": min(s + DOCS_PER_BLOCK, total)}
            for i, s in enumerate(starts)
        ]
    return [
        {"index": i, "source": path, "start": 0, "stop": -1}
        for i, path in enumerate(expand_urls(c.corpus))
    ]


def item_documents(spec: dict, item: dict, stats: CorpusStats):
    """(doc_id, sentences) of one item, as corpus.iter_documents gives them."""
    source = item["source"]
    if source == "builtin" or source.startswith("tfds:"):
        docs = corpus_lib.iter_documents(
            source, text_feature=spec["text_feature"], tfds_data_dir=spec["tfds_data_dir"]
        )
        docs = itertools.islice(docs, item["start"], item["stop"])
        stats.files += item["start"] == 0
    else:
        docs = corpus_lib.file_documents(source, spec["corpus_format"], stats, spec["text_feature"])
    for doc_id, doc in docs:
        stats.documents += 1
        stats.sentences += len(doc)
        yield doc_id, doc


def forced_document(spec: dict, items: list[dict]) -> list[str]:
    """The documents the held-out split keeps besides those their hash picks
    (sentences.forced_heldout), from the first documents of the items, in corpus order."""
    docs = (d for item in items for d, _ in item_documents(spec, item, CorpusStats()))
    return list(forced_heldout(docs, spec["heldout_fraction"]))


class _ShardBuilder:
    """Encoded chunks of one split of one item, cut into shards of about `shard_bytes`."""

    def __init__(self, spec: dict, item: int, split: str):
        self.spec, self.item, self.split = spec, item, split
        self.itemsize = np.dtype(spec["token_dtype"]).itemsize
        self.entries: list[dict] = []
        self.skipped = dict.fromkeys(COUNTS, 0)  # and the text's [UNK] and special tokens
        self._reset()

    def _reset(self):
        self.tokens, self.starts, self.lengths, self.doc_sizes, self.size = [], [], [], [], 0

    def add(self, chunk) -> None:
        tokens, starts, lengths, doc_sizes, counts = chunk
        for key, value in counts.items():
            self.skipped[key] += value
        if not len(doc_sizes):
            return
        self.tokens.append(tokens)
        self.starts.append(starts)
        self.lengths.append(lengths)
        self.doc_sizes.append(doc_sizes)
        self.size += len(tokens) * (self.itemsize + 1)
        if self.size >= self.spec["shard_bytes"]:
            self.flush()

    def flush(self) -> None:
        if not self.tokens:
            return
        lengths, doc_sizes = np.concatenate(self.lengths), np.concatenate(self.doc_sizes)
        # Sentence starts: cumulative lengths plus one [SEP] per document that ended before.
        begin = np.cumsum(lengths) - lengths + np.repeat(np.arange(len(doc_sizes)), doc_sizes)
        columns = {
            "tokens": np.concatenate(self.tokens),
            "word_starts": np.concatenate(self.starts),
            "sentences": np.stack([begin, begin + lengths], 1),
            "documents": np.concatenate([[0], np.cumsum(doc_sizes)]),
        }
        spec = self.spec
        body, entry = fmt.encode_shard(
            columns, spec["vocab_size"], spec["block_tokens"], spec["token_dtype"]
        )
        entry["path"] = f"{self.split}/{self.item:06d}-{len(self.entries):05d}.shard"
        url = fmt.join(spec["output"], entry["path"])
        if not fmt.shard_is_complete(url, entry):  # a killed run's identical shard stays
            fmt.write_file(url, body)
        self.entries.append(entry)
        self._reset()


def _record_url(spec: dict, index: int) -> str:
    return fmt.join(spec["output"], "items", f"{index:06d}.json")


def finished_record(spec: dict, item: dict) -> dict | None:
    """The record of an item a previous run finished (its shards complete), else None."""
    data = fmt.read_file(_record_url(spec, item["index"]))
    if data is None:
        return None
    record = json.loads(data)
    if record.get("item") != item or record.get("tokenizer") != spec["tokenizer_fingerprint"]:
        return None
    if record.get("document_ids") != DOCUMENT_IDS:  # split by another naming of documents
        return None
    if record.get("forced_heldout", []) != spec.get("forced_heldout", []):  # or another rule
        return None
    for entries in record["shards"].values():
        for entry in entries:
            if not fmt.shard_is_complete(fmt.join(spec["output"], entry["path"]), entry):
                return None
    return record


def prepare_item(spec: dict, item: dict, tokenizer) -> dict:
    """Tokenizes one item into shards (unless a previous run finished it); its record."""
    record = finished_record(spec, item)
    if record is not None:
        return record
    stats = CorpusStats()
    builders = {split: _ShardBuilder(spec, item["index"], split) for split in SPLITS}
    chunk_chars = max(1, min(CHUNK_CHARS, spec["shard_bytes"] // 2))
    pending = {split: [] for split in SPLITS}
    size = dict.fromkeys(SPLITS, 0)
    for doc_id, doc in item_documents(spec, item, stats):
        heldout = is_heldout(doc_id, spec["heldout_fraction"], spec.get("forced_heldout"))
        split = "eval" if heldout else "train"
        pending[split].append(doc)
        size[split] += sum(len(s) for s in doc)
        if size[split] >= chunk_chars:
            builders[split].add(encode_chunk(tokenizer, pending[split]))
            pending[split], size[split] = [], 0
    for split in SPLITS:
        if pending[split]:
            builders[split].add(encode_chunk(tokenizer, pending[split]))
        builders[split].flush()
    return item_record(spec, item, builders, stats)


def item_record(spec: dict, item: dict, builders: dict, stats: CorpusStats) -> dict:
    """Writes the record of a finished item (its shards, skip counts, corpus stats)."""
    record = {
        "item": item,
        "tokenizer": spec["tokenizer_fingerprint"],
        "document_ids": DOCUMENT_IDS,
        "forced_heldout": spec.get("forced_heldout", []),
        "shards": {split: b.entries for split, b in builders.items()},
        "skipped": {split: b.skipped for split, b in builders.items()},
        "stats": stats.as_dict(),
    }
    fmt.write_file(_record_url(spec, item["index"]), json.dumps(record).encode())
    return record


def write_manifest(records: list[dict], spec: dict) -> dict:
    """Assembles the manifest from every item's record, in item order, and writes it last."""
    records = sorted(records, key=lambda r: r["item"]["index"])
    splits = {}
    for split in SPLITS:
        shards = [e for r in records for e in r["shards"][split]]
        splits[split] = {
            key: sum(e[key] for e in shards) for key in ("documents", "sentences", "tokens")
        }
        for key in COUNTS:
            splits[split][key] = sum(r["skipped"][split].get(key, 0) for r in records)
        splits[split]["shards"] = shards
    stats = CorpusStats()
    for r in records:
        for key, value in r["stats"].items():
            setattr(stats, key, getattr(stats, key) + value)
    if splits["train"]["documents"] == 0:
        empty = f" (empty files skipped: {stats.empty_files})" if stats.empty_files else ""
        raise ValueError(f"corpus {spec['corpus']!r} yielded no training documents{empty}")
    keys = ("tokenizer_fingerprint", "tokenizer_file", "language", "lowercase", "vocab_size")
    manifest = {"format_version": fmt.FORMAT_VERSION, **{k: spec[k] for k in keys}}
    manifest.update(
        sep_id=spec["sep_id"],
        token_dtype=spec["token_dtype"],
        block_tokens=spec["block_tokens"],
        corpus=spec["corpus"],
        heldout_fraction=spec["heldout_fraction"],
        document_ids=DOCUMENT_IDS,
        forced_heldout=spec.get("forced_heldout", []),
        items=len(records),
        splits=splits,
        corpus_stats=stats.as_dict(),
    )
    fmt.write_file(fmt.join(spec["output"], fmt.MANIFEST), json.dumps(manifest, indent=1).encode())
    return manifest


def local_tokenizer(spec: dict, cache: str | None = None):
    """The store's tokenizer (its file under the output URL), for a worker: one thread, as the
    engine runs one worker per core."""
    from bertjax.data.tokenizer import Tokenizer

    local = paths.local_copy(fmt.join(spec["output"], spec["tokenizer_file"]), cache)
    return Tokenizer(local, language=spec["language"], lowercase=spec["lowercase"], num_threads=1)
