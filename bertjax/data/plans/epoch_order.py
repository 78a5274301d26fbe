"""The order of one epoch over the pieces of a store, position by position: which piece, and which
unit (row, or packed row) of that piece, each position of the epoch takes.

Pieces. Epoch e shuffles the m pieces (`IndexShuffle`, keyed by e). Windows. Pieces are read
WINDOW (4) at a time (BERT's run_pretraining.py interleaved 4 files); a window of k pieces has
k R units (R: units per piece, calibrated by the caller), shuffled together (a second keyed
`IndexShuffle`) and shared out over its pieces in proportion to their units this epoch, so each
unit of a window is read about equally often.

Lanes. A global batch of B rows is cut into L = B / lane_rows lanes of lane_rows consecutive
rows (config.data.lane_rows; L = 1 when it does not divide B, and L <= m / WINDOW): lane l
reads its own pieces (every L-th of the epoch's shuffled pieces, from the l-th on), WINDOW at a
time, and gives lane_rows rows to every step. A host's rows of a step then fall in about
(its rows / lane_rows + 1) lanes, whatever the number of hosts, so the pieces it plans and reads
per step do not grow with the pod (without lanes every host planned every window the whole job
read). Before its first batch a host plans WINDOW pieces for each lane its rows fall in, so
lane_rows trades start-up for per-step work: lanes of 32 rows had a host of 256 rows plan 32
pieces (all of a store under ~32 pieces, so its start-up grew with the store up to there, issue
71); lanes of 256 (the default) have it plan 4, and a host of 32 rows plan a lane's windows as
they turn over at 256 rows a step. m - L floor(m / L) < L pieces (a different few each epoch)
sit an epoch out so that lanes have equal lengths. With L = 1 this is the order of issue 51: the
same batches.

Length. The lanes give their rows in turns of L lane_rows positions (lane l: rows
[l lane_rows, (l + 1) lane_rows) of each turn), so an epoch holds the positions every lane can
serve: the whole turns of a lane's n = (m // L) R units, then the first n mod lane_rows positions
of the next turn (lane 0's). Where L = B / lane_rows a turn is a step and this drops nothing from
the steps of an epoch (floor(len / B)); where L is capped (fewer than 4 B / lane_rows pieces) a
step spans turns, and the epoch ends before a position past a lane's units (issue 61: the last
step of such an epoch raised).

Position p of an epoch (step p // B, row p % B; a step's positions start at a multiple of B) is
computed alone, from the shuffled piece order, its window's shuffle and its window's units.
"""

from __future__ import annotations

import numpy as np

from bertjax.data.plans.index_shuffle import IndexShuffle
from bertjax.data.plans.once_cache import OnceCache

WINDOW = 4  # pieces read together (BERT's run_pretraining.py interleaves min(4, files) files)
MATERIALIZED = 1 << 22  # a window shuffle of at most this many slots is computed once, kept


def lane_count(batch_size: int, lane_rows: int, pieces: int) -> int:
    """L: batch_size / lane_rows lanes when lane_rows (> 0) divides it, at most pieces / WINDOW
    (each lane has a window of its own), at least 1."""
    if lane_rows <= 0 or batch_size % lane_rows:
        return 1
    return max(1, min(batch_size // lane_rows, pieces // WINDOW))


class EpochOrder:
    """Positions of one epoch -> (piece, unit of the piece); subclasses say each piece's units
    (`units`) and what an empty window means (`no_rows`)."""

    def __init__(self, pieces: int, units_per_piece: int, piece_key: int, window_key,
                 lanes: int = 1, lane_rows: int = 1, cache_windows: int = 4):  # fmt: skip
        """``piece_key``: the key of the epoch's piece shuffle; ``window_key(W)``: the key of
        window W's shuffle (W = window of the lane * lanes + lane: the window's number)."""
        self.m, self.r, self.lanes = int(pieces), int(units_per_piece), max(1, int(lanes))
        self.lane_rows = int(lane_rows) if self.lanes > 1 else 1
        self.per_lane = self.m // self.lanes  # pieces each lane reads this epoch
        self.piece_order = IndexShuffle(self.m, piece_key)
        self.window_key = window_key
        self._windows = OnceCache(cache_windows)

    def __len__(self) -> int:
        """Positions every lane serves: whole turns of lanes, then lane 0's part of the next."""
        turns, rest = divmod(self.per_lane * self.r, self.lane_rows)
        return self.lanes * self.lane_rows * turns + rest

    def units(self, piece: int) -> int:
        raise NotImplementedError

    def no_rows(self, members: np.ndarray):
        raise ValueError(f"pieces {members.tolist()} have no units")

    def prepare(self, pieces: np.ndarray) -> None:
        """Called with the pieces of several windows about to be shared out."""

    def lane_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lane, position within the lane) of each position."""
        positions = np.asarray(positions, np.int64)
        if self.lanes == 1:
            return np.zeros_like(positions), positions
        rows = self.lanes * self.lane_rows
        step, row = np.divmod(positions, rows)
        lane, within = np.divmod(row, self.lane_rows)
        return lane, step * self.lane_rows + within

    def members(self, lane: int, window: int) -> np.ndarray:
        """The pieces of window ``window`` of lane ``lane``."""
        first, end = window * WINDOW, min(self.per_lane, (window + 1) * WINDOW)
        return self.piece_order[lane + self.lanes * np.arange(first, end, dtype=np.int64)]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(piece, unit of the piece) of each position of the epoch."""
        positions = np.asarray(positions, np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"position out of range for an epoch of {len(self)} units")
        lane, within_lane = self.lane_of(positions)
        window, within = np.divmod(within_lane, WINDOW * self.r)
        piece, unit = np.empty_like(window), np.empty_like(window)
        span = int(window.max(initial=0)) + 1
        code = lane * span + window  # (lane, window) as one int64
        pairs = [divmod(c, span) for c in np.unique(code).tolist()]
        new = [pair for pair in pairs if pair not in self._windows]
        if len(new) > 1:  # the pieces of every new window at once (one read of their indexes)
            self.prepare(np.concatenate([self.members(*pair) for pair in new]))
        for c, pair in zip(np.unique(code).tolist(), pairs):
            chosen = code == c
            members, shuffle, bounds = self.window(*pair)
            slot = within[chosen] if shuffle is None else shuffle[within[chosen]]
            which = np.searchsorted(bounds, slot, side="right")
            piece[chosen] = members[which]
            unit[chosen] = slot - np.concatenate([[0], bounds])[which]
        return piece, unit

    def window(self, lane: int, window: int):
        """(pieces, shuffle of its slots or None, end slot of each piece) of one window of one
        lane, computed once (threads asking meanwhile wait for it)."""
        return self._windows.get((lane, window), lambda: self._share(lane, window))

    def _share(self, lane: int, window: int):
        members = self.members(lane, window)
        size = len(members) * self.r
        shuffle = None
        if len(members) > 1:
            shuffle = IndexShuffle(size, self.window_key(window * self.lanes + lane))
            if size <= MATERIALIZED:  # its values, once: a lookup per row afterwards
                shuffle = shuffle[np.arange(size)]
        weight = np.asarray(self.window_units(members), np.float64)
        if not weight.sum():
            self.no_rows(members)
        bounds = np.floor(np.cumsum(weight) / weight.sum() * size).astype(np.int64)
        bounds[-1] = size
        return members, shuffle, bounds

    def window_units(self, members: np.ndarray) -> list[int]:
        """Units of each piece of a window (the weights of its shares)."""
        return [self.units(int(p)) for p in members]


class TokenWindowOrder(EpochOrder):
    """token_windows rows of one epoch, read in windows: piece j holds rows [j R, (j + 1) R) of
    the epoch's cut of the token stream (consecutive tokens), so a window's rows come from WINDOW
    runs of the store and a host's batches from a few. The last piece is short (its rows repeat
    in its share)."""

    def __init__(self, rows: int, rows_per_piece: int, piece_key: int, window_key,
                 lanes: int = 1, lane_rows: int = 1, cache_windows: int = 4):  # fmt: skip
        self.rows, r = int(rows), max(1, int(rows_per_piece))
        pieces = -(-self.rows // r)
        super().__init__(pieces, r, piece_key, window_key, lanes, lane_rows, cache_windows)

    def units(self, piece: int) -> int:
        return min(self.r, self.rows - piece * self.r)

    def __getitem__(self, positions) -> np.ndarray:
        """The row (of the epoch's plan) at each position."""
        positions = np.asarray(positions, np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"position out of range for an epoch of {len(self)} rows")
        piece, unit = self.locate(positions.reshape(-1))
        rows = piece * self.r + unit % np.minimum(self.r, self.rows - piece * self.r)
        return rows.reshape(positions.shape)
