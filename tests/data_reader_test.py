"""The sharded store's block reader under threads (bertjax/data/store/block_cache.py): behind a slow
fake filesystem, threads asking for the same blocks at once read each block once, the cache counts
each block's bytes once and stays within its bound, ranges of a synchronous filesystem go out on
several threads, runs coalesce across small gaps (a gap's blocks read once whatever thread asks
for them meanwhile), and a bad block stops every waiting thread."""

import threading
import time

import fsspec
import numpy as np
import pytest

from bertjax.data.store import shard_format as fmt
from bertjax.data.store.block_cache import BlockCache, RangeReader

VOCAB, BLOCK, SHARD_TOKENS, SHARDS = 64, 32, 320, 3  # 10 blocks of 96 bytes a shard


class _SlowFS:
    """The local filesystem with ``latency`` seconds a request; it counts requests, every range
    asked for (path, start, end) and the most requests in flight at once."""

    def __init__(self, latency: float, asynchronous: bool):
        self.fs, self.latency, self.async_impl = fsspec.filesystem("file"), latency, asynchronous
        self.lock, self.requests, self.asked, self.flying, self.most = threading.Lock(), 0, [], 0, 0

    def _request(self, ranges):
        with self.lock:
            self.requests += 1
            self.asked.extend(ranges)
            self.flying += 1
            self.most = max(self.most, self.flying)
        time.sleep(self.latency)
        with self.lock:
            self.flying -= 1

    def cat_ranges(self, paths, starts, ends):
        if not self.async_impl:  # fsspec's own: one range after another
            return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends)]
        self._request(list(zip(paths, starts, ends)))
        return self.fs.cat_ranges(paths, starts, ends)

    def cat_file(self, path, start=None, end=None):
        self._request([(path, start, end)])
        return self.fs.cat_file(path, start=start, end=end)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(directory, manifest-like shard entries, layouts, the tokens of every shard)."""
    root = tmp_path_factory.mktemp("blocks")
    rng = np.random.default_rng(0)
    shards, layouts, tokens = [], [], []
    for k in range(SHARDS):
        ids = rng.integers(5, VOCAB, SHARD_TOKENS).astype(np.uint16)
        columns = {
            "tokens": ids,
            "word_starts": (ids % 2).astype(np.uint8),
            "sentences": np.array([[0, SHARD_TOKENS]]),
            "documents": np.array([0, 1]),
        }
        body, entry = fmt.encode_shard(columns, VOCAB, BLOCK, np.uint16)
        entry.update(path=f"train/{k}.shard", token_dtype="uint16")
        (root / "train").mkdir(exist_ok=True)
        (root / entry["path"]).write_bytes(body)
        shards.append(entry)
        layouts.append(fmt.index_layout(entry, VOCAB, BLOCK, 2))
        tokens.append(ids)
    return str(root), shards, layouts, tokens


def _cache(store, fs, cache_blocks=100, gap_blocks=0, threads=4):
    url, shards, layouts, _ = store
    reader = RangeReader(fs, threads)
    return BlockCache(url, reader, shards, layouts, BLOCK, cache_blocks * 3 * BLOCK, gap_blocks)


def _tokens(data: bytes) -> np.ndarray:
    return np.frombuffer(data[: 2 * BLOCK], "<u2")


def _on_threads(count, work):
    """``work(i)`` on ``count`` threads started together; their results (or their error)."""
    start, results, errors = threading.Barrier(count), [None] * count, []

    def run(i):
        start.wait()
        try:
            results[i] = work(i)
        except Exception as e:  # noqa: BLE001 (handed to the test)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def test_threads_asking_for_the_same_blocks_read_each_once_and_count_it_once(store):
    fs = _SlowFS(0.05, asynchronous=True)
    cache = _cache(store, fs)
    keys = np.array([[0, 1], [0, 2], [1, 5], [2, 0], [2, 9]])
    results, errors = _on_threads(8, lambda i: cache.fetch(keys))
    assert not errors
    for blocks in results:
        for (shard, block), data in zip(keys.tolist(), blocks):
            want = store[3][shard][block * BLOCK : (block + 1) * BLOCK]
            np.testing.assert_array_equal(_tokens(data)[: len(want)], want)
    blocks_asked = [r for r in fs.asked if r[1] >= store[2][0]["index_bytes"]]
    assert fs.requests == 1 and len(blocks_asked) == 4  # runs: 0:1-2, 1:5, 2:0, 2:9
    assert cache.cached == sum(len(v) for v in cache.cache.values()) == 5 * 3 * BLOCK
    assert cache.reader.counts() == (1, 8)  # 4 runs of blocks and their 4 checksum ranges


def test_the_cache_holds_its_bound_under_threads_round_after_round(store):
    """Four threads, each its own blocks and some in common, over rounds, with a cache of four
    blocks: the bytes counted are the bytes held, never above the bound (it was: a block read by
    two threads was counted twice, and the cache then held one block at a time)."""
    fs = _SlowFS(0.01, asynchronous=True)
    cache = _cache(store, fs, cache_blocks=4)
    for round_ in range(3):

        def work(i, round_=round_):
            keys = np.array(sorted({(0, round_), (1, (i + round_) % 10), (2, i)}))
            return cache.fetch(keys)

        _, errors = _on_threads(4, work)
        assert not errors
        assert cache.cached == sum(len(v) for v in cache.cache.values())
        assert cache.cached <= 4 * 3 * BLOCK and len(cache.cache) == 4
    # block (0, r) is asked by all four threads in round r: read once each round
    shared = [r for r in fs.asked if r[0].endswith("0.shard") and r[2] - r[1] == 3 * BLOCK]
    assert len(shared) == 3


def test_a_synchronous_filesystem_reads_the_ranges_of_one_fetch_on_threads(store):
    fs = _SlowFS(0.02, asynchronous=False)
    cache = _cache(store, fs, threads=4)
    keys = np.array([[k, b] for k in range(SHARDS) for b in (0, 4, 8)])
    cache.fetch(keys)
    assert len(fs.asked) == fs.requests == 18  # 9 runs and their checksums, a request each
    assert fs.most >= 2  # in flight together, not one after another
    assert cache.reader.counts() == (18, 18)


def test_runs_coalesce_across_gaps_of_up_to_gap_blocks(store):
    """Blocks at most two apart are one run; a run's checksums (just before the data region) and
    its blocks are one range when no more than two blocks' bytes lie between them."""
    fs = _SlowFS(0.0, asynchronous=True)
    cache = _cache(store, fs, gap_blocks=2)
    cache.fetch(np.array([[0, 0], [0, 3], [0, 7], [1, 2]]))
    index, crc, block = store[2][0]["index_bytes"], store[2][0]["block_crc32"][0], 3 * BLOCK
    asked = sorted((r[0][-7:], r[1], r[2]) for r in fs.asked)
    assert asked == [
        ("0.shard", crc, index + 4 * block),  # blocks 0-3 (the gap read) and their checksums
        ("0.shard", crc + 4 * 7, crc + 4 * 8),  # block 7's checksum: 7 blocks away
        ("0.shard", index + 7 * block, index + 8 * block),
        ("1.shard", crc + 4 * 2, crc + 4 * 3),
        ("1.shard", index + 2 * block, index + 3 * block),
    ]
    assert len(cache.cache) == 6  # the gap's blocks are checked and kept too
    assert np.count_nonzero(cache._known[0]) == 5 and np.count_nonzero(cache._known[1]) == 1


def test_a_block_in_the_gap_of_another_threads_read_is_waited_for_not_read_again(store):
    """One thread reads blocks 0 and 3 of shard 0 as one run (the gap's blocks 1-2 with them);
    threads asking meanwhile for block 1 or 2 wait for that read: one range in all (each sent
    its own before, as the reads ahead of a first batch did, all started together)."""
    fs = _SlowFS(0.1, asynchronous=True)
    cache = _cache(store, fs, gap_blocks=2)
    first = threading.Thread(target=cache.fetch, args=(np.array([[0, 0], [0, 3]]),))
    first.start()
    time.sleep(0.03)  # its read in flight
    results, errors = _on_threads(2, lambda i: cache.fetch(np.array([[0, 1 + i]])))
    first.join()
    assert not errors and fs.requests == 1 and len(fs.asked) == 1
    for i, (data,) in enumerate(results):
        want = store[3][0][(1 + i) * BLOCK : (2 + i) * BLOCK]
        np.testing.assert_array_equal(_tokens(data), want)


def test_a_corrupted_block_stops_the_reader_and_every_thread_waiting_for_it(store, tmp_path):
    url, shards, layouts, _ = store
    broken = tmp_path / "train"
    broken.mkdir()
    for entry in shards:
        body = bytearray(open(f"{url}/{entry['path']}", "rb").read())
        if entry["path"].endswith("1.shard"):
            body[layouts[1]["index_bytes"] + 3 * 3 * BLOCK + 1] ^= 0xFF  # in block 3
        (tmp_path / entry["path"]).write_bytes(bytes(body))
    fs = _SlowFS(0.05, asynchronous=True)
    cache = _cache((str(tmp_path), shards, layouts, None), fs)
    _, errors = _on_threads(4, lambda i: cache.fetch(np.array([[1, 3]])))
    assert len(errors) == 4 and fs.requests == 1
    assert all("1.shard: block 3" in str(e) and "CRC-32" in str(e) for e in errors)
    assert not cache.cache and not cache._pending  # nothing half-read is kept
