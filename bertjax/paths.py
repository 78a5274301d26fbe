"""Paths a run reads and keeps: local paths or URLs (gs://, s3://, file://: what `etils.epath`,
orbax's own path type, opens).

Every path a user gives is resolved once, where it enters (`resolve`): ``~`` expanded, a relative
path made absolute against the current directory, ``file://`` turned into its local path, other
URLs left as they are; a path that must exist and does not stops with one line naming the
setting (`MissingPathError`). Files the run writes go through `Path` (epath), so a workdir on
cloud storage holds checkpoints, metrics, the tokenizer and the run meta. What a library can
only read from local disk (SentencePiece models, memory-mapped token stores, safetensors)
comes from `local_copy`, under the local cache directory (`cache_dir`). What these functions
ask of a URL is tried again on transient errors within the retry budget (bertjax/retry.py), and
a transient error is never taken for "not there".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from etils import epath

from bertjax import retry

CACHE_ENV = "BERTJAX_CACHE_DIR"  # overrides the default local cache directory


class MissingPathError(FileNotFoundError):
    """A path given in a setting does not exist (the message names the setting and the path)."""


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL other than file:// (those need `local_copy` to be read locally)."""
    return "://" in str(path) and not str(path).startswith("file://")


def resolve(path: str, key: str = "", *, must_exist: bool = False) -> str:
    """``path`` as the run will use it: URLs unchanged (file:// becomes a local path), ``~``
    expanded, relative paths absolute. ``must_exist``: a missing path raises MissingPathError
    naming ``key`` (the setting it came from)."""
    if not path:
        return path
    path = _local(path)
    if not is_url(path):
        path = os.path.abspath(os.path.expanduser(path))
    if must_exist and not exists(path):
        raise MissingPathError(f"{key or 'path'}={path!r} does not exist")
    return path


def _local(path: str) -> str:
    """``path`` without a file:// scheme (epath and local libraries take plain local paths)."""
    path = str(path)
    return path[len("file://") :] if path.startswith("file://") else path


def Path(path: str) -> epath.Path:  # noqa: N802 (a constructor, as epath.Path)
    """The path type every file the run keeps goes through (file:// URLs as local paths)."""
    return epath.Path(_local(path))


def _info(path: str) -> dict | None:
    """fsspec's description of the object or directory at URL ``path``; None when there is none.
    Transient errors are tried again (bertjax/retry.py), never taken for "not there"."""
    import fsspec

    def info():
        fs, inner = fsspec.core.url_to_fs(path)
        try:
            return fs.info(inner)
        except FileNotFoundError:
            return None

    return retry.call(path, info)


def exists(path: str) -> bool:
    if is_url(path):
        return _info(path) is not None
    return Path(path).exists()


def isdir(path: str) -> bool:
    if is_url(path):
        return (_info(path) or {}).get("type") == "directory"
    return Path(path).is_dir()


def isfile(path: str) -> bool:
    if is_url(path):
        found = _info(path)
        return found is not None and found.get("type") != "directory"
    path = Path(path)
    return path.exists() and not path.is_dir()


def join(path: str, *parts: str) -> str:
    return os.fspath(Path(path).joinpath(*parts))


def read_text(path: str) -> str:
    if is_url(path):
        return retry.call(path, Path(path).read_text, encoding="utf-8")
    return Path(path).read_text(encoding="utf-8")


def write_bytes(path: str, data: bytes) -> None:
    """Writes a whole file; a reader never sees half of it (a local file is written beside, under
    a name no other process or thread uses, and renamed; an object store's single upload is
    atomic, and tried again on transient errors); a failed write leaves the file as it was. A
    local file is on disk before it takes its name (a power cut leaves the old file or the new)."""
    if is_url(path):
        retry.call(path, Path(path).write_bytes, data)
        return
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_bytes(path: str) -> bytes:
    """A whole file's bytes (a URL's tried again on transient errors)."""
    return retry.call(path, Path(path).read_bytes)


def remove(path: str) -> None:
    """Removes a file (tried again on transient errors: a workdir on a URL, a gcsfuse mount)."""
    retry.call(path, Path(path).unlink)


def rmtree(path: str) -> None:
    """Removes a directory and what it holds (tried again on transient errors)."""
    retry.call(path, Path(path).rmtree)


def rename(path: str, target: str) -> None:
    """Moves ``path`` to ``target`` (tried again on transient errors; on an object store a
    directory is moved object by object, so a retried move finishes what the failed try left)."""
    retry.call(path, _move, path, target)


def _move(path: str, target: str) -> None:
    if Path(path).exists():
        Path(path).rename(target)
    elif not Path(target).exists():
        raise FileNotFoundError(f"{path}: nothing to move to {target}")


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def makedirs(path: str) -> None:
    if is_url(path):
        retry.call(path, Path(path).mkdir, parents=True, exist_ok=True)
        return
    Path(path).mkdir(parents=True, exist_ok=True)


def cache_dir(configured: str = "") -> str:
    """The local cache directory: ``configured`` (config.data.cache_dir), else $BERTJAX_CACHE_DIR,
    else bertjax-cache under the system temp directory."""
    chosen = (
        configured
        or os.environ.get(CACHE_ENV)
        or os.path.join(tempfile.gettempdir(), "bertjax-cache")
    )
    if is_url(chosen):
        raise ValueError(f"config.data.cache_dir={chosen!r}: the cache must be a local directory")
    return resolve(chosen)


def _version(info: dict) -> str | None:
    """What changes when an object is rewritten, from its fsspec ``info``: its size and its
    store's version tag (generation, ETag or modification time, whichever the filesystem
    reports); None when it reports none (an HTTP server without ETag, some S3-compatible
    stores): the size alone would not tell a rewrite of the same size apart."""
    tags = [str(info.get(t, "")) for t in VERSION_TAGS]
    if not any(tags):
        return None
    return json.dumps([info.get("size"), *tags])


VERSION_TAGS = ("generation", "ETag", "etag", "md5Hash", "LastModified", "updated", "mtime")


def local_copy(path: str, cache: str | None = None) -> str:
    """A local file with the content of ``path``: ``path`` itself when it is local (a file://
    URL is local: its path), else a copy under ``cache`` (default `cache_dir()`) keyed by the URL
    and the object's version, made once; a rewritten object gets a new copy. An object whose
    filesystem reports no version is fetched on every call and kept by its content's hash.

    A copy is downloaded beside its place, synced to disk and renamed, so no reader sees half of
    one and a download killed half-way leaves only a temporary file, never used; a kept copy
    whose size is not the object's (a power cut before the disk had it) is fetched again. A
    download that fails with a transient error is started again (bertjax/retry.py)."""
    if not is_url(path):
        return _local(path)
    return retry.call(path, _download, path, cache or cache_dir())


def _download(path: str, cache: str) -> str:
    """One try of `local_copy` of URL ``path``."""
    import fsspec

    downloads = os.path.join(cache, "downloads")
    os.makedirs(downloads, exist_ok=True)
    fs, inner = fsspec.core.url_to_fs(path)
    info = fs.info(inner)
    size, version = info.get("size"), _version(info)
    if version is not None:
        digest = hashlib.sha256(f"{path} {version}".encode()).hexdigest()[:16]
        target = os.path.join(downloads, digest, os.path.basename(path))
        if os.path.isfile(target) and (size is None or os.path.getsize(target) == size):
            return target
    handle, tmp = tempfile.mkstemp(prefix=".download-", dir=downloads)
    try:
        content, got = hashlib.sha256(), 0
        with fs.open(inner, "rb") as source, os.fdopen(handle, "wb") as sink:
            while chunk := source.read(1 << 20):
                content.update(chunk)
                sink.write(chunk)
                got += len(chunk)
            sink.flush()
            os.fsync(sink.fileno())
        if size is not None and got != size:  # the connection ended early: try again
            raise ConnectionError(f"{path}: the download ended after {got} of {size} bytes")
        if version is None:
            digest = hashlib.sha256(f"{path} {content.hexdigest()}".encode()).hexdigest()[:16]
            target = os.path.join(downloads, digest, os.path.basename(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def publish_directory(tmp: str, directory: str) -> bool:
    """Gives the local directory ``tmp`` (written beside ``directory``) the name ``directory``,
    its files on disk first (a power cut leaves the whole directory or none of it). False when
    another process published ``directory`` first: ``tmp`` is removed and theirs stays."""
    for name in os.listdir(tmp):
        with open(os.path.join(tmp, name), "rb") as f:
            os.fsync(f.fileno())
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    try:
        os.replace(tmp, directory)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def upload(local: str, path: str) -> None:
    """Copies a local file to ``path`` (local or URL)."""
    with open(local, "rb") as f:
        write_bytes(path, f.read())
