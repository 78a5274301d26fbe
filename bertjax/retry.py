"""Storage requests that fail for a while: what a command sees when storage stays unreachable.

`StorageUnavailable` is raised when a request to storage (a store's byte ranges, a manifest, a
tokenizer file, a checkpoint on a URL) kept failing with transient errors past the retry budget.
It is not bad input (the store, file or flag is not at fault), so it is no `OSError` or
`ValueError`: commands end with `bertjax.cli.RETRY` (75, "restart: it resumes"), not with
`bertjax.cli.BAD_INPUT`. A missing or corrupt object is a different error
(`bertjax.data.store.shard_format.StoreError`, bad input).
"""

from __future__ import annotations


class Retryable(Exception):
    """The command stopped for a reason that a rerun of the same command gets past (exit status
    `bertjax.cli.RETRY`); ``str()`` says what happened."""


class StorageUnavailable(Retryable):
    """Storage did not answer ``target`` within the retry budget; ``str()`` is one line naming
    the object, the last error, and how long and how often it was tried."""

    def __init__(self, target: str, error: BaseException, elapsed_s: float, attempts: int):
        self.target, self.error = str(target), error
        self.elapsed_s, self.attempts = float(elapsed_s), int(attempts)
        last = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        super().__init__(
            f"storage unreachable: {self.target} ({last}) after {self.attempts} tries over "
            f"{self.elapsed_s:.0f} s; the object is not known to be bad: rerun the same command "
            "when storage answers again (the run resumes from its last checkpoint)"
        )

    def __reduce__(self):  # crosses process boundaries (data worker processes) whole
        return type(self), (self.target, self.error, self.elapsed_s, self.attempts)
