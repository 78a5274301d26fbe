"""Sentence plans at any store size: a plan per piece of the store, read in a two-level stateless
shuffle, so a host builds and holds only the pieces its rows fall in.

Pieces. Each shard (a local store: one) is cut, from the document and token counts the manifest
already holds, into `pieces_k = min(D_k // 2, ceil(tokens_k / piece_tokens))` (at least 1) runs of
whole documents, piece j of shard k holding documents [j D_k / pieces_k, (j + 1) D_k / pieces_k).
A piece's plan (samples.py's nsp, sop, pairs, full_sentences, doc_sentences, mlm; packed rows
too) is built from that piece's part of the shard index alone (two range reads), keyed by
(seed, epoch, piece), so it is the same on every host and from any copy of the store. Rows never
cross a piece: NSP's random B comes from another document of the same piece (BERT's
create_pretraining_data drew it from the same input file), FULL-SENTENCES rows do not run across
a piece's last document, and each piece's last row is short.

Order (epoch_order.py). Epoch e shuffles the pieces and reads them WINDOW (4) at a time, per lane
of the global batch; a window's units are shuffled together and shared out over its pieces in
proportion to their units (rows, or packed rows) in this epoch. Every host reads all pieces of
the windows of its lanes over its life, so building their plans to share the rows out costs it
nothing more; lanes keep those windows few per host whatever the host count. A piece hands out
units j = 0, 1, ... of its own shuffled plan (j modulo its size). R is calibrated once per row
length on epoch 0's first window of lane 0 (units per token, times the store's mean tokens per
piece), so an epoch is about one pass over the store: a piece with more units than its share
leaves the rest for the next epoch's (new) plan, one with fewer repeats some. Deviation from a
whole-store plan: these piece edges and windows of equal size (measured:
tests/data_plan_stats_test.py, benchmarks/data/plan_stats.py). A store of one piece (the built-in
corpus) gives exactly the whole-store plan of samples.py and its permutation. A piece of over
MAX_PIECE_TOKENS tokens (documents that long) is refused with a message naming token_windows.

Threads. Index reads and plan building happen outside any lock (once_cache.py): prefetch threads
build different pieces at once, and a piece another thread is building is waited for, not built
twice; the index ranges of a window's pieces are read together (two rounds of ranges).
"""

from __future__ import annotations

import numpy as np

from bertjax.data import keys
from bertjax.data.plans import rows, samples
from bertjax.data.plans.epoch_order import WINDOW, EpochOrder, lane_count
from bertjax.data.plans.once_cache import OnceCache

MAX_PIECE_TOKENS = 1 << 27  # a piece above this (documents this long) is refused


class Pieces:
    """The pieces of one split, from its per-shard document and token counts."""

    def __init__(self, documents, tokens, piece_tokens: int):
        self.documents = np.asarray(documents, np.int64)
        self.tokens = np.asarray(tokens, np.int64)
        wanted = -(-self.tokens // max(1, int(piece_tokens)))
        self.per_shard = np.maximum(1, np.minimum(self.documents // 2, wanted))
        self.per_shard[self.documents == 0] = 0
        self.first = np.concatenate([[0], np.cumsum(self.per_shard)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.first[-1])

    def locate(self, piece: int) -> tuple[int, int, int]:
        """(shard, first document, end document) of piece ``piece``."""
        shard = int(np.searchsorted(self.first, piece, side="right") - 1)
        j, m, d = piece - int(self.first[shard]), int(self.per_shard[shard]), self.documents[shard]
        return shard, int(j * d // m), int((j + 1) * d // m)

    def largest(self) -> tuple[int, float]:
        """(shard, estimated tokens) of the shard with the largest pieces."""
        per_piece = self.tokens / np.maximum(self.per_shard, 1)
        shard = int(np.argmax(per_piece)) if len(per_piece) else 0
        return shard, float(per_piece[shard]) if len(per_piece) else 0.0


class _PieceView:
    """The part of a store's index one piece covers, as samples.py's plans read a store."""

    def __init__(self, store, documents: np.ndarray, sentences: np.ndarray):
        self.directory, self.split = store.directory, store.split
        self.documents, self.sentences = documents, sentences

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1


def piece_key(seed: int, purpose: str, epoch: int, length: int) -> int:
    """The key of epoch ``epoch``'s shuffle of the pieces at row length ``length``."""
    return int(keys.row_keys(seed, epoch, f"{purpose}/pieces/{length}", np.zeros(1))[0])


def window_key(seed: int, purpose: str, epoch: int, length: int):
    """window W -> the key of its shuffle, in epoch ``epoch`` at row length ``length``."""
    name = f"{purpose}/window/{length}"
    return lambda w: int(keys.row_keys(seed, epoch, name, np.array([w]))[0])


class PiecePlan(EpochOrder):
    """One epoch of a sentence plan at one row length: ``locate`` and ``samples`` by position."""

    def __init__(self, split, length: int, epoch: int, units_per_piece: int):
        self.split, self.length, self.epoch = split, length, epoch
        self.pieces = split.pieces
        super().__init__(
            len(split.pieces),
            units_per_piece,
            piece_key(split.seed, split.purpose, epoch, length),
            window_key(split.seed, split.purpose, epoch, length),
            split.lanes,
            split.lane_rows,
            split.windows_kept,
        )

    def units(self, piece: int) -> int:
        return self.split.units(self.length, self.epoch, piece)

    def window_units(self, members: np.ndarray) -> list[int]:
        self.split.views(members.tolist())  # the window's indexes in one read
        return super().window_units(members)

    def prepare(self, pieces: np.ndarray) -> None:
        self.split.views(pieces.tolist())  # several windows' indexes in one read

    def no_rows(self, members: np.ndarray):
        store, c = self.split.store, self.split.c
        raise ValueError(
            f"store {store.directory!r} ({store.split}): no piece of pieces {members.tolist()} "
            f"gives {c.sample_plan!r} rows of length {self.length} (one-sentence documents?); "
            "use config.data.sample_plan='token_windows' or 'full_sentences', or a larger "
            "config.data.piece_tokens"
        )

    def samples(self, positions: np.ndarray):
        """(columns a_start, a_end, b_start, b_end, label of every sample, row of each sample,
        offset of each sample in its row) of the units at ``positions`` (one sample per row
        unless rows are packed)."""
        piece, unit = self.locate(positions)
        if not self.split.c.pack_rows:  # one sample per row: gathered per piece, vectorized
            out = np.empty((5, len(piece)), np.int64)
            for p in np.unique(piece).tolist():
                chosen = piece == p
                plan, order, _ = self.split.piece(self.length, self.epoch, p)
                picked = order[unit[chosen] % len(order)]
                for i, name in enumerate(("a_start", "a_end", "b_start", "b_end", "label")):
                    out[i, chosen] = getattr(plan, name)[picked]
            row_of = np.arange(len(piece), dtype=np.int64)
            return tuple(out), row_of, np.zeros(len(piece), np.int64)
        cols = [[] for _ in range(5)]
        row_of, offsets = [], []
        for i, (p, u) in enumerate(zip(piece.tolist(), unit.tolist())):
            plan, _, (row_starts, packed, offset) = self.split.piece(self.length, self.epoch, p)
            r = u % (len(row_starts) - 1)
            chosen = packed[row_starts[r] : row_starts[r + 1]]
            for col, name in zip(cols, ("a_start", "a_end", "b_start", "b_end", "label")):
                col.append(getattr(plan, name)[chosen])
            row_of.append(np.full(len(chosen), i, np.int64))
            offsets.append(offset[row_starts[r] : row_starts[r + 1]])
        joined = tuple(np.concatenate(c) for c in cols)
        return joined, np.concatenate(row_of), np.concatenate(offsets)


class PieceSplit:
    """Per-piece plans of one split: built on first use, an LRU of them kept; units per piece
    calibrated per row length. ``lane_rows``, ``batch_size``: the lanes of the order
    (epoch_order.py; lane_rows 0: one lane); ``host_rows``: this host's rows of a batch, which
    fix how many pieces it keeps."""

    def __init__(self, store, data_config, seed: int, purpose: str, *, lane_rows: int = 0,
                 batch_size: int = 1, host_rows: int = 1):  # fmt: skip
        self.store, self.c, self.seed, self.purpose = store, data_config, seed, purpose
        self.pieces = Pieces(*store.shard_counts(), data_config.piece_tokens)
        shard, largest = self.pieces.largest()
        if largest > MAX_PIECE_TOKENS:
            self._too_large(shard, int(self.pieces.documents[shard]), largest)
        self.lanes = lane_count(batch_size, lane_rows, len(self.pieces))
        self.lane_rows = lane_rows if self.lanes > 1 else 1
        # windows a host reads at once: its lanes (one more where its rows straddle two), and
        # the next window of each while a prefetched batch crosses into it
        host_lanes = -(-host_rows // self.lane_rows) + 1 if self.lanes > 1 else 1
        self.windows_kept = 2 * min(self.lanes, host_lanes) + 2
        kept = WINDOW * self.windows_kept + WINDOW  # pieces: those windows' and calibration's
        self._plans = OnceCache(kept)
        self._views = OnceCache(kept)
        self._epochs = OnceCache(4)
        self._units = OnceCache(16)

    def piece(self, length: int, epoch: int, piece: int):
        """(plan, order, packing or None) of one piece in one epoch at one row length."""
        return self._plans.get((length, epoch, piece), lambda: self._build(length, epoch, piece))

    def _build(self, length: int, epoch: int, piece: int):
        c = self.c
        view = self.views([piece])[0]
        suffix = f"/{piece}" if piece else ""  # piece 0: the whole-store plan's keys
        plan_rng = keys.generator(self.seed, epoch, f"{self.purpose}/plan/{length}{suffix}")
        if c.sample_plan == "nsp" and view.num_documents < 2:
            zeros = np.zeros(0, np.int64)
            plan = samples.Plan(zeros, zeros, zeros, zeros, zeros.astype(np.int32))
        else:
            plan = samples.make_plan(view, c.sample_plan, length, c.short_seq_prob, plan_rng)
        order_rng = keys.generator(self.seed, epoch, f"{self.purpose}/order/{length}{suffix}")
        order = order_rng.permutation(len(plan))
        packing = rows.pack(plan.lengths(), order, length) if c.pack_rows else None
        return plan, order, packing

    def _too_large(self, shard: int, documents: int, tokens: float):
        raise ValueError(
            f"store {self.store.directory!r} ({self.store.split}): shard {shard} holds "
            f"{documents} document(s) of about {tokens / 2**20:,.0f} M tokens per piece; "
            f"sample_plan={self.c.sample_plan!r} plans over whole documents, so its start-up "
            "and memory would grow with them: set config.data.sample_plan='token_windows' "
            "(windows of the token stream, computed per row), or split the documents"
        )

    def views(self, pieces: list[int]) -> list[_PieceView]:
        """The index of each of ``pieces`` (those not kept: read together, two rounds of
        ranges), cached."""
        return self._views.get_many(list(pieces), self._read_views)

    def _read_views(self, pieces: list[int]) -> list[_PieceView]:
        where = [self.pieces.locate(p) for p in pieces]
        views = [_PieceView(self.store, *index) for index in self.store.piece_indexes(where)]
        for (shard, first, end), view in zip(where, views):
            span = view.sentences[-1, 1] - view.sentences[0, 0] if len(view.sentences) else 0
            if span > MAX_PIECE_TOKENS:
                self._too_large(shard, end - first, span)
        return views

    def tokens(self, piece: int) -> int:
        """Tokens of one piece's documents, their [SEP]s included (from its index)."""
        sentences = self.views([piece])[0].sentences
        return int(sentences[-1, 1] - sentences[0, 0] + 1) if len(sentences) else 0

    def units(self, length: int, epoch: int, piece: int) -> int:
        """Units (rows, or packed rows) of one piece's plan."""
        _, order, packing = self.piece(length, epoch, piece)
        return len(order) if packing is None else len(packing[0]) - 1

    def units_per_piece(self, length: int) -> int:
        """R: units of epoch 0's plans per token over the pieces of its first window (of lane
        0), times the store's mean tokens per piece (from the manifest)."""
        return self._units.get(length, lambda: self._calibrate(length))

    def _calibrate(self, length: int) -> int:
        m = len(self.pieces)
        # The pieces of epoch 0's first window of lane 0: its first batch builds them anyway.
        first = EpochOrder(m, 1, piece_key(self.seed, self.purpose, 0, length), None, self.lanes,
                           self.lane_rows)  # fmt: skip
        chosen = first.members(0, 0).tolist()
        self.views(chosen)
        found = sum(self.units(length, 0, p) for p in chosen)
        if m <= 1:
            return found
        measured = max(1, sum(self.tokens(p) for p in chosen))
        mean = self.pieces.tokens.sum() / m
        return max(1, round(found / measured * mean))

    def epoch(self, length: int, epoch: int) -> PiecePlan:
        """The epoch's PiecePlan (a few kept: each holds its windows' shares)."""
        return self._epochs.get(
            (length, epoch),
            lambda: PiecePlan(self, length, epoch, self.units_per_piece(length)),
        )
