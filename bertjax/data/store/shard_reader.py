"""Reading one split of a sharded store (bertjax/data/store/shard_format.py) from a path or URL.

Opening reads the manifest and each shard's index region (document and sentence offsets, token
counts, block checksums), never the tokens; with ``index=False`` (the pipeline, every plan) only
the manifest, then each shard's block checksums on its first read and the index ranges of the
pieces a sentence plan builds (`piece_index`), so that the time to the first batch does not grow
with the store. `tokens` and `word_starts` are column views that
fetch, per gather, only the blocks holding the asked-for positions: adjacent
blocks go in one range request, all of a gather's requests at once (fsspec `cat_ranges`), each
block is checked against its CRC, and blocks stay in an LRU cache of bounded size. A host thus
reads about the bytes of its own rows; the batch prefetch thread (config.data.prefetch) is the
read-ahead. A local path (a gcsfuse mount too) is read the same way.
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading
import zlib

import numpy as np

from bertjax.data.store import shard_format as fmt
from bertjax.data.store.memmap import SPLITS

CACHE_BYTES = 256 << 20  # default bound of the block cache per split
COUNT_SHARDS = 16  # shards whose token counts stand for the store's before its index is loaded


class _Blocks:
    """Data-region blocks of every shard of a split, fetched by range and cached (LRU)."""

    def __init__(self, url, fs, shards, layouts, block_tokens, cache_bytes):
        self.url, self.fs, self.shards, self.layouts = url, fs, shards, layouts
        self.block_tokens, self.cache_bytes = block_tokens, cache_bytes
        self.crcs: dict[int, np.ndarray] = {}  # shard -> CRC-32 of its blocks, read on first use
        self.block_bytes = layouts[0]["block_bytes"] if layouts else 1
        root = fmt.filesystem(url)[1].rstrip("/")
        self.paths = [f"{root}/{s['path']}" for s in shards]
        self.cache: collections.OrderedDict = collections.OrderedDict()
        self.cached = 0
        self.lock = threading.Lock()
        self.bytes_read = 0  # bytes fetched from storage so far (blocks, checksums, counts)
        self.index_bytes_read = 0  # bytes of piece indexes fetched (documents, sentences)

    def sections(self, shards: list[int], name: str) -> list[bytes]:
        """One index section (index_layout's ``name``) of each of ``shards``, read at once."""
        if not shards:
            return []
        starts = [self.layouts[k][name][0] for k in shards]
        ends = [self.layouts[k][name][1] for k in shards]
        bodies = self.fs.cat_ranges([self.paths[k] for k in shards], starts, ends)
        for k, body, start, end in zip(shards, bodies, starts, ends):
            if isinstance(body, Exception):
                raise fmt.StoreError(
                    f"cannot read shard {self._name(k)} ({body!r}): the manifest lists it; "
                    "restore it or prepare the store again (complete shards are kept)"
                )
            self.bytes_read += len(body)
            if len(body) != end - start:
                raise fmt.StoreError(
                    f"shard {self._name(k)} is truncated: bytes [{start}, {end}) gave "
                    f"{len(body)}; the manifest says {self.shards[k]['bytes']} bytes: prepare "
                    "the store again (complete shards are kept)"
                )
        return bodies

    def ranges(self, shards: list[int], name: str, starts, ends) -> list[bytes]:
        """Byte ranges [start, end) of one index section of each of ``shards``, read at once."""
        base = [self.layouts[k][name][0] for k in shards]
        bodies = self.fs.cat_ranges(
            [self.paths[k] for k in shards],
            [b + s for b, s in zip(base, starts)],
            [b + e for b, e in zip(base, ends)],
        )
        for k, body, start, end in zip(shards, bodies, starts, ends):
            if isinstance(body, Exception) or len(body) != end - start:
                raise fmt.StoreError(
                    f"cannot read bytes [{start}, {end}) of the {name} of shard {self._name(k)} "
                    f"({body!r:.200}): restore it or prepare the store again"
                )
            self.index_bytes_read += len(body)
        return bodies

    def fetch(self, keys: np.ndarray) -> list[bytes]:
        """The blocks ``keys`` ([K, 2] unique (shard, block) pairs, sorted), in that order."""
        with self.lock:
            unknown = sorted({int(k) for k in np.unique(keys[:, 0])} - set(self.crcs))
        if unknown:  # block checksums of shards not read before (a few bytes per block)
            for k, body in zip(unknown, self.sections(unknown, "block_crc32")):
                with self.lock:
                    self.crcs[k] = np.frombuffer(body, "<u4")
        found: dict[tuple[int, int], bytes] = {}
        with self.lock:
            for shard, block in keys.tolist():
                data = self.cache.get((shard, block))
                if data is not None:
                    self.cache.move_to_end((shard, block))
                    found[(shard, block)] = data
        missing = [k for k in map(tuple, keys.tolist()) if k not in found]
        runs: list[list[tuple[int, int]]] = []  # adjacent blocks of one shard: one range request
        for key in missing:
            if runs and runs[-1][-1][0] == key[0] and runs[-1][-1][1] + 1 == key[1]:
                runs[-1].append(key)
            else:
                runs.append([key])
        if runs:
            starts, ends = [], []
            for run in runs:
                shard, first, last = run[0][0], run[0][1], run[-1][1]
                base = self.layouts[shard]["index_bytes"]
                starts.append(base + first * self.block_bytes)
                ends.append(min(base + (last + 1) * self.block_bytes, self.shards[shard]["bytes"]))
            bodies = self.fs.cat_ranges([self.paths[r[0][0]] for r in runs], starts, ends)
            for run, body, start, end in zip(runs, bodies, starts, ends):
                if isinstance(body, Exception):
                    raise fmt.StoreError(f"cannot read {self._name(run[0][0])}: {body}")
                self.bytes_read += len(body)
                if len(body) != end - start:
                    raise fmt.StoreError(
                        f"shard {self._name(run[0][0])} is truncated: bytes [{start}, {end}) "
                        f"gave {len(body)}; the manifest says {self.shards[run[0][0]]['bytes']} "
                        "bytes: prepare the store again (complete shards are kept)"
                    )
                for i, key in enumerate(run):
                    data = body[i * self.block_bytes : (i + 1) * self.block_bytes]
                    if zlib.crc32(data) != int(self.crcs[key[0]][key[1]]):
                        raise fmt.StoreError(
                            f"shard {self._name(key[0])}: block {key[1]} (bytes "
                            f"{start + i * self.block_bytes}..) fails its CRC-32 check: the file "
                            "is corrupted; delete it and rerun the prepare job to rewrite it"
                        )
                    found[key] = data
            with self.lock:
                for key in missing:
                    self.cache[key] = found[key]
                    self.cached += len(found[key])
                while self.cached > self.cache_bytes and len(self.cache) > 1:
                    self.cached -= len(self.cache.popitem(last=False)[1])
        return [found[k] for k in map(tuple, keys.tolist())]

    def _name(self, shard: int) -> str:
        return fmt.join(self.url, self.shards[shard]["path"])


class Column:
    """A read-only int64-indexable view of one column (tokens or word starts) of a split."""

    def __init__(self, blocks: _Blocks, offsets: np.ndarray, dtype, word_starts: bool):
        self.blocks, self.offsets, self.dtype = blocks, offsets, np.dtype(dtype)
        self.word_starts = word_starts
        self.shape = (int(offsets[-1]),)
        self.counts = np.diff(offsets)  # tokens of each shard
        self.itemsize = np.dtype(blocks.shards[0]["token_dtype"]).itemsize if blocks.shards else 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self)), dtype=np.int64)
        return self.gather(index, with_word_starts=False)[0]

    def gather(self, index, with_word_starts: bool = True) -> tuple[np.ndarray, ...]:
        """This column at ``index`` (and, ``with_word_starts``, the word starts there, from the
        same blocks: one read for both columns of a row)."""
        index = np.asarray(index, np.int64)
        if index.size and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"index out of range for a column of {len(self)} tokens")
        flat = index.reshape(-1)
        wanted = (self.word_starts, True) if with_word_starts else (self.word_starts,)
        if not flat.size:
            return tuple(np.zeros(index.shape, np.uint8 if w else self.dtype) for w in wanted)
        shard = np.searchsorted(self.offsets, flat, side="right") - 1
        n = self.blocks.block_tokens
        block, within = np.divmod(flat - self.offsets[shard], n)
        stride = int(block.max()) + 1  # (shard, block) as one int64: a fast 1-D unique
        combined, inverse = np.unique(shard * stride + block, return_inverse=True)
        keys = np.stack(np.divmod(combined, stride), 1)
        data = self.blocks.fetch(keys)
        starts = np.cumsum([0] + [len(d) for d in data])[:-1]
        buffer = np.frombuffer(b"".join(data), np.uint8)
        base = starts[inverse.reshape(-1)]
        out = []
        for word_starts in wanted:
            if word_starts:  # after the block's tokens; the last block of a shard is shorter
                byte = np.minimum(n, self.counts[shard] - block * n) * self.itemsize + within
                out.append(buffer[base + byte].reshape(index.shape))
                continue
            position = base + within * self.itemsize
            parts = buffer[position[:, None] + np.arange(self.itemsize)].copy()
            tokens = parts.view(np.dtype(f"<u{self.itemsize}")).reshape(index.shape)
            out.append(tokens.astype(self.dtype))
        return tuple(out)


class ShardedStore:
    """One split of a sharded store at a path or URL; the same interface as store.Store."""

    def __init__(
        self,
        url: str,
        split: str,
        tokenizer,
        cache_bytes: int = CACHE_BYTES,
        index: bool = True,
    ):
        """``index=False`` opens from the manifest alone: the document and sentence index of
        every shard is read on first use of `documents` / `sentences` (the pipeline never asks:
        it reads pieces, `piece_index`), block checksums per shard on its first read."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: must be one of {SPLITS}")
        self.url = self.directory = url.rstrip("/")
        self.split = split
        self.meta = manifest = fmt.read_manifest(self.url)
        fmt.check_tokenizer(self.url, manifest, tokenizer)
        self.vocab_size, block_tokens = manifest["vocab_size"], manifest["block_tokens"]
        dtype = np.dtype(manifest["token_dtype"])
        shards = [dict(s, token_dtype=dtype.name) for s in manifest["splits"][split]["shards"]]
        self.shards = shards
        self.fs, _ = fmt.filesystem(self.url)
        self.layouts = [
            fmt.index_layout(s, self.vocab_size, block_tokens, dtype.itemsize) for s in shards
        ]
        self._num_documents = sum(int(s["documents"]) for s in shards)
        offsets = np.concatenate([[0], np.cumsum([s["tokens"] for s in shards])]).astype(np.int64)
        self.blocks = _Blocks(self.url, self.fs, shards, self.layouts, block_tokens, cache_bytes)
        self.tokens = Column(self.blocks, offsets, dtype, word_starts=False)
        self.word_starts = Column(self.blocks, offsets, np.uint8, word_starts=True)
        self._index = None
        if index:
            self._load_index()

    def _load_index(self) -> dict:
        """Documents, sentences, token counts and block checksums of every shard."""
        if self._index is not None:
            return self._index
        shards, layouts = self.shards, self.layouts
        indexes = self._read_indexes(self.fs, shards, layouts)
        documents, sentences = [np.zeros(1, np.int64)], []
        counts = np.zeros(self.vocab_size, np.int64)
        token_base = sentence_base = 0
        for k, (shard, layout, index) in enumerate(zip(shards, layouts, indexes)):
            section = {
                name: np.frombuffer(index[slice(*layout[name])], dt)
                for name, dt in (
                    ("documents", "<i8"),
                    ("sentences", "<i8"),
                    ("token_counts", "<i8"),
                    ("block_crc32", "<u4"),
                )
            }
            documents.append(section["documents"][1:] + sentence_base)
            sentences.append(section["sentences"].reshape(-1, 2) + token_base)
            counts += section["token_counts"]
            self.blocks.crcs[k] = section["block_crc32"]
            token_base += shard["tokens"]
            sentence_base += shard["sentences"]
        self._index = {
            "documents": np.concatenate(documents),
            "sentences": (np.concatenate(sentences) if sentences else np.zeros((0, 2), np.int64)),
            "token_counts": counts,
        }
        return self._index

    @property
    def documents(self) -> np.ndarray:
        """[D + 1] int64 sentence offsets of each document (reads every shard's index once)."""
        return self._load_index()["documents"]

    @property
    def sentences(self) -> np.ndarray:
        """[S, 2] int64 token range of each sentence (reads every shard's index once)."""
        return self._load_index()["sentences"]

    def _read_indexes(self, fs, shards, layouts) -> list[bytes]:
        """Each shard's index region (one range request each, all at once), size-checked."""
        if not shards:
            return []
        names = [fmt.join(self.url, s["path"]) for s in shards]
        paths = [fmt.filesystem(n)[1] for n in names]
        sizes = {}
        for directory in sorted({p.rsplit("/", 1)[0] for p in paths}):
            for info in fs.ls(directory, detail=True):
                sizes[info["name"].rstrip("/")] = info["size"]
        for name, path, shard in zip(names, paths, shards):
            found = sizes.get(path, sizes.get(path.lstrip("/")))
            if found is None:
                raise fmt.StoreError(
                    f"shard {name} is missing: the manifest lists it; restore it or prepare the "
                    "store again (complete shards are kept)"
                )
            if found != shard["bytes"]:
                raise fmt.StoreError(
                    f"shard {name} has {found} bytes; the manifest says {shard['bytes']}: the file "
                    "is truncated or was replaced; delete it and rerun the prepare job"
                )
        bodies = fs.cat_ranges(paths, [0] * len(paths), [lay["index_bytes"] for lay in layouts])
        for name, body, shard in zip(names, bodies, shards):
            if isinstance(body, Exception) or zlib.crc32(body) != shard["index_crc32"]:
                raise fmt.StoreError(
                    f"shard {name}: its index region fails the manifest's CRC-32 check: the file "
                    "is corrupted; delete it and rerun the prepare job to rewrite it"
                )
        return bodies

    def shard_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """([shards] documents, [shards] tokens) from the manifest."""
        documents = np.asarray([s["documents"] for s in self.shards], np.int64)
        return documents, np.asarray([s["tokens"] for s in self.shards], np.int64)

    def piece_index(self, shard: int, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Documents first..end-1 of one shard: (their sentence offsets from 0 [n + 1], their
        sentences' global token ranges [S, 2]), read as two ranges of the shard's index (not
        checked against the index's CRC, which covers the whole region: checked for order)."""
        if self._index is not None:
            documents = self._index["documents"]
            lo = int(sum(int(s["documents"]) for s in self.shards[:shard])) + first
            docs = np.asarray(documents[lo : lo + end - first + 1], np.int64)
            return docs - docs[0], self._index["sentences"][docs[0] : docs[-1]]
        (docs,) = self.blocks.ranges([shard], "documents", [8 * first], [8 * (end + 1)])
        docs = np.frombuffer(docs, "<i8").astype(np.int64)
        lo, hi = int(docs[0]), int(docs[-1])
        (sentences,) = self.blocks.ranges([shard], "sentences", [16 * lo], [16 * hi])
        sentences = np.frombuffer(sentences, "<i8").reshape(-1, 2) + self.tokens.offsets[shard]
        if np.any(np.diff(docs) < 0) or np.any(sentences[:, 1] < sentences[:, 0]):
            raise fmt.StoreError(
                f"shard {self.blocks._name(shard)}: its index is not in order at documents "
                f"{first}..{end - 1}: the file is corrupted; delete it and rerun the prepare job"
            )
        return docs - lo, sentences

    @property
    def fingerprint(self) -> str:
        """A stable hash of the manifest's data description (tokenizer, corpus, counts)."""
        meta = {k: v for k, v in self.meta.items() if k not in ("tokenizer_file", "created")}
        return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def num_documents(self) -> int:
        return self._num_documents

    def document_sentences(self, doc: int) -> tuple[int, int]:
        return int(self.documents[doc]), int(self.documents[doc + 1])

    def token_counts(self, max_tokens: int | None = None, chunk: int = 0) -> np.ndarray:
        """[V] int64 occurrences of each token id from the shard indexes (no token is read):
        exact once the index is loaded; otherwise the sum over at most `COUNT_SHARDS` evenly
        strided shards (all of them in a smaller store), so that opening stays constant."""
        if self._index is not None:
            return self._index["token_counts"].copy()
        chosen = sorted({int(i) for i in np.linspace(0, len(self.shards) - 1, COUNT_SHARDS)})
        chosen = chosen if self.shards else []
        sections = self.blocks.sections(chosen, "token_counts")
        counts = np.zeros(self.vocab_size, np.int64)
        for body in sections:
            counts += np.frombuffer(body, "<i8")
        return counts
