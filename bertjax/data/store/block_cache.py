"""The data-region blocks of a sharded store's split, read by range and kept in a bounded LRU cache,
for any number of threads at once.

A fetch groups the blocks it lacks into runs, one per shard stretch: adjacent blocks, and blocks
at most `gap_blocks` apart with the blocks between them (read, checked and cached as well: a
range costs a round trip, a few blocks more cost little); each run is one range, plus one range
of the CRC-32s of its blocks unless the shard's index was loaded. All of a fetch's ranges go in
one `RangeReader.read`. Blocks another thread is reading, a gap's blocks included, are waited
for, never read twice (the reads ahead of a first batch start together and ask for the same
blocks: each read the same gaps again before, a range each); a block enters the cache once (its
bytes counted once), and is evicted to the bound after every insert: the cache's own
(`cache_bytes`), or a `CacheBudget` the process's caches share (cache_budget.py: the least
recently used block of any of them goes first).

`RangeReader` sends the ranges of one read in flight together: an asynchronous filesystem
(gcsfs, s3fs: `async_impl`) does so itself in one `cat_ranges` call; a synchronous one (a local
path, which a gcsfuse mount is) reads a call's ranges one after another, so they are spread over
`threads` threads (started on the first such read, stopped by `close`). It counts requests
(calls, or ranges on a synchronous filesystem) and ranges.
Ranges that fail with a transient error (bertjax/retry.py) are sent again, those alone, with
backoff, until the retry budget has passed (then `StorageUnavailable`); a missing or short shard
or a block that fails its CRC is a bad store (`StoreError`), any other error a refused request.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import zlib

import numpy as np

from bertjax import retry
from bertjax.data.store import shard_format as fmt
from bertjax.data.store.cache_budget import CacheBudget


class RangeReader:
    """Byte ranges of files of one filesystem, in flight together; counts what it sends."""

    def __init__(self, fs, threads: int = 16):
        self.fs = fs
        self.concurrent = bool(getattr(fs, "async_impl", False))
        self.threads = max(1, int(threads))
        self._pool = None
        self._lock = threading.Lock()
        self.requests = 0  # round trips asked for (a call; a range on a synchronous filesystem)
        self.ranges = 0  # byte ranges asked for (object storage bills each as a request)

    def read(self, paths: list, starts: list, ends: list) -> list:
        """The bytes of each range [start, end) of ``paths``, or the error storage answered for
        it when that error is not transient (a missing file). Ranges that fail with a transient
        error are sent again, only those, until the retry budget has passed
        (bertjax/retry.py); then `StorageUnavailable` names the first of them."""
        out: list = [None] * len(paths)
        todo = list(range(len(paths)))
        attempt = retry.current().attempt()
        while True:
            bodies = self._send(
                [paths[i] for i in todo], [starts[i] for i in todo], [ends[i] for i in todo]
            )
            for i, body in zip(todo, bodies):
                out[i] = body
            failed = [i for i in todo if isinstance(out[i], Exception)]
            failed = [i for i in failed if retry.is_transient(out[i])]
            if not failed:
                attempt.succeeded(len(todo))
                return out
            first = failed[0]
            where = f"{self._url(paths[first])} bytes [{starts[first]}, {ends[first]})"
            attempt.failed(out[first], where, requests=len(failed))
            todo = failed

    def _url(self, path: str) -> str:
        unstrip = getattr(self.fs, "unstrip_protocol", None)
        return unstrip(path) if unstrip is not None else path

    def _send(self, paths: list, starts: list, ends: list) -> list:
        """One try of each range: its bytes or its error (a call that raises a transient error
        gives it for each of its ranges)."""
        with self._lock:
            self.ranges += len(paths)
            self.requests += 1 if self.concurrent else len(paths)
        if self.concurrent or self.threads == 1 or len(paths) <= 1:
            return _bodies(self.fs.cat_ranges, paths, starts, ends)
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, "bertjax-ranges")
            pool = self._pool
        parts = np.array_split(np.arange(len(paths)), min(self.threads, len(paths)))
        futures = [
            pool.submit(
                _bodies,
                self.fs.cat_ranges,
                [paths[i] for i in part],
                [starts[i] for i in part],
                [ends[i] for i in part],
            )
            for part in parts
        ]
        return [body for future in futures for body in future.result()]

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.requests, self.ranges

    def close(self, timeout_s: float | None = None) -> bool:
        """Stops its threads, once the reads running end (a later read starts them again), or
        after ``timeout_s`` (None: no limit): a read hung in storage is left behind, its thread
        ending when the read returns or with the process. Whether every thread ended."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return True
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in list(getattr(pool, "_threads", ())):  # the executor's own threads
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return True


def _bodies(cat_ranges, paths: list, starts: list, ends: list) -> list:
    """``cat_ranges(paths, starts, ends)``; a transient error raised by the call stands for each
    range's answer (any other is raised)."""
    try:
        return cat_ranges(paths, starts, ends)
    except Exception as error:  # noqa: BLE001
        if not retry.is_transient(error):
            raise
        return [error] * len(paths)


class _Pending:
    """Blocks one fetch is reading: other fetches wait for them here."""

    def __init__(self):
        self.done = threading.Event()
        self.data: dict[tuple[int, int], bytes] = {}
        self.error: Exception | None = None


class BlockCache:
    """Data-region blocks of every shard of a split, fetched by range and cached (LRU); the
    bound is ``cache_bytes``, or a `CacheBudget` shared with other caches (``budget``)."""

    def __init__(
        self,
        url,
        reader: RangeReader,
        shards,
        layouts,
        block_tokens,
        cache_bytes,
        gap_blocks: int = 0,
        budget: CacheBudget | None = None,
    ):
        self.url, self.reader, self.shards, self.layouts = url, reader, shards, layouts
        self.block_tokens = block_tokens
        self.budget = budget if budget is not None else CacheBudget(cache_bytes)
        self.gap_blocks = int(gap_blocks)
        self.crcs: dict[int, np.ndarray] = {}  # shard -> CRC-32 of its blocks (0 = not known)
        self._known: dict[int, np.ndarray] = {}  # shard -> which of those were read
        self.block_bytes = layouts[0]["block_bytes"] if layouts else 1
        root = fmt.filesystem(url)[1].rstrip("/")
        self.paths = [f"{root}/{s['path']}" for s in shards]
        self.cache: collections.OrderedDict = collections.OrderedDict()
        self.cached = 0  # bytes held by the cache
        self.lock = self.budget.lock
        self._pending: dict[tuple[int, int], _Pending] = {}
        self.bytes_read = 0  # bytes fetched from storage so far (blocks, checksums, counts)
        self.index_bytes_read = 0  # bytes of piece indexes fetched (documents, sentences)

    def set_crcs(self, shard: int, crcs: np.ndarray) -> None:
        """Every block checksum of ``shard`` (from its loaded index)."""
        self.crcs[shard] = np.asarray(crcs, np.uint32)
        self._known[shard] = np.ones(len(crcs), bool)

    def _check(self, k: int, body, start: int, end: int, what: str) -> bytes:
        """``body`` as read from shard ``k``, or one error: a missing or short file is a bad store
        (`fmt.StoreError`: restore it or prepare again); any other error storage answered (a
        refused request: transient errors never get here, `RangeReader.read` retried them) is
        not, and is raised naming the shard."""
        if isinstance(body, FileNotFoundError):
            raise fmt.StoreError(
                f"shard {self.name(k)} is missing ({body!r:.200}): the manifest lists it; restore "
                "it or prepare the store again (complete shards are kept)"
            )
        if isinstance(body, Exception):
            raise OSError(
                f"cannot read {what} of shard {self.name(k)}: storage refused the request "
                f"({type(body).__name__}: {str(body)[:200]}), not a transient error, so it was not "
                "retried: check the store's URL and this host's access to it"
            ) from body
        if len(body) != end - start:
            raise fmt.StoreError(
                f"shard {self.name(k)} is truncated: bytes [{start}, {end}) gave {len(body)}; the "
                f"manifest says {self.shards[k]['bytes']} bytes: prepare the store again "
                "(complete shards are kept)"
            )
        return body

    def sections(self, shards: list[int], name: str) -> list[bytes]:
        """One index section (index_layout's ``name``) of each of ``shards``, read at once."""
        if not shards:
            return []
        starts = [self.layouts[k][name][0] for k in shards]
        ends = [self.layouts[k][name][1] for k in shards]
        bodies = self.reader.read([self.paths[k] for k in shards], starts, ends)
        out = [self._check(k, *args, name) for k, *args in zip(shards, bodies, starts, ends)]
        with self.lock:
            self.bytes_read += sum(len(b) for b in out)
        return out

    def ranges(self, shards: list[int], name: str, starts, ends) -> list[bytes]:
        """Byte ranges [start, end) of one index section of each of ``shards``, read at once."""
        if not shards:
            return []
        base = [self.layouts[k][name][0] for k in shards]
        starts = [b + s for b, s in zip(base, starts)]
        ends = [b + e for b, e in zip(base, ends)]
        bodies = self.reader.read([self.paths[k] for k in shards], starts, ends)
        out = [
            self._check(k, *args, f"the {name}") for k, *args in zip(shards, bodies, starts, ends)
        ]
        with self.lock:
            self.index_bytes_read += sum(len(b) for b in out)
        return out

    def fetch(self, keys: np.ndarray) -> list[bytes]:
        """The blocks ``keys`` ([K, 2] unique (shard, block) pairs, sorted), in that order."""
        wanted = list(map(tuple, np.asarray(keys).tolist()))
        found: dict[tuple[int, int], bytes] = {}
        waits: dict[int, _Pending] = {}
        mine = _Pending()
        claimed: list[tuple[int, int]] = []  # blocks this fetch reads: others wait for them
        with self.lock:
            missing = []
            for key in wanted:
                data = self.cache.get(key)
                if data is not None:
                    self.budget.used(self, key)
                    found[key] = data
                elif key in self._pending:
                    waits[id(self._pending[key])] = self._pending[key]
                else:
                    missing.append(key)
            runs = self._runs(missing)
            for shard, first, last in runs:  # a gap's blocks too: read here, never twice
                for block in range(first, last + 1):
                    key = (shard, block)
                    if key not in self.cache and key not in self._pending:
                        self._pending[key] = mine
                        claimed.append(key)
        if runs:
            try:
                mine.data = self._read(runs)
            except Exception as e:  # the waiters raise it too
                mine.error = e
                raise
            finally:
                with self.lock:
                    for key in claimed:
                        self._pending.pop(key, None)
                    if mine.error is None:
                        self._insert(mine.data)
                mine.done.set()
            found.update(mine.data)
        for pending in waits.values():
            pending.done.wait()
            if pending.error is not None:
                raise pending.error
            found.update(pending.data)
        return [found[k] for k in wanted]

    def _insert(self, blocks: dict) -> None:
        """Into the cache (under the lock): each block once; the budget evicts to its bound."""
        for key, data in blocks.items():
            if key in self.cache:
                self.budget.used(self, key)
                continue
            self.cache[key] = data
            self.cached += len(data)
            self.budget.added(self, key, len(data))

    def evict(self, key) -> None:
        """Drops one block (the budget's choice, under the lock)."""
        self.cached -= len(self.cache.pop(key))

    def use_budget(self, budget: CacheBudget) -> None:
        """Holds its blocks under ``budget`` from now on (the blocks held so far are dropped)."""
        self.release()
        self.budget, self.lock = budget, budget.lock

    def release(self) -> None:
        """Drops every block it holds (the pipeline is closed)."""
        with self.lock:
            self.budget.release(self)
            self.cache.clear()
            self.cached = 0

    def _runs(self, keys: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """(shard, first block, last block) runs covering ``keys`` (sorted), gaps filled."""
        runs: list[list[int]] = []
        for shard, block in keys:
            if runs and runs[-1][0] == shard and block - runs[-1][2] - 1 <= self.gap_blocks:
                runs[-1][2] = block
            else:
                runs.append([shard, block, block])
        return [tuple(r) for r in runs]

    def _read(self, runs: list[tuple[int, int, int]]) -> dict[tuple[int, int], bytes]:
        """Reads ``runs`` (`_runs`) and their checksums in one read; checks each block. A run's
        checksums (the end of the shard's index region, just before its data) and its blocks are
        one range when at most `gap_blocks` blocks' bytes lie between them (a run from a shard's
        first block: always)."""
        shard_of, paths, starts, ends, parts = [], [], [], [], []
        for shard, first, last in runs:
            layout = self.layouts[shard]
            begin = layout["index_bytes"] + first * self.block_bytes
            end = min(
                layout["index_bytes"] + (last + 1) * self.block_bytes, self.shards[shard]["bytes"]
            )
            crc = None  # where the run's checksums start, when they are read
            known = self._known.get(shard)
            if known is None or not known[first : last + 1].all():
                crc = layout["block_crc32"][0] + 4 * first
                if begin - (crc + 4 * (last - first + 1)) <= self.gap_blocks * self.block_bytes:
                    begin, crc = crc, crc  # one range: checksums, what follows, blocks
                else:
                    shard_of.append(shard)
                    paths.append(self.paths[shard])
                    starts.append(crc)
                    ends.append(crc + 4 * (last - first + 1))
            shard_of.append(shard)
            paths.append(self.paths[shard])
            starts.append(begin)
            ends.append(end)
            parts.append(((shard, first, last), len(paths) - 1, crc))
        bodies = self.reader.read(paths, starts, ends)
        bodies = [self._check(*args, "bytes") for args in zip(shard_of, bodies, starts, ends)]
        with self.lock:
            self.bytes_read += sum(len(b) for b in bodies)
        found = {(p, s): b for p, s, b in zip(paths, starts, bodies)}
        out: dict[tuple[int, int], bytes] = {}
        for (shard, first, last), i, crc in parts:
            body, start = bodies[i], starts[i]
            if crc is not None:  # from its own range, or from the head of the run's range
                crcs = found[(paths[i], crc)] if crc != start else body
                self._learn(shard, first, np.frombuffer(crcs[: 4 * (last - first + 1)], "<u4"))
            skip = self.layouts[shard]["index_bytes"] + first * self.block_bytes - start
            out.update(self._split((shard, first, last), start + skip, body[skip:]))
        return out

    def _learn(self, shard: int, first: int, crcs: np.ndarray) -> None:
        with self.lock:
            if shard not in self.crcs:
                blocks = self.layouts[shard]["blocks"]
                self.crcs[shard] = np.zeros(blocks, np.uint32)
                self._known[shard] = np.zeros(blocks, bool)
            self.crcs[shard][first : first + len(crcs)] = crcs
            self._known[shard][first : first + len(crcs)] = True

    def _split(self, run, start: int, body: bytes) -> dict[tuple[int, int], bytes]:
        """The blocks of one run's bytes (read from byte ``start``), each checked."""
        shard, first, last = run
        out = {}
        for i, block in enumerate(range(first, last + 1)):
            data = body[i * self.block_bytes : (i + 1) * self.block_bytes]
            if zlib.crc32(data) != int(self.crcs[shard][block]):
                raise fmt.StoreError(
                    f"shard {self.name(shard)}: block {block} (bytes {start + i * self.block_bytes}"
                    "..) fails its CRC-32 check: the file is corrupted; delete it and rerun the "
                    "prepare job to rewrite it"
                )
            out[(shard, block)] = data
        return out

    def name(self, shard: int) -> str:
        return fmt.join(self.url, self.shards[shard]["path"])
