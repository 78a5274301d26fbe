"""JAX's persistent compilation cache as train.py runs it (bertjax/training/compile_cache.py):
a restart's compile is a hit; an entry cut by a kill, corrupted, or written by JAX's own cache
is a miss, never an error, and is written again; a size cap removes the least recently used
entries and nothing left behind in the directory stops later writes (jax#39880)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.training import compile_cache


@pytest.fixture
def cache(tmp_path):
    """JAX's cache at ``tmp_path`` (bertjax's in its place) for the test, JAX's own state back
    after; counts JAX's cache hits and misses."""
    from jax._src import compilation_cache as jax_cache

    before = {name: getattr(jax.config, name) for name in (
        "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_enable_xla_caches")}  # fmt: skip
    counts = {"hits": 0, "misses": 0}
    active = [True]

    def listen(event, **kwargs):
        if active[0] and event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        if active[0] and event == "/jax/compilation_cache/cache_misses":
            counts["misses"] += 1

    jax.monitoring.register_event_listener(listen)
    installed = compile_cache.enable(str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every program
    try:
        yield installed, counts
    finally:
        active[0] = False  # jax has no public unregister; the listener goes quiet
        for name, value in before.items():
            jax.config.update(name, value)
        jax_cache.reset_cache()


X = np.ones((16, 16), np.float32)  # numpy: no program of JAX's own puts it on the device


def _compile(scale: float):
    """A program lowered afresh (no in-memory cache): it goes to the persistent cache."""
    return jax.jit(lambda a: jnp.tanh(a * scale).sum()).lower(X).compile()


def _entries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(compile_cache.SUFFIX))


@pytest.mark.parametrize("cut", ["truncated", "corrupted", "jax_s_own_format"])
def test_a_cut_or_foreign_entry_is_a_miss_and_is_written_again(cache, tmp_path, cut):
    installed, counts = cache
    _compile(2.0)
    (name,) = _entries(tmp_path)
    entry = tmp_path / name
    data = entry.read_bytes()
    assert compile_cache.unpack(data) is not None and counts["misses"] == 1
    _compile(2.0)
    assert counts["hits"] == 1  # a restart's compile: loaded, not compiled
    value = compile_cache.unpack(data)
    if cut == "truncated":  # what a kill mid-write leaves where the write is in place (JAX's)
        entry.write_bytes(data[: len(data) // 2])
    elif cut == "corrupted":
        entry.write_bytes(data[:-40] + bytes(b ^ 0xFF for b in data[-40:]))
    else:  # an entry JAX's own LRU cache wrote: the bare value
        entry.write_bytes(value)
    out = _compile(2.0)  # a miss, compiled again (no error), and the entry written whole
    assert counts["hits"] == 1 and counts["misses"] == 2 and installed.misses_torn == 1
    assert compile_cache.unpack(entry.read_bytes()) is not None
    assert float(out(X)) == pytest.approx(256 * np.tanh(2.0), rel=1e-5)  # float32 sum
    _compile(2.0)
    assert counts["hits"] == 2
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temp left


def test_a_size_cap_keeps_the_recent_entries_and_leftovers_never_stop_writes(tmp_path):
    """Entries of ~1 KiB under a 2.5 KiB cap: each write removes the least recently used; files
    JAX's own cache leaves (an entry without its access-time file, the lock) and a half-written
    temporary do not stop a write; an entry larger than the cap is not written."""
    (tmp_path / "orphan-cache").write_bytes(b"x" * 10)  # JAX's entry whose -atime file is gone
    (tmp_path / ".lockfile").write_text("")
    (tmp_path / ".entry-killed").write_bytes(b"half")
    store = compile_cache.AtomicCache(str(tmp_path), max_bytes=2560)
    for i, key in enumerate(["a", "b", "c"]):
        store.put(key, bytes([i]) * 1000)
        os.utime(tmp_path / f"{key}-cache", (i, i))  # written in this order
    assert store.get("a") is None and store.get("b") == b"\x01" * 1000
    store.put("d", b"\x03" * 1000)  # "b" was read last: "c" goes
    assert _entries(tmp_path) == ["b-cache", "d-cache", "orphan-cache"]
    store.put("huge", b"\x04" * 4000)
    assert store.get("huge") is None and "huge-cache" not in _entries(tmp_path)
    assert compile_cache.unpack(compile_cache.pack(b"v")) == b"v"


def test_where_the_cache_is():
    import ml_collections

    config = ml_collections.ConfigDict({"compile_cache": ""})
    assert compile_cache.location(config, "gs://b/run", {}) == "gs://b/run/compile_cache"
    shared = {compile_cache.ENV: "/sweep/xla"}  # every run that names none
    assert compile_cache.location(config, "gs://b/run", shared) == "/sweep/xla"
    config.compile_cache = "off"
    assert compile_cache.location(config, "/w", shared) is None
    config.compile_cache = "gs://b/xla"
    assert compile_cache.location(config, "/w", shared) == "gs://b/xla"
