"""Paths a run reads and keeps (bertjax/paths.py): a URL whose filesystem reports no version is not
served stale after a rewrite of the same size; a tokenizer path may start with ~; files the run
writes into shared places appear whole or not at all."""

import os
import threading

import fsspec
import pytest

from bertjax import paths
from bertjax.data.tokenizer import Tokenizer
from bertjax.interop import checkpoints


def test_a_rewritten_object_of_the_same_size_is_copied_again_when_no_version_is_reported(
    tmp_path,
):
    """memory:// reports a size and no generation, ETag or mtime, as an HTTP server may."""
    fs = fsspec.filesystem("memory")
    fs.pipe("/bertjax-paths/vocab.txt", b"first")
    url = "memory://bertjax-paths/vocab.txt"
    assert paths._version(fs.info("/bertjax-paths/vocab.txt")) is None
    first = paths.local_copy(url, str(tmp_path))
    fs.pipe("/bertjax-paths/vocab.txt", b"other")  # same size
    second = paths.local_copy(url, str(tmp_path))
    assert open(first, "rb").read() == b"first" and open(second, "rb").read() == b"other"
    assert paths.local_copy(url, str(tmp_path)) == second  # same content, same copy
    assert not [n for n in os.listdir(tmp_path / "downloads") if n.startswith(".download-")]


def test_a_tokenizer_path_may_start_with_a_tilde(tmp_path, monkeypatch, small_spm):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "spm.model").write_bytes(open(small_spm, "rb").read())
    tok = Tokenizer("~/spm.model")
    assert tok.path == str(tmp_path / "spm.model")
    assert tok.fingerprint() == Tokenizer(small_spm).fingerprint()
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Tokenizer("~/missing.model")


def test_a_tokenizer_written_into_a_shared_cache_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """Threads writing the checkpoint's tokenizer while another reads it: every read sees the
    whole file; a write that fails leaves what was there."""
    data = os.urandom(1 << 20)
    meta = {"tokenizer_file": "spm.model", "tokenizer_bytes": __import__("base64").b64encode(data)}
    target = checkpoints.write_tokenizer(meta, str(tmp_path))
    sizes, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            with open(target, "rb") as f:
                sizes.add(len(f.read()))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [
        threading.Thread(target=checkpoints.write_tokenizer, args=(meta, str(tmp_path)))
        for _ in range(8)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert sizes == {len(data)} and open(target, "rb").read() == data

    def broken_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        checkpoints.write_tokenizer(dict(meta, tokenizer_bytes=b"AAAA"), str(tmp_path))
    assert open(target, "rb").read() == data and os.listdir(tmp_path) == ["spm.model"]
