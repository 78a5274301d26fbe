"""A `jax.profiler` trace of chosen training steps (``config.profile``), written where
TensorBoard's profile plugin and xprof look for it:

    WORKDIR/plugins/profile/steps-F-L/HOST.xplane.pb     (XSpace: ops, their device times, ...)
    WORKDIR/plugins/profile/steps-F-L/HOST.trace.json.gz (the same timeline, Chrome trace JSON)

Steps are numbered as metrics.jsonl numbers them (step 1 is the first update). The trace covers
``steps`` steps from ``first_step``, never a run's first step, which compiles: a window that
starts there (or at 0, the default) starts at the run's second step. A window the run already
passed before it (re)started is not traced again. Process 0 traces its own host, or with
``all_processes`` every process its own, each file named HOST-pPROCESS then. Open it with
``tensorboard --logdir=WORKDIR`` (the Profile tab: ``pip install tensorboard-plugin-profile``) or
``xprof --logdir=WORKDIR`` (``pip install xprof``); ui.perfetto.dev opens the .trace.json.gz.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable

import jax
import ml_collections

from bertjax import paths

# The trace files jax.profiler writes, HOST + one of these.
_SUFFIXES = (".xplane.pb", ".trace.json.gz", ".memory_profile.json.gz")


def default_profile_config() -> ml_collections.ConfigDict:
    """``config.profile``: which steps a run traces (none by default)."""
    c = ml_collections.ConfigDict()
    c.first_step = 0  # the first step traced (0: the run's second step; its first compiles)
    c.steps = 0  # how many steps are traced (0: no trace)
    c.all_processes = False  # every process traces its own host (False: process 0 only)
    return c


def validate_profile_config(profile: ml_collections.ConfigDict) -> None:
    for key in ("first_step", "steps"):
        if int(profile[key]) < 0:
            raise ValueError(f"config.profile.{key}={profile[key]!r}: must be 0 or more")


def trace_window(profile, start: int) -> tuple[int, int] | None:
    """(first, last) steps to trace, numbered as metrics.jsonl numbers them, for a run that
    (re)starts after ``start`` steps; None when nothing is traced."""
    steps = int(profile.steps) if profile is not None else 0
    if not steps:
        return None
    first = int(profile.first_step)
    if first and first + steps - 1 <= start:  # traced (or passed) before this start
        return None
    first = max(first, start + 2)  # step start + 1 compiles
    return first, first + steps - 1


class StepProfile:
    """Starts a trace before the first chosen step reads its batch (`before`) and stops it once
    the last chosen step has finished on the devices (`after`), before that step's logging,
    evaluation or checkpoint; `close` stops one still running. The two waits for the devices
    are the only host syncs a trace adds."""

    def __init__(
        self, config: ml_collections.ConfigDict, workdir: str, start: int, say: Callable = print
    ):
        profile = config.get("profile")
        self.window = trace_window(profile, start)
        if self.window and not (jax.process_index() == 0 or profile.all_processes):
            self.window = None
        self.workdir, self.say = workdir, say
        self.local: str | None = None  # the trace's local directory while it runs
        self.done = 0  # the last step traced so far

    def before(self, done: int, state) -> None:
        """Before the step after ``done`` steps: starts the trace when it is the first chosen,
        once the steps before have finished (their device work is not in the trace)."""
        if self.window is not None and done == self.window[0] - 1 and self.local is None:
            jax.block_until_ready(state)
            self.local = tempfile.mkdtemp(prefix="bertjax-profile-")
            jax.profiler.start_trace(self.local)

    def after(self, done: int, state) -> None:
        """After step ``done`` was dispatched: stops the trace when it was the last chosen."""
        if self.local is not None:
            self.done = done
            if done == self.window[1]:
                self._stop(state)

    def close(self, state) -> None:
        """Stops a trace still running (the run ended inside its window)."""
        if self.local is not None:
            self._stop(state)

    def _stop(self, state) -> None:
        try:
            jax.block_until_ready(state)  # the last traced step's device work is in the trace
        finally:
            jax.profiler.stop_trace()
        local, self.local = self.local, None
        first = self.window[0]
        last = max(self.done, first)  # the run may end inside the window
        self.window = None
        try:
            where = self._publish(local, f"steps-{first}-{last}")
        finally:
            shutil.rmtree(local, ignore_errors=True)
        if jax.process_index() == 0:
            self.say(
                f"profile of steps {first}-{last}: {where} (open: tensorboard "
                f"--logdir={self.workdir}, Profile tab; or xprof --logdir={self.workdir})"
            )

    def _publish(self, local: str, name: str) -> str:
        """Copies the trace's files into WORKDIR/plugins/profile/NAME, named after this host
        (and process, when there are several); returns that directory."""
        target = paths.join(self.workdir, "plugins", "profile", name)
        paths.makedirs(target)
        host = socket.gethostname()
        if jax.process_count() > 1:
            host = f"{host}-p{jax.process_index()}"
        files = glob.glob(os.path.join(local, "plugins", "profile", "*", "*"))
        if not files:
            logging.warning("jax.profiler wrote no trace files for %s", name)
        for file in files:
            base = os.path.basename(file)
            suffix = next((end for end in _SUFFIXES if base.endswith(end)), None)
            paths.upload(file, paths.join(target, host + suffix if suffix else base))
        return target
