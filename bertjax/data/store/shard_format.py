"""The sharded token store: bertjax's store columns cut into shard files plus a manifest, on any
path or URL (local, file://, gs://, s3://), made once by `python -m bertjax.data.prepare`.

Layout under the store URL (manifest.json is written last, in one atomic write; a store without
it is never read):
  manifest.json               format version, tokenizer fingerprint and file, counts, block size,
                              every shard with its byte size, SHA-256 and row counts, per split
  tokenizer/<model file>      the tokenizer the store was made with
  items/<item>.json           one per finished unit of preparation work (a file, a block of
                              documents): the shards it wrote; a rerun skips such items
  <split>/<item>-<part>.shard the shards of a split, in corpus order

One shard holds whole documents, in this byte order (all little-endian):
  documents    int64  [D + 1]  sentence offsets of each document, from 0
  sentences    int64  [S, 2]   token range [start, end) of each sentence, from 0
  token_counts int64  [V]      occurrences of each token id
  block_crc32  uint32 [NB]     CRC-32 of each block of the data region
  data region  NB blocks of `block_tokens` tokens (the last one shorter): the block's tokens
               (uint16 | uint32; each document's tokens, then [SEP]), then their word starts
               (uint8), so one range read gives both columns of a row
The index region (everything before the data) is what a reader loads at startup; the data region
is read by byte ranges, whole blocks, each checked against its CRC. Global indices are
int64: shard k's tokens follow shard k-1's, so the concatenated columns equal the local store's
(bertjax/data/store/memmap.py) for the same corpus and tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib

import numpy as np

from bertjax import paths, retry

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_BYTES = 512 << 20  # default shard size (data region); 0.5 GB
BLOCK_TOKENS = 16 << 10  # default tokens per read/checksum block (48 KiB with uint16 tokens)


class StoreError(ValueError):
    """A sharded store that cannot be used as it is (the message names the file and what to do)."""


def filesystem(url: str):
    """(fsspec filesystem, path inside it) of a local path or URL."""
    import fsspec

    if "://" not in url:
        url = os.path.abspath(url)
    return fsspec.core.url_to_fs(url)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def token_dtype(vocab_size: int):
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def index_layout(entry: dict, vocab_size: int, block_tokens: int, itemsize: int) -> dict:
    """Byte offsets of each section of a shard from its counts (see the module docstring)."""
    d, s, t = entry["documents"], entry["sentences"], entry["tokens"]
    data_bytes = t * itemsize + t
    blocks = -(-t // block_tokens)
    out, offset = {}, 0
    for name, size in (
        ("documents", 8 * (d + 1)),
        ("sentences", 16 * s),
        ("token_counts", 8 * vocab_size),
        ("block_crc32", 4 * blocks),
    ):
        out[name] = (offset, offset + size)
        offset += size
    out["index_bytes"], out["data_bytes"], out["blocks"] = offset, data_bytes, blocks
    out["block_bytes"] = block_tokens * (itemsize + 1)  # of every block but the last
    out["file_bytes"] = offset + data_bytes
    return out


def encode_shard(columns: dict, vocab_size: int, block_tokens: int, dtype) -> tuple[bytes, dict]:
    """A shard's bytes and its manifest entry (without path) from its columns: tokens,
    word_starts, sentences [S, 2] and documents [D + 1] (offsets from 0)."""
    tokens = np.asarray(columns["tokens"]).astype(dtype)
    starts = np.asarray(columns["word_starts"], np.uint8)
    blocks = [
        tokens[i : i + block_tokens].tobytes() + starts[i : i + block_tokens].tobytes()
        for i in range(0, len(tokens), block_tokens)
    ]
    crcs = np.fromiter((zlib.crc32(b) for b in blocks), np.uint32, len(blocks))
    data = b"".join(blocks)
    counts = np.bincount(tokens, minlength=vocab_size)[:vocab_size].astype(np.int64)
    index = b"".join(
        [
            np.asarray(columns["documents"], np.int64).tobytes(),
            np.asarray(columns["sentences"], np.int64).reshape(-1, 2).tobytes(),
            counts.tobytes(),
            crcs.tobytes(),
        ]
    )
    body = index + data
    entry = {
        "documents": len(columns["documents"]) - 1,
        "sentences": int(np.asarray(columns["sentences"]).reshape(-1, 2).shape[0]),
        "tokens": len(tokens),
        "bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "index_crc32": zlib.crc32(index),
    }
    return body, entry


def write_file(url: str, data: bytes) -> None:
    """Writes a whole file so that no reader sees part of it: a local file as `paths.write_bytes`
    does (beside, under a name no other writer uses, synced, renamed); an object store's single
    upload is atomic (tried again on transient errors: bertjax/retry.py)."""
    fs, path = filesystem(url)
    if fs.protocol in ("file", ("file", "local")) or "file" in fs.protocol:
        paths.write_bytes(path, data)
        return
    retry.call(url, fs.pipe_file, path, data)


def read_file(url: str) -> bytes | None:
    """The bytes of a file (tried again on transient errors); None when it does not exist."""
    fs, path = filesystem(url)
    try:
        return retry.call(url, fs.cat_file, path)
    except FileNotFoundError:
        return None


def shard_is_complete(url: str, entry: dict) -> bool:
    """Whether a shard file exists with the size and SHA-256 its entry records."""
    data = read_file(url)
    return (
        data is not None
        and len(data) == entry["bytes"]
        and hashlib.sha256(data).hexdigest() == entry["sha256"]
    )


def read_manifest(url: str) -> dict:
    """The manifest of a complete store; one clear error otherwise."""
    where = join(url, MANIFEST)
    data = read_file(where)
    if data is None:
        raise StoreError(
            f"{where} does not exist: {url!r} is not a prepared store, or its prepare job did "
            "not finish; run `python -m bertjax.data.prepare --config=CONFIG "
            f"--output={url}` (a rerun keeps the shards already written)"
        )
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise StoreError(f"{where} is not valid JSON ({e}); rerun the prepare job") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise StoreError(
            f"{where} has format_version={manifest.get('format_version')!r}; this bertjax reads "
            f"version {FORMAT_VERSION}: prepare the store again with this version"
        )
    return manifest


def check_tokenizer(url: str, manifest: dict, tokenizer) -> None:
    """Stops when ``tokenizer`` is not the one the store was made with."""
    if (
        manifest["tokenizer_fingerprint"] != tokenizer.fingerprint()
        or manifest["language"] != tokenizer.language
    ):
        raise StoreError(
            f"store {url!r} was prepared with tokenizer {manifest['tokenizer_fingerprint']} "
            f"({manifest['tokenizer_file']}, language={manifest['language']}) but the configured "
            f"tokenizer is {tokenizer.fingerprint()} ({tokenizer.path}, "
            f"language={tokenizer.language}): leave config.data.tokenizer_model/hf_vocab empty to "
            "use the store's own tokenizer, or prepare a store with this one"
        )
