"""Weights & Biases as a tracker, when ``config.trackers`` names wandb (``bertjax[wandb]``).

The W&B run's id is the bertjax run's (WORKDIR/run.json), opened with ``resume="allow"``: a run
restarted from its checkpoints, by hand or by a supervisor, continues the same W&B run. It logs
the run config (with the phase plan of a multi-phase run) as the W&B config, every train and eval
line at its step (a ``phase`` index too when there are phases), and the final summary. A stop by
a signal or an unreachable storage marks the run preempting (it will resume); any other error
finishes it failed. W&B's own environment applies as usual: ``WANDB_MODE=offline`` writes the run
under WORKDIR/wandb for a later ``wandb sync``, ``WANDB_API_KEY`` or ``wandb login`` for online
runs. A gs:// workdir keeps W&B's local files in the bertjax cache (W&B writes a local folder).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import ml_collections

from bertjax import paths
from bertjax.training.tracker_base import Tracker


def _local_dir(workdir: str, run_id: str) -> str:
    """Where W&B writes its run folder: the workdir when local, else the bertjax cache."""
    if paths.is_url(workdir):
        return os.path.join(paths.cache_dir(), "wandb", run_id)
    return workdir


class WandbTracker(Tracker):
    """One W&B run, process 0 only (`bertjax.training.trackers.Trackers` makes it)."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, run_id: str):
        import wandb

        settings = config.wandb
        directory = _local_dir(workdir, run_id)
        os.makedirs(directory, exist_ok=True)
        tags = [tag.strip() for tag in settings.tags.split(",") if tag.strip()]
        name = settings.name or os.path.basename(workdir.rstrip("/")) or None
        try:
            self.run = wandb.init(
                project=settings.project or os.environ.get("WANDB_PROJECT") or "bertjax",
                entity=settings.entity or None,
                name=name,
                tags=tags or None,
                id=run_id,
                resume="allow",
                dir=directory,
                config=config.to_dict(),
            )
        except wandb.errors.Error as error:
            raise ValueError(
                f"config.trackers names wandb, and W&B did not start ({error}): run `wandb login` "
                "or set WANDB_API_KEY, or set WANDB_MODE=offline to write the run locally"
            ) from None
        self.phase_index: int | None = None
        self.preempted = self.failed = False

    def start(self, step: int, phase, phases: list) -> None:
        if len(phases) <= 1:
            return
        self.phase_index = phase.index
        plan = [{"name": p.name, "start": p.start, "end": p.end} for p in phases]
        self.run.config.update({"phase_plan": plan}, allow_val_change=True)
        self.run.summary["phase"] = phase.name

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        values = dict(scalars)
        if self.phase_index is not None:
            values["phase"] = self.phase_index
        self.run.log(values, step=step)

    def finish(self, summary: dict) -> None:
        numbers = {k: v for k, v in summary.items() if isinstance(v, int | float)}
        self.run.summary.update(numbers)
        if summary.get("stopped_by_signal"):
            self.preempted = True

    def fail(self, error: BaseException) -> None:
        from bertjax.retry import StorageUnavailable
        from bertjax.training.stopping import Interrupted

        if isinstance(error, Interrupted | StorageUnavailable | KeyboardInterrupt):
            self.preempted = True
        else:
            self.failed = True

    def close(self) -> None:
        if self.run is None:
            return
        if self.preempted:
            self.run.mark_preempting()  # W&B shows it as preempted: it resumes
        self.run.finish(exit_code=1 if self.failed else 0)
        self.run = None
