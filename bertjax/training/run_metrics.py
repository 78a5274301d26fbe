"""What a run logs besides the step's own metrics: held-out metrics over fixed eval batches
(`evaluate`), and the tokens, FLOPs and storage retries of the steps since the last log line
(`LogWindow`), every number a host computes from its own rows summed over the processes."""

from __future__ import annotations

import collections
import time

import jax
import numpy as np

from bertjax import retry
from bertjax.training import metrics as metrics_lib
from bertjax.training import processes, sharding


def evaluate(steps, state, data, mesh, config) -> dict:
    """Held-out metrics over fixed eval batches: the objective's metrics of the summed loss
    sums and normalizers (exact averages), what the objective adds from host-side counts summed
    over the processes (e.g. perplexity, a majority baseline), and task scores of the
    predictions (every row's, on every process)."""
    objective = state.spec.objective
    totals = None
    counts = collections.Counter()
    predictions = []
    for batch in data.eval_batches(int(config.eval_batches)):
        counts.update(objective.held_out_counts(batch))
        out = steps.eval(state, sharding.global_batch(batch, mesh, config.batch_size))
        parts = jax.device_get({"sums": out["sums"], "norms": out["norms"]})
        if "predictions" in out:  # fine-tuning: task metrics need every dev prediction on host
            predictions.append(jax.device_get(out["predictions"]))
        totals = parts if totals is None else jax.tree.map(np.add, totals, parts)
    if totals is None:
        return {}
    report = objective.report(totals["sums"], totals["norms"])
    counts = processes.sum_counters(counts)  # each host counted its own rows
    result = objective.held_out_metrics({k: float(v) for k, v in report.items()}, counts)
    if predictions:
        result.update(data.score(np.concatenate(predictions)))
    return result


class LogWindow:
    """Tokens and model FLOPs of the steps since the last log line, for tokens/s and MFU."""

    def __init__(self, config, model_cfg, objective, peak: float):
        self.config, self.model_cfg, self.objective, self.peak = config, model_cfg, objective, peak
        self.num_devices = jax.device_count()
        self.restart()

    def restart(self) -> None:
        self.tokens = self.flops = 0.0
        self.start = time.perf_counter()
        self.storage = retry.COUNTS.snapshot()

    def add(self, host_batch: dict, batch_size: int) -> None:
        """Estimates of the global batch from this host's rows (its count x the processes); the
        mean of the processes' estimates (`scalars`) is the exact global count."""
        self.tokens += float(np.sum(host_batch["attention_mask"])) * jax.process_count()
        self.flops += self.objective.batch_flops(
            self.model_cfg, host_batch, batch_size, metrics_lib.train_flops_per_sequence
        )

    def scalars(self, steps: int) -> dict:
        """perf/* of the window's ``steps`` steps, and storage/*: the requests of the processes
        (the data workers' not counted) that failed in the window and were retried, and those
        that then succeeded; starts a new window."""
        elapsed = time.perf_counter() - self.start
        now = retry.COUNTS.snapshot()
        failed, recovered = (now[k] - self.storage[k] for k in ("failed", "recovered"))
        tokens, flops, failed, recovered = processes.sum_numbers(
            [self.tokens, self.flops, failed, recovered]
        )
        tokens, flops = tokens / jax.process_count(), flops / jax.process_count()
        out = {
            "perf/tokens_per_second": tokens / elapsed,
            "perf/steps_per_second": steps / elapsed,
            "perf/mfu": metrics_lib.mfu(
                flops / steps, elapsed / steps, self.num_devices, self.peak
            ),
            "storage/failed_requests": int(failed),
            "storage/recovered_requests": int(recovered),
        }
        self.restart()
        return out
