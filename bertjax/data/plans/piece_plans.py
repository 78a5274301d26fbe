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

Order. Epoch e shuffles the pieces (`IndexShuffle`, keyed by e) and groups them WINDOW (4) at a
time (BERT's run_pretraining.py read 4 files at once); a window gets `len(window) * R` rows,
shuffled within the window (a second keyed `IndexShuffle`) and shared out over its pieces in
proportion to their units (rows, or packed rows) in this epoch, so each unit of a window is read
about equally often. Every host reads all 4 pieces of a window over its life, so building their
plans to share the rows out costs it nothing more. Position p of the epoch is computed alone,
from O(shards) numbers and its window's pieces. A piece hands out units j = 0, 1, ... of its own
shuffled plan (j modulo its size). R is calibrated once per row length on epoch 0's first window
(units per token, times the store's mean tokens per piece), so an epoch is about one pass over
the store: a piece with more units than its share leaves the rest for the next epoch's (new)
plan, one with fewer repeats some. Deviation from a whole-store plan: these piece edges and
windows of equal size (measured: tests/data_plan_stats_test.py, benchmarks/plan_stats.py). A
store of one piece (the built-in corpus) gives exactly the whole-store plan of samples.py and
its permutation. A piece of over MAX_PIECE_TOKENS tokens (documents that long) is refused with
a message naming token_windows.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from bertjax.data import keys
from bertjax.data.plans import rows, samples
from bertjax.data.plans.index_shuffle import IndexShuffle

WINDOW = 4  # pieces read together (BERT's run_pretraining.py interleaves min(4, files) files)
MAX_PIECE_TOKENS = 1 << 27  # a piece above this (documents this long) is refused
_CACHE_PIECES = 4 * WINDOW  # piece plans kept per split


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


def _piece_order(split, epoch: int, length: int) -> IndexShuffle:
    """Epoch ``epoch``'s shuffle of the pieces."""
    key = keys.row_keys(split.seed, epoch, f"{split.purpose}/pieces/{length}", np.zeros(1))
    return IndexShuffle(len(split.pieces), int(key[0]))


class PiecePlan:
    """One epoch of a sentence plan at one row length: ``locate`` and ``samples`` by position."""

    def __init__(self, split, length: int, epoch: int, units_per_piece: int):
        self.split, self.length, self.epoch, self.r = split, length, epoch, units_per_piece
        self.pieces = split.pieces
        self.m = len(self.pieces)
        self.piece_order = _piece_order(split, epoch, length)
        self._windows: dict[int, tuple] = {}

    def __len__(self) -> int:
        return self.m * self.r

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(piece, unit of the piece) of each position of the epoch."""
        positions = np.asarray(positions, np.int64)
        per_window = WINDOW * self.r
        window, within = np.divmod(positions, per_window)
        piece, unit = np.empty_like(positions), np.empty_like(positions)
        for w in np.unique(window).tolist():
            chosen = window == w
            members, shuffle, bounds = self._window(w)
            slot = within[chosen] if shuffle is None else shuffle[within[chosen]]
            which = np.searchsorted(bounds, slot, side="right")
            piece[chosen] = members[which]
            unit[chosen] = slot - np.concatenate([[0], bounds])[which]
        return piece, unit

    def _window(self, w: int):
        """(pieces, shuffle of its slots or None, end slot of each piece) of window ``w``: the
        window's rows shared out in proportion to each piece's units (its plan, built here)."""
        with self.split.lock:  # prefetch threads share the epoch
            if w not in self._windows:
                if len(self._windows) >= 4:
                    self._windows.pop(next(iter(self._windows)))
                self._windows[w] = self._share(w)
            return self._windows[w]

    def _share(self, w: int):
        members = self._members(w)
        size = len(members) * self.r
        shuffle = None
        if len(members) > 1:
            purpose = f"{self.split.purpose}/window/{self.length}"
            key = keys.row_keys(self.split.seed, self.epoch, purpose, np.array([w]))
            shuffle = IndexShuffle(size, int(key[0]))
            if size <= 1 << 22:  # its values, once: a lookup per row afterwards
                shuffle = shuffle[np.arange(size)]
        weight = np.asarray(
            [self.split.units(self.length, self.epoch, int(p)) for p in members], np.float64
        )
        if not weight.sum():
            self._no_rows(members)
        bounds = np.floor(np.cumsum(weight) / weight.sum() * size).astype(np.int64)
        bounds[-1] = size
        return members, shuffle, bounds

    def _members(self, window: int) -> np.ndarray:
        """The pieces of one window of this epoch."""
        return self.piece_order[np.arange(window * WINDOW, min(self.m, (window + 1) * WINDOW))]

    def _no_rows(self, members: np.ndarray):
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
    calibrated per row length."""

    def __init__(self, store, data_config, seed: int, purpose: str):
        self.store, self.c, self.seed, self.purpose = store, data_config, seed, purpose
        self.pieces = Pieces(*store.shard_counts(), data_config.piece_tokens)
        shard, largest = self.pieces.largest()
        if largest > MAX_PIECE_TOKENS:
            self._too_large(shard, int(self.pieces.documents[shard]), largest)
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._views: collections.OrderedDict = collections.OrderedDict()
        self._epochs: collections.OrderedDict = collections.OrderedDict()
        self._units: dict[int, int] = {}
        self.lock = threading.RLock()

    def piece(self, length: int, epoch: int, piece: int):
        """(plan, order, packing or None) of one piece in one epoch at one row length."""
        key = (length, epoch, piece)
        with self.lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            c = self.c
            view = self._view(piece)
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
            self._cache[key] = (plan, order, packing)
            if len(self._cache) > _CACHE_PIECES:
                self._cache.popitem(last=False)
            return self._cache[key]

    def _too_large(self, shard: int, documents: int, tokens: float):
        raise ValueError(
            f"store {self.store.directory!r} ({self.store.split}): shard {shard} holds "
            f"{documents} document(s) of about {tokens / 2**20:,.0f} M tokens per piece; "
            f"sample_plan={self.c.sample_plan!r} plans over whole documents, so its start-up "
            "and memory would grow with them: set config.data.sample_plan='token_windows' "
            "(windows of the token stream, computed per row), or split the documents"
        )

    def _view(self, piece: int) -> _PieceView:
        """The index of one piece (two range reads of its shard), cached."""
        with self.lock:
            if piece in self._views:
                self._views.move_to_end(piece)
                return self._views[piece]
            shard, first, end = self.pieces.locate(piece)
            view = _PieceView(self.store, *self.store.piece_index(shard, first, end))
            if (
                len(view.sentences)
                and view.sentences[-1, 1] - view.sentences[0, 0] > MAX_PIECE_TOKENS
            ):
                self._too_large(shard, end - first, view.sentences[-1, 1] - view.sentences[0, 0])
            self._views[piece] = view
            if len(self._views) > _CACHE_PIECES:
                self._views.popitem(last=False)
            return view

    def tokens(self, piece: int) -> int:
        """Tokens of one piece's documents, their [SEP]s included (from its index)."""
        sentences = self._view(piece).sentences
        return int(sentences[-1, 1] - sentences[0, 0] + 1) if len(sentences) else 0

    def units(self, length: int, epoch: int, piece: int) -> int:
        """Units (rows, or packed rows) of one piece's plan."""
        _, order, packing = self.piece(length, epoch, piece)
        return len(order) if packing is None else len(packing[0]) - 1

    def units_per_piece(self, length: int) -> int:
        """R: units of epoch 0's plans per token over the pieces of its first window, times the
        store's mean tokens per piece (from the manifest)."""
        if length not in self._units:
            m = len(self.pieces)
            # The pieces of epoch 0's first window: the first batch builds them anyway.
            chosen = _piece_order(self, 0, length)[np.arange(min(m, WINDOW))].tolist()
            found = sum(self.units(length, 0, p) for p in chosen)
            if m <= 1:
                self._units[length] = found
            else:
                measured = max(1, sum(self.tokens(p) for p in chosen))
                mean = self.pieces.tokens.sum() / m
                self._units[length] = max(1, round(found / measured * mean))
        return self._units[length]

    def epoch(self, length: int, epoch: int) -> PiecePlan:
        """The epoch's PiecePlan (a few kept: each holds its windows' shares)."""
        key = (length, epoch)
        with self.lock:
            if key not in self._epochs:
                self._epochs[key] = PiecePlan(self, length, epoch, self.units_per_piece(length))
                if len(self._epochs) > 4:
                    self._epochs.popitem(last=False)
            return self._epochs[key]
