"""The global batch size of every step: fixed, or growing by tokens (batch-size warmup).

Batch-size warmup: the batch takes the sizes start, start + quantum, ..., up to (not including)
``batch_size``, then ``batch_size``; the warmup consumes ``batch_warmup.tokens`` tokens (rows x
row length). ``shape`` "equal_steps" gives every size the same number of steps (ModernBERT's
``BatchSizeWarmupScheduler``, answerdotai/ModernBERT); "equal_tokens" the same number of tokens,
so the batch grows in proportion to the tokens consumed (cramming's ramp, Geiping & Goldstein
2023, keyed there to wall time: here to tokens, which keeps it deterministic).

The sizes depend only on the config, never on how many hosts or devices run it; the trainer
checks at start-up that every size divides over them (``quantum`` a multiple of the process
count and of the mesh's batch shards). Data are indexed by samples consumed (`samples_before`),
so the batch of step n is a pure function of (config, n) and a restart at n asks for exactly
the rows it would have got.
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
    c.shape = "equal_steps"  # "equal_steps" (ModernBERT) | "equal_tokens" (cramming's ramp)
    # with config.budget_flops: the warmup's share of the budget's tokens (cramming: 0.6); when
    # > 0 it replaces `tokens`
    c.budget_fraction = 0.0
    return c


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Global batch of every step: ``sizes[k]`` for ``stage_steps[k]`` steps, then ``final``."""

    final: int
    sizes: tuple = ()
    stage_steps: tuple = ()

    @classmethod
    def from_config(
        cls, config: ml_collections.ConfigDict, length: int, tokens: int | None = None
    ) -> BatchPlan:
        """The plan of ``config.batch_size`` and ``config.batch_warmup`` at row length T;
        ``tokens``: the warmup's length when a budget sets it (batch_warmup.budget_fraction)."""
        final = int(config.batch_size)
        warmup = config.get("batch_warmup")
        tokens = int(tokens if tokens is not None else (warmup.tokens if warmup else 0))
        if warmup is None or not tokens:
            return cls(final)
        quantum = int(warmup.quantum) or max(1, final // 8)
        start = int(warmup.start) or quantum
        problems = []
        if final % quantum:
            problems.append(f"quantum {quantum} must divide config.batch_size={final}")
        if start % quantum or not 0 < start < final:
            problems.append(f"start {start} must be a multiple of quantum below batch_size")
        if warmup.shape not in ("equal_steps", "equal_tokens"):
            problems.append(f"shape {warmup.shape!r} is not 'equal_steps' or 'equal_tokens'")
        if problems:
            raise ValueError("config.batch_warmup: " + "; ".join(problems))
        sizes = tuple(range(start, final, quantum))
        if warmup.shape == "equal_steps":
            steps = (max(1, round(tokens / (length * sum(sizes)))),) * len(sizes)
        else:  # every size for tokens / len(sizes) tokens
            steps = tuple(max(1, round(tokens / len(sizes) / (length * b))) for b in sizes)
        return cls(final, sizes, steps)

    @property
    def warmup_steps(self) -> int:
        return sum(self.stage_steps)

    def _stage(self, step: int) -> int:
        """The warmup stage of ``step`` (len(sizes): past the warmup)."""
        return int(np.searchsorted(np.cumsum(self.stage_steps), step, side="right"))

    @property
    def quantum(self) -> int:
        """The largest size every batch of the plan is a multiple of."""
        return int(np.gcd.reduce([self.final, *self.sizes]))

    def batch(self, step: int) -> int:
        """Global batch size of ``step``."""
        stage = self._stage(step)
        return self.sizes[stage] if stage < len(self.sizes) else self.final

    def samples_before(self, step: int) -> int:
        """Samples (rows) the steps before ``step`` consumed."""
        used, start = 0, 0
        for size, steps in zip(self.sizes, self.stage_steps):
            used += size * min(max(step - start, 0), steps)
            start += steps
        return used + max(0, step - start) * self.final

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
        ends = jnp.asarray(np.cumsum(self.stage_steps), jnp.int32)
        stage = jnp.searchsorted(ends, jnp.asarray(step, jnp.int32), side="right")
        return table[stage]

    def samples_at(self, step):
        """`samples_before` of a traced step (jnp float32), the clock of a token-timed schedule."""
        import jax.numpy as jnp

        step = jnp.asarray(step, jnp.float32)
        if not self.sizes:
            return step * self.final
        ends = np.cumsum(self.stage_steps)
        starts = np.concatenate([[0], ends])  # first step of each stage, and of the final batch
        before = np.concatenate([[0], np.cumsum(np.multiply(self.sizes, self.stage_steps))])
        stage = jnp.searchsorted(jnp.asarray(ends, jnp.float32), step, side="right")
        sizes = jnp.asarray([*self.sizes, self.final], jnp.float32)
        start = jnp.asarray(starts, jnp.float32)[stage]
        return jnp.asarray(before, jnp.float32)[stage] + (step - start) * sizes[stage]
