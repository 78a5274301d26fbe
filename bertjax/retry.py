"""Storage requests that fail for a while: retried within a time budget, counted, and told.

A request to storage (a store's byte ranges, a manifest, a shard index, a tokenizer file, a file
of a workdir on a URL) that fails with a transient error (bertjax/errors.py decides: a connection
error, a timeout, HTTP 408, 429 or 5xx, as each fsspec backend and huggingface_hub raise them) is
tried again after an exponential backoff with full jitter (after its k-th failure a delay drawn
uniformly from
[0, min(`MOST_DELAY_S`, `FIRST_DELAY_S` x 2^(k-1))], so that a pod's hosts do not retry in step),
(never less than the server asked for: `server_wait`, a 429's ``Retry-After`` or ``RateLimit``)
until it succeeds or its time budget (`config.storage_retry_seconds`, `BUDGET_S` by default)
has passed; then `StorageUnavailable` names the object, the last error, how long and how often
it was tried. Any other error (not found, permission denied, a bad request) is raised at once,
as it came. Failures are counted (`COUNTS`, per process: for metrics) and logged at most once
a minute, not per retry. A run that is stopping (its `Cancel` token, installed with `scope` and
cancelled by its first signal) gives up its retries after one more try instead of waiting out
the budget; the token is the run's, so the next run in the same process retries again.

What each layer under bertjax retries by itself, so that this layer does not multiply it:
- gcsfs (gs:// through fsspec, and through epath, which uses fsspec when TensorFlow is not
  installed): each request up to 6 tries, sleeping min(2^(k-1) + U(0, 1), 32) s between them
  (~31-36 s in all), on HTTP 408, 429, 500-504, a 401 "Invalid Credentials", and requests' and
  aiohttp's connection errors and timeouts; then it raises (`gcsfs.retry.HttpError` with its
  ``code``, `requests.exceptions.ProxyError` for a 502, an aiohttp error).
- s3fs over aiobotocore: botocore itself retries 429, 500, 502, 503, 504, 509, throttling codes
  and socket errors (legacy mode: 5 attempts, sleeping U(0, 1) x 2^(k-1) s); around that s3fs
  tries each call up to 5 times (0.1 x 1.7^k s apart) on timeouts, dropped connections and
  "SlowDown"; then it raises the error translated to Python's (`OSError` with errno EBUSY for
  503 and SlowDown, EREMOTEIO for 500, EIO for other codes; TimeoutError for RequestTimeout;
  FileNotFoundError, PermissionError).
- TensorStore, which orbax writes and reads checkpoint arrays through (gs://): its gcs driver
  retries HTTP 408, 429 and 5xx and unreachable hosts up to ``gcs_request_retries.max_retries``
  = 32 times, the delay doubling from ``initial_delay`` = 1 s to ``max_delay`` = 32 s plus up to
  1 s of jitter: ~15 minutes before it gives up. bertjax does not wrap orbax's saves and restores
  (a retried save would write its arrays again; TensorStore's own budget already outlasts this
  one); only the files bertjax reads, writes, lists, renames and removes itself (checkpoint
  listings, cleanup and set-aside among them) go through this layer.
- huggingface_hub (hf:// corpora, bertjax/data/text/hub.py): ranged reads and tree pages retry
  408, 429 and 5xx up to 5 times (1, 2, 4, 8, 8 s apart, or what a 429's RateLimit/Retry-After
  says, plus 1 s); repo info, paths-info and HEADs are not retried there, only here.
A request this layer sees fail has therefore already been retried for up to about a minute
below it. The budget is a time, not a count, for that reason: a count would multiply with the
layers' counts (6 x N gcsfs requests, 5 x 5 x N botocore attempts) and give a run no known
bound, while a time bounds how long a request is tried, whatever each try costs below: at most
the budget plus one try. And it is what a user decides: how long an outage a run should ride
out before it saves and exits with `bertjax.cli.RETRY` (75) for its supervisor to restart it.

`StorageUnavailable` is not bad input (the store, file or flag is not at fault), so it is no
`OSError` or `ValueError`: commands end with `bertjax.cli.RETRY` (75, "restart: it resumes"),
not with `bertjax.cli.BAD_INPUT`. A missing or corrupt object is a different error
(`bertjax.data.store.shard_format.StoreError`, bad input).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import random
import re
import threading
import time
from collections.abc import Callable, Iterator

from bertjax import errors
from bertjax.errors import Retryable

__all__ = ["Retryable", "StorageUnavailable", "Cancel", "Policy", "call", "scope"]

BUDGET_S = 600.0  # default time a request is retried (config.storage_retry_seconds)
FIRST_DELAY_S = 1.0  # backoff bound after the first failure, doubled after each failure
MOST_DELAY_S = 60.0  # the backoff bound stops growing here
LOG_EVERY_S = 60.0  # retries are logged at most this often (per process)


class StorageUnavailable(Retryable):
    """Storage did not answer ``target`` within the retry budget (or before the run stopped:
    ``stopping``); ``str()`` is one line naming the object, the last error, and how long and how
    often it was tried."""

    def __init__(
        self, target: str, error: BaseException, elapsed_s: float, attempts: int,
        stopping: bool = False,
    ):  # fmt: skip
        self.target, self.error = str(target), error
        self.elapsed_s, self.attempts, self.stopping = float(elapsed_s), int(attempts), stopping
        last = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        if isinstance(error, _Described):
            last = str(error)
        why = " (not tried again: the run is stopping)" if stopping else ""
        super().__init__(
            f"storage unreachable: {self.target} ({last}) after {self.attempts} tries over "
            f"{self.elapsed_s:.0f} s{why}; the object is not known to be bad: rerun the same "
            "command when storage answers again (the run resumes from its last checkpoint)"
        )

    def __reduce__(self):  # crosses process boundaries (data worker processes) whole
        error = self.error
        try:
            pickle.dumps(error)
        except Exception:  # noqa: BLE001  (an HTTP client's error may hold a socket or a lock)
            error = _Described(" ".join(f"{type(error).__name__}: {error}".split())[:300])
        return type(self), (self.target, error, self.elapsed_s, self.attempts, self.stopping)


class _Described(Exception):
    """An error that could not cross a process boundary, as its type and message."""


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` may go away if the request is sent again (bertjax/errors.py: a
    connection error or timeout, HTTP 408, 429 or 5xx, TensorStore's UNAVAILABLE ...; not an
    error already given up on, `StorageUnavailable`)."""
    return errors.is_transient(error)


_RATE_LIMIT = re.compile(r"\br\s*=\s*0\b.*?\bt\s*=\s*(\d+)")


def server_wait(error: BaseException) -> float:
    """Seconds the server asked a client to wait before its next request: ``Retry-After`` (in
    seconds), or the reset ``t`` of an IETF ``RateLimit`` header whose remaining ``r`` is 0 (the
    Hugging Face Hub's 429s); 0 when the error's response says neither."""
    headers = getattr(getattr(error, "response", None), "headers", None)
    if not hasattr(headers, "get"):
        return 0.0
    waits = [0.0]
    found = _RATE_LIMIT.search(str(headers.get("ratelimit") or headers.get("RateLimit") or ""))
    if found:
        waits.append(float(found.group(1)))
    after = str(headers.get("retry-after") or headers.get("Retry-After") or "").strip()
    if after.isdigit():
        waits.append(float(after))
    return max(waits)


def transient_cause(error: BaseException) -> BaseException | None:
    """The transient error in ``error``'s chain of causes that makes it one (bertjax/errors.py),
    if it is one: what a wrapping layer (orbax, a "does not fit" message) raised it from."""
    return errors.transient_cause(error)


class Cancel:
    """A run's stop, for its storage requests: once `cancel` is called (the run's first signal,
    or another process's preemption notice), a request waiting out a backoff wakes, is tried
    once more at once (a lone failed request still recovers), and is then given up on
    (`StorageUnavailable`) instead of waiting out the budget. A run owns one and installs it
    with `scope` for its duration."""

    def __init__(self):
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleeps up to ``seconds``, waking when cancelled; whether it was."""
        return self._event.wait(max(0.0, seconds))


class Counts:
    """A process's storage requests that failed and were retried, those that then succeeded,
    those given up on, and the last failure; logged at most once every ``LOG_EVERY_S``."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.failed = self.recovered = self.given_up = 0
            self.last_error, self.last_target = "", ""
            self._logged_at: float | None = None
            self._failed_logged = 0

    def failure(self, target: str, error: BaseException, requests: int, now: float) -> None:
        """``requests`` requests to ``target`` failed with ``error`` and will be tried again."""
        with self._lock:
            self.failed += requests
            self.last_error = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            self.last_target = target
            due = self._logged_at is None or now - self._logged_at >= LOG_EVERY_S
            if not due:
                return
            since = self.failed - self._failed_logged
            window = (
                "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f} s"
            )
            self._logged_at, self._failed_logged = now, self.failed
            failed, recovered = self.failed, self.recovered
        logging.warning(
            "storage: %d requests failed and are retried%s (%d in all, %d recovered); last: %s "
            "(%s)",
            since, window, failed, recovered, target, self.last_error,
        )  # fmt: skip

    def count(self, recovered: int = 0, given_up: int = 0) -> None:
        with self._lock:
            self.recovered += recovered
            self.given_up += given_up

    def snapshot(self) -> dict:
        """The counts so far (for metrics): failed, recovered, given_up, last_error, last_target."""
        with self._lock:
            return {
                "failed": self.failed,
                "recovered": self.recovered,
                "given_up": self.given_up,
                "last_error": self.last_error,
                "last_target": self.last_target,
            }


COUNTS = Counts()  # this process's


class Policy:
    """How long and how often a request is tried: backoff with full jitter within ``budget_s``,
    given up early when ``token`` (the run's `Cancel`, installed by `scope`) is cancelled.
    ``clock``, ``sleep`` and ``rng`` are injectable (tests run on a fake clock and never
    sleep)."""

    def __init__(
        self,
        budget_s: float = BUDGET_S,
        *,
        first_delay_s: float = FIRST_DELAY_S,
        most_delay_s: float = MOST_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
        counts: Counts | None = None,
        token: Cancel | None = None,
    ):
        self.budget_s = check_budget(budget_s)
        self.first_delay_s, self.most_delay_s = float(first_delay_s), float(most_delay_s)
        self.clock, self.sleep = clock, sleep or self._sleep
        self.rng = rng or random.Random()
        self.counts = counts or COUNTS
        self.token = token

    def _sleep(self, seconds: float) -> None:
        token = self.token
        if token is None:
            time.sleep(seconds)
        else:
            token.wait(seconds)  # wakes early when the run stops

    def cancelled(self) -> bool:
        token = self.token
        return token is not None and token.cancelled()

    def attempt(self, target: str = "") -> Attempt:
        """The tries of one request (or of one set of ranges: `Attempt.failed` per round)."""
        return Attempt(self, target)

    def call(self, target: str, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)``, tried again on transient errors within the budget."""
        attempt = self.attempt(target)
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as error:  # noqa: BLE001  (not transient: raised again at once)
                attempt.failed(error)
            else:
                attempt.succeeded()
                return result


class Attempt:
    """The tries of one request under a `Policy`, from its first."""

    def __init__(self, policy: Policy, target: str):
        self.policy, self.target = policy, str(target)
        self.start = policy.clock()
        self.tries = 0
        self.last_try = False  # the run stopped: the try after the one that failed is the last

    def failed(self, error: BaseException, target: str = "", requests: int = 1) -> None:
        """After a try failed with ``error`` (``requests`` requests of ``target``): raises it when
        it is not transient, `StorageUnavailable` once the budget has passed (or after one more
        try once the run is stopping); otherwise counts it and sleeps a backoff (never past the
        budget, cut short when the run stops) before the caller tries again."""
        policy, target = self.policy, str(target or self.target)
        self.tries += 1
        if not is_transient(error):
            raise error
        now = policy.clock()
        elapsed = now - self.start
        # the budget as a deadline: a backoff cut to ``deadline - now`` reaches it exactly (as
        # ``budget - elapsed``, rounding could leave the clock a hair short, and a clock that
        # only moves by the sleeps, as in tests, then never got there)
        deadline = self.start + policy.budget_s
        if now >= deadline or self.last_try:
            policy.counts.count(given_up=requests)
            spent = elapsed if self.last_try else max(elapsed, policy.budget_s)
            raise StorageUnavailable(
                target, error, spent, self.tries, stopping=self.last_try
            ) from error
        policy.counts.failure(target, error, requests, now)
        if policy.cancelled():  # stopping: one more try at once, then give up
            self.last_try = True
            return
        bound = min(policy.most_delay_s, policy.first_delay_s * 2.0 ** min(self.tries - 1, 60))
        delay = max(policy.rng.uniform(0.0, bound), server_wait(error))  # at least as asked
        policy.sleep(min(delay, deadline - now))
        self.last_try = policy.cancelled()  # woken by a stop: this coming try is the last

    def succeeded(self, requests: int = 1) -> None:
        """After the request succeeded: counted as recovered when it had failed before."""
        if self.tries:
            self.policy.counts.count(recovered=requests)


def check_budget(seconds) -> float:
    seconds = float(seconds)
    if not seconds >= 0.0:
        raise ValueError(
            f"config.storage_retry_seconds={seconds}: must be >= 0 (seconds a failing storage "
            "request is retried)"
        )
    return seconds


POLICY = Policy()  # what this process's storage requests use (`configure` sets its budget)


def configure(budget_s: float) -> None:
    """This process's retry budget (config.storage_retry_seconds)."""
    POLICY.budget_s = check_budget(budget_s)


@contextlib.contextmanager
def scope(token: Cancel) -> Iterator[Cancel]:
    """Inside, storage requests give up early once ``token`` is cancelled (a run's stop); the
    token is the run's: on leaving, requests are retried for their whole budget again."""
    previous, POLICY.token = POLICY.token, token
    try:
        yield token
    finally:
        POLICY.token = previous


def current() -> Policy:
    """The policy storage requests use now (read at each request, so tests can swap it)."""
    return POLICY


def call(target: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` under this process's policy (`Policy.call`)."""
    return current().call(target, fn, *args, **kwargs)
