"""Batches computed ahead of the step that asks: reads of ``group`` consecutive steps each (their
rows read in one round, bertjax/data/read_settings.py), submitted to an executor (threads, or
the worker processes of config.data.workers) up to ``ahead`` steps past the step asked for, and
never at or past ``end``, the first step the run will not ask for (a phase's or the run's end:
reads ahead of it would be requests and masking for nothing). Only whole groups are submitted,
so a read always serves ``group`` batches, but for the last read before ``end``. A step asked for
out of order (a restart, a jump) is computed at once and the reads ahead start again after it.
The batches are the ones computed in order: a batch is a function of the config and its step."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

from bertjax import retry

CLOSE_WAIT_S = 10.0  # how long closing waits for the reads running (a hung read is left)
STOP_READ_WAIT_S = 5.0  # once the run stops, how long the step waiting for its batch still waits
STOPPED_WAIT_S = 1.0  # closing a stopped run's reads waits at most this long for those running
POLL_S = 0.25


def result(future: concurrent.futures.Future, what: str):
    """``future.result()``; once the run stops (its `bertjax.retry.Cancel`), waited for at most
    `STOP_READ_WAIT_S` more (the read gets one more try: a lone failed request still comes),
    then `bertjax.retry.StorageUnavailable` (a read that hangs, or storage out: the stop must not
    wait for it)."""
    policy = retry.current()
    stopped_at = None
    while True:
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            pass
        if stopped_at is None and policy.cancelled():
            stopped_at = time.monotonic()
        if stopped_at is not None and time.monotonic() - stopped_at > STOP_READ_WAIT_S:
            error = TimeoutError(f"no answer within {STOP_READ_WAIT_S:.0f} s of the stop")
            raise retry.StorageUnavailable(what, error, STOP_READ_WAIT_S, 1, stopping=True)


class Prefetch:
    """``compute(steps) -> batches`` of the steps ahead, ``group`` steps a call."""

    def __init__(self, compute: Callable, executor, ahead: int, group: int, end: int | None = None):
        self.compute, self.executor = compute, executor
        self.ahead, self.group = int(ahead), max(1, min(int(group), int(ahead)))
        self.end = end  # no read ahead at or past this step (None: none)
        self._futures: dict[int, tuple[concurrent.futures.Future, int]] = {}
        # every read submitted and not finished, including one the step waiting for it took
        # out of _futures: closing waits for (or leaves behind) those
        self._unfinished: set[concurrent.futures.Future] = set()
        self._next: int | None = None  # the first step not submitted
        self._lock = threading.RLock()  # (a read's done callback may run under it: a cancel)

    def batch(self, step: int, compute_now: Callable):
        """The batch of ``step``: from its read ahead, or ``compute_now(step)`` (then the reads
        ahead start: the first batch comes first)."""
        with self._lock:
            entry = self._futures.get(step)
        now = compute_now(step) if entry is None else None
        with self._lock:
            entry = self._futures.pop(step, None)
            dropped = {s for s in self._futures if s < step or s > step + self.ahead}
            for s in dropped:
                future, _ = self._futures.pop(s)
                if not any(f is future for f, _ in self._futures.values()):
                    future.cancel()
            if entry is None or self._next is None or self._next <= step:
                self._next = step + 1
                while self._next in self._futures:  # still ahead from before a jump back
                    self._next += 1
            while True:
                stop = self._next + self.group  # the group's steps: [_next, stop)
                if self.end is not None:
                    stop = min(stop, self.end)
                if stop <= self._next or stop - 1 > step + self.ahead:
                    break
                steps = list(range(self._next, stop))
                future = self.executor.submit(self.compute, steps)
                self._unfinished.add(future)
                future.add_done_callback(self._finished)
                for i, s in enumerate(steps):
                    self._futures[s] = (future, i)
                self._next = stop
        if entry is None:
            return now
        future, i = entry
        return result(future, f"the batch of step {step}")[i]

    def _finished(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._unfinished.discard(future)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Cancels the reads not started and waits up to ``timeout_s`` for those running (at most
        one a thread; `STOPPED_WAIT_S` once the run stopped: its reads have given up by then, or
        hang); a read that hangs in storage past that is left behind (its thread ends when the
        read returns, or with the process). When none is left running, the executor's threads or
        worker processes have ended when this returns."""
        if retry.current().cancelled():
            timeout_s = min(timeout_s, STOPPED_WAIT_S)
        with self._lock:
            running = list(self._unfinished)
            self._futures.clear()
        for future in running:
            future.cancel()  # those not started
        _, hung = concurrent.futures.wait(running, timeout=timeout_s)
        # Nothing left running: join the threads or worker processes (a second shutdown call
        # would not wait, so there is one).
        self.executor.shutdown(wait=not hung, cancel_futures=True)
