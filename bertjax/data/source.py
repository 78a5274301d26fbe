"""What the trainer may ask of a data source: the `DataSource` base class.

Every source (the pretraining `Pipeline`, fine-tuning task data) gives this host's rows of the
global batch of a step and fixed held-out batches; the optional hooks have defaults that do
nothing, so the trainer never probes a source with ``hasattr``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

from bertjax.data import keys


def host_rows(global_batch_size: int, process_index: int, process_count: int) -> slice:
    """The rows of each global batch that host ``process_index`` of ``process_count`` builds."""
    if global_batch_size % process_count:
        raise ValueError(
            f"config.batch_size={global_batch_size} is not divisible by the process count "
            f"{process_count}: every host must get the same number of rows"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is outside [0, {process_count})")
    per_host = global_batch_size // process_count
    return slice(process_index * per_host, (process_index + 1) * per_host)


def shuffled_rows(
    seed: int, step: int, global_batch_size: int, rows: slice, count: int, stream: str
) -> np.ndarray:
    """Example indices of this host's ``rows`` of global batch ``step`` over ``count`` examples
    seen in epochs, each epoch a permutation keyed by (seed, epoch, stream): what fine-tuning
    and pair data draw (independent of the host count, like every batch)."""
    positions = int(step) * global_batch_size + np.arange(global_batch_size)[rows]
    epochs, offsets = np.divmod(positions, count)
    index = np.empty_like(positions)
    for epoch in np.unique(epochs):
        order = keys.generator(seed, int(epoch), stream).permutation(count)
        index[epochs == epoch] = order[offsets[epochs == epoch]]
    return index


def ordered_rows(
    count: int, global_batch_size: int, rows: slice, num_batches: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(indices, weights) of this host's rows of each held-out batch: ``count`` examples in
    order, the last batch padded with repeats of the last example at weight 0 (``num_batches``
    > 0 caps the batches)."""
    total = -(-count // global_batch_size)
    for b in range(min(total, num_batches) if num_batches > 0 else total):
        positions = b * global_batch_size + np.arange(global_batch_size)[rows]
        yield np.minimum(positions, count - 1), (positions < count).astype(np.float32)


class DataSource(abc.ABC):
    """Batches as a pure function of the step, plus what the trainer may ask of them."""

    tokenizer = None  # the source's Tokenizer (encode/decode, special ids)
    dev_metric: str | None = None  # a dev metric to keep WORKDIR/best by (fine-tuning)
    # the version of the plans its rows come from (bertjax/data/plan_version.py), recorded in
    # every checkpoint and checked on resume; None: rows that no plan version decides
    plan_version: int | None = None
    _prefetch = None  # a subclass's reads ahead (bertjax/data/prefetch.py), where it has them
    _end: int | None = None  # `end_at`'s step

    @property
    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A stable hash of the data (recorded in checkpoints; changes when the data does)."""

    @abc.abstractmethod
    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This host's rows of global batch ``step`` (numpy, fixed shapes)."""

    @abc.abstractmethod
    def eval_batches(self, num_batches: int) -> Iterator[dict[str, np.ndarray]]:
        """Held-out batches, the same on every call (``num_batches`` 0: all of them)."""

    def step_batch_size(self, step: int) -> int | None:
        """The global batch size of ``step`` (batch-size warmup); None: config.batch_size."""
        return None

    def model_config(self):
        """A BertConfig the data fixes (a fine-tuning checkpoint's), or None: the run's own."""
        return None

    def unigram_log_prior(self) -> np.ndarray | None:
        """[V] log token frequencies for the MLM bias init, or None when the source has none."""
        return None

    def score(self, predictions: np.ndarray) -> dict:
        """Task metrics of the held-out predictions (fine-tuning); {} when there are none."""
        return {}

    def write_predictions(self, path: str) -> None:
        """Writes the last scored predictions beside the best checkpoint (fine-tuning)."""

    def check_resume(self, saved_config: dict, step: int) -> None:
        """Raises when resuming at ``step`` a run saved with ``saved_config`` (a dict) would
        change the data of the steps already trained (a mixture's past weights)."""

    def end_at(self, steps: int) -> None:
        """The run asks for no batch at or past step ``steps`` (its phase ends there): reads
        ahead stop before it. A batch asked for later is still computed (at once)."""
        self._end = int(steps)
        if self._prefetch is not None:
            self._prefetch.end = self._end

    def close(self) -> None:
        """Stops background work (prefetching)."""
