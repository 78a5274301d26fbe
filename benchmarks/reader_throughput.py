"""Finished (read, planned, masked) batches per second from a sharded store, beside the local
memmap store of the same corpus, with and without 50 ms added to every request.

`LatencyFS` wraps the local filesystem as object storage behaves: every `cat_ranges` call pays
one round trip (its ranges are in flight together, as gcsfs's), every `cat_file` one; the block
cache (config.data.store_cache_bytes) is 1 MiB, far smaller than the store, so rows keep
fetching. The pipeline computes `prefetch` batches ahead on `prefetch_threads` threads (or, with
--workers, in `workers` processes); the rate is over N steps after the first 20 (global batch 32
on one host, as the trainer asks for them). The corpus is the built-in one four times over
(~1.7 M tokens), prepared once into a sharded store of 1 MiB shards and into today's local
store.

  python benchmarks/reader_throughput.py                    # T=128 and 512, ~2 minutes
  python benchmarks/reader_throughput.py --steps 100 --plans full_sentences
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bertjax import trainer  # noqa: E402
from bertjax.data import make_pipeline  # noqa: E402
from bertjax.data.store import beam_prepare, shard_writer  # noqa: E402
from bertjax.data.store import shard_format as fmt  # noqa: E402
from bertjax.data.text import corpus  # noqa: E402
from bertjax.data.tokenizer import train_sentencepiece  # noqa: E402

WARM = 20  # steps before the timed ones


class LatencyFS:
    """A filesystem that adds ``latency`` seconds to every request (a `cat_ranges` call is one
    request, its ranges in flight together)."""

    def __init__(self, fs, latency: float):
        self.fs, self.latency, self.requests = fs, latency, 0

    def _wait(self):
        self.requests += 1
        time.sleep(self.latency)

    def cat_ranges(self, paths, starts, ends, **kwargs):
        self._wait()
        return self.fs.cat_ranges(paths, starts, ends, **kwargs)

    def cat_file(self, path, *args, **kwargs):
        self._wait()
        return self.fs.cat_file(path, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fs, name)


def _prepare(work: str, spm: str) -> tuple[str, str]:
    """(corpus file, sharded store path)."""
    docs = [d for _, d in corpus.iter_documents("builtin")]
    path = os.path.join(work, "corpus.txt")
    with open(path, "w") as f:
        f.write(("\n\n".join("\n".join(d) for d in docs) + "\n") * 4)
    config = trainer.default_run_config()
    config.data.update(corpus=path, tokenizer_model=spm, shard_bytes=1 << 20)
    out = os.path.join(work, "store")
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, out, items)
    tok = shard_writer.local_tokenizer(spec)
    shard_writer.write_manifest([shard_writer.prepare_item(spec, i, tok) for i in items], spec)
    return path, out


def hf_streaming(work: str, store_path: str, length: int, steps: int) -> float | None:
    """Tokens/s of Hugging Face `datasets` streaming the same tokens as rows of T (the store's
    token stream cut every T tokens, in a parquet file), shuffled in a buffer of 1000 rows, 32
    rows a batch as numpy: reading only, no masking. None when `datasets` is not installed."""
    try:
        import datasets
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    from bertjax.data.store.shard_reader import ShardedStore
    from bertjax.data.tokenizer import Tokenizer

    manifest = fmt.read_manifest(store_path)
    tok = Tokenizer(os.path.join(store_path, manifest["tokenizer_file"]))
    tokens = ShardedStore(store_path, "train", tok, index=False).tokens
    rows = np.asarray(tokens[np.arange(len(tokens) // length * length)]).reshape(-1, length)
    path = os.path.join(work, f"rows{length}.parquet")
    pq.write_table(pa.table({"input_ids": list(rows)}), path)
    stream = datasets.load_dataset("parquet", data_files=path, split="train", streaming=True)
    batches = stream.shuffle(seed=0, buffer_size=1000).iter(batch_size=32)
    next(batches)
    start = time.perf_counter()
    for _, batch in zip(range(steps), batches):
        np.asarray(batch["input_ids"], np.int32)
    return 32 * length * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--plans", default="full_sentences,nsp,token_windows")
    parser.add_argument("--threads", default="1,32")
    parser.add_argument("--workers", default="", help="also with these config.data.workers")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bertjax-reader-")
    os.environ["BERTJAX_CACHE_DIR"] = os.path.join(work, "cache")
    spm = train_sentencepiece(
        (s for _, d in corpus.iter_documents("builtin") for s in d),
        os.path.join(work, "spm"),
        vocab_size=8000,
    )
    path, store = _prepare(work, spm)
    real = fmt.filesystem
    print("one host, global batch 32, block cache 1 MiB, shared 2-core CPU (compare within a run)")
    print("| plan | T | store | latency ms | threads | tokens/s | requests/batch | first batch s |")
    print("|---|---|---|---|---|---|---|---|")
    for plan in args.plans.split(","):
        for length in (int(t) for t in args.lengths.split(",")):
            runs = [("local memmap", "", 0, 1, 0)]
            for latency in (0, 50):
                runs += [("sharded", store, latency, int(t), 0) for t in args.threads.split(",")]
            for w in (int(w) for w in args.workers.split(",") if w):
                runs.append((f"sharded, {w} worker processes", store, 0, 1, w))
            for name, url, latency, threads, workers in runs:
                fake = None
                if url:
                    fs = LatencyFS(real(url)[0], latency / 1000)

                    def patched(location, fs=fs):
                        return fs, real(location)[1]

                    fmt.filesystem = fake = patched
                config = trainer.default_run_config()
                config.batch_size = 32
                config.data.update(corpus=path, tokenizer_model=spm, store=url,
                                   store_cache_bytes=1 << 20, sample_plan=plan,
                                   max_seq_length=length, max_predictions=length * 15 // 100,
                                   prefetch=max(2, threads, 4 * workers),
                                   prefetch_threads=threads, workers=workers)  # fmt: skip
                start = time.perf_counter()
                pipeline = make_pipeline(config, work, process_index=0, process_count=1)
                pipeline.batch(0)
                first = time.perf_counter() - start
                for step in range(1, WARM + 1):  # worker processes started and warm
                    pipeline.batch(step)
                before = fs.requests if fake else 0
                start = time.perf_counter()
                for step in range(WARM + 1, WARM + args.steps + 1):
                    pipeline.batch(step)
                rate = 32 * length * args.steps / (time.perf_counter() - start)
                requests = (fs.requests - before) / args.steps if fake else 0
                pipeline.close()
                fmt.filesystem = real
                print(f"| {plan} | {length} | {name} | {latency} | {threads} | {rate:,.0f} | "
                      f"{requests:.1f} | {first:.2f} |", flush=True)  # fmt: skip
            rate = hf_streaming(work, store, length, args.steps)
            if rate is not None and plan == args.plans.split(",")[0]:
                print(f"| (HF datasets streaming, reading only) | {length} | parquet rows | 0 | "
                      f"1 | {rate:,.0f} | - | - |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
