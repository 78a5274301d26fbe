"""WORKDIR/best: the train state with the best dev metric so far, its predictions and metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import jax

from bertjax import paths
from bertjax.tasks.task_metrics import better
from bertjax.training.checkpoint import Checkpointer


class BestCheckpoint:
    """Keeps WORKDIR/best: the state with the best dev ``metric`` so far, and its predictions."""

    def __init__(self, workdir: str, metric: str, predictions_file: str = "dev_predictions.tsv"):
        self.metric, self.predictions_file = metric, predictions_file
        self.directory = paths.join(workdir, "best")
        self._ckpt = Checkpointer(self.directory, keep=1, async_save=False)
        self.value: float | None = None
        self.step: int | None = None
        if self._ckpt.latest_step() is not None:  # a resumed run competes with its earlier best
            best = self._ckpt.read_meta().get("best", {})
            self.value, self.step = best.get("value"), best.get("step")

    def update(
        self, step: int, result: dict, state, meta: dict, write_predictions: Callable[[str], None]
    ) -> bool:
        """Saves ``state`` (and writes its predictions) when ``result`` improves the dev metric."""
        key = f"eval/{self.metric}"
        if key not in result:
            raise KeyError(
                f"config.task.metric={self.metric!r} is not among the eval metrics "
                f"{sorted(k[5:] for k in result)}"
            )
        value = float(result[key])
        if not better(self.metric, value, self.value):
            return False
        self.value, self.step = value, int(step)
        best = {"metric": self.metric, "value": value, "step": int(step)}
        self._ckpt.save(state, {**meta, "best": best}, force=True)
        self._ckpt.wait()
        if jax.process_index() == 0:  # shared files: one writer
            write_predictions(paths.join(self.directory, self.predictions_file))
            record = {**best, "metrics": {k: float(v) for k, v in result.items()}}
            paths.write_text(paths.join(self.directory, "best.json"), json.dumps(record, indent=1))
        logging.info("new best %s=%.4f at step %d -> %s", self.metric, value, step, self.directory)
        return True

    def close(self) -> None:
        self._ckpt.close()
