"""A file corpus's files, wherever they are: local paths and globs, file:// URLs, object stores
(gs://, s3://, any fsspec URL) and the Hugging Face Hub (hf://, bertjax/data/text/hub.py);
``config.data.corpus`` is one of those or several, comma-separated.

`expand` lists the files in corpus order (each entry's matches sorted), `open_file` reads one
(``.gz``, ``.bz2``, ``.xz`` and ``.zst`` files decompressed on the fly: JSON Lines and text as the
Hub holds them), `local_file` gives a local copy where a library needs one, and `check_format`
stops a file whose name says another format than config.data.corpus_format."""

from __future__ import annotations

import bz2
import glob
import gzip
import io
import lzma
import os
import re

from bertjax import paths, retry
from bertjax.data.text import hub

_GLOB_CHARS = re.compile(r"[*?\[]")
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
_FORMAT_OF = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def parts(spec: str) -> list[str]:
    return [p.strip() for p in str(spec).split(",") if p.strip()]


def expand(spec: str) -> list[str]:
    """Comma-separated paths, globs or URLs → the corpus's files, in order; a missing path or a
    pattern that matches nothing is an error naming it."""
    found: list[str] = []
    for part in parts(spec):
        if hub.is_hub(part):
            found.extend(url for url, _ in hub.files(part))
        elif paths.is_url(part):
            found.extend(_expand_url(part))
        else:
            found.extend(_expand_local(part.removeprefix("file://")))
    if not found:
        raise ValueError(f"corpus {spec!r} names no files")
    return found


def sizes(spec: str) -> list[tuple[str, int, str]]:
    """(file, size, version) of each file of ``spec``: what changes when a file is rewritten (a
    local file's modification time, an object's generation or ETag; a Hub file is named at its
    commit, which never changes)."""
    out = []
    for part in parts(spec):
        if hub.is_hub(part):
            out.extend((url, size, "") for url, size in hub.files(part))
        elif paths.is_url(part):
            for url in _expand_url(part):
                info = paths._info(url) or {}
                out.append((url, int(info.get("size") or 0), paths._version(info) or ""))
        else:
            for path in _expand_local(part.removeprefix("file://")):
                stat = os.stat(path)
                out.append((path, stat.st_size, str(stat.st_mtime_ns)))
    return out


def _expand_local(part: str) -> list[str]:
    if _GLOB_CHARS.search(part):
        matched = sorted(p for p in glob.glob(part, recursive=True) if os.path.isfile(p))
        if not matched:
            raise FileNotFoundError(f"corpus glob {part!r} matched no files")
        return matched
    if os.path.isdir(part):
        raise ValueError(
            f"corpus path {part!r} is a directory: use a glob such as "
            f"{os.path.join(part, '*.txt')!r}"
        )
    if not os.path.isfile(part):
        raise FileNotFoundError(f"corpus file {part!r} does not exist")
    return [part]


def _expand_url(part: str) -> list[str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(part)
    if _GLOB_CHARS.search(path):
        matched = retry.call(part, fs.glob, path)
    else:
        matched = [path]
    matched = sorted(m for m in matched if retry.call(part, fs.isfile, m))
    if not matched:
        raise FileNotFoundError(f"corpus {part!r} matched no files")
    return [fs.unstrip_protocol(m) for m in matched]


def open_file(path: str, size: int | None = None, stop: int | None = None):
    """A binary file object of a corpus file (decompressed by its name's suffix); ``stop``: the
    byte the reader needs up to, where reads are ranged requests (the Hub)."""
    if hub.is_hub(path):
        raw = hub.open_file(path, size, stop)
    elif paths.is_url(path):
        import fsspec

        raw = retry.call(path, fsspec.open(path, "rb").open)
    else:
        raw = open(path.removeprefix("file://"), "rb")
    return decompressed(raw, path)


def decompressed(raw, name: str):
    """``raw`` read through the decompressor its file name asks for (none: ``raw``)."""
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    if name.endswith(".bz2"):
        return bz2.BZ2File(raw)
    if name.endswith(".xz"):
        return lzma.LZMAFile(raw)
    if name.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def local_file(path: str, cache: str) -> str:
    """A local file with ``path``'s bytes (itself when local; a Hub file in huggingface_hub's
    cache layout under ``cache``, another URL through paths.local_copy)."""
    if hub.is_hub(path):
        return hub.download(path, cache)
    return paths.local_copy(path, cache)


def format_of(path: str) -> str | None:
    """The corpus format a file's name says (parquet or jsonl), None for other names."""
    name = str(path).lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    return _FORMAT_OF.get(os.path.splitext(name)[1])


def check_format(path: str, corpus_format: str) -> None:
    """Stops a file whose name says another format than ``corpus_format`` (Parquet read as text
    or text as Parquet; JSON Lines read as plain text, which would train on its keys)."""
    named = format_of(path)
    parquet = (named == "parquet") != (corpus_format == "parquet")
    if parquet or (named == "jsonl" and corpus_format in ("sentences", "documents")):
        wanted = named or "sentences"
        raise ValueError(
            f"{path}: a {wanted} file, but config.data.corpus_format={corpus_format!r}: set "
            f"--config.data.corpus_format={wanted}"
        )
