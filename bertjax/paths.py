"""Paths a run reads and keeps: local paths or URLs (gs://, s3://, file://: what `etils.epath`,
orbax's own path type, opens).

Every path a user gives is resolved once, where it enters (`resolve`): ``~`` expanded, a relative
path made absolute against the current directory, ``file://`` turned into its local path, other
URLs left as they are; a path that must exist and does not stops with one line naming the
setting (`MissingPathError`). Files the run writes go through `Path` (epath), so a workdir on
cloud storage holds checkpoints, metrics, the tokenizer and the run meta. What a library can
only read from local disk (SentencePiece models, memory-mapped token stores, safetensors)
comes from `local_copy`, under the local cache directory (`cache_dir`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from etils import epath

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


def exists(path: str) -> bool:
    return Path(path).exists()


def isdir(path: str) -> bool:
    return Path(path).is_dir()


def isfile(path: str) -> bool:
    path = Path(path)
    return path.exists() and not path.is_dir()


def join(path: str, *parts: str) -> str:
    return os.fspath(Path(path).joinpath(*parts))


def read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def write_bytes(path: str, data: bytes) -> None:
    """Writes a whole file; a reader never sees half of it (a local file is written beside, under
    a name no other process or thread uses, and renamed; an object store's single upload is
    atomic); a failed write leaves the file as it was."""
    if is_url(path):
        Path(path).write_bytes(data)
        return
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def makedirs(path: str) -> None:
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


def _version(path: str) -> str | None:
    """What changes when the object at URL ``path`` is rewritten: its size and its store's
    version tag (generation, ETag or modification time, whichever the filesystem reports); None
    when it reports none (an HTTP server without ETag, some S3-compatible stores): the size
    alone would not tell a rewrite of the same size apart."""
    import fsspec

    fs, inner = fsspec.core.url_to_fs(path)
    info = fs.info(inner)
    tags = [str(info.get(t, "")) for t in VERSION_TAGS]
    if not any(tags):
        return None
    return json.dumps([info.get("size"), *tags])


VERSION_TAGS = ("generation", "ETag", "etag", "md5Hash", "LastModified", "updated", "mtime")


def local_copy(path: str, cache: str | None = None) -> str:
    """A local file with the content of ``path``: ``path`` itself when it is local (a file://
    URL is local: its path), else a copy under ``cache`` (default `cache_dir()`) keyed by the URL
    and the object's version, made once; a rewritten object gets a new copy. An object whose
    filesystem reports no version is fetched on every call and kept by its content's hash."""
    if not is_url(path):
        return _local(path)
    import fsspec

    downloads = os.path.join(cache or cache_dir(), "downloads")
    os.makedirs(downloads, exist_ok=True)
    version = _version(path)
    if version is not None:
        digest = hashlib.sha256(f"{path} {version}".encode()).hexdigest()[:16]
        target = os.path.join(downloads, digest, os.path.basename(path))
        if os.path.isfile(target):
            return target
    handle, tmp = tempfile.mkstemp(prefix=".download-", dir=downloads)
    try:
        content = hashlib.sha256()
        with fsspec.open(path, "rb") as source, os.fdopen(handle, "wb") as sink:
            while chunk := source.read(1 << 20):
                content.update(chunk)
                sink.write(chunk)
        if version is None:
            digest = hashlib.sha256(f"{path} {content.hexdigest()}".encode()).hexdigest()[:16]
            target = os.path.join(downloads, digest, os.path.basename(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def upload(local: str, path: str) -> None:
    """Copies a local file to ``path`` (local or URL)."""
    with open(local, "rb") as f:
        write_bytes(path, f.read())
