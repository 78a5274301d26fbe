"""Mixtures of sharded stores with sampling weights (ModernBERT-style web/code/papers mixes).

    config.data.mixture = (("gs://B/web", 0.7), ("gs://B/code", 0.2), ("gs://B/papers", 0.1))
    config.data.mixture_changes = ((20000, (0.5, 0.3, 0.2)),)   # new weights from step 20000 on

Each step's global batch takes n_k rows from store k: B * w_k rounded by largest remainder (ties
to the earlier store), the same every step of a weight phase; the rows' places in the batch are
a permutation keyed by (seed, step). Store k's rows are its own samples, in order: row i of
store k at step s is its sample consumed_k(s) + i, where consumed_k(s) = sum over the steps
before s of n_k at that step: a closed form of (config, step), so the batch of step N is a pure
function of (config, N) on any number of hosts. Batches ahead are computed as the pipeline's
(prefetch.py, the first store's read settings): the rows of `read_steps` steps from each store
in one read of that store.

Changing weights on resume, the rule: a change is a new entry of `mixture_changes` at a step
at or after the step the run resumes from; each store then continues from the sample where it
stopped, so nothing is seen twice or skipped (Megatron-LM#457 is what happens otherwise: new
weights applied to the whole past move every store's position). Editing `mixture` weights or a
change at a step before the resume step rewrites the past; the trainer refuses such a resume
(`check_resume`), naming the key.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time

import numpy as np

from bertjax.data import keys
from bertjax.data.plan_version import PLAN_VERSION
from bertjax.data.prefetch import CLOSE_WAIT_S, Prefetch
from bertjax.data.source import DataSource, host_rows


def rows_per_store(weights, batch_size: int) -> np.ndarray:
    """n_k: batch_size * w_k / sum(w) rounded by largest remainder (ties to the earlier store)."""
    w = np.asarray(weights, np.float64)
    exact = batch_size * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    remainder = exact - counts
    extra = np.argsort(-remainder, kind="stable")[: batch_size - counts.sum()]
    counts[extra] += 1
    return counts


def weight_phases(c, batch_size: int) -> list[tuple[int, np.ndarray]]:
    """[(first step, rows per store)] of config.data.mixture and its changes, by step."""
    initial = [float(w) for _, w in c.mixture]
    phases = [(0, rows_per_store(initial, batch_size))]
    for step, weights in sorted(tuple(change) for change in c.mixture_changes):
        if len(weights) != len(initial):
            raise ValueError(
                f"config.data.mixture_changes: step {step} gives {len(weights)} weights for "
                f"{len(initial)} stores"
            )
        phases.append((int(step), rows_per_store(weights, batch_size)))
    return phases


def consumed(phases, step: int) -> np.ndarray:
    """Samples each store gave in steps [0, step): closed form over the weight phases."""
    total = np.zeros(len(phases[0][1]), np.int64)
    for (start, counts), (end, _) in zip(phases, [*phases[1:], (None, None)]):
        stop = step if end is None else min(step, end)
        total += max(0, stop - start) * counts
    return total


class Mixture(DataSource):
    """This host's rows of each step's global batch, drawn from several stores by weight."""

    plan_version = PLAN_VERSION

    def __init__(self, config, pipelines: list, *, process_index: int, process_count: int):
        c = config.data
        self.config, self.pipelines = config, pipelines
        self.tokenizer = pipelines[0].tokenizer
        for pipeline, (url, _) in zip(pipelines, c.mixture):
            if pipeline.tokenizer.fingerprint() != self.tokenizer.fingerprint():
                raise ValueError(
                    f"config.data.mixture: store {url!r} was made with another tokenizer than "
                    f"{c.mixture[0][0]!r}; a mixture needs one tokenizer"
                )
        if pipelines[0].step_batch_size(0) != config.batch_size:  # a growing batch
            raise ValueError("config.data.mixture with a growing batch (config.batch_warmup)")
        self.phases = weight_phases(c, config.batch_size)
        self.process_index, self.process_count = process_index, process_count
        reads = pipelines[0].reads
        self._prefetch = None
        if reads.prefetch:
            threads = concurrent.futures.ThreadPoolExecutor(reads.prefetch_threads, "bertjax-mix")
            self._prefetch = Prefetch(
                self.compute_batches, threads, reads.prefetch, reads.read_steps
            )

    @property
    def fingerprint(self) -> str:
        parts = [p.fingerprint for p in self.pipelines]
        parts.append([(s, c.tolist()) for s, c in self.phases])
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def sources(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(store, store sample index) of every row of global batch ``step``."""
        counts = [c for start, c in self.phases if start <= step][-1]
        store = np.repeat(np.arange(len(counts)), counts)
        store = store[
            keys.generator(self.config.seed, step, "mixture/order").permutation(len(store))
        ]
        rank = np.zeros(len(store), np.int64)  # i: the i-th row of its store in this batch
        for k in range(len(counts)):
            rank[store == k] = np.arange(counts[k])
        return store, consumed(self.phases, step)[store] + rank

    def batch(self, step: int) -> dict[str, np.ndarray]:
        if self._prefetch is None:
            return self.compute_batches([int(step)])[0]
        return self._prefetch.batch(int(step), lambda s: self.compute_batches([s])[0])

    def compute_batches(self, steps: list[int]) -> list[dict[str, np.ndarray]]:
        """This host's rows of the batches of ``steps``, computed now: each store's rows of all
        of them located, then read together (one read a store), then built and masked."""
        located = []  # per step: (store of each row, {store k: (its rows, its located rows)})
        for step in steps:
            store, sample = self.sources(int(step))
            hosts = host_rows(len(store), self.process_index, self.process_count)
            store, sample = store[hosts], sample[hosts]
            length = self.pipelines[0].seq_len(int(step))
            parts = {}
            for k in np.unique(store).tolist():
                chosen = store == k
                rows = self.pipelines[k].locate_rows(
                    length, sample[chosen], sample[chosen], f"mask/mixture/{k}"
                )
                parts[k] = (chosen, rows)
            located.append((store, parts))
        read = {}
        for k, pipeline in enumerate(self.pipelines):
            mine = [(i, parts[k][1]) for i, (_, parts) in enumerate(located) if k in parts]
            for (i, _), got in zip(mine, pipeline.read_rows([rows for _, rows in mine])):
                read[i, k] = got
        out = []
        for i, (store, parts) in enumerate(located):
            batches = {
                k: (
                    chosen,
                    self.pipelines[k].mask_rows(self.pipelines[k].build_rows(rows, read[i, k])),
                )
                for k, (chosen, rows) in parts.items()
            }
            first = next(iter(batches.values()))[1]
            batch = {}
            for key, value in first.items():
                batch[key] = np.zeros((len(store), *value.shape[1:]), value.dtype)
                for chosen, part in batches.values():
                    batch[key][chosen] = part[key]
            out.append(batch)
        return out

    def seq_len(self, step: int) -> int:
        return self.pipelines[0].seq_len(step)

    def eval_batches(self, num_batches: int):
        """The first store's held-out batches."""
        return self.pipelines[0].eval_batches(num_batches)

    def unigram_log_prior(self):
        return self.pipelines[0].unigram_log_prior()

    def check_resume(self, saved_config, step: int) -> None:
        """Refuses a resume at ``step`` whose weights before ``step`` differ from the saved run's
        (see the module docstring)."""
        saved = saved_config.get("data", {})
        if not saved.get("mixture"):
            return
        import ml_collections

        old = weight_phases(ml_collections.ConfigDict(saved), self.config.batch_size)
        if consumed(old, step).tolist() != consumed(self.phases, step).tolist():
            raise ValueError(
                "config.data.mixture / mixture_changes: the weights of steps before the resume "
                f"step {step} differ from the checkpoint's; keep them and add a change at step "
                f">= {step} to config.data.mixture_changes (bertjax/data/mixture.py)"
            )

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stops its and its stores' background work, within ``timeout_s`` (Pipeline.close)."""
        deadline = time.monotonic() + timeout_s
        if self._prefetch is not None:
            self._prefetch.close(timeout_s)
        for p in self.pipelines:
            p.close(max(0.0, deadline - time.monotonic()))
