"""One run over several JAX processes (one per host): joining it, what every process must agree
on, and a lost process named.

- `initialize`: `jax.distributed.initialize` with the cluster JAX detects (Cloud TPU, SLURM, Open
  MPI, Kubernetes) or an explicit coordinator (``--coordinator_address`` or JAX's own
  ``JAX_COORDINATOR_ADDRESS``, ``--num_processes``, ``--process_id``), and a heartbeat timeout of
  `HEARTBEAT_TIMEOUT_S` (JAX's default is 100 s: a lost host would hold the others that long).
- `exchange`: every process's JSON value, on every process, through the coordination service's
  key-value store (no XLA program to compile); `sum_counters` (host-side counts made global) and
  `check_same` (configs that differ between processes stop the run before its first step,
  naming the keys) are built on it; `gather` is the same with a timeout, for processes that may
  be stuck elsewhere (a stop during a storage outage).
- The watchdog: a thread asks the coordination service which processes are still alive (JAX's
  heartbeats, sent by a C++ thread, so a busy Python does not count as lost). When one is gone,
  every other prints one line naming it (host, pid) and what to do, and exits with status
  `EXIT_PROCESS_LOST`. Without it JAX aborts the survivors with a C++ check failure once the
  heartbeat times out; bertjax turns that off (``jax_enable_recoverability``) so the watchdog
  decides. JAX's hook for this (the client's ``missed_heartbeat_callback``) cannot be called
  from Python in jaxlib 0.10 (std::bad_cast). One case stays JAX's: when process 0, which hosts
  the coordination service, dies, the others abort at once with JAX's own message.
  A process that fails on its own publishes its error and status (bertjax/errors.py); the others
  stop with that status. A failed collective is no such reason (every survivor of a lost host
  meets one): a process whose collective failed waits for the watchdog to name the lost one
  (75, on every survivor, whatever the process count) or for another to say why it failed.
  The watchdog also passes JAX's preemption notice on (`on_preemption_notice`): a SIGTERM to
  any process cancels every process's storage retries, so that none waits on storage to stop.
- `finish`: the processes leave together, process 0 (the service) last.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter

import jax

from bertjax import cli, errors

HEARTBEAT_TIMEOUT_S = 30  # seconds without a heartbeat before a process counts as lost
WATCH_INTERVAL_S = 1.0  # how often the watchdog asks which processes are alive
EXIT_PROCESS_LOST = cli.RETRY  # the status of a process stopped because another was lost
_WAIT_MS = 60 * 60 * 1000  # a peer may still be preparing data (tokenizing) when another asks


class LaunchError(RuntimeError):
    """The run could not be joined (no cluster detected, no coordinator, bad process ids)."""


class MismatchError(ValueError):
    """The processes of one run were started with different settings."""


def _client():
    """JAX's coordination-service client (None outside a jax.distributed run). jax has no public
    accessor; multihost_utils and orbax read the same object (tests/private_api_test.py fails
    when it moves)."""
    if not jax.distributed.is_initialized():
        return None
    from jax._src import distributed

    return distributed.global_state.client


def exit_status(error: BaseException) -> int:
    """The exit status a command ends with for ``error`` (bertjax/errors.py's table)."""
    return errors.exit_status(error)


_FAILED = "bertjax/failed/"  # key-value directory: a process's error, published before it exits
_RERUN = "the same command on every host: the run resumes from its last complete checkpoint"
_NOTICE = "RECEIVED_PREEMPTION_NOTICE"  # the key JAX's preemption sync manager sets (TSL's)
PUBLISHED_CHARS = 2000  # of a failing process's error, in the line each of the others prints


class _Group:
    """This process's part of a multi-process run: who the others are, and the watchdog."""

    def __init__(self, heartbeat_timeout: int):
        self.client, self.index, self.count = _client(), jax.process_index(), jax.process_count()
        self.heartbeat_timeout = heartbeat_timeout
        self.names = exchange("process", f"{socket.gethostname()} pid {os.getpid()}")
        self.finishing = threading.Event()  # set: others leaving is expected, not reported
        self.failing = threading.Event()  # set: this process fails (its error is published)
        self.failed: dict = {}  # the other processes that published a failure, by index
        self.others_gone = threading.Event()
        self.listeners: list = []  # called once when a preemption notice reaches the run
        self.notified = False
        self.watchdog = threading.Thread(target=self._watch, name="bertjax-watchdog", daemon=True)
        self.watchdog.start()

    def describe(self, index: int) -> str:
        return f"process {index} of {self.count} ({self.names[index]})"

    def _watch(self) -> None:
        everyone = list(range(self.count))
        others = set(everyone) - {self.index}
        while True:
            try:  # returns once every live process has asked (a barrier of the live ones)
                live = self.client.get_live_nodes(everyone)
                failed = dict(self.client.key_value_dir_get(_FAILED))
                self._check_notice()
            except Exception:  # the client is shut down, or the service (process 0) is gone
                if not self.finishing.is_set() and self.index != 0:  # best effort: JAX aborts
                    self._stop(f"lost {self.describe(0)}, which hosts the run's coordination "
                               "service (it failed, was killed, or its host is gone)")  # fmt: skip
                self.others_gone.set()
                return
            gone = others - set(live)
            failed = {int(key.rsplit("/", 1)[1]): json.loads(v) for key, v in failed.items()}
            failed.pop(self.index, None)
            self.failed = failed
            lost = gone - set(failed)  # left without saying why
            # failed on their own (bad input, storage, a stop): not a collective that failed
            # because a peer was lost, which every survivor meets (then the lost one decides)
            decided = {
                i: f for i, f in failed.items() if f.get("kind") != errors.Kind.RUNTIME.value
            }
            if self.finishing.is_set():
                if gone == others:
                    self.others_gone.set()
                    return
            elif lost:
                self._stop(
                    ", ".join(self.describe(i) for i in sorted(lost)) + " left the run (it "
                    f"failed, was killed, or its host stopped answering for "
                    f"{self.heartbeat_timeout} s: see its log)"
                )
            elif decided and not self.failing.is_set():
                self._stop_for(decided)
            time.sleep(WATCH_INTERVAL_S)

    def _check_notice(self) -> None:
        """Calls the preemption listeners once JAX's preemption sync manager has told the
        coordination service of a notice (a SIGTERM to any process of the run)."""
        if self.notified or not self.listeners:
            return
        try:
            self.client.key_value_try_get(_NOTICE)
        except Exception:  # noqa: BLE001  (not set: no notice yet)
            return
        self.notified = True
        for listener in list(self.listeners):
            listener()

    def _stop_for(self, decided: dict) -> None:
        """Stops this process for the other processes that failed on their own (``decided``),
        with the status they end with."""
        what = "; ".join(f"{self.describe(i)} failed ({f['error']})" for i, f in decided.items())
        status = max(f["status"] for f in decided.values())
        self._stop(what, "Fix that, then rerun" if not errors.restarts(status) else "Rerun", status)

    def _stop(self, what: str, then: str = "Rerun", status: int = EXIT_PROCESS_LOST) -> None:
        """Prints one line (what happened, what to do) and exits this process with ``status``
        (a lost process: `cli.RETRY`; one that failed: the status it ends with)."""
        sys.stdout.flush()
        me = self.describe(self.index)
        sys.stderr.write(f"error: {what}; {me} stops too. {then} {_RERUN}\n")
        sys.stderr.flush()
        if self.index == 0:  # it hosts the service: the others leave first (or JAX aborts them)
            self._wait_for_the_others(self.heartbeat_timeout + 10 * WATCH_INTERVAL_S)
        os._exit(status)

    def _wait_for_the_others(self, timeout_s: float) -> None:
        """Until every other process has left the run (each stops on its own), at most
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if set(self.client.get_live_nodes(list(range(self.count)))) <= {self.index}:
                    return
            except Exception:  # noqa: BLE001  (the service is going away: nothing to wait for)
                return
            time.sleep(WATCH_INTERVAL_S / 4)

    def publish(self, error: BaseException) -> None:
        """Tells the others this process fails with ``error``, and the status it ends with."""
        first = (str(error).strip().splitlines() or [""])[0]
        if len(first) > PUBLISHED_CHARS:  # the others print it in their one line: whole, or marked
            first = first[:PUBLISHED_CHARS] + " [...]"
        self.failing.set()
        record = {"error": f"{type(error).__name__}: {first}", "status": exit_status(error),
                  "kind": errors.classify(error).value}  # fmt: skip
        try:
            self.client.key_value_set(f"{_FAILED}{self.index}", json.dumps(record))
        except Exception:  # the service is gone already
            pass

    def settle(self, timeout_s: float) -> None:
        """Waits until another process says why it failed (not a collective: bad input,
        storage, a stop), every other process has failed too (a common error: out of memory at
        the first step), or the watchdog names one that was lost (it exits this process), at
        most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.others_gone.is_set():
            failed = dict(self.failed)
            if len(failed) == self.count - 1 or any(
                f.get("kind") != errors.Kind.RUNTIME.value for f in failed.values()
            ):
                return
            time.sleep(WATCH_INTERVAL_S / 4)

    def fail(self, error: BaseException) -> None:
        """Tells the others this process fails with ``error`` (they stop, naming it); process 0,
        which hosts the coordination service, waits until they have left."""
        if not self.failing.is_set():
            self.publish(error)
        self.finishing.set()
        if self.index == 0:
            self.others_gone.wait(self.heartbeat_timeout + 10 * WATCH_INTERVAL_S)
        self.leave()

    def leave(self) -> None:
        """Disconnects from the coordination service, then lets the watchdog end: a thread still
        inside a call to the service when the interpreter exits aborts the process (C++ code
        catches the forced unwind of the exiting thread)."""
        self.finishing.set()
        jax.distributed.shutdown()
        self.watchdog.join(10 * WATCH_INTERVAL_S)


_group: _Group | None = None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_S,
    initialization_timeout: int = 300,
) -> None:
    """Joins the run: the cluster JAX detects, or the coordinator, process count and id given
    (``coordinator_address`` None: JAX's JAX_COORDINATOR_ADDRESS, else detection); then starts
    the watchdog."""
    global _group
    jax.config.update("jax_enable_recoverability", True)  # the watchdog names a lost process
    try:
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            initialization_timeout=initialization_timeout,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        )
    except (ValueError, TypeError) as error:  # nothing detected, or bad ids
        raise LaunchError(
            f"--multihost could not join a run ({error}): JAX detects Cloud TPU, SLURM, Open MPI "
            "and Kubernetes jobs by themselves; elsewhere give --coordinator_address=HOST:PORT "
            "(or JAX_COORDINATOR_ADDRESS) of process 0's host, --num_processes and --process_id"
        ) from None
    except Exception as error:  # the coordinator was not reached in time
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "(detected)")
        raise LaunchError(
            f"--multihost: process {process_id} could not join the run at {address} within "
            f"{initialization_timeout} s ({first}); start the same command on every host, with "
            "process 0's address reachable from each"
        ) from None
    _group = _Group(heartbeat_timeout_seconds)
    logging.info("joined as %s", _group.describe(_group.index))


def exchange(name: str, value) -> list:
    """Every process's ``value`` (JSON), in process order, on every process. A collective: every
    process calls it with the same ``name``, in the same order."""
    posted = _post(name, value)
    if posted is None:
        return [value]
    client, prefix = posted
    client.wait_at_barrier(f"{prefix}written", _WAIT_MS)
    entries = dict(client.key_value_dir_get(prefix))
    client.wait_at_barrier(f"{prefix}read", _WAIT_MS)  # then each removes its own key
    client.key_value_delete(f"{prefix}{jax.process_index()}")
    return [json.loads(entries[f"{prefix}{i}"]) for i in range(jax.process_count())]


def _post(name: str, value):
    """This process's ``value`` (JSON) written under the next key prefix of ``name`` (the n-th
    call of a name on every process shares one prefix): (the client, the prefix), or None in a
    run of one process."""
    client = _client()
    if client is None or jax.process_count() == 1:
        return None
    sequence = _sequence[name] = _sequence.get(name, -1) + 1
    prefix = f"bertjax/{name}/{sequence}/"
    client.key_value_set(f"{prefix}{jax.process_index()}", json.dumps(value))
    return client, prefix


_sequence: dict[str, int] = {}


def sum_counters(counter: Counter) -> Counter:
    """``counter`` summed over the processes (host-side counts of each host's own rows)."""
    total = Counter()
    for pairs in exchange("counts", [[key, value] for key, value in counter.items()]):
        total.update({(tuple(k) if isinstance(k, list) else k): v for k, v in pairs})
    return total


def sum_numbers(values: list[float]) -> list[float]:
    """``values`` added up elementwise over the processes."""
    return [sum(column) for column in zip(*exchange("numbers", [float(v) for v in values]))]


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(tree, sort_keys=True, default=repr)}


def check_same(what: str, settings: dict) -> None:
    """Raises `MismatchError` on every process when ``settings`` (a nested dict) differ between
    processes, naming the keys and each process's value."""
    every = exchange(f"same-{what}", _flat(settings))
    keys = sorted(k for k in set().union(*every) if len({o.get(k) for o in every}) > 1)
    if not keys:
        return
    shown = "; ".join(
        f"{key}: " + ", ".join(f"process {i}: {o.get(key, '(unset)')}" for i, o in enumerate(every))
        for key in keys[:5]
    )
    more = f" (and {len(keys) - 5} more)" if len(keys) > 5 else ""
    raise MismatchError(
        f"the {len(every)} processes were started with different {what}s: {shown}{more}. "
        "Start every host with the same command"
    )


def on_error(error: BaseException) -> None:
    """Called with the exception that ends this process's run: the others are told this one
    fails (they stop with one line and its status instead of waiting for a heartbeat timeout).
    A runtime error (a collective that failed) may come from another process that is gone or
    that failed on its own: then this one waits, up to a heartbeat timeout, for the watchdog to
    name the lost one (it exits this process, 75) or for the other to say why (this process
    exits with its status); when every other process met a runtime error too, it is this one's
    (status 1, its traceback)."""
    global _group
    if _group is None:
        return
    _group.publish(error)
    if errors.is_runtime(error):
        _group.settle(_group.heartbeat_timeout + 5 * WATCH_INTERVAL_S)
        decided = {i: f for i, f in _group.failed.items()
                   if f.get("kind") != errors.Kind.RUNTIME.value}  # fmt: skip
        if decided:
            _group.finishing.set()
            _group._stop_for(decided)
    group, _group = _group, None
    group.fail(error)


def on_preemption_notice(listener) -> None:
    """Calls ``listener()`` (once, from the watchdog) when a preemption notice reaches the run:
    a SIGTERM to any of its processes, which JAX's own handler takes (bertjax/training/
    stopping.py cancels its storage retries so that a process waiting on storage reaches the
    stop)."""
    if _group is not None:
        _group.listeners.append(listener)


def gather(name: str, value, timeout_s: float) -> list | None:
    """Every process's ``value`` (JSON), in process order, when every process gives one within
    ``timeout_s``; else None. Unlike `exchange`, a process that never calls it (blocked
    elsewhere) costs the others only the timeout."""
    posted = _post(name, value)
    if posted is None:
        return [value]
    client, prefix = posted
    deadline = time.monotonic() + timeout_s
    while True:
        entries = dict(client.key_value_dir_get(prefix))
        if len(entries) == jax.process_count():
            return [json.loads(entries[f"{prefix}{i}"]) for i in range(jax.process_count())]
        if time.monotonic() > deadline:
            return None
        time.sleep(WATCH_INTERVAL_S / 4)


def finish(timeout_s: float = 600) -> None:
    """Leaves the run together: a barrier, then every process but 0 disconnects, and process 0,
    which hosts the coordination service, goes last."""
    global _group
    if _group is None:
        return
    group, _group = _group, None
    group.client.wait_at_barrier("bertjax/finish", int(timeout_s * 1000))
    group.finishing.set()  # from here a process that leaves is one that finished
    group.client.wait_at_barrier("bertjax/finished", int(timeout_s * 1000))
    if group.index == 0:
        group.others_gone.wait(timeout_s)
    group.leave()
