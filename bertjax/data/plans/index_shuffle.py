"""A stateless shuffle of [0, n): position i of the order is computed alone, in O(1) memory.

An epoch of a web-scale store has billions of rows; a materialized permutation of them (8 bytes
a row) would not fit a host, and would have to be rebuilt at every start. `IndexShuffle(n, key)`
is a keyed bijection of [0, n) evaluated per index: a balanced Feistel network over the smallest
even number of bits covering n (4 rounds, each a SplitMix64 hash of the half-block and a round
key), restricted to [0, n) by cycle-walking (an index that lands outside is enciphered again; the
restriction of a permutation this way stays a permutation). The idea is the one Grain and
`tf.random.experimental.index_shuffle` use; this is bertjax's own construction on keys.mix.
"""

from __future__ import annotations

import numpy as np

from bertjax.data import keys

ROUNDS = 4


class IndexShuffle:
    """order[i] for i in [0, n): a permutation of [0, n) keyed by ``key`` (any int)."""

    def __init__(self, n: int, key: int):
        if n < 0:
            raise ValueError(f"IndexShuffle: n={n} must be >= 0")
        self.n = int(n)
        bits = max(2, int(self.n - 1).bit_length() if self.n > 1 else 2)
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        base = keys.mix(np.uint64(int(key) & 0xFFFFFFFFFFFFFFFF))
        self.round_keys = [keys.mix(base + np.uint64(r + 1)) for r in range(ROUNDS)]

    def __len__(self) -> int:
        return self.n

    def _encipher(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half)
        left, right = x >> shift, x & self.mask
        for round_key in self.round_keys:
            left, right = right, left ^ (keys.mix(right ^ round_key) & self.mask)
        return (left << shift) | right

    def __getitem__(self, index) -> np.ndarray:
        index = np.asarray(index, np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.n):
            raise IndexError(f"index out of range for a shuffle of {self.n}")
        x = self._encipher(index.reshape(-1).astype(np.uint64))
        outside = x >= np.uint64(self.n)
        while outside.any():  # cycle-walking: at most a few rounds (the domain is < 4n)
            x[outside] = self._encipher(x[outside])
            outside = x >= np.uint64(self.n)
        return x.astype(np.int64).reshape(index.shape)
