"""Values computed once per key, whichever thread asks first, outside any lock: the piece indexes,
piece plans and window shares that prefetch threads share. A thread asking for a key another
thread is computing waits for that result instead of computing it again; threads asking for
different keys compute (and read from storage) at the same time. The last `size` values are kept."""

from __future__ import annotations

import collections
import concurrent.futures
import threading


class OnceCache:
    """key -> value, each computed once by the first thread that asks; an LRU of `size`."""

    def __init__(self, size: int):
        self.size = max(1, int(size))
        self._values: collections.OrderedDict = collections.OrderedDict()
        self._pending: dict = {}
        self._lock = threading.Lock()

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._values

    def values(self) -> list:
        with self._lock:
            return list(self._values.values())

    def get(self, key, compute):
        """The value of ``key``: kept, being computed by another thread (waited for), or
        ``compute()`` now."""
        return self.get_many([key], lambda keys: [compute()])[0]

    def get_many(self, keys: list, compute_many) -> list:
        """The values of ``keys``; those neither kept nor being computed come from one call
        ``compute_many(absent keys) -> values`` (one read for several pieces)."""
        found, waits, mine = {}, {}, []
        with self._lock:
            for key in keys:
                if key in self._values:
                    self._values.move_to_end(key)
                    found[key] = self._values[key]
                elif key in self._pending:
                    waits[key] = self._pending[key]
                elif key not in found and key not in mine:
                    mine.append(key)
                    self._pending[key] = concurrent.futures.Future()
        if mine:
            futures = [self._pending[key] for key in mine]
            try:
                values = list(compute_many(mine))
            except BaseException as e:
                with self._lock:
                    for key in mine:
                        self._pending.pop(key, None)
                for future in futures:
                    future.set_exception(e)
                raise
            with self._lock:
                for key, value in zip(mine, values):
                    self._values[key] = value
                    self._pending.pop(key, None)
                while len(self._values) > self.size:
                    self._values.popitem(last=False)
            for key, value, future in zip(mine, values, futures):
                future.set_result(value)
                found[key] = value
        for key, future in waits.items():
            found[key] = future.result()
        return [found[key] for key in keys]

    def resize(self, size: int) -> None:
        """Keeps at least ``size`` values from now on."""
        with self._lock:
            self.size = max(self.size, int(size))
