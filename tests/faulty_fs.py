"""An fsspec filesystem over local files that fails chosen requests as object storage does,
registered as ``faulty://`` when imported (``faulty:///tmp/store`` is the local /tmp/store).

Every request counts, from 1, in the order this process sends them: a `cat_file` (so each range
of fsspec's `cat_ranges` on a synchronous filesystem), an `info`, an `ls`, an `open`. `PLAN`
decides which fail, raising `OSError("503 Service Unavailable")` as a wrapped HTTP error does:
``fail_at`` (request numbers), ``every`` (every N-th request), ``start``/``stop`` (an outage:
every request from ``start`` until ``stop``, 0: no end; or while the file ``while_exists``
exists), each only on paths containing ``match``; ``hang_while_exists``: a request waits (a read
that hangs: no error, no answer) while that file exists, then goes on. Keyed by the batch a
request is for (the thread computing it says so through `computing`; tests/fault_runner.py
wraps the pipeline's `compute_batches` in it): ``outage_from_batch`` = k fails, and
``hang_from_batch`` = k hangs for good, every request of the k-th batch this process computes
(from 0, in the order it begins them) and of every later one (so every process of a run meets
it at the same step); each prints one line when it first does.
A spawned process (a data worker) reads its plan from $BERTJAX_FAULTS (JSON of those keys) when
it imports this module; `make_pipeline` is the pipeline factory such a worker is given, so that
it imports this module, and so knows the protocol, before it opens the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import fsspec
from fsspec.implementations.local import LocalFileSystem

from bertjax.data.pipeline import make_pipeline as _make_pipeline

PROTOCOL = "faulty"
ENV = "BERTJAX_FAULTS"


class Plan:
    """Which requests fail (see the module docstring); counts requests and failures."""

    def __init__(
        self, fail_at=(), every=0, start=0, stop=0, match: str = "", while_exists: str = "",
        hang_while_exists: str = "", outage_from_batch: int = 0, hang_from_batch: int = 0,
    ):  # fmt: skip
        self.fail_at, self.every = {int(n) for n in fail_at}, int(every)
        self.start, self.stop, self.match = int(start), int(stop), str(match)
        self.while_exists = str(while_exists)  # an outage: every request fails while it exists
        self.hang_while_exists = str(hang_while_exists)  # requests hang while it exists
        self.outage_from_batch, self.hang_from_batch = int(outage_from_batch), int(hang_from_batch)
        self.requests = self.failures = self.hung = 0
        self.told: set = set()
        self._lock = threading.Lock()

    def request(self, path: str) -> None:
        """Counts a request to ``path``; raises when the plan fails it."""
        with self._lock:
            self.requests += 1
            n = self.requests
            batch = getattr(BATCH, "index", None)  # of this process's batches, from 0
            out = self.outage_from_batch and batch is not None and batch >= self.outage_from_batch
            hangs_for_good = (
                self.hang_from_batch and batch is not None and batch >= self.hang_from_batch
            )
            fails = self.match in str(path) and (
                n in self.fail_at
                or (self.every and n % self.every == 0)
                or (self.start and n >= self.start and (not self.stop or n < self.stop))
                or (self.while_exists and os.path.exists(self.while_exists))
                or out
            )
            self.failures += bool(fails)
            hangs = self.match in str(path) and self.hang_while_exists
            hangs = hangs and os.path.exists(self.hang_while_exists)
            self.hung += bool(hangs)
        for what, now in (("outage", out), ("hang", hangs_for_good)):
            if now and what not in self.told:
                self.told.add(what)
                print(f"faulty_fs: {what} from batch {batch} on", flush=True)
        if hangs_for_good:
            time.sleep(3600)  # a read that never answers (the process ends first)
        if fails:
            raise OSError(f"503 Service Unavailable (request {n}, injected)")
        while hangs and os.path.exists(self.hang_while_exists):
            time.sleep(0.05)


PLAN = Plan(**json.loads(os.environ.get(ENV) or "{}"))
BATCH = threading.local()  # .index: which of this process's batches the thread computes
_COUNTED = [0]  # batches this process began to compute, in the order it began them
_COUNT_LOCK = threading.Lock()


@contextlib.contextmanager
def computing(steps: list):
    """Inside, this thread's requests are for the last of the batches ``steps``, counted from
    the first batch this process computed, in the order it began them (the same on every process
    of a run, across its phases)."""
    with _COUNT_LOCK:
        _COUNTED[0] += len(steps)
        BATCH.index = _COUNTED[0] - 1
    try:
        yield
    finally:
        BATCH.index = None


class FaultyFileSystem(LocalFileSystem):
    """The local filesystem under ``faulty://``, its requests going through `PLAN`."""

    protocol = PROTOCOL

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return super()._strip_protocol(path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        PLAN.request(path)
        return super().cat_file(path, start=start, end=end, **kwargs)

    def info(self, path, **kwargs):
        PLAN.request(path)
        return super().info(path, **kwargs)

    def ls(self, path, detail=False, **kwargs):
        PLAN.request(path)
        return super().ls(path, detail=detail, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        PLAN.request(path)
        return super()._open(path, mode=mode, **kwargs)


fsspec.register_implementation(PROTOCOL, FaultyFileSystem, clobber=True)


def make_pipeline(*args, **kwargs):
    """bertjax's `make_pipeline`, from a process that knows ``faulty://`` (a test puts this in
    the pipeline module's place, so that worker processes are started with it)."""
    return _make_pipeline(*args, **kwargs)
