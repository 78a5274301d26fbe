"""A stop request (SIGTERM, SIGINT) made one decision for every process of a run.

One process: a signal sets a flag the loop reads after each step; that step is saved and the run
stops. Several processes (a pod slice, a GPU cluster): a signal often reaches one host only (a
maintenance event, a spot preemption) or the hosts a step apart, and a process that stops to save
while another goes on to its next step deadlocks both in different collectives. So the stop goes
through JAX's preemption sync point, as MaxText does: JAX's notifier owns SIGTERM (its own C
handler, installed by `jax.distributed.initialize`), tells the coordination service, every
process reports its step, and `multihost_utils.reached_preemption_sync_point(step)` is true on
every process at the same step (the largest reported plus one). SIGINT is passed on to that
notifier as a SIGTERM of this process, so Ctrl-C on one host stops all of them the same way; a
second SIGINT interrupts at once.

JAX's sync point needs every process to report each step in order, from the same first step
(`StopRequests.reached` is called with every step), and nobody else to report (bertjax's orbax
manager does not: bertjax/training/checkpoint.py).
"""

from __future__ import annotations

import signal


def _preemption_sync() -> bool:
    """Whether this is a jax.distributed run with JAX's preemption sync manager."""
    from jax._src import distributed

    state = distributed.global_state
    if state.client is None:
        return False
    if state.preemption_sync_manager is None:
        raise RuntimeError(
            "jax_enable_preemption_service is off: bertjax stops the processes of a run together "
            "through it (a signal to one host would otherwise deadlock the others); turn it on"
        )
    return True


class StopRequests:
    """SIGTERM/SIGINT → a stop at the same step on every process (`reached`)."""

    def __init__(self):
        self.synced = _preemption_sync()
        self.received: int | None = None
        self._previous = {}
        signals = (signal.SIGINT,) if self.synced else (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def _handle(self, signum, frame):
        if self.synced and signum == signal.SIGINT:
            if self.received is not None:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGTERM)  # JAX's notifier tells every process
        self.received = signum

    def reached(self, step: int) -> bool:
        """True when the run stops after ``step`` (the same step on every process). Call it
        with every step, in order, from the run's first."""
        if self.synced:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(int(step))
        return self.received is not None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
