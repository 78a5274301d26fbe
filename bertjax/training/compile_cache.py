"""JAX's persistent compilation cache for train.py: a restart loads the programs it compiled
before (the train and eval steps, the init) instead of compiling them again.

Where: ``config.compile_cache`` ("" = the directory or URL in $BERTJAX_COMPILE_CACHE where that is
set, which shares one cache between every run that does not name its own, e.g. a sweep's; else
WORKDIR/compile_cache, so every restart of a run and every host reading that workdir finds it; a
local directory or a URL such as gs://BUCKET/xla-cache to share it between runs; "off" = no
cache). train.py turns it on (`enable`) before anything
compiles; a library caller (a notebook, the tests) keeps JAX's own setting.

JAX's own file cache (jax._src.lru_cache, jax 0.10) writes an entry in place, so a process killed
mid-write leaves a torn entry that every later run reads, fails to load and never replaces; and
with a size cap (``jax_compilation_cache_max_size``) each entry has a second, access-time file,
and one entry left without it stops every later write (jax#39880). bertjax installs its own
`AtomicCache` in JAX's place instead:
- an entry is one file (local: written beside under a unique name, synced, renamed; on an object
  store: one upload, which is atomic), headed by a magic, its length and its SHA-256: a torn, cut
  or foreign entry (JAX's own format) is a miss, never an error, and is written again;
- only process 0 writes (JAX's rule: several hosts would race on a bucket); every process reads;
- with a size cap (JAX's ``jax_compilation_cache_max_size``, bytes), the least recently used
  entries (by their file's modification time, which a hit refreshes) are removed after a write;
  nothing a removal leaves or fails to remove stops later writes, and an entry larger than the
  cap is not written;
- storage errors cost a miss or a skipped write (a short retry budget, `IO_BUDGET_S`), never
  the run.
Programs that compile in under `MIN_COMPILE_S` are not cached (JAX's threshold is 1 s, which
leaves out every program of a small model on a fast host).

Trust: a cached entry is an executable the process loads and runs. Whoever can write the cache
directory can run code in the job: keep it where only the job's own identity can write (the
workdir's bucket or disk), never in a shared, writable location.

Not for TPU programs compiled without a TPU (`python -m bertjax.compile`): such a deviceless
executable cannot be reloaded from JAX's cache; that command keeps what the compiler said
instead (bertjax/aot/cache.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct

from bertjax import paths, retry

MAGIC = b"bertjax-xla-cache\x01"
SUFFIX = "-cache"
MIN_COMPILE_S = 0.1  # programs compiling faster than this are not cached
IO_BUDGET_S = 10.0  # a cache read or write is retried this long, then skipped
OFF = "off"
ENV = "BERTJAX_COMPILE_CACHE"  # the default cache of every run that names none
_HEADER = struct.Struct(">Q32s")  # value length, SHA-256 of the value


def pack(value: bytes) -> bytes:
    """An entry: the magic, the value's length and SHA-256, the value."""
    return MAGIC + _HEADER.pack(len(value), hashlib.sha256(value).digest()) + value


def unpack(entry: bytes) -> bytes | None:
    """The value of a whole entry; None for a torn, cut or foreign one."""
    start = len(MAGIC) + _HEADER.size
    if len(entry) < start or not entry.startswith(MAGIC):
        return None
    length, digest = _HEADER.unpack_from(entry, len(MAGIC))
    value = entry[start:]
    if len(value) != length or hashlib.sha256(value).digest() != digest:
        return None
    return value


def _interface():
    from jax._src.compilation_cache_interface import CacheInterface

    return CacheInterface


class AtomicCache:
    """JAX's CacheInterface over a directory or URL, entries written whole (module docstring)."""

    def __init__(self, path: str, max_bytes: int = -1, writer: bool = True):
        self.path, self._path = path, path  # JAX's interface names its directory ``_path``
        self.max_bytes, self.writer = int(max_bytes), writer
        self.url = paths.is_url(path)
        self.policy = retry.Policy(IO_BUDGET_S, counts=retry.Counts())
        self.misses_torn = 0  # entries found torn or foreign (each a miss)
        if not self.url:
            os.makedirs(path, exist_ok=True)

    def _file(self, key: str) -> str:
        if not key:
            raise ValueError("key cannot be empty")
        return paths.join(self.path, key + SUFFIX)

    def get(self, key: str) -> bytes | None:
        file = self._file(key)
        try:
            entry = self.policy.call(file, paths.Path(file).read_bytes)
        except FileNotFoundError:
            return None
        except Exception as error:  # noqa: BLE001  (storage trouble: a miss)
            logging.warning("compile cache: %s not read (%s): compiling", file, error)
            return None
        value = unpack(entry)
        if value is None:
            self.misses_torn += 1
            logging.warning("compile cache: %s is torn or not bertjax's: a miss", file)
            return None
        if not self.url and self.max_bytes >= 0:
            try:
                os.utime(file)  # recently used: the last to be removed
            except OSError:
                pass
        return value

    def put(self, key: str, value: bytes) -> None:
        if not self.writer:
            return
        entry = pack(value)
        if 0 <= self.max_bytes < len(entry):
            logging.warning("compile cache: an entry of %d bytes exceeds the cap (%d): not kept",
                            len(entry), self.max_bytes)  # fmt: skip
            return
        file = self._file(key)
        try:
            if self.url:
                self.policy.call(file, paths.Path(file).write_bytes, entry)
            else:  # whole or not at all: beside, synced, renamed
                paths.write_bytes(file, entry)
        except Exception as error:  # noqa: BLE001  (storage trouble: not kept)
            logging.warning("compile cache: %s not written (%s)", file, error)
            return
        if self.max_bytes >= 0 and not self.url:
            self._evict()

    def _evict(self) -> None:
        """Removes the least recently used entries until the cache holds at most the cap."""
        entries = []
        for name in os.listdir(self.path):
            if not name.endswith(SUFFIX):
                continue
            try:
                stat = os.stat(os.path.join(self.path, name))
            except OSError:  # removed meanwhile
                continue
            entries.append((stat.st_mtime, stat.st_size, name))
        total = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.remove(os.path.join(self.path, name))
            except OSError:  # another process removed it: counted as gone either way
                pass
            total -= size

    def clear(self) -> None:  # JAX's interface: used by its tests only
        for name in os.listdir(self.path) if not self.url else ():
            if name.endswith(SUFFIX):
                os.remove(os.path.join(self.path, name))


def location(config, workdir: str, environ=os.environ) -> str | None:
    """The cache directory of a run: config.compile_cache, else $BERTJAX_COMPILE_CACHE, else
    WORKDIR/compile_cache; None when it is "off"."""
    chosen = str(config.get("compile_cache", "") or "") or environ.get(ENV, "")
    if chosen == OFF:
        return None
    if chosen:
        return paths.resolve(chosen, "config.compile_cache")
    return paths.join(paths.resolve(workdir, "--workdir"), "compile_cache")


def enable(path: str) -> AtomicCache:
    """Turns JAX's persistent compilation cache on at ``path`` with an `AtomicCache` in place of
    JAX's own (read through jax._src.compilation_cache: tests/private_api_test.py fails when it
    moves). Call before the first compile."""
    import jax
    from jax._src import compilation_cache

    cache_class = type("AtomicCache", (AtomicCache, _interface()), {})
    writer = jax.process_index() == 0 if jax.distributed.is_initialized() else True
    cache = cache_class(path, max_bytes=jax.config.jax_compilation_cache_max_size, writer=writer)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    if paths.is_url(path):  # XLA's own GPU caches write local files only
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    compilation_cache.reset_cache()
    with compilation_cache._cache_initialized_mutex:
        compilation_cache._cache = cache
        compilation_cache._cache_initialized = True
    logging.info("compile cache: %s", path)
    return cache
