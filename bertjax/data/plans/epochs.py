"""The epochs of one split of a store: what position p of epoch e at row length T holds.

token_windows: the epoch's plan is the token stream cut every T - 2 tokens (samples.py
`TokenWindows`, rows by index). Its order: a store of up to WINDOW pieces' worth of rows
(config.data.piece_tokens each, at most a quarter of a shard: `window_piece_tokens`) is one
keyed `IndexShuffle` of all rows; a larger one is read in windows (epoch_order.py
`TokenWindowOrder`: pieces of consecutive rows, WINDOW at a time per lane, rows shuffled within a
window), so the rows of a batch come from a few runs of the store, a host's reads coalesce into
few ranges, and its first batch reads a few pieces whatever the store's size. The sentence
plans: per piece of the store (piece_plans.py).
"""

from __future__ import annotations

import numpy as np

from bertjax.data import keys
from bertjax.data.plans import piece_plans, samples
from bertjax.data.plans.epoch_order import WINDOW, TokenWindowOrder, lane_count
from bertjax.data.plans.index_shuffle import IndexShuffle
from bertjax.data.plans.once_cache import OnceCache


class SplitEpochs:
    """The epochs of one split at each row length: token_windows plans and orders, or the
    sentence plans' per-piece plans (``pieces``), built once each, a few kept."""

    def __init__(self, store, config, batch_size: int, purpose: str, *, lane_rows: int = 0,
                 host_rows: int = 1):  # fmt: skip
        self.store, self.c, self.seed = store, config.data, config.seed
        self.batch_size, self.purpose = batch_size, purpose
        self.lane_rows, self.host_rows = lane_rows, host_rows
        self._epochs = OnceCache(4)  # (length, epoch) plans kept
        self._sizes = OnceCache(16)
        self.pieces = None
        if self.c.sample_plan == "token_windows":
            self._piece_tokens = self.window_piece_tokens()
        else:
            self.pieces = piece_plans.PieceSplit(
                store, self.c, self.seed, purpose, lane_rows=lane_rows, batch_size=batch_size,
                host_rows=host_rows,
            )  # fmt: skip

    def epoch(self, length: int, epoch: int):
        """token_windows: (plan, order, None); a sentence plan: its PiecePlan."""
        if self.pieces is not None:
            return self.pieces.epoch(length, epoch)
        return self._epochs.get((length, epoch), lambda: self._windows(length, epoch))

    def _cut_rows(self, length: int) -> int:
        """token_windows: the rows every epoch's order serves, the fewest any epoch's cut gives.
        A cut starts at a random shift below the window width, so it holds one of two row counts;
        an order over the cut's own count made epochs of two lengths (a piece apart: the short
        last piece's rows repeat), and a step count taken from epoch 0 alone made a later, shorter
        epoch wrap around and repeat some of its rows. A longer cut's last row goes unread, as
        its tail tokens do."""
        width, tokens = length - 2, len(self.store.tokens)
        if tokens > width:  # shifted by up to width - 1 tokens (samples.TokenWindows)
            return (tokens - width + 1) // width
        return tokens // width

    def _windows(self, length: int, epoch: int):
        c = self.c
        plan_rng = keys.generator(self.seed, epoch, f"{self.purpose}/plan/{length}")
        plan = samples.make_plan(self.store, c.sample_plan, length, c.short_seq_prob, plan_rng)
        return plan, self._order(self._cut_rows(length), length, epoch), None

    def window_piece_tokens(self) -> int:
        """Tokens of a token_windows piece: config.data.piece_tokens, and in a store of several
        shards at most a quarter of its median shard (from the manifest), so that a piece's rows
        lie in one shard (in two about one time in four) and a host's reads of a piece join into
        one range. Pieces of piece_tokens spanned several shards of a store of small shards
        (one shard a small input file): a range each, for every piece of every lane."""
        tokens = np.asarray(self.store.shard_counts()[1])
        piece = int(self.c.piece_tokens)
        if len(tokens) > 1:
            piece = min(piece, int(np.median(tokens)) // 4)
        return max(1, piece)

    def _order(self, rows: int, length: int, epoch: int):
        """The order of an epoch of ``rows`` token windows."""
        rows_per_piece = max(1, self._piece_tokens // (length - 2))
        pieces = -(-rows // rows_per_piece)
        if pieces <= WINDOW:  # one window: the whole epoch in one shuffle, by index
            purpose = f"{self.purpose}/order/{length}"
            key = int(keys.row_keys(self.seed, epoch, purpose, np.zeros(1, np.int64))[0])
            return IndexShuffle(rows, key)
        lanes = lane_count(self.batch_size, self.lane_rows, pieces)
        lane_rows = self.lane_rows if lanes > 1 else 1
        kept = 2 * min(lanes, -(-self.host_rows // lane_rows) + 1) + 2
        return TokenWindowOrder(
            rows,
            rows_per_piece,
            piece_plans.piece_key(self.seed, self.purpose, epoch, length),
            piece_plans.window_key(self.seed, self.purpose, epoch, length),
            lanes,
            lane_rows,
            kept,
        )

    def num_units(self, length: int, epoch: int) -> int:
        if self.pieces is not None:
            return len(self.pieces.epoch(length, epoch))
        return len(self.epoch(length, epoch)[1])

    def steps_per_epoch(self, length: int) -> int:
        return self._sizes.get(length, lambda: self._steps_per_epoch(length))

    def _steps_per_epoch(self, length: int) -> int:
        units = self.num_units(length, 0)
        if units < self.batch_size:
            raise ValueError(
                f"store {self.store.directory!r} ({self.store.split}) gives {units} rows of "
                f"length {length} per epoch, fewer than the batch size {self.batch_size}: use a "
                "bigger corpus or a smaller config.batch_size"
            )
        return units // self.batch_size
