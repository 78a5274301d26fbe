"""How the pipeline reads its store, chosen from what the store is when config.data leaves it to it
(-1), and logged once: each setting given in config.data is kept as given.

A local store (tokenized into the local cache, memory-mapped): 2 batches computed ahead on one
thread, each its own read (a read is a memory access): as before.

A sharded store (a URL, or a local path, which may be a gcsfuse mount): object storage answers a
request in tens of milliseconds, whatever its size up to a few MB, so a host keeps several rounds
of requests in flight and makes each round count:
- read_steps K = clamp(2^17 / (host rows x T), 1, 8): the rows of K consecutive batches are read
  in one round of ranges (~128 k tokens a round; the windowed orders put them in a few runs);
- prefetch_threads P = 4 such reads in flight, each computing its batches when its bytes come;
- prefetch = K x P batches ahead;
- read_gap_bytes = 1 MiB: two needed blocks of a shard closer than this are read as one range
  (reading 1 MiB costs less than the round trip of another request);
- read_threads = 32: threads sending one read's ranges on a synchronous filesystem (a gcsfuse
  mount; gcsfs and s3fs send them together themselves);
- store_cache_bytes = max(256 MiB, P x K x host rows x the store's block bytes): the blocks of
  the reads in flight, each row a block at worst. It bounds every block cache of the host
  together: it is cut into equal shares, one for this process and one for each of
  config.data.workers worker processes, and in a process one share holds the blocks of every
  split (train, eval) and every store of a mixture, least recently used evicted first
  (store/cache_budget.py). (Before issue 61 each split of each process had the whole of it.)
Measured: benchmarks/data/reader_throughput.py, docs/results/data.md "Data preparation and the
sharded store".
"""

from __future__ import annotations

import dataclasses
import logging

AUTO = -1
CACHE_FLOOR = 256 << 20
ROUND_TOKENS = 1 << 17  # tokens of the batches one read of a sharded store serves
MAX_READ_STEPS = 8
READS_IN_FLIGHT = 4
GAP_BYTES = 1 << 20
RANGE_THREADS = 32


@dataclasses.dataclass(frozen=True)
class ReadSettings:
    """The resolved read settings of one pipeline (config.data keys of the same names)."""

    prefetch: int
    prefetch_threads: int
    read_steps: int
    read_threads: int
    read_gap_bytes: int
    store_cache_bytes: int  # the host's block caches together: every split, every process
    workers: int = 0  # worker processes, each with its share of store_cache_bytes

    @property
    def process_cache_bytes(self) -> int:
        """The share of store_cache_bytes that one process's block caches hold together."""
        return self.store_cache_bytes // (1 + self.workers)

    def describe(self, sharded: bool = True) -> str:
        cache = "memory-mapped, no block cache"
        if sharded:
            cache = f"block caches {self.store_cache_bytes >> 20} MiB a host"
            if self.workers:
                cache += (
                    f" ({self.process_cache_bytes >> 20} MiB in each of {1 + self.workers} "
                    "processes)"
                )
            cache += ", train and eval splits together"
        return (
            f"{self.prefetch} batches ahead, read {self.read_steps} at a time with "
            f"{self.prefetch_threads} reads in flight; ranges closer than "
            f"{self.read_gap_bytes >> 10} KiB joined, {self.read_threads} threads a read on a "
            f"synchronous filesystem; {cache}"
        )


def choose(c, *, sharded: bool, host_rows: int, block_bytes: int = 0) -> ReadSettings:
    """The settings of config.data ``c`` (its -1 values chosen) for a store that is ``sharded``
    or local, a host reading ``host_rows`` rows a batch of up to c.max_seq_length tokens."""
    given = {f.name: c[f.name] for f in dataclasses.fields(ReadSettings)}
    if not sharded:
        chosen = dict(prefetch=2, prefetch_threads=1, read_steps=1, read_threads=1,
                      read_gap_bytes=0, store_cache_bytes=CACHE_FLOOR)  # fmt: skip
    else:
        tokens = max(1, host_rows * c.max_seq_length)
        steps = given["read_steps"] if given["read_steps"] != AUTO else None
        steps = steps or min(MAX_READ_STEPS, max(1, ROUND_TOKENS // tokens))
        threads = given["prefetch_threads"] if given["prefetch_threads"] != AUTO else None
        threads = threads or max(READS_IN_FLIGHT, c.workers)
        chosen = dict(
            prefetch=steps * threads,
            prefetch_threads=threads,
            read_steps=steps,
            read_threads=RANGE_THREADS,
            read_gap_bytes=GAP_BYTES,
            store_cache_bytes=max(CACHE_FLOOR, threads * steps * host_rows * block_bytes),
        )
    settings = {k: (v if v != AUTO else chosen[k]) for k, v in given.items()}
    if settings["prefetch"] and settings["read_steps"] > settings["prefetch"]:
        settings["read_steps"] = settings["prefetch"]  # a read serves batches ahead only
    return ReadSettings(**settings)


def log_choice(store: str, settings: ReadSettings, c, sharded: bool = True) -> None:
    """One line: the settings, and which of them were chosen here rather than given."""
    chosen = [f.name for f in dataclasses.fields(ReadSettings) if c[f.name] == AUTO]
    logging.info(
        "data: store %s: %s (chosen from the store: %s; set config.data.<name> to override)",
        store,
        settings.describe(sharded),
        ", ".join(chosen) or "none",
    )
