"""Randomness keyed by what it is for: seeded generators and a counter-based hash for masking.

Nothing here reads global random state. Plans use `generator(seed, epoch, purpose)`; masking uses
`uniform(row_keys, positions)`, a vectorized SplitMix64-style hash, so each row's random numbers
depend only on its own key (seed, epoch, global sample index), never on the batch around it.
"""

from __future__ import annotations

import zlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def purpose_code(purpose: str) -> int:
    """A stable 32-bit number for a purpose name."""
    return zlib.crc32(purpose.encode("utf-8"))


def generator(seed: int, epoch: int, purpose: str) -> np.random.Generator:
    """A Philox generator seeded from (seed, epoch, purpose)."""
    sequence = np.random.SeedSequence(
        [int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), purpose_code(purpose)]
    )
    return np.random.Generator(np.random.Philox(sequence))


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer: a bijective scramble of uint64 values."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        return x ^ (x >> np.uint64(31))


def row_keys(seed: int, epoch: int, purpose: str, sample_index: np.ndarray) -> np.ndarray:
    """uint64 key per row from (seed, epoch, purpose, global sample index)."""
    with np.errstate(over="ignore"):
        base = mix(np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF) + _GOLDEN)
        base = mix(
            base
            ^ np.uint64(int(epoch) & 0xFFFFFFFF)
            ^ (np.uint64(purpose_code(purpose)) << np.uint64(32))
        )
        return mix(base + np.asarray(sample_index, np.uint64) * _GOLDEN)


def uniform(keys: np.ndarray, width: int, stream: int = 0) -> np.ndarray:
    """[len(keys), width] floats in [0, 1): hash of (row key, stream, column)."""
    return uniform_at(keys, np.arange(width, dtype=np.uint64)[None, :], stream)


def uniform_at(keys: np.ndarray, columns: np.ndarray, stream: int = 0) -> np.ndarray:
    """Floats in [0, 1) for given columns ([B, N] or broadcastable) of each row: same values as
    `uniform`."""
    columns = np.asarray(columns).astype(np.uint64) + np.uint64(stream) * np.uint64(1 << 32)
    with np.errstate(over="ignore"):
        bits = mix(keys[:, None] ^ mix(columns + _GOLDEN))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
