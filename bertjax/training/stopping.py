"""A stop request (SIGTERM, SIGINT) made one decision for every process of a run, and Ctrl-C that
works in every phase.

One process: the first signal stops the run within seconds wherever it is. Inside a training
step (the step's dispatch, its bookkeeping, a checkpoint being started) it only sets a flag that
the loop reads after the step: that step is saved and the run stops. Everywhere else (preparing
the tokenizer and the store, restoring, compiling, waiting for a batch, evaluating) the code runs
in an `interruptible` region, where the signal raises `Interrupted` at once; the loop saves the
state it has (the last step applied: a batch being read or an evaluation never changes it) when
steps were trained since the last save, and stops. A second signal ends the process at once.

Python runs signal handlers only between bytecodes, so a main thread inside a long C call
(SentencePiece training, an XLA compile, a hung read in C) would not see the signal until the call
returns. Commands (train.py: `command_mode`) therefore also watch signals from a thread
(`signal.set_wakeup_fd`): when the main thread has not taken a signal within `GRACE_S` and no
trained step is unsaved, the watcher ends the process itself (exit 128 + the signal,
bertjax/cli.py); a second signal ends it at once. Library callers (a notebook, the GLUE harness)
keep their process: there a signal raises `Interrupted`/sets the flag, and a second one raises
KeyboardInterrupt.

Several processes (a pod slice, a GPU cluster): a signal often reaches one host only (a
maintenance event, a spot preemption) or the hosts a step apart, and a process that stops to save
while another goes on to its next step deadlocks both in different collectives. So the stop goes
through JAX's preemption sync point, as MaxText does: JAX's notifier owns SIGTERM (its own C
handler, installed by `jax.distributed.initialize`), tells the coordination service, every
process reports its step, and `multihost_utils.reached_preemption_sync_point(step)` is true on
every process at the same step (the largest reported plus one). SIGINT is passed on to that
notifier as a SIGTERM of this process, so Ctrl-C on one host stops all of them the same way; a
second SIGINT leaves at once (the other processes name it as lost and stop, bertjax/training/
processes.py), without JAX's abort at interpreter exit.

JAX's sync point needs every process to report each step in order, from the same first step
(`StopRequests.reached` is called with every step), and nobody else to report (bertjax's orbax
manager does not: bertjax/training/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from bertjax.errors import Retryable

GRACE_S = 2.0  # how long the watcher lets the main thread take a signal before acting itself
METRICS_WAIT_S = 5.0  # a stop's metric writes wait at most this long on storage (a save follows)
SAVE_WAIT_S = 60.0  # a save after storage stopped answering, or a close, waits at most this long
STUCK_WAIT_S = (
    10.0  # a process stuck at a stop waits this long for the others to say where they are
)

_command_mode = False


def command_mode() -> None:
    """Lets the signal watcher end this process (train.py): without it a signal never exits the
    interpreter, whatever the main thread is doing."""
    global _command_mode
    _command_mode = True


class Interrupted(BaseException):
    """A signal stopped the run outside a step (not an Exception: nothing swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


class StoppedApart(Retryable):
    """A stop came while this process's batch did not (storage out past the stop, a hung read)
    and the processes were not all at one step, so none could be saved: exit 143 (restart: the
    run resumes from the last checkpoint), the others stopping with it."""

    status = 128 + signal.SIGTERM

    def __init__(self, step: int, saved: int, steps: list | None):
        where = "not every process answered" if steps is None else f"the processes were at {steps}"
        lost = f"step {step} could not be saved" if step != saved else "nothing was lost"
        super().__init__(
            f"stopped while the batch after step {step} did not come (storage did not answer, "
            f"or a read hung) and {where}: {lost}; rerun the same command to resume from step "
            f"{saved}"
        )


def bounded(fn: Callable, seconds: float, what: str, raises: bool = True):
    """``fn()``, waited for at most ``seconds`` (in a thread of its own, left behind when it
    does not return in time: a write or save that hangs on storage, which a stop must not wait
    for). Returns its result, or None after a warning when it did not return in time; its
    error is raised (``raises``) or logged as a warning."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as error:  # noqa: BLE001  (raised in the caller)
            box["error"] = error

    thread = threading.Thread(target=run, name="bertjax-bounded", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        logging.warning("%s did not end within %g s (storage did not answer): left behind",
                        what, seconds)  # fmt: skip
        return None
    if "error" in box:
        if raises:
            raise box["error"]
        error = box["error"]
        logging.warning("%s failed: %s: %s", what, type(error).__name__, str(error)[:300])
        return None
    return box.get("result")


def preemption_sync() -> bool:
    """Whether this is a jax.distributed run with JAX's preemption sync manager (read through
    JAX's private distributed state: tests/private_api_test.py fails when it moves)."""
    if "jax" not in sys.modules:  # no jax.distributed run without jax
        return False
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


def leave_now(signum: int, why: str) -> None:
    """Ends this process at once: one line, exit 128 + ``signum`` (no interpreter teardown, whose
    thread joins would wait for a hung read and whose C++ threads abort under jax.distributed)."""
    sys.stdout.flush()
    name = signal.Signals(signum).name
    sys.stderr.write(f"stopped by {name} {why}: rerun the same command to resume "
                     f"(exit status {128 + signum})\n")  # fmt: skip
    sys.stderr.flush()
    os._exit(128 + signum)


class StopRequests:
    """SIGTERM/SIGINT → a stop at the same step on every process (`reached`), or at once outside
    a step (`interruptible`). The first signal (under several processes: the preemption notice
    of any of them) cancels ``token``, the run's `bertjax.retry.Cancel`: storage requests
    waiting out a backoff give up, so that no stop waits on storage."""

    def __init__(self, token=None):
        from bertjax import retry

        self.token = token if token is not None else retry.Cancel()
        self.synced = preemption_sync()
        if self.synced:  # JAX's handler takes SIGTERM: the notice comes through the service
            from bertjax.training import processes

            processes.on_preemption_notice(self.token.cancel)
        self.received: int | None = None  # the first signal this process got
        self.signals = 0
        # whether trained steps are not yet saved (or a save is being written): the watcher
        # never ends the process then (the trainer sets it for its run)
        self.unsaved: Callable[[], bool] = lambda: False
        self.training = False  # in the training loop (several processes: stops go together)
        self._interruptible = 0
        self._taken = threading.Event()  # the main thread took the latest signal
        self._previous: dict = {}
        self._wakeup = None
        if threading.current_thread() is not threading.main_thread():
            return  # not the main thread: leave signals alone
        signals = (signal.SIGINT,) if self.synced else (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        if _command_mode:
            self._watch()

    def _handle(self, signum, frame):
        self.signals += 1
        self._taken.set()
        first = self.received is None
        if first:
            self.received = signum
            self.token.cancel()  # backoffs give up: nothing waits on storage from here
        if not first:  # a second signal: now
            if _command_mode:
                leave_now(signum, "(a second signal)")
            raise KeyboardInterrupt
        if self.synced:
            if self._interruptible and not self.training:
                raise Interrupted(signum)  # not in the loop yet: nothing to stop together
            if signum == signal.SIGINT:
                signal.raise_signal(signal.SIGTERM)  # JAX's notifier tells every process
            return
        if self._interruptible:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def interruptible(self):
        """Inside, a signal raises `Interrupted` at once (also one that came before): code here
        leaves no state half-changed (it reads, computes, or prepares what it can redo)."""
        if self.received is not None and not self.synced:
            raise Interrupted(self.received)
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1

    def stopping_together(self) -> bool:
        """Several processes, and a stop was requested (a preemption notice reached the run):
        a process that cannot reach the next step (its batch never comes) stops where it is,
        with the others when they are at the same step (bertjax/training/trainer.py)."""
        return self.synced and self.token.cancelled()

    def reached(self, step: int) -> bool:
        """True when the run stops after ``step`` (the same step on every process). Call it
        with every step, in order, from the run's first."""
        if self.synced:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(int(step))
        return self.received is not None

    def _watch(self) -> None:
        """A thread that sees each signal as it arrives, even while the main thread is in C."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
        threading.Thread(target=self._watcher, args=(read,), name="bertjax-signals",
                         daemon=True).start()  # fmt: skip

    def _watcher(self, read: int) -> None:
        seen = 0
        while True:
            data = os.read(read, 64)
            if 0 in data:  # restore(): the handlers are back
                os.close(read)
                return
            for signum in data:
                if signum not in self._previous:
                    continue
                seen += 1
                if seen > 1:
                    leave_now(signum, "(a second signal)")
                if self._taken.wait(GRACE_S) or self.unsaved():
                    continue  # the main thread has it, or a trained state waits for a save
                leave_now(signum, "while the main thread was busy in native code; nothing "
                          "trained since the last checkpoint was lost")  # fmt: skip

    def restore(self) -> None:
        """Puts back the handlers that were there before (and stops the watcher)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            _, write, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            os.write(write, b"\0")  # the watcher closes its end and returns
            os.close(write)
            self._wakeup = None
