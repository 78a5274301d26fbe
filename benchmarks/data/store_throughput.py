"""Sharded-store throughput: preparation on Beam (1 vs 2 workers) beside today's local store and
Hugging Face `datasets.map(batched=True, num_proc=N)` with the same tokenizer on the same files;
the reader's tokens/s per host from the GCS emulator at T=128 and T=512; time to first batch.

  python benchmarks/data/store_throughput.py  # ~8 MB corpus (4 files of the built-in one)
  python benchmarks/data/store_throughput.py --mb 32 --steps 20

All on this machine's CPU, which other jobs share: figures are rough, compare within one run.
`datasets` is optional (its row is left out when it is not installed).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from bertjax import trainer  # noqa: E402
from bertjax.data import make_pipeline  # noqa: E402
from bertjax.data.store import beam_prepare  # noqa: E402
from bertjax.data.store import configured as store_config  # noqa: E402
from bertjax.data.text import corpus  # noqa: E402
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402


def _corpus(directory: str, megabytes: float, files: int = 4) -> str:
    docs = [d for _, d in corpus.iter_documents("builtin")]
    text = "\n\n".join("\n".join(d) for d in docs) + "\n"
    copies = max(1, round(megabytes * 1e6 / len(text.encode()) / files))
    for i in range(files):
        with open(os.path.join(directory, f"part{i}.txt"), "w") as f:
            f.write(text * copies)
    return os.path.join(directory, "part*.txt")


def _emulator() -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = os.path.join(ROOT, "tests", "gcs_emulator.py")
    server = subprocess.Popen([sys.executable, script, str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    os.environ.update(
        STORAGE_EMULATOR_HOST=url,
        GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator",
        GOOGLE_CLOUD_PROJECT="bench",
    )
    for _ in range(100):
        try:
            request = urllib.request.Request(
                f"{url}/storage/v1/b?project=bench",
                data=b'{"name": "bench"}',
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=5).read()
            return server, "gs://bench"
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the GCS emulator did not start")


def _hf_datasets(files: str, spm: str, workers: int) -> float | None:
    """Tokens/s of datasets.map(batched=True, num_proc=workers) over the same lines."""
    try:
        import datasets
    except ImportError:
        return None
    tok = Tokenizer(spm, num_threads=1)  # one core per process, as Beam's workers
    data = datasets.load_dataset("text", data_files=sorted(corpus.expand_paths(files)))["train"]

    def encode(batch):
        flat, lengths = tok.encode_flat(batch["text"])
        return {"ids": [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])]}

    start = time.perf_counter()
    out = data.map(
        encode,
        batched=True,
        num_proc=workers,
        remove_columns=["text"],
        load_from_cache_file=False,  # measure the work, not datasets' cache of the last call
    )
    wall = time.perf_counter() - start
    return sum(len(r) for r in out["ids"]) / wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=8.0, help="corpus size in MB")
    parser.add_argument("--steps", type=int, default=10, help="batches timed per reader row")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bertjax-store-bench-")
    os.environ["BERTJAX_CACHE_DIR"] = os.path.join(work, "cache")
    files = _corpus(work, args.mb)
    spm = train_sentencepiece(
        (s for _, d in corpus.iter_documents("builtin") for s in d),
        os.path.join(work, "spm"),
        vocab_size=8000,
    )
    config = trainer.default_run_config()
    config.data.corpus, config.data.tokenizer_model = files, spm
    config.data.shard_bytes = 4 << 20
    print(f"corpus {args.mb} MB in 4 files; CPU shared with other jobs: rough figures")
    print("| preparation | cores | tokens | wall s | tokens/s | tokens/s per core |")
    print("|---|---|---|---|---|---|")
    for workers in (1, 2):
        out = os.path.join(work, f"beam{workers}")
        options = [
            f"--direct_num_workers={workers}",
            "--direct_running_mode=multi_processing",
        ]
        start = time.perf_counter()
        manifest = beam_prepare.run(config, out, options)
        wall = time.perf_counter() - start
        tokens = sum(s["tokens"] for s in manifest["splits"].values())
        row = f"{tokens} | {wall:.1f} | {tokens / wall:,.0f} | {tokens / wall / workers:,.0f}"
        print(f"| Beam DirectRunner, multi_processing | {workers} | {row} |")
    start = time.perf_counter()
    store_config.load_store(config, Tokenizer(spm), "train")
    local_wall = time.perf_counter() - start
    from bertjax.data.store import shard_writer

    spec = beam_prepare.make_spec(config, os.path.join(work, "direct"), [])
    tok = Tokenizer(spm, num_threads=1)
    start = time.perf_counter()
    for item in shard_writer.work_items(config.data):
        shard_writer.prepare_item(spec, item, tok)
    wall = time.perf_counter() - start
    row = f"{tokens} | {wall:.1f} | {tokens / wall:,.0f} | {tokens / wall:,.0f}"
    print(f"| the Beam job's units, in one process without Beam | 1 | {row} |")
    threads, wall = Tokenizer(spm).num_threads, local_wall  # SentencePiece's threads
    row = f"{tokens} | {wall:.1f} | {tokens / wall:,.0f} | {tokens / wall / threads:,.0f}"
    print(f"| local store (today's path, one process) | {threads} | {row} |")
    for workers in (1, 2):
        rate = _hf_datasets(files, spm, workers)
        if rate is None:
            print("| HF datasets.map(batched=True) | - | not installed | | | |")
            break
        print(f"| HF datasets.map(batched=True, num_proc={workers}) | {workers} | | | "
              f"{rate:,.0f} | {rate / workers:,.0f} |")  # fmt: skip

    server, bucket = _emulator()
    try:
        from bertjax.data.store import shard_format

        fs, _ = shard_format.filesystem(bucket)
        fs.put(os.path.join(work, "beam2"), f"{bucket}/store", recursive=True)
        print("\n| reader | T | batch | tokens/s (one host) | first batch s |")
        print("|---|---|---|---|---|")
        for length in (128, 512):
            for store in (f"{bucket}/store", os.path.join(work, "beam2"), ""):
                c = config.copy_and_resolve_references()
                c.batch_size, c.data.store, c.data.prefetch = 32, store, 0
                c.data.max_seq_length, c.data.sample_plan = length, "full_sentences"
                c.data.max_predictions = length * 15 // 100
                start = time.perf_counter()
                pipeline = make_pipeline(c, work, process_index=0, process_count=1)
                pipeline.batch(0)
                first = time.perf_counter() - start
                start = time.perf_counter()
                for step in range(1, args.steps + 1):
                    pipeline.batch(step)  # rows of a shuffled epoch: random places
                rate = 32 * length * args.steps / (time.perf_counter() - start)
                name = {"": "local store (memmap)", f"{bucket}/store": "store on the GCS emulator"}
                name = name.get(store, "store on local disk (range reads)")
                print(f"| {name} | {length} | 32 | {rate:,.0f} | {first:.1f} |")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
