"""Half-written files are never read back as whole: a truncated or corrupted compile-cache entry
is a miss and is replaced, and compile jobs sharing the cache never write into one file
(bertjax/aot/cache.py); a download killed half-way, or a kept copy cut short, is fetched again,
and a download that fails for a while is retried (bertjax/paths.py `local_copy`); a tokenizer
training killed half-way is never found, and a cut-short model stops with one line naming it.
The files are cut as a kill or a power cut leaves them."""

import dataclasses
import glob
import gzip
import os
import random
import threading
import types

import faulty_fs
import jax
import jax.numpy as jnp
import pytest

from bertjax import paths, retry
from bertjax.aot.cache import ENTRY, Compiled, CompiledCache
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def compiled():
    """Two programs as XLA:CPU compiled them (their HLO text and memory analysis)."""
    x = jnp.ones((8, 8))
    first = Compiled.of(jax.jit(lambda a: a @ a).lower(x).compile(), 0.5)
    second = Compiled.of(jax.jit(lambda a: jnp.tanh(a).sum(0)).lower(x).compile(), 0.25)
    return first, second


def _cache(directory) -> CompiledCache:
    target = types.SimpleNamespace(chip=types.SimpleNamespace(platform="cpu"))
    return CompiledCache(str(directory), target, ("O0",))


@pytest.mark.parametrize("cut", ["truncated", "corrupted", "empty", "other_content"])
def test_a_cut_or_corrupted_compile_cache_entry_is_a_miss_and_is_replaced(tmp_path, compiled, cut):
    cache, (program, _) = _cache(tmp_path), compiled
    key = cache.key("a lowered program")
    cache.put(key, program)
    assert cache.get(key) == program
    entry = os.path.join(tmp_path, key + ENTRY)
    data = open(entry, "rb").read()
    if cut == "truncated":  # what a kill mid-write left under the old fixed temp names
        open(entry, "wb").write(data[: len(data) // 2])
    elif cut == "corrupted":
        open(entry, "wb").write(data[:20] + bytes(b ^ 0xFF for b in data[20:40]) + data[40:])
    elif cut == "empty":
        open(entry, "wb").close()
    else:  # whole gzip, but not an entry
        open(entry, "wb").write(gzip.compress(b'{"seconds": 1.0}'))
    assert cache.get(key) is None  # a miss: the compile that follows puts it again
    cache.put(key, program)
    assert cache.get(key) == program


def test_compile_jobs_sharing_the_cache_write_whole_entries(tmp_path, compiled):
    """Eight writers (two programs under one key, as two jobs compiling it at once) while a
    reader reads: every read is a miss or one writer's whole entry; no temporary file stays."""
    cache, key = _cache(tmp_path), "same"
    big = [dataclasses.replace(p, text=p.text * 200) for p in compiled]  # ~MBs of HLO each
    start, stop, seen = threading.Barrier(9), threading.Event(), []

    def write(entry):
        start.wait()
        for _ in range(3):
            cache.put(key, entry)

    def read():
        start.wait()
        while not stop.is_set():
            seen.append(cache.get(key))

    writers = [threading.Thread(target=write, args=(big[i % 2],)) for i in range(8)]
    reader = threading.Thread(target=read)
    for thread in [*writers, reader]:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert all(entry is None or entry in big for entry in seen)
    assert cache.get(key) in big
    assert os.listdir(tmp_path) == ["same" + ENTRY]


@pytest.fixture
def fake_time(monkeypatch):
    time = types.SimpleNamespace(now=0.0)
    sleep = lambda s: setattr(time, "now", time.now + s)  # noqa: E731
    policy = retry.Policy(clock=lambda: time.now, sleep=sleep, rng=random.Random(0),
                          counts=retry.Counts())  # fmt: skip
    monkeypatch.setattr(retry, "POLICY", policy)
    return policy


def test_a_download_cut_short_is_never_used_and_a_failing_one_is_retried(
    tmp_path, monkeypatch, fake_time
):
    """local_copy of a URL: a kill mid-download leaves a temporary file, never used; a kept copy
    cut short (a power cut before the disk had it) is fetched again; requests that fail
    transiently (the object's size, its open) are retried."""
    source = tmp_path / "bucket" / "vocab.txt"
    source.parent.mkdir()
    data = os.urandom(3 << 20)
    source.write_bytes(data)
    url, cache = f"faulty://{source}", str(tmp_path / "cache")
    monkeypatch.setattr(faulty_fs, "PLAN", faulty_fs.Plan())
    first = paths.local_copy(url, cache)
    downloads = os.path.join(cache, "downloads")
    open(os.path.join(downloads, ".download-killed"), "wb").write(data[:1000])  # a kill's leftover
    open(first, "wb").write(data[: 1 << 20])  # cut short
    monkeypatch.setattr(faulty_fs, "PLAN", faulty_fs.Plan(fail_at=[1, 3]))  # info, then open
    again = paths.local_copy(url, cache)
    assert again == first and open(again, "rb").read() == data
    counts = fake_time.counts.snapshot()
    assert faulty_fs.PLAN.failures == counts["failed"] == 2 and counts["recovered"] == 1
    assert paths.local_copy(url, cache) == first and faulty_fs.PLAN.requests == 6  # info: kept
    leftovers = [n for n in os.listdir(downloads) if n.startswith(".download-")]
    assert leftovers == [".download-killed"]  # never read, never renamed into place


def test_a_tokenizer_training_killed_half_way_is_never_found(tmp_path, builtin_spm):
    """What a kill during training leaves (its temporary directory, a cut model in it) is never
    read: the next training trains; a model cut short where a model belongs (a copy made by
    another tool) stops with one line naming it, not SentencePiece's internal error."""
    directory = str(tmp_path / "tokenizer")
    killed = f"{directory}.tmp-99999"
    os.makedirs(killed)
    model = open(builtin_spm, "rb").read()
    open(os.path.join(killed, "spm.model"), "wb").write(model[: len(model) // 2])
    docs = [d for _, d in zip(range(30), corpus.iter_documents("builtin"))]
    trained = train_sentencepiece((s for _, d in docs for s in d), directory, vocab_size=150)
    assert trained == os.path.join(directory, "spm.model")
    assert Tokenizer(trained).vocab_size >= 150
    assert not glob.glob(f"{directory}.tmp-{os.getpid()}")  # its own temporary: renamed
    for cut in (model[: len(model) // 2], b""):
        open(trained, "wb").write(cut)
        with pytest.raises(ValueError, match=f"{trained}.*not a whole SentencePiece model"):
            Tokenizer(trained)
