"""Grain (the data loader of MaxText and other large JAX trainers) beside bertjax, on the same
sharded store behind the same slow filesystem: the closest pipeline Grain allows, as MaxText
builds it, `MapDataset.source(rows).shuffle(seed).map(...).to_iter_dataset(ReadOptions(threads))
.batch(B).map(mask).mp_prefetch(workers)`, where the random-access source is the store's
token_windows rows (rows of T - 2 consecutive tokens, epoch 0's cut), each read by bertjax's
reader (`ShardedStore`, one gather a row, the same block cache), and the masking is bertjax's.
So what differs is what Grain does: a read per row on its reading threads, its index shuffle
over all rows, its worker processes. The sentence plans have no Grain equivalent short of
wrapping bertjax's plans.

`--grain-arrayrecord`: the same rows written into an ArrayRecord file on local disk (no latency)
and read with Grain's `ArrayRecordDataSource` (its own C++ reader), for Grain's local speed.
Called by benchmarks/data/reader_throughput.py (`--grain`), one process per run.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import slow_store

from bertjax.data import keys
from bertjax.data.corruption import masking
from bertjax.data.store import shard_format as fmt
from bertjax.data.store.shard_reader import ShardedStore
from bertjax.data.tokenizer import Tokenizer

THREADS, WORKERS, SEED = 16, 2, 0


class _CountedLatency(slow_store.LatencyFS):
    """LatencyFS that also appends a byte per request to a file: counts over worker processes."""

    def __init__(self, fs, latency, per, counter):
        super().__init__(fs, latency, per)
        self.counter = counter

    def _count(self, requests, ranges, data):
        super()._count(requests, ranges, data)
        with open(self.counter, "ab") as f:
            f.write(b"r" * ranges)


class StoreRows:
    """token_windows rows of a sharded store as a Grain random-access source (opened lazily in
    each process that reads it)."""

    def __init__(self, args, counter: str):
        self.args, self.counter = args, counter
        manifest = fmt.read_manifest(args.store)
        self.width = args.length - 2
        self.rows = manifest["splits"]["train"]["tokens"] // self.width
        self._store, self._lock = None, None

    def __getstate__(self):
        return {"args": self.args, "counter": self.counter, "width": self.width, "rows": self.rows}

    def __setstate__(self, state):
        self.__dict__.update(state, _store=None, _lock=None)

    def __len__(self) -> int:
        return self.rows

    def _open(self) -> ShardedStore:
        if self._store is None:
            self._lock = self._lock or threading.Lock()
            with self._lock:
                if self._store is None:
                    a = self.args
                    real = fmt.filesystem(a.store)[0]
                    slow_store.install(
                        _CountedLatency(real, a.latency_ms / 1000, a.per, self.counter)
                    )
                    store = ShardedStore(a.store, "train", Tokenizer(a.spm), index=False)
                    store.set_reads(int(a.cache_mib * 2**20) or 256 << 20, 32, 0)
                    self._store = store
        return self._store

    def __getitem__(self, row: int):
        positions = int(row) * self.width + np.arange(self.width)
        ids, starts = self._open().tokens.gather(positions)
        return {"ids": ids.astype(np.int32), "starts": starts}


class Rows:
    """[CLS] window [SEP] rows of a batch, masked by bertjax (a Grain map function)."""

    def __init__(self, spm: str, length: int):
        self.spm, self.length = spm, length
        self._tok = None

    def __call__(self, batch):
        if self._tok is None:
            self._tok = Tokenizer(self.spm, num_threads=1)
        tok, n = self._tok, len(batch["ids"])
        ids = np.concatenate(
            [np.full((n, 1), tok.cls_id), batch["ids"], np.full((n, 1), tok.sep_id)], 1
        ).astype(np.int32)
        starts = np.pad(batch["starts"] > 0, ((0, 0), (1, 1)))
        maskable = ~tok.special[ids]
        spec = masking.MaskSpec(mode="token", rate=0.15, max_predictions=self.length * 15 // 100)
        row_keys = keys.row_keys(SEED, 0, "mask", batch["index"])
        return masking.mask_batch(ids, maskable, starts, row_keys, spec, mask_id=tok.mask_id,
                                  normal_ids=tok.normal_ids)  # fmt: skip


def _dataset(source, args, workers: int):
    import grain
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read its absl flags
    rows = grain.MapDataset.source(source).shuffle(seed=SEED)
    rows = rows.map_with_index(lambda i, row: dict(row, index=np.int64(i)))
    stream = rows.to_iter_dataset(grain.ReadOptions(num_threads=THREADS, prefetch_buffer_size=500))
    stream = stream.batch(args.batch, drop_remainder=True).map(Rows(args.spm, args.length))
    if workers:
        stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return stream


def run(args) -> dict:
    """One Grain run (``args.setting``: "grain" = THREADS threads, WORKERS processes;
    "grain-1" = no worker process; "grain-arrayrecord": the rows from ArrayRecord, local)."""
    counter = os.path.join(args.work, f"grain-requests-{os.getpid()}")
    open(counter, "wb").close()
    workers = 0 if args.setting == "grain-1" else WORKERS
    start = time.perf_counter()
    if args.setting == "grain-arrayrecord":
        source = _array_record(args)
    else:
        source = StoreRows(args, counter)
    batches = iter(_dataset(source, args, workers))
    next(batches)
    first = time.perf_counter() - start
    first_requests = os.path.getsize(counter)
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        next(batches)
    took = time.perf_counter() - start
    ranges = os.path.getsize(counter) - first_requests
    del batches
    counts = (ranges, ranges, 0)  # per range: a request is a range
    cpu = time.process_time() - cpu if not workers else float("nan")
    return slow_store.run_report(args, took, first, first_requests, counts, cpu)


def _array_record(args):
    """The store's token_windows rows in one ArrayRecord file (written once), as a source."""
    import grain
    from array_record.python import array_record_module

    path = os.path.join(os.path.dirname(args.store), f"rows-{args.length}.array_record")
    if not os.path.exists(path):
        rows = StoreRows(args, os.devnull)
        rows.args = type(args)(**{**vars(args), "latency_ms": 0})
        writer = array_record_module.ArrayRecordWriter(path + ".tmp", "group_size:1")
        for first in range(0, len(rows), 4096):
            for row in range(first, min(len(rows), first + 4096)):
                got = rows[row]
                writer.write(got["ids"].astype(np.uint16).tobytes() + got["starts"].tobytes())
        writer.close()
        os.replace(path + ".tmp", path)
    return _Decoded(grain.sources.ArrayRecordDataSource([path]), args.length - 2)


class _Decoded:
    """ArrayRecord rows (uint16 ids, then uint8 word starts) as the store's rows."""

    def __init__(self, source, width: int):
        self.source, self.width = source, width

    def __len__(self):
        return len(self.source)

    def __getitem__(self, row):
        raw = np.frombuffer(self.source[row], np.uint8)
        ids = raw[: 2 * self.width].view("<u2").astype(np.int32)
        return {"ids": ids, "starts": raw[2 * self.width :]}


def hf_streaming(args) -> float | None:
    """Tokens/s of Hugging Face `datasets` streaming the same token rows from a local parquet file,
    shuffled in a buffer of 1000 rows, ``args.batch`` rows a batch as numpy: reading only, no
    masking. None when `datasets` is not installed."""
    try:
        import datasets
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    width = args.length - 2
    store = ShardedStore(args.store, "train", Tokenizer(args.spm), index=False)
    tokens = store.tokens[np.arange(len(store.tokens) // width * width)]
    path = os.path.join(args.work, f"rows{args.length}.parquet")
    pq.write_table(pa.table({"input_ids": list(np.asarray(tokens).reshape(-1, width))}), path)
    stream = datasets.load_dataset("parquet", data_files=path, split="train", streaming=True)
    batches = stream.shuffle(seed=0, buffer_size=1000).iter(batch_size=args.batch)
    next(batches)
    start = time.perf_counter()
    for _, batch in zip(range(args.steps), batches):
        np.asarray(batch["input_ids"], np.int32)
    return args.batch * width * args.steps / (time.perf_counter() - start)


def shuffle_rates(n: int = 1 << 20) -> dict[str, float]:
    """Positions per second of Grain's index shuffle (`grain.experimental.index_shuffle`, one call
    a position, as `MapDataset.shuffle` asks it) and of bertjax's `IndexShuffle` (positions in
    arrays of 256, 4096, 65536 a call), over n positions of a permutation of 2^32 + 5."""
    from grain import experimental

    from bertjax.data.plans.index_shuffle import IndexShuffle

    size = (1 << 32) + 5
    start = time.perf_counter()
    for i in range(n):
        experimental.index_shuffle(i, size - 1, SEED, 4)
    rates = {"grain index_shuffle, a position a call": n / (time.perf_counter() - start)}
    shuffle = IndexShuffle(size, SEED)
    for per in (256, 4096, 1 << 16):
        start = time.perf_counter()
        for first in range(0, n, per):
            shuffle[np.arange(first, first + per)]
        rates[f"bertjax IndexShuffle, {per} positions a call"] = n / (time.perf_counter() - start)
    return rates


if __name__ == "__main__":  # python benchmarks/data/grain_reader.py: the two index shuffles
    print("| index shuffle | positions/s |\n|---|---|")
    for name, rate in shuffle_rates().items():
        print(f"| {name} | {rate:,.0f} |")
