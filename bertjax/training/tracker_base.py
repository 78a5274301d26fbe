"""The tracker interface (`bertjax.training.trackers` holds the trackers and the set of them;
`bertjax.training.wandb_tracker` the W&B one): apart, so neither imports the other's module."""

from __future__ import annotations

from collections.abc import Mapping


class Tracker:
    """What the trainer tells a tracker; each hook's default does nothing."""

    def start(self, step: int, phase, phases: list) -> None:
        """A phase starts (or resumes) at ``step``; ``phases``: the run's plan."""

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Train or eval scalars of ``step``."""

    def finish(self, summary: dict) -> None:
        """The run's last metrics (`train_and_evaluate`'s summary), once, when it returns."""

    def fail(self, error: BaseException) -> None:
        """The call ends with ``error`` instead (a signal stop, storage unreachable, a bug)."""

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
