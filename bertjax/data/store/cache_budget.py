"""One bound on the bytes of blocks that the block caches of one process hold together (a
pipeline's train and eval splits, every store of a mixture): one LRU over all their blocks, under
one lock they share, so a split that reads now takes the room of blocks another read long ago.

A host's budget (config.data.store_cache_bytes, read_settings.py) is cut into one such bound per
process that reads the store: the trainer's, and each of config.data.workers worker processes.
Every cache's bookkeeping is a few dict operations under the lock (block_cache.py); the reads
themselves happen outside it.
"""

from __future__ import annotations

import collections
import threading


class CacheBudget:
    """The blocks of several caches, least recently used first, evicted to ``limit`` bytes (at
    least one block is kept). Its methods are called with ``lock`` held."""

    def __init__(self, limit: int):
        self.limit = max(0, int(limit))
        self.lock = threading.Lock()  # the lock of every cache that shares this budget
        self.held = 0  # bytes of blocks held by the caches
        self.peak = 0  # the most they held, after any insert
        self._order: collections.OrderedDict = collections.OrderedDict()  # (cache, key) -> bytes

    def used(self, cache, key) -> None:
        """Block ``key`` of ``cache`` was read from the cache: the most recently used."""
        self._order.move_to_end((cache, key))

    def added(self, cache, key, size: int) -> None:
        """Block ``key`` of ``cache`` entered it: evicts the least recently used blocks of any
        cache (`cache.evict(key)`) until the caches hold at most ``limit`` bytes."""
        self._order[(cache, key)] = int(size)
        self.held += int(size)
        while self.held > self.limit and len(self._order) > 1:
            (owner, old), freed = self._order.popitem(last=False)
            owner.evict(old)
            self.held -= freed
        self.peak = max(self.peak, self.held)

    def release(self, cache) -> None:
        """Forgets every block of ``cache`` (it lets go of them: closed, or given a new budget)."""
        for entry in [entry for entry in self._order if entry[0] is cache]:
            self.held -= self._order.pop(entry)
