"""Sequence-length schedules: the row length of every step, known ahead, and its ordinal at that
length.

- none: every step uses max_seq_length.
- phases (mixed_lengths=False): ((0.9, 128), (0.1, 512)) = the first 90% of num_train_steps at 128,
  then 512 (BERT's two phases); steps past the end stay in the last phase.
- mixed (mixed_lengths=True): ((0.25, 128), (0.5, 512), (0.25, 1024)) = each block of 100 steps
  holds exactly 25/50/25 steps of each length in an order shuffled by (seed, block).
The ordinal (how many earlier steps used the same length) drives that length's own epochs.
"""

from __future__ import annotations

import numpy as np

from bertjax.data import keys

BLOCK = 100


def _largest_remainder(fractions: list[float], total: int) -> list[int]:
    """Integer counts summing to `total`, proportional to `fractions`."""
    raw = np.asarray(fractions) * total
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


class LengthSchedule:
    """step -> (row length, ordinal among steps of that length)."""

    def __init__(
        self,
        max_seq_length: int,
        schedule=(),
        mixed: bool = False,
        total_steps: int | None = None,
        seed: int = 0,
    ):
        self.seed = seed
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.schedule = [(float(f), int(t)) for f, t in schedule]
        self.lengths = sorted({t for _, t in self.schedule} or {max_seq_length})
        self.mixed = mixed and bool(self.schedule)
        if self.schedule and not self.mixed:
            if not total_steps or total_steps < 1:
                raise ValueError(
                    "config.data.length_schedule in phases needs config.num_train_steps (the "
                    "total number "
                    "of steps the fractions refer to); set it, or use mixed_lengths=True"
                )
            ends = np.rint(np.cumsum([f for f, _ in self.schedule]) * total_steps).astype(int)
            self.phase_ends = ends.tolist()
            self.phase_ends[-1] = max(self.phase_ends[-1], total_steps)
        if self.mixed:
            merged: dict[int, float] = {}
            for f, t in self.schedule:
                merged[t] = merged.get(t, 0.0) + f
            self.block_lengths = list(merged)
            self.block_counts = _largest_remainder(list(merged.values()), BLOCK)

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """Lengths of the steps of one block and each step's rank among steps of its length."""
        if block not in self._blocks:
            if len(self._blocks) >= 64:
                self._blocks.clear()
            self._blocks[block] = self._make_block(block)
        return self._blocks[block]

    def _make_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.repeat(self.block_lengths, self.block_counts)
        lengths = keys.generator(self.seed, block, "lengths").permutation(lengths)
        ranks = np.zeros(BLOCK, np.int64)
        for t in self.block_lengths:
            where = lengths == t
            ranks[where] = np.arange(where.sum())
        return lengths, ranks

    def __call__(self, step: int) -> tuple[int, int]:
        if step < 0:
            raise ValueError(f"step={step}: must be >= 0")
        if not self.schedule:
            return self.lengths[0], step
        if self.mixed:
            block, offset = divmod(step, BLOCK)
            lengths, ranks = self._block(block)
            length = int(lengths[offset])
            return length, block * self.block_counts[self.block_lengths.index(length)] + int(
                ranks[offset]
            )
        start, before = 0, {}
        for (_, length), end in zip(self.schedule, self.phase_ends):
            if step < end or end == self.phase_ends[-1]:
                return length, before.get(length, 0) + step - start
            before[length] = before.get(length, 0) + end - start
            start = end
        raise AssertionError("unreachable")
