"""Importing pre-tokenized MDS shards (mosaicml-streaming's format, in which Ettin and mmBERT
publish their data) into a sharded store, without mosaicml-streaming.

    from bertjax.data.store import mds_import
    mds_import.import_mds("gs://B/ettin/mds", "gs://B/stores/ettin", "gs://B/tok/tokenizer.json",
                          column="input_ids")

MDS, as its writer lays it out: DIR/index.json lists the shards ("raw_data": {"basename"},
"column_names"/"column_encodings"/"column_sizes" sorted by name, "compression"); a shard is
uint32 n, uint32 offsets[n + 1] (from the file start), the shard's JSON config, then the
samples; a sample is one uint32 size per variable-size column, then the columns' bytes in name
order. Token columns may be "ndarray:<uint dtype>[:<shape>]" (a shape-less one starts with one
byte ndim << 2 | shape-dtype code and the shape), "ndarray" (one more leading dtype byte) or
"bytes" (raw little-endian ids of `bytes_dtype`). Each sample becomes one document of one
"sentence" (there are no sentence boundaries in token ids), followed by [SEP]; word starts come
from the tokenizer's pieces. Train with a single-segment plan (full_sentences / doc_sentences).
"""

from __future__ import annotations

import json

import numpy as np

from bertjax import paths
from bertjax.data.store import shard_format as fmt
from bertjax.data.store import shard_writer
from bertjax.data.store.memmap import SPLITS
from bertjax.data.text.sentences import CorpusStats

_VALUE_DTYPES = {8: "uint8", 16: "uint16", 32: "uint32", 64: "uint64", 33: "int32", 65: "int64"}
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}


def _decode(encoding: str, data: bytes, bytes_dtype: str) -> np.ndarray:
    """Token ids of one column value."""
    if encoding == "bytes":
        return np.frombuffer(data, np.dtype(bytes_dtype).newbyteorder("<"))
    parts = encoding.split(":")
    if parts[0] != "ndarray":
        raise ValueError(f"MDS column encoding {encoding!r} does not hold token ids")
    at = 0
    if len(parts) >= 2:
        dtype = parts[1]
    else:
        dtype, at = _VALUE_DTYPES[data[0]], 1
    if len(parts) < 3:  # a dynamic shape: ndim << 2 | shape dtype code, then the shape
        code = data[at]
        ndim, shape_dtype = code >> 2, np.dtype(_SHAPE_DTYPES[code & 3])
        at += 1 + ndim * shape_dtype.itemsize
    return np.frombuffer(data[at:], np.dtype(dtype).newbyteorder("<")).reshape(-1)


def mds_samples(directory: str, column: str, bytes_dtype: str = "uint16"):
    """(shard basename, [token id arrays]) of every shard of an MDS dataset, in index order."""
    index_url = fmt.join(directory, "index.json")
    data = fmt.read_file(index_url)
    if data is None:
        raise FileNotFoundError(f"{index_url} does not exist: not an MDS dataset directory")
    for shard in json.loads(data)["shards"]:
        name = shard["raw_data"]["basename"]
        if shard.get("compression"):
            raise ValueError(
                f"{directory}/{name}: compressed MDS shards ({shard['compression']}) are not read; "
                "decompress them first (streaming's zip_data → raw_data)"
            )
        if shard.get("format") != "mds" or column not in shard["column_names"]:
            raise ValueError(
                f"{directory}/{name}: no MDS column {column!r}; columns: {shard['column_names']}"
            )
        body = fmt.read_file(fmt.join(directory, name))
        n = int(np.frombuffer(body[:4], "<u4")[0])
        offsets = np.frombuffer(body[4 : 8 + 4 * n], "<u4").astype(np.int64)
        names, encodings, sizes = (
            shard["column_names"],
            shard["column_encodings"],
            shard["column_sizes"],
        )
        variable = [s is None for s in sizes]
        samples = []
        for i in range(n):
            sample = body[offsets[i] : offsets[i + 1]]
            count = sum(variable)
            lengths = np.frombuffer(sample[: 4 * count], "<u4").tolist()
            at, k = 4 * count, 0
            for name_, encoding, size in zip(names, encodings, sizes):
                width = size if size is not None else lengths[k]
                k += size is None
                if name_ == column:
                    samples.append(_decode(encoding, sample[at : at + width], bytes_dtype))
                at += width
        yield name, samples


def import_mds(
    directory: str,
    output: str,
    tokenizer_path: str,
    *,
    column: str = "input_ids",
    bytes_dtype: str = "uint16",
    heldout_every: int = 0,
    shard_bytes: int = fmt.SHARD_BYTES,
    block_tokens: int = fmt.BLOCK_TOKENS,
) -> dict:
    """Writes the MDS dataset at ``directory`` as a sharded store at ``output`` (one unit of work
    per MDS shard, as the Beam job's units: a rerun keeps finished ones); its manifest.
    ``heldout_every``: every n-th sample goes to the eval split (0: none)."""
    from bertjax.data.tokenizer import Tokenizer

    output = paths.resolve(output).rstrip("/")
    tokenizer = Tokenizer(paths.local_copy(paths.resolve(tokenizer_path)))
    name = tokenizer_path.rstrip("/").rsplit("/", 1)[-1]
    fmt.write_file(fmt.join(output, "tokenizer", name), open(tokenizer.path, "rb").read())
    spec = {
        "output": output,
        "corpus": f"mds {directory} column={column}",
        "heldout_fraction": 0.0,
        "language": tokenizer.language,
        "lowercase": tokenizer.lowercase,
        "shard_bytes": shard_bytes,
        "block_tokens": block_tokens,
        "tokenizer_file": f"tokenizer/{name}",
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "sep_id": tokenizer.sep_id,
        "token_dtype": fmt.token_dtype(tokenizer.vocab_size).name,
    }
    records, seen = [], 0
    for index, (shard, samples) in enumerate(mds_samples(directory, column, bytes_dtype)):
        item = {"index": index, "source": f"{directory}/{shard}", "start": 0, "stop": -1}
        record = shard_writer.finished_record(spec, item)
        if record is None:
            builders = {s: shard_writer._ShardBuilder(spec, index, s) for s in SPLITS}
            for i, ids in enumerate(samples):
                heldout = heldout_every and (seen + i) % heldout_every == heldout_every - 1
                builders["eval" if heldout else "train"].add(_chunk(tokenizer, ids))
            for builder in builders.values():
                builder.flush()
            n = len(samples)
            stats = CorpusStats(files=1, documents=n, sentences=n)
            record = shard_writer.item_record(spec, item, builders, stats)
        records.append(record)
        seen += len(samples)
    return shard_writer.write_manifest(records, spec)


def _chunk(tokenizer, ids: np.ndarray):
    """encode_chunk's tuple for one pre-tokenized document of one sentence."""
    ids = np.asarray(ids, np.int64)
    lengths = np.array([len(ids)], np.int64)
    unknown = int((ids == tokenizer.unk_id).sum())
    counts = {
        "empty_sentences_dropped": int(not len(ids)),
        "empty_documents_dropped": int(not len(ids)),
        "unk_tokens": unknown,
        "special_tokens": int(tokenizer.special[ids].sum()) - unknown,
    }
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.uint8), lengths[:0], lengths[:0], counts
    starts = tokenizer.word_starts(ids, lengths)
    tokens = np.append(ids, tokenizer.sep_id)
    return tokens, np.append(starts, True).astype(np.uint8), lengths, np.ones(1, np.int64), counts
