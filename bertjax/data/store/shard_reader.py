"""Reading one split of a sharded store (bertjax/data/store/shard_format.py) from a path or URL.

Opening reads the manifest and each shard's index region (document and sentence offsets, token
counts, block checksums), never the tokens; with ``index=False`` (the pipeline, every plan) only
the manifest, then the index ranges of the pieces a sentence plan builds (`piece_indexes`, the
pieces of a window together) and the checksums of the blocks it reads, with them, so that the
time to the first batch does not grow with the store. `tokens` and `word_starts` are column
views that fetch, per gather, only the blocks holding the asked-for positions (block_cache.py:
runs of blocks per shard, one read for all, each block checked against its CRC, an LRU cache of
bounded size shared by every thread). A host thus reads about the bytes of its own rows; the
pipeline gathers the rows of several batches at once (`gather_many`). A local path (a gcsfuse
mount too) is read the same way.
"""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np

from bertjax import retry
from bertjax.data.store import shard_format as fmt
from bertjax.data.store.block_cache import BlockCache, RangeReader
from bertjax.data.store.cache_budget import CacheBudget
from bertjax.data.store.memmap import SPLITS

CACHE_BYTES = 256 << 20  # default bound of a split's block cache opened alone (no pipeline)
COUNT_SHARDS = 16  # shards whose token counts stand for the store's before its index is loaded


class Column:
    """A read-only int64-indexable view of one column (tokens or word starts) of a split."""

    def __init__(self, blocks: BlockCache, offsets: np.ndarray, dtype, word_starts: bool):
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

    def gather_many(self, indexes) -> list[tuple[np.ndarray, np.ndarray]]:
        """`gather` (with word starts) of each of ``indexes``, their blocks fetched in one read."""
        indexes = [np.asarray(i, np.int64) for i in indexes]
        joined = np.concatenate([i.reshape(-1) for i in indexes] or [np.zeros(0, np.int64)])
        columns = self.gather(joined)
        bounds = np.cumsum([0] + [i.size for i in indexes])
        return [
            tuple(c[a:b].reshape(i.shape) for c in columns)
            for i, a, b in zip(indexes, bounds[:-1], bounds[1:])
        ]


class ShardedStore:
    """One split of a sharded store at a path or URL; the same interface as store.Store."""

    def __init__(
        self,
        url: str,
        split: str,
        tokenizer,
        cache_bytes: int = CACHE_BYTES,
        index: bool = True,
        read_threads: int = 16,
        gap_blocks: int = 0,
        manifest: dict | None = None,
    ):
        """``index=False`` opens from the manifest alone: the document and sentence index of
        every shard is read on first use of `documents` / `sentences` (the pipeline never asks:
        it reads pieces, `piece_indexes`), the checksums of blocks with the blocks.
        ``read_threads``: threads reading one fetch's ranges on a synchronous filesystem;
        ``gap_blocks``: blocks a fetch reads between two it needs rather than send two ranges
        (block_cache.py); ``manifest``: the store's manifest, read already (the pipeline reads
        it once for the tokenizer and both splits: it grows with the store, a line a shard)."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: must be one of {SPLITS}")
        self.url = self.directory = url.rstrip("/")
        self.split = split
        self.meta = manifest = manifest or fmt.read_manifest(self.url)
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
        self.reader = RangeReader(self.fs, read_threads)
        self.blocks = BlockCache(self.url, self.reader, shards, self.layouts, block_tokens,
                                 cache_bytes, gap_blocks)  # fmt: skip
        self.tokens = Column(self.blocks, offsets, dtype, word_starts=False)
        self.word_starts = Column(self.blocks, offsets, np.uint8, word_starts=True)
        self._index = None
        if index:
            self._load_index()

    def set_reads(self, cache, read_threads: int, gap_bytes: int) -> None:
        """The block cache's bound (bytes, or a `CacheBudget` shared with the process's other
        caches), the threads of a read on a synchronous filesystem, and the gap (bytes) across
        which a read joins two runs of blocks (read_settings.py)."""
        self.blocks.use_budget(cache if isinstance(cache, CacheBudget) else CacheBudget(cache))
        self.reader.threads = max(1, int(read_threads))
        self.blocks.gap_blocks = int(gap_bytes) // max(1, self.blocks.block_bytes)

    def close(self, timeout_s: float | None = None) -> None:
        """Stops its read threads (a read hung past ``timeout_s`` is left behind) and drops its
        cached blocks (reopened on a later read)."""
        self.reader.close(timeout_s)
        self.blocks.release()

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
            self.blocks.set_crcs(k, section["block_crc32"])
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
            listed = retry.call(fs.unstrip_protocol(directory), fs.ls, directory, detail=True)
            for info in listed:
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
        ends = [lay["index_bytes"] for lay in layouts]
        bodies = self.reader.read(paths, [0] * len(paths), ends)
        bodies = [
            self.blocks._check(k, b, 0, e, "the index")
            for k, (b, e) in enumerate(zip(bodies, ends))
        ]
        for name, body, shard in zip(names, bodies, shards):
            if zlib.crc32(body) != shard["index_crc32"]:
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
        """Documents first..end-1 of one shard: `piece_indexes` of one piece."""
        return self.piece_indexes([(shard, first, end)])[0]

    def piece_indexes(self, pieces) -> list[tuple[np.ndarray, np.ndarray]]:
        """Of each (shard, first, end) of ``pieces``, documents first..end-1 of that shard: (their
        sentence offsets from 0 [n + 1], their sentences' global token ranges [S, 2]); read as
        two rounds of ranges for all the pieces together (their document offsets, then their
        sentences), not checked against the index's CRC, which covers the whole region: checked
        for order."""
        if self._index is not None:
            documents, out = self._index["documents"], []
            for shard, first, end in pieces:
                lo = int(sum(int(s["documents"]) for s in self.shards[:shard])) + first
                docs = np.asarray(documents[lo : lo + end - first + 1], np.int64)
                out.append((docs - docs[0], self._index["sentences"][docs[0] : docs[-1]]))
            return out
        shards = [shard for shard, _, _ in pieces]
        docs = self.blocks.ranges(shards, "documents", [8 * first for _, first, _ in pieces],
                                  [8 * (end + 1) for _, _, end in pieces])  # fmt: skip
        docs = [np.frombuffer(d, "<i8").astype(np.int64) for d in docs]
        sentences = self.blocks.ranges(shards, "sentences", [16 * int(d[0]) for d in docs],
                                       [16 * int(d[-1]) for d in docs])  # fmt: skip
        out = []
        for (shard, first, end), d, body in zip(pieces, docs, sentences):
            sentence = np.frombuffer(body, "<i8").reshape(-1, 2) + self.tokens.offsets[shard]
            if np.any(np.diff(d) < 0) or np.any(sentence[:, 1] < sentence[:, 0]):
                raise fmt.StoreError(
                    f"shard {self.blocks.name(shard)}: its index is not in order at documents "
                    f"{first}..{end - 1}: the file is corrupted; delete it and rerun the prepare "
                    "job"
                )
            out.append((d - d[0], sentence))
        return out

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
