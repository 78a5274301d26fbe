"""Start-up against the store's size, on real text (issue 71): requests and seconds from
`make_pipeline` to the first batch, and with the reads that batch starts, for every sample plan,
on the same corpus prepared 1, 6 and 36 times over and on a synthetic store of thousands of
shards of the same size. It must not grow (DESIGN.md "Start-up never grows with the corpus").

The corpus: Vim's help files (`/usr/share/vim/vim*/doc/*.txt`, ~2.4 M tokens with an 8000-piece
SentencePiece) in 8 files, or the built-in corpus (`--corpus builtin`); N copies are 8 N files
(links to the 8), prepared as the Beam job's units do with the default shard size: a shard a
file (8 N shards of ~300 k tokens), as the issue's store was. The synthetic store
(benchmarks/first_batch.py's `SyntheticStore`, computed on the fly) has `--synthetic` shards of
the corpus's median shard size. One host of a global batch of 256 rows, T=128 (the issue's),
or host 0 of `--hosts`; the read settings chosen for a URL store; every range pays
`--latency-ms` (slow_store.LatencyFS per range: a gcsfuse mount, as the earlier tables counted).
"first batch": `make_pipeline` and `batch(0)`; "with reads ahead": until the reads `batch(0)`
starts (its next `prefetch` batches) are done; the mean of `--seeds` runs (which pieces a host
reads is drawn by the seed). ``BERTJAX_ROOT=DIR`` measures another checkout.

  python benchmarks/data/startup_growth.py    # every plan, 1x 6x 36x + 4096 shards
  python benchmarks/data/startup_growth.py --plans nsp,token_windows --copies 1,6 --synthetic 0
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import sys
import tempfile
import time

import first_batch  # puts this checkout's bertjax (or BERTJAX_ROOT's) on the path
import numpy as np
import slow_store

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.store import beam_prepare, shard_writer
from bertjax.data.store import shard_format as fmt
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece

PLANS = first_batch.PLANS
FILES = 8


def corpus_files(kind: str, work: str) -> list[str]:
    """The 8 files of one copy of the corpus, made once under ``work``."""
    os.makedirs(os.path.join(work, "base"), exist_ok=True)
    paths = [os.path.join(work, "base", f"{kind}{i}.txt") for i in range(FILES)]
    if all(os.path.exists(p) for p in paths):
        return paths
    if kind == "vim":  # a document per paragraph ("sentences" format), Vim's files dealt out
        found = sorted(glob.glob(slow_store.VIM_DOCS))
        if not found:
            raise SystemExit(f"no Vim help files at {slow_store.VIM_DOCS}: use --corpus builtin")
        texts = [[open(f, encoding="latin-1").read() for f in found[i::FILES]] for i in range(8)]
    else:
        docs = ["\n".join(d) for _, d in corpus.iter_documents("builtin")]
        texts = [docs[i::FILES] for i in range(FILES)]
    for path, parts in zip(paths, texts):
        with open(path + ".tmp", "w") as f:
            f.write("\n\n".join(parts) + "\n\n")
        os.replace(path + ".tmp", path)
    return paths


def tokenizer(kind: str, work: str, files: list[str]) -> str:
    spm = os.path.join(work, f"spm-{kind}", "spm.model")
    if not os.path.exists(spm):
        sentences = [line.strip() for f in files for line in open(f) if line.strip()]
        spm = train_sentencepiece(iter(sentences), os.path.dirname(spm), vocab_size=8000)
    return spm


def store(kind: str, work: str, files: list[str], spm: str, copies: int) -> str:
    """The store of ``copies`` copies of the corpus (8 x copies files, linked), made once."""
    out = os.path.join(work, f"store-{kind}-{copies}")
    if os.path.exists(os.path.join(out, fmt.MANIFEST)):
        return out
    directory = os.path.join(work, f"corpus-{kind}-{copies}")
    os.makedirs(directory, exist_ok=True)
    for copy in range(copies):
        for path in files:
            link = os.path.join(directory, f"c{copy:03d}-{os.path.basename(path)}")
            if not os.path.exists(link):
                os.symlink(path, link)
    config = trainer.default_run_config()
    config.data.update(corpus=os.path.join(directory, "*.txt"), tokenizer_model=spm)
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, out, items)
    tok = shard_writer.local_tokenizer(spec)
    shard_writer.write_manifest([shard_writer.prepare_item(spec, i, tok) for i in items], spec)
    return out


def measure(url: str, spm: str, plan: str, fs, hosts: int, work: str, seed: int) -> dict:
    """One fresh pipeline's start-up through ``fs`` (a LatencyFS), counted from 0."""
    fs.requests = fs.ranges = fs.bytes = 0
    config = trainer.default_run_config()
    config.batch_size, config.seed = 256, seed
    config.data.update(store=url, tokenizer_model=spm, max_seq_length=128, max_predictions=20)
    if plan == "packed":
        config.data.update(sample_plan="full_sentences", pack_rows=True)
    else:
        config.data.sample_plan = plan
    start = time.perf_counter()
    pipeline = make_pipeline(config, work, process_index=0, process_count=hosts)
    pipeline.batch(0)
    first_s, first = time.perf_counter() - start, fs.counts()[1]
    prefetch = getattr(pipeline, "_prefetch", None)
    ahead = [f for f, _ in prefetch._futures.values()] if prefetch is not None else []
    concurrent.futures.wait(ahead)
    ahead_s, ahead_requests = time.perf_counter() - start, fs.counts()[1]
    shards = len(pipeline.store.shards)
    pipeline.close()
    return dict(shards=shards, first=first, first_s=first_s, ahead=ahead_requests,
                ahead_s=ahead_s)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="vim", choices=("vim", "builtin"))
    parser.add_argument("--copies", default="1,6,36")
    parser.add_argument("--synthetic", type=int, default=4096, help="shards (0: none)")
    parser.add_argument("--plans", default=",".join(PLANS))
    parser.add_argument("--hosts", type=int, default=1, help="process count (this is host 0)")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--seeds", default="0,1,2", help="config.seed of each run; means shown")
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(),
                                                           "bertjax-startup"))  # fmt: skip
    args = parser.parse_args()
    files = corpus_files(args.corpus, args.data_dir)
    spm = tokenizer(args.corpus, args.data_dir, files)
    copies = [int(c) for c in args.copies.split(",") if c]
    stores = {f"{c}x": store(args.corpus, args.data_dir, files, spm, c) for c in copies}
    real = fmt.filesystem
    tok = Tokenizer(spm, num_threads=1)
    median = 0
    if stores:
        shards = fmt.read_manifest(next(iter(stores.values())))["splits"]["train"]["shards"]
        median = int(np.median([s["tokens"] for s in shards]))
    work = tempfile.mkdtemp(prefix="bertjax-startup-")
    print(f"{args.corpus}: host 0 of {args.hosts}, batch 256 global, T=128, "
          f"{args.latency_ms:g} ms a range; synthetic: {args.synthetic} shards of {median:,} "
          f"tokens; requests = ranges, the mean over seeds {args.seeds}")  # fmt: skip
    names = [*stores, *([f"synthetic {args.synthetic}"] if args.synthetic and median else [])]
    print(
        "| plan | "
        + " | ".join(f"{n}: requests (first batch / with reads ahead)" for n in names)
        + " | first batch s | growth, each store "
        "over the one before (first batch) |"
    )
    print("|---|" + "---|" * (len(names) + 2))  # fmt: skip
    seeds = [int(x) for x in args.seeds.split(",")]
    warm = True
    for plan in args.plans.split(","):
        rows = []
        for name in names:
            if name in stores:
                fs = slow_store.LatencyFS(real(stores[name])[0], args.latency_ms / 1000, "range")
                fmt.filesystem = lambda url, fs=fs: (fs, real(url)[1])
                url = stores[name]
            else:
                first_batch.SHARD_TOKENS = median
                fake = first_batch.SyntheticStore(tok, args.synthetic * median)
                fs = slow_store.LatencyFS(fake, args.latency_ms / 1000, "range")
                fmt.filesystem = lambda url, fs=fs: (fs, url.split("://", 1)[-1])
                url = "synthetic://store"
            if warm:  # imports and first-call costs out of the first timing
                measure(url, spm, plan, fs, args.hosts, work, seeds[0])
                warm = False
            runs = [measure(url, spm, plan, fs, args.hosts, work, seed) for seed in seeds]
            rows.append({k: float(np.mean([r[k] for r in runs])) for k in runs[0]})
            fmt.filesystem = real
        growth = [b["first"] / max(1, a["first"]) for a, b in zip(rows, rows[1:])]
        cells = [f"{r['first']:.1f} / {r['ahead']:.1f}" for r in rows]
        seconds = " / ".join(f"{r['first_s']:.2f}" for r in rows)
        print(f"| {plan} | {' | '.join(cells)} | {seconds} | "
              f"{' / '.join(f'{g:.2f}' for g in growth)} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
