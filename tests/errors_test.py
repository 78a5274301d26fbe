"""bertjax/errors.py, the one classifier: errors as the real clients raise them (gcsfs, s3fs
after translating botocore's, aiohttp, requests, botocore, httpx, huggingface_hub's own
`hf_raise_for_status` on real responses, TensorStore's texts), their chains of causes, the
evidence of damage, the exit status every command ends with (in-process through
`bertjax.cli.input_errors`), and README's exit table."""

import errno
import json
import os
import ssl
import zlib

import pytest
from helpers import ROOT

from bertjax import cli, errors, retry
from bertjax.errors import Kind


def _s3(code, status):
    import botocore.exceptions

    meta = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(meta, "GetObject")


def _hub(status, **headers):
    """huggingface_hub's error for a response of ``status``, as its client raises it."""
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    url = "https://hub.local/api/datasets/org/corpus/tree/main"
    response = httpx2.Response(status, request=httpx2.Request("GET", url), headers=headers)
    with pytest.raises(Exception) as raised:
        hf_raise_for_status(response)
    return raised.value


def _offline():
    """What huggingface_hub raises for a request while HF_HUB_OFFLINE is set (no retry helps)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    return OfflineModeIsEnabled("Cannot reach https://hub.local: offline mode is enabled")


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as error:
            raise outer from error
    except BaseException as error:
        return error


def _response_error(status):
    """aiohttp's error for a response of ``status``, with its request (as gcsfs meets it)."""
    import aiohttp
    import multidict
    import yarl

    url = yarl.URL("https://storage.googleapis.com/b/o")
    info = aiohttp.RequestInfo(url, "GET", multidict.CIMultiDictProxy(multidict.CIMultiDict()))
    return aiohttp.ClientResponseError(info, (), status=status)


def _storage():
    import aiohttp
    import botocore.exceptions
    import httpx2
    import requests
    from gcsfs.retry import HttpError
    from s3fs.errors import translate_boto_error

    return [
        HttpError({"code": 503, "message": "Backend Error"}),
        HttpError({"code": 429, "message": "rate"}),
        requests.exceptions.ProxyError(),  # gcsfs's 502
        requests.exceptions.ConnectionError(),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("Response payload is not completed"),
        _response_error(500),
        translate_boto_error(_s3("SlowDown", 503)),  # OSError(EBUSY)
        translate_boto_error(_s3("InternalError", 500)),  # OSError(EREMOTEIO)
        translate_boto_error(_s3("RequestTimeout", 400)),  # TimeoutError
        translate_boto_error(_s3("SomeNewServerTrouble", 500)),  # EIO raised from a 500
        _s3("SlowDown", 503),
        botocore.exceptions.EndpointConnectionError(endpoint_url="https://s3"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="https://s3"),
        httpx2.ConnectError("[Errno 111] Connection refused"),
        httpx2.ReadTimeout("timed out"),
        _hub(429, **{"Retry-After": "3"}),
        _hub(503),
        TimeoutError(),
        ConnectionResetError(),
        errors.ShortRead("the download ended after 10 of 20 bytes"),
        OSError(errno.ETIMEDOUT, "timed out"),
        OSError(errno.EIO, "Input/output error"),  # gcsfuse's storage error
        OSError("503 Service Unavailable"),
        ValueError('UNAVAILABLE: Error reading "gs://b/c/3/state/d/0"'),  # TensorStore's
        ValueError("DEADLINE_EXCEEDED: Error writing gs://b/c/3"),
        ValueError(
            "INTERNAL: Error reading [...]: We encountered an internal error. Please try "
            "again. [source locations='tensorstore/kvstore/gcs_grpc/gcs_grpc.cc:503']"
        ),
        ValueError('INTERNAL: Error reading "gs://b/c/3/state/d/0": RST_STREAM closed stream'),
    ]


def _bad_input():
    import aiohttp
    import requests
    from aiohttp.client_reqrep import ConnectionKey
    from gcsfs.retry import HttpError
    from s3fs.errors import translate_boto_error

    key = ConnectionKey(*(("storage.googleapis.com", 443, True, True)
                          + (None,) * (len(ConnectionKey._fields) - 4)))  # fmt: skip
    certificate = aiohttp.ClientConnectorCertificateError(
        key, ssl.SSLCertVerificationError(1, "certificate verify failed")
    )
    return [
        HttpError({"code": 404, "message": "No such object"}),
        HttpError({"code": 400, "message": "bad"}),
        _response_error(404),
        aiohttp.InvalidURL("gs//bucket/no-scheme"),
        certificate,
        requests.exceptions.SSLError("certificate verify failed"),
        translate_boto_error(_s3("NoSuchKey", 404)),  # FileNotFoundError
        translate_boto_error(_s3("AccessDenied", 403)),  # PermissionError
        translate_boto_error(_s3("InvalidRange", 416)),  # OSError(EINVAL)
        translate_boto_error(_s3("EntityTooLarge", 400)),  # EIO raised from an unmapped 400
        translate_boto_error(_s3("QuotaExceeded", 403)),  # storage full: EIO from a 403
        _s3("NoSuchKey", 404),
        _hub(401),
        _hub(403),
        _hub(404, **{"X-Error-Code": "RepoNotFound"}),
        _offline(),
        errors.LongRead("gs://b/o: 30 bytes arrived of 20"),
        FileNotFoundError("gs://b/o"),
        OSError("Forbidden: b/shard-503.bin"),  # gcsfs's 403; a number in a name is no status
        OSError(errno.ENOSPC, "No space left on device"),
        ValueError("Bad Request: b/o"),
        ValueError('NOT_FOUND: Error opening "zarr" driver'),  # TensorStore's
        ValueError("the field UNAVAILABLE is not a status"),
    ]


def test_the_errors_of_the_real_clients_are_told_apart():
    """Timeouts, dropped connections, 429 and 5xx (huggingface_hub's too) are storage that may
    answer again; not found, permission denied, 4xx, invalid URLs, TLS and certificate
    failures, s3fs's EIO raised from a 4xx and a body longer than the object are bad input."""
    storage, bad = _storage(), _bad_input()
    assert [errors.classify(e).value for e in storage] == ["storage"] * len(storage)
    assert [errors.classify(e).value for e in bad] == ["input"] * len(bad)
    assert all(retry.is_transient(e) for e in storage)
    assert not any(retry.is_transient(e) for e in bad)


def test_the_deepest_cause_decides_and_a_given_up_error_is_never_retried():
    import httpx2

    unavailable = ValueError('UNAVAILABLE: Error reading "gs://b/c/3/state/d/0"')
    wrapped = _raised_from(ValueError("checkpoint does not fit this model"), unavailable)
    assert errors.classify(wrapped) is Kind.STORAGE
    assert errors.transient_cause(wrapped) is unavailable
    probe = _raised_from(ValueError("workdir 'gs://b/w' is not writable"), ConnectionResetError())
    assert errors.classify(probe) is Kind.STORAGE
    tls = _raised_from(httpx2.ConnectError("handshake"), ssl.SSLCertVerificationError(1, "bad"))
    assert errors.classify(tls) is Kind.INPUT  # a certificate failure under a connect error
    gloo = ValueError("UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error: Connection "
                      "reset by peer")  # fmt: skip
    assert errors.classify(_raised_from(RuntimeError("the step failed"), gloo)) is Kind.RUNTIME
    assert errors.classify(ValueError("UNKNOWN token [X]")) is Kind.INPUT
    assert errors.classify(KeyError("a bug")) is Kind.BUG
    given_up = retry.StorageUnavailable("gs://b/o", OSError("503 Service Unavailable"), 600, 20)
    assert errors.classify(given_up) is Kind.RESTART and not retry.is_transient(given_up)


def test_damage_is_told_from_storage_that_did_not_answer():
    """Only evidence that stored bytes are bad (TensorStore's texts as orbax raised them for a
    truncated and a lost chunk, metadata that does not parse) sets a checkpoint aside."""
    damage = [
        ValueError(
            'OUT_OF_RANGE: Error reading "params.w/0.0" in OCDBT database at local file '
            '"/w/checkpoints/2/state/": Requested byte range [0, 15160) is not valid for '
            "value of size 7740"
        ),  # fmt: skip
        ValueError(
            'FAILED_PRECONDITION: Error reading "params.w/0.0" in OCDBT database at local '
            'file "/w/checkpoints/2/state/": Truncated Zstd-compressed stream'
        ),  # fmt: skip
        _raised_from(ValueError("checkpoint /w/2 does not fit"), json.JSONDecodeError("x", "{", 1)),
        FileNotFoundError("/w/checkpoints/2/meta/metadata not found"),
        zlib.error("Error -3 while decompressing data: invalid block type"),
    ]
    no_damage = [
        ValueError('UNAVAILABLE: Error reading "gs://b/c/3/state/d/0"'),
        ValueError('INTERNAL: Error reading "gs://b/c/3": RST_STREAM closed stream'),
        MemoryError(),
        ValueError("checkpoint /w/2 does not fit this model: shape (4, 8) vs (8, 8)"),
        ValueError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2G"),
    ]
    assert [errors.shows_damage(e) for e in damage] == [True] * len(damage)
    assert [errors.shows_damage(e) for e in no_damage] == [False] * len(no_damage)


@pytest.mark.parametrize("kind", ["storage", "input"])
def test_every_command_ends_as_the_classifier_says(kind, capsys):
    """Through `cli.input_errors`, as every command ends: storage that may answer again (not
    retried where it happened) 75, bad input 2, each one line naming the error."""
    cases = _storage() if kind == "storage" else _bad_input()
    status = cli.RETRY if kind == "storage" else cli.BAD_INPUT
    for error in cases:
        with pytest.raises(SystemExit) as ended, cli.input_errors(verbose=False):
            raise error
        assert ended.value.code == status, (error, ended.value.code)
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: storage did not answer (" if status == 75 else "error: ")
    for error in (KeyError("a bug"), ValueError("UNKNOWN: Gloo AllGather failed")):
        with pytest.raises(type(error)), cli.input_errors(verbose=False):
            raise error  # a bug or the runtime's: its traceback (status 1)


def test_exit_statuses_and_what_a_supervisor_does():
    assert errors.exit_status(ConnectionResetError()) == 75
    assert errors.exit_status(ValueError("UNKNOWN: Gloo failed")) == 1
    assert errors.exit_status(ValueError("UNKNOWN: Gloo failed"), peer_lost=True) == 75
    assert [errors.restarts(s) for s in (0, 1, 2, 75, 130, 137, 143)] == [
        False, False, False, True, True, True, True]  # fmt: skip
    with pytest.raises(ValueError, match="exit status 3: not one bertjax ends with"):
        errors.restarts(3)
    assert errors.job_restarts([0, 0, 0]) is None and errors.job_restarts([75, -9, 143])
    assert errors.job_restarts([75, 2, 75]) is False  # one process's bad input fails the job


def test_the_documented_exit_table_is_the_classifier_s():
    """docs/operations.md's table is `errors.table_markdown()` (paste it in when it changes)."""
    page = open(os.path.join(ROOT, "docs", "operations.md")).read()
    assert errors.table_markdown() in page
    assert [row.status for row in errors.EXITS] == ["0", "1", "2", "75", "128+N"]
    assert cli.stopped_by(15) == cli.STOPPED == 143 and cli.stopped_by(2) == 130
