"""One answer to "what is this error?", and what each answer means for whoever runs the command.

The retry layer (bertjax/retry.py: is the request tried again?), the checkpoint code (is a step
unreachable, or damaged and set aside?), `bertjax.cli` (which exit status, one line or a
traceback?) and `bertjax.training.processes` (what the other processes of a run are told) all
ask `classify`; a new call site is covered by construction. An error is one `Kind`:

- `Kind.STORAGE`: storage may answer again: a connection reset, refused or timed out, HTTP 408,
  429 or 5xx (gcsfs's ``code``, aiohttp's and httpx's ``status``, requests' and
  huggingface_hub's ``response.status_code``, botocore's response metadata or throttling code),
  TensorStore's and gRPC's UNAVAILABLE and DEADLINE_EXCEEDED on a read or write. Retried within
  the budget; if it reaches a command, exit 75 (restart: it resumes).
- `Kind.RESTART`: bertjax already decided that a rerun gets past it (`Retryable`: storage
  unreachable past its budget, a checkpoint set aside): exit 75.
- `Kind.RUNTIME`: a collective or a device call failed (jaxlib's JaxRuntimeError, a Gloo
  collective's ValueError, XLA's status texts). Under --multihost often a lost peer, which the
  watchdog names (then 75); otherwise exit 1 with the traceback.
- `Kind.INPUT`: bad input that a rerun meets again: not found, permission denied, an HTTP 4xx
  (401/403/404: huggingface_hub's too), an invalid URL, a TLS or certificate failure, an S3 code
  s3fs does not know (its ``OSError(EIO)`` raised from botocore's 400), a body longer than the
  object (`LongRead`: a transcoding server answers so every time), any other ValueError or
  OSError of ours. Exit 2 with one line.
- `Kind.BUG`: anything else. Exit 1 with the traceback.

The error and its chain of causes are read together (``__cause__``, or ``__context__`` unless
suppressed): the deepest link that says something decides (the root cause: a "does not fit"
ValueError raised from TensorStore's UNAVAILABLE is storage; s3fs's EIO raised from a 400 is
input), except that a `Retryable` anywhere in it decides (bertjax gave up already: a
`StorageUnavailable` is never retried again by an outer layer). `shows_damage` says whether an
error is evidence that stored bytes are bad (a missing or truncated chunk, a checksum or decode
failure, unreadable metadata), the only errors for which a checkpoint is set aside.

`EXITS` is the exit-status table (README's is `table_markdown()`, tests/errors_test.py checks it;
the launcher templates in launch/ restart by `restarts`, tests/launchers_test.py checks them).
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import json
import re
import zlib

FINISHED = 0
BUG = 1  # an uncaught exception (Python's status)
BAD_INPUT = 2
RETRY = 75  # EX_TEMPFAIL of sysexits.h
SIGNALLED = 128  # + the signal: stopped by it after saving


class Kind(enum.Enum):
    STORAGE = "storage"  # storage may answer again: retried within the budget, then 75
    RESTART = "restart"  # bertjax decided a rerun gets past it (`Retryable`): 75
    RUNTIME = "runtime"  # a collective or device call failed: 75 when a peer was lost, else 1
    INPUT = "input"  # bad input: 2, one line
    BUG = "bug"  # 1, with the traceback


class Retryable(Exception):
    """The command stopped for a reason that a rerun of the same command gets past (exit status
    ``status``, 75 unless a subclass says otherwise); ``str()`` says what happened."""

    status = RETRY


class LongRead(ValueError):
    """More bytes arrived than the object holds: the server answers so every time (a transcoding
    proxy), so it is not tried again (a short read is: `ShortRead`)."""


class ShortRead(ConnectionError):
    """The connection ended before the object's bytes had all arrived: tried again."""


# HTTP statuses worth another try: timeout, too many requests, server errors
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504, 509})
# errnos of a connection or a storage backend that may answer again (EIO, EBUSY, EREMOTEIO: what
# gcsfuse and s3fs report for storage-side errors; s3fs's EIO raised from a 4xx is not)
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "EPIPE",
        "EAGAIN",
        "EBUSY",
        "EIO",
        "EREMOTEIO",
        "ESHUTDOWN",
    )  # fmt: skip
    if hasattr(errno, name)
)
# error types (module.name, anywhere in the class's bases) of the HTTP clients under fsspec and
# huggingface_hub that mean the connection failed, not the request
TRANSIENT_TYPES = frozenset(
    {
        "aiohttp.client_exceptions.ClientConnectionError",  # its TLS errors are told first
        "aiohttp.client_exceptions.ClientPayloadError",  # the body ended early
        "requests.exceptions.ConnectionError",  # its SSLError is told first
        "requests.exceptions.Timeout",
        "requests.exceptions.ChunkedEncodingError",
        "urllib3.exceptions.ProtocolError",
        "urllib3.exceptions.TimeoutError",
        "urllib3.exceptions.NewConnectionError",
        "botocore.exceptions.HTTPClientError",
        "botocore.exceptions.ConnectionError",
        "botocore.exceptions.IncompleteReadError",
        "botocore.exceptions.ResponseStreamingError",
        "http.client.IncompleteRead",
        "gcsfs.retry.ChecksumError",  # bytes corrupted in transit
        "google.auth.exceptions.TransportError",  # the token server did not answer
        *(
            f"{m}.{n}"
            for m in ("httpx", "httpx2")  # huggingface_hub 1.x: httpx; 2.x: httpx2
            for n in ("TimeoutException", "NetworkError", "RemoteProtocolError")
        ),  # fmt: skip
    }
)
# types that no rerun gets past: a URL that is not one, TLS and certificate failures
PERMANENT_TYPES = frozenset(
    {
        "aiohttp.client_exceptions.InvalidURL",
        "aiohttp.client_exceptions.NonHttpUrlClientError",
        "aiohttp.client_exceptions.ClientSSLError",
        "aiohttp.client_exceptions.ServerFingerprintMismatch",
        "requests.exceptions.SSLError",
        "requests.exceptions.InvalidURL",
        "requests.exceptions.MissingSchema",
        "requests.exceptions.InvalidSchema",
        "urllib3.exceptions.SSLError",
        "urllib3.exceptions.LocationParseError",
        "ssl.SSLError",
        "huggingface_hub.errors.OfflineModeIsEnabled",  # HF_HUB_OFFLINE=1: a ConnectionError
        *(f"{m}.{n}" for m in ("httpx", "httpx2") for n in ("UnsupportedProtocol", "InvalidURL")),
    }
)
# error codes of S3-style services that are throttling or a server's trouble (any status)
TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
     "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequestsException"}
)  # fmt: skip
# what an error without errno or status says when it is one of those (a wrapped HTTP error)
_TRANSIENT_TEXT = re.compile(
    r"\b(408|429|5\d\d) (service|too many|internal|bad gateway|gateway|request time|slow)|"
    r"\b(http|status|code)\W{0,3}(408|429|5\d\d)\b|service unavailable|too many requests|"
    r"slow ?down|reduce your request rate|internal server error|bad gateway|gateway time-?out|"
    r"timed out|connection (reset|refused|aborted)|temporarily unavailable",
    re.IGNORECASE,
)
# the runtime's status codes, as a failed collective's or device call's text begins (jaxlib
# raises a Gloo collective's failure as a ValueError, most others as JaxRuntimeError)
_RUNTIME_STATUS = re.compile(
    r"^(UNKNOWN|INTERNAL|UNAVAILABLE|ABORTED|CANCELLED|DEADLINE_EXCEEDED|FAILED_PRECONDITION|"
    r"RESOURCE_EXHAUSTED):"
)
# TensorStore's status codes (every absl status), as its errors' texts begin
_STATUS = re.compile(
    r"^(UNKNOWN|INTERNAL|UNAVAILABLE|ABORTED|CANCELLED|DEADLINE_EXCEEDED|FAILED_PRECONDITION|"
    r"RESOURCE_EXHAUSTED|OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|INVALID_ARGUMENT|PERMISSION_DENIED):"
)
# a status text about stored bytes (TensorStore's kvstores, orbax's checkpoints), not the runtime's
_STORAGE_TEXT = re.compile(
    r"Error (reading|writing|opening|listing|deleting)|kvstore|OCDBT|tensorstore|\b(gs|s3|file)://",
    re.IGNORECASE,
)
# storage that may answer again: unreachable, out of time, GCS's "internal error. Please try
# again" (a 500 TensorStore's own retries leave out), a gRPC stream reset
_TRANSIENT_STATUS_TEXT = re.compile(
    r"^(UNAVAILABLE|DEADLINE_EXCEEDED):|^INTERNAL:.*(please try again|internal server error|"
    r"RST_STREAM)",
    re.IGNORECASE | re.DOTALL,
)
# a status text that says stored bytes are missing or bad
_DAMAGE_TEXT = re.compile(
    r"^(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND):|^FAILED_PRECONDITION:.*(truncat|corrupt|checksum|crc|"
    r"decod|invalid|unexpected end)|checksum mismatch|crc.{0,20}(mismatch|failed)|corrupt",
    re.IGNORECASE | re.DOTALL,
)
_NEVER = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
          FileExistsError, LongRead)  # fmt: skip
_DAMAGE_TYPES = (json.JSONDecodeError, UnicodeDecodeError, zlib.error, EOFError,
                 FileNotFoundError)  # fmt: skip


def chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and the errors it was raised from, outermost first (as a traceback prints
    them: the explicit cause, else the context unless suppressed)."""
    links, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        links.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return links


def _text(error: BaseException) -> str:
    """``str(error)``, or its type's name when the error cannot say (an aiohttp response error
    made without its request raises in ``__str__``)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001
        return type(error).__name__


def _names(error: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__}


def http_status(error: BaseException) -> int | None:
    """The HTTP status an HTTP client's error carries (gcsfs ``code``, aiohttp ``status``,
    requests' and huggingface_hub's ``response.status_code``, botocore's response metadata; an
    S3 throttling or server code counts as 503), if any."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        code = response.get("Error", {}).get("Code")
        if code in TRANSIENT_CODES:
            return 503
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    for owner, name in ((error, "status"), (error, "status_code"), (error, "code"),
                        (response, "status_code")):  # fmt: skip
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    return None


def _runtime(error: BaseException) -> bool:
    """The runtime's failure: jaxlib's error types, or a status text (a Gloo collective's
    ValueError) that is not about stored bytes."""
    text = _text(error)
    if type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
        return not _STORAGE_TEXT.search(text)
    if isinstance(error, (ValueError, RuntimeError)) and _RUNTIME_STATUS.match(text):
        return not _STORAGE_TEXT.search(text)
    return False


def _verdict(error: BaseException) -> Kind | None:
    """What ``error`` alone says (None: nothing; its causes may)."""
    if isinstance(error, Retryable):
        return Kind.RESTART
    if _runtime(error):
        return Kind.RUNTIME
    names = _names(error)
    if names & PERMANENT_TYPES:
        return Kind.INPUT
    status = http_status(error)
    if status is not None:
        return Kind.STORAGE if status in TRANSIENT_STATUS else Kind.INPUT
    if isinstance(error, _NEVER):
        return Kind.INPUT
    if isinstance(error, (TimeoutError, ConnectionError)) or names & TRANSIENT_TYPES:
        return Kind.STORAGE
    if isinstance(error, OSError):
        if error.errno is not None:
            return Kind.STORAGE if error.errno in TRANSIENT_ERRNOS else Kind.INPUT
        return Kind.STORAGE if _TRANSIENT_TEXT.search(_text(error)) else None
    text = _text(error)
    if isinstance(error, (ValueError, RuntimeError)) and _STATUS.match(text):
        if _TRANSIENT_STATUS_TEXT.search(text):  # TensorStore's (a ValueError)
            return Kind.STORAGE
    return None


def classify(error: BaseException) -> Kind:
    """What ``error`` is, from it and the errors it was raised from (the module docstring)."""
    links = chain(error)
    if any(isinstance(link, Retryable) for link in links):  # bertjax decided: never retried
        return Kind.RESTART
    kind = None
    for link in links:  # the deepest link that says something decides
        kind = _verdict(link) or kind
    if kind is not None:
        return kind
    return Kind.INPUT if isinstance(error, (ValueError, OSError)) else Kind.BUG


def is_transient(error: BaseException) -> bool:
    """Whether sending the request again may succeed (`Kind.STORAGE`)."""
    return classify(error) is Kind.STORAGE


def transient_cause(error: BaseException) -> BaseException | None:
    """The error of ``error``'s chain that makes it `Kind.STORAGE` (what a wrapping layer, orbax
    or a "does not fit" message, raised it from), or None when it is another kind."""
    if classify(error) is not Kind.STORAGE:
        return None
    return next(link for link in reversed(chain(error)) if _verdict(link) is Kind.STORAGE)


def is_runtime(error: BaseException) -> bool:
    """Whether ``error`` is the runtime's (a failed collective or device call): never bad
    input; under --multihost possibly a sign of a lost process."""
    return classify(error) is Kind.RUNTIME


def shows_damage(error: BaseException) -> bool:
    """Whether ``error`` is evidence that stored bytes are missing or bad (a file or chunk not
    found, a byte range past a truncated file, a checksum, CRC or decode failure, metadata that
    does not parse), as opposed to storage that did not answer, memory, or a bug."""
    if classify(error) in (Kind.STORAGE, Kind.RESTART, Kind.RUNTIME):
        return False
    for link in chain(error):
        if isinstance(link, _DAMAGE_TYPES):
            return True
        text = _text(link)
        if _DAMAGE_TEXT.search(text) and (_STORAGE_TEXT.search(text) or not _STATUS.match(text)):
            return True
    return False


def exit_status(error: BaseException, peer_lost: bool = False) -> int:
    """The exit status a command ends with for ``error`` (the table below): a runtime error is 75
    when a peer of the run was lost (``peer_lost``), else a bug's 1."""
    kind = classify(error)
    if kind is Kind.RUNTIME:
        return RETRY if peer_lost else BUG
    if kind is Kind.RESTART:
        return next(link.status for link in chain(error) if isinstance(link, Retryable))
    return {Kind.STORAGE: RETRY, Kind.INPUT: BAD_INPUT}.get(kind, BUG)


def stopped_by(signum: int) -> int:
    """The exit status of a run stopped by signal ``signum`` after saving: 128 + the signal."""
    return SIGNALLED + int(signum)


@dataclasses.dataclass(frozen=True)
class Exit:
    """A row of the exit table: the status (or statuses), what it means, what a supervisor does,
    and whether it restarts the command."""

    status: str
    meaning: str
    supervisor: str
    restart: bool


EXITS = (
    Exit(str(FINISHED), "finished", "nothing", False),
    Exit(
        str(BUG),
        "a bug: an error bertjax did not expect (the traceback is printed)",
        "stop; report it",
        False,
    ),  # fmt: skip
    Exit(
        str(BAD_INPUT),
        "bad input: a flag, a file, a config key, a URL (one line says what and "
        "where), or a full disk",
        "stop: the same command fails the same way",
        False,
    ),  # fmt: skip
    Exit(
        str(RETRY),
        "not done: storage unreachable (past its budget, or an error no retry met), another "
        "process lost, a checkpoint set aside",
        "restart the same command: it resumes",
        True,
    ),  # fmt: skip
    Exit(
        f"{SIGNALLED}+N",
        "stopped by signal N after saving (143: SIGTERM, a preemption; 130: Ctrl-C)",
        "restart the same command: it resumes",
        True,
    ),  # fmt: skip
)
# every status a bertjax command exits with: the table's rows, 128+N for the signals 1-127
STATUSES = (FINISHED, BUG, BAD_INPUT, RETRY, *range(SIGNALLED + 1, 256))


def restarts(status: int) -> bool:
    """Whether a supervisor restarts a command that exited with ``status`` (`EXITS`)."""
    status = int(status)
    if status > SIGNALLED:
        return EXITS[-1].restart
    for row in EXITS[:-1]:
        if row.status == str(status):
            return row.restart
    raise ValueError(f"exit status {status}: not one bertjax ends with ({STATUSES[:4]}, 128+N)")


def job_restarts(statuses: list[int]) -> bool | None:
    """What a supervisor of a job of several processes does with their statuses (a negative one:
    killed by that signal, as Python's subprocess reports it): None when every process finished
    (0), False when one ended with a status that is not restarted (the job fails), else True."""
    statuses = [SIGNALLED - s if s < 0 else s for s in statuses]
    if all(s == FINISHED for s in statuses):
        return None
    return all(s == FINISHED or restarts(s) for s in statuses)


def table_markdown() -> str:
    """The exit table as README shows it."""
    rows = ["| status | meaning | what a supervisor does |", "|---|---|---|"]
    rows += [f"| {row.status} | {row.meaning} | {row.supervisor} |" for row in EXITS]
    return "\n".join(rows)
