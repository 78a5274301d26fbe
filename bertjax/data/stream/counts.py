"""Token counts of a streamed corpus's units, kept in the workdir (WORKDIR/stream_counts/KEY/), so
that a resumed run finds where its lanes are without reading and tokenizing again all that they
read before the checkpoint: it reads only the units at its position.

Where a lane's windows start takes the token counts of the units before them (lanes.py). A count
is a function of the unit, the tokenizer, the held-out rule and the data plan's version: KEY
is a digest of them (`key`). Each process writes the counts it knows into a file of its own
(process-I.json), at most every `SAVE_EVERY_S` while it reads new units (in a thread of its
own: the batches never wait on it), and when its pipeline closes (not once the run was told to
stop: a stop does not wait on storage); at its start a process reads every file under KEY, so a
pod resumed on another process count finds the counts of its new lanes. Writing is best effort:
a failed write is logged and costs only the reading it would have saved. A file that is not a
count table is skipped with a warning; a count a unit's tokens contradict when the unit is read
stops the run with one line naming the file (lanes.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable

from bertjax import paths, retry
from bertjax.data.plan_version import PLAN_VERSION

SAVE_EVERY_S = 60.0  # at most one write a process in this many seconds while it reads units
CLOSE_WAIT_S = 10.0  # closing waits this long for a write in flight before its own
FOLDER = "stream_counts"


def key(units: list, tokenizer_fingerprint: str, heldout_fraction: float, forced: list) -> str:
    """What a unit's token count depends on, as a folder name."""
    facts = [units, tokenizer_fingerprint, heldout_fraction, forced, PLAN_VERSION]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


class SavedCounts:
    """The counts under WORKDIR/stream_counts/KEY: read at the start, written by this process."""

    def __init__(self, workdir: str | None, key: str, process_index: int, units: int):
        self.directory = paths.join(workdir, FOLDER, key) if workdir else None
        self.path = paths.join(self.directory, f"process-{process_index}.json") if workdir else ""
        self.units = units
        self._saved = 0  # counts in this process's file
        self._last = time.monotonic()
        self._thread: threading.Thread | None = None  # a write in flight

    def load(self) -> dict[int, int]:
        """Every count the processes of earlier runs wrote (unit -> tokens)."""
        if self.directory is None or not paths.exists(self.directory):
            return {}
        folder = paths.Path(self.directory)
        found = retry.call(self.directory, lambda: sorted(folder.glob("*.json")))
        known: dict[int, int] = {}
        for file in map(str, found):
            try:
                table = json.loads(paths.read_text(file))
                counts = {int(unit): int(count) for unit, count in table.items()}
                if not all(0 <= u < self.units and c >= 0 for u, c in counts.items()):
                    raise ValueError("a unit or count out of range")
            except (ValueError, AttributeError, TypeError) as error:
                logging.warning("%s is not a table of the stream's token counts (%s): skipped; "
                                "its units are read again to count them", file, error)  # fmt: skip
                continue
            known.update(counts)
        if known:
            logging.info("stream: token counts of %d units from %s", len(known), self.directory)
        return known

    def save(self, counts: Callable[[], dict[int, int]], *, now: bool = False) -> None:
        """Writes ``counts()`` (this process's) when it knows more than it wrote: ``now`` (the
        pipeline closes: waits for the write), else in a thread of its own, `SAVE_EVERY_S`
        after the last write began and none is in flight (a workdir whose storage is slow or
        out never holds up the batches; ``counts`` is not called in between); best effort."""
        if self.directory is None:
            return
        if self._thread is not None and self._thread.is_alive():
            if not now:
                return
            self._thread.join(CLOSE_WAIT_S)
        if not now and time.monotonic() - self._last < SAVE_EVERY_S:
            return
        table = counts()
        if len(table) <= self._saved:
            return
        self._last = time.monotonic()
        if now:
            self._write(table)
            return
        self._thread = threading.Thread(
            target=self._write, args=(table,), name="bertjax-stream-counts", daemon=True
        )
        self._thread.start()

    def _write(self, counts: dict[int, int]) -> None:
        try:
            paths.write_text(self.path, json.dumps({str(u): c for u, c in sorted(counts.items())}))
        except Exception as error:  # noqa: BLE001  (a cache: the run goes on without it)
            logging.warning(
                "could not write %s (%s: %s): a resumed run reads again the units whose "
                "counts it lacks", self.path, type(error).__name__, error,
            )  # fmt: skip
            return
        self._saved = max(self._saved, len(counts))
