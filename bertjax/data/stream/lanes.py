"""Lanes of a streamed corpus: the global batch of B rows is cut into L lanes of R = B / L
consecutive rows (L: the largest divisor of B that is at most the number of units), and each
lane reads its own units (units.py) only, shared out by bytes. A lane's token stream is its
units' training documents, tokenized (a [SEP] after each document), epoch after epoch, each
epoch its units in an order keyed by (seed, epoch, lane); window k of a lane is tokens
[k W, (k + 1) W) of that stream (W = T - 2, a row `[CLS] window [SEP]`), and lane l gives step s
its windows s R .. s R + R - 1. So a batch is a function of the step alone (not of the process
count: a process builds the rows of the lanes its rows fall in, reads only their units, and a
resumed run recomputes where step s's windows start), and every document is read by one lane.

Where a window starts takes the token counts of the units before it in the lane's stream: the
first epoch counts them as it goes, and the workdir keeps them (counts.py); a run resumed
mid-corpus tokenizes the lane's units before its position once to count them only where the
workdir lacks their counts (kept in memory; the units a step reads are kept too, a few a
lane)."""

from __future__ import annotations

import collections
import threading

import numpy as np

from bertjax.data import keys

KEPT_UNITS = 3  # tokenized units a lane keeps in memory


def lane_count(batch_size: int, units: int) -> int:
    """L: the largest divisor of the batch size that is at most the number of units."""
    return max(d for d in range(1, batch_size + 1) if batch_size % d == 0 and d <= max(units, 1))


def share_out(sizes: list[int], lanes: int) -> list[list[int]]:
    """The units (indices) of each lane, in corpus order: each unit, largest first, to the lane
    with the fewest bytes so far (then the fewest units, then the lowest index)."""
    load = [(0, 0, lane) for lane in range(lanes)]
    members: list[list[int]] = [[] for _ in range(lanes)]
    for unit in sorted(range(len(sizes)), key=lambda u: (-sizes[u], u)):
        bytes_, count, lane = min(load)
        members[lane].append(unit)
        load[lane] = (bytes_ + sizes[unit], count + 1, lane)
    return [sorted(m) for m in members]


class LaneStream:
    """The token stream of one lane; ``tokenize(unit)`` gives a unit's (tokens, word starts)."""

    def __init__(self, lane: int, units: list[int], seed: int, tokenize):
        self.lane, self.units, self.seed, self.tokenize = lane, units, seed, tokenize
        self.counts: dict[int, int] = {}  # unit -> training tokens (read, or from counts_from)
        self.counts_from = ""  # where counts read from the workdir came from
        self._kept: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def order(self, epoch: int) -> list[int]:
        """The lane's units in epoch ``epoch``'s order."""
        rng = keys.generator(self.seed, epoch, f"stream/lane/{self.lane}")
        return [self.units[i] for i in rng.permutation(len(self.units))]

    def _unit(self, unit: int) -> tuple[np.ndarray, np.ndarray]:
        if unit in self._kept:
            self._kept.move_to_end(unit)
            return self._kept[unit]
        got = self.tokenize(unit)
        if self.counts.get(unit, len(got[0])) != len(got[0]):
            raise ValueError(
                f"unit {unit} of the streamed corpus holds {len(got[0])} training tokens, but "
                f"{self.counts_from} says {self.counts[unit]}: the counts there are stale or "
                "damaged: delete that folder and resume again (its units are counted anew)"
            )
        self.counts[unit] = len(got[0])
        self._kept[unit] = got
        while len(self._kept) > KEPT_UNITS:
            self._kept.popitem(last=False)
        return got

    def _count(self, unit: int) -> int:
        if unit not in self.counts:
            self._unit(unit)
        return self.counts[unit]

    def total(self) -> int | None:
        """Tokens an epoch of the lane holds; None until every unit was counted."""
        if len(self.counts) < len(set(self.units)):
            return None
        total = sum(self.counts[u] for u in self.units)
        if total == 0:
            raise ValueError(
                f"lane {self.lane} of the streamed corpus has no training text in its units "
                f"{self.units}: they hold only empty or held-out documents"
            )
        return total

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, word starts) at lane offsets [start, stop)."""
        with self._lock:
            epoch, base = 0, 0
            total = self.total()
            if total is not None:
                epoch, base = start // total, (start // total) * total
            pieces = []
            while base < stop:
                for unit in self.order(epoch):
                    count = self._count(unit)
                    if base + count > start and base < stop:
                        tokens, starts = self._unit(unit)
                        lo, hi = max(start - base, 0), min(stop - base, count)
                        pieces.append((tokens[lo:hi], starts[lo:hi]))
                    base += count
                    if base >= stop:
                        break
                else:  # a whole epoch short of ``stop``: every unit is counted now
                    epoch += 1
                    self.total()  # (raises when the lane holds no text at all)
        tokens = np.concatenate([p[0] for p in pieces])
        starts = np.concatenate([p[1] for p in pieces])
        return tokens, starts
