"""The global batch size of every step: fixed, or growing by tokens (batch-size warmup).

Batch-size warmup as ModernBERT's (answerdotai/ModernBERT ``BatchSizeWarmupScheduler``): the
batch takes the sizes start, start + quantum, ..., up to (not including) ``batch_size``, each
for the same number of steps, chosen so that the warmup consumes ``batch_warmup.tokens`` tokens
(rows x row length); then ``batch_size``. The sizes depend only on the config, never on how
many hosts or devices run it; the trainer checks at start-up that every size divides over them
(``quantum`` a multiple of the process count and of the mesh's batch shards). Data are indexed
by samples consumed (`samples_before`), so the batch of step n is a pure function of (config,
n) and a restart at n asks for exactly the rows it would have got.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np


def default_batch_warmup_config() -> ml_collections.ConfigDict:
    """``config.batch_warmup``: off (a fixed ``config.batch_size``) by default."""
    c = ml_collections.ConfigDict()
    c.tokens = 0  # tokens (rows x row length) over which the batch grows (0: a fixed batch)
    c.quantum = 0  # the batch grows in multiples of this (0: batch_size // 8); sizes % quantum == 0
    c.start = 0  # first batch size (0: quantum)
    return c


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Global batch of every step: ``sizes`` for ``stage_steps`` steps each, then ``final``."""

    final: int
    sizes: tuple = ()
    stage_steps: int = 0

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, length: int) -> BatchPlan:
        """The plan of ``config.batch_size`` and ``config.batch_warmup`` at row length T."""
        final = int(config.batch_size)
        warmup = config.get("batch_warmup")
        if warmup is None or not warmup.tokens:
            return cls(final)
        quantum = int(warmup.quantum) or max(1, final // 8)
        start = int(warmup.start) or quantum
        problems = []
        if final % quantum:
            problems.append(f"quantum {quantum} must divide config.batch_size={final}")
        if start % quantum or not 0 < start < final:
            problems.append(f"start {start} must be a multiple of quantum below batch_size")
        if problems:
            raise ValueError("config.batch_warmup: " + "; ".join(problems))
        sizes = tuple(range(start, final, quantum))
        stage = max(1, round(int(warmup.tokens) / (length * sum(sizes))))
        return cls(final, sizes, stage)

    @property
    def warmup_steps(self) -> int:
        return len(self.sizes) * self.stage_steps

    @property
    def quantum(self) -> int:
        """The largest size every batch of the plan is a multiple of."""
        return int(np.gcd.reduce([self.final, *self.sizes]))

    def batch(self, step: int) -> int:
        """Global batch size of ``step``."""
        if step < self.warmup_steps:
            return self.sizes[step // self.stage_steps]
        return self.final

    def samples_before(self, step: int) -> int:
        """Samples (rows) the steps before ``step`` consumed."""
        warm = min(step, self.warmup_steps)
        stages, partial = divmod(warm, self.stage_steps) if self.stage_steps else (0, 0)
        used = self.stage_steps * sum(self.sizes[:stages])
        if partial:
            used += partial * self.sizes[stages]
        return used + max(0, step - self.warmup_steps) * self.final

    def steps_for_samples(self, samples: int) -> int:
        """The first step before which at least ``samples`` rows were consumed."""
        low, high = 0, max(1, -(-samples // min(self.sizes or (self.final,)))) + 1
        while low < high:  # samples_before is non-decreasing
            middle = (low + high) // 2
            if self.samples_before(middle) >= samples:
                high = middle
            else:
                low = middle + 1
        return low

    def batch_at(self, step):
        """`batch` of a traced step (jnp), for the LR scaling of a growing batch."""
        import jax.numpy as jnp

        if not self.sizes:
            return jnp.asarray(self.final, jnp.float32)
        table = jnp.asarray([*self.sizes, self.final], jnp.float32)
        stage = jnp.minimum(jnp.asarray(step, jnp.int32) // self.stage_steps, len(self.sizes))
        return table[stage]
