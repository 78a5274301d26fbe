"""Time to the first batch of a sharded store against the corpus size: does a host's start-up
grow with the corpus? (issue 34: it must not; MaxText's Grain path starts in ~6 s on 64 hosts.)

For each size, the built-in corpus repeated into 4 files is prepared once into a sharded store
on local disk (the Beam job's units in one process, `shard_writer.prepare_item`), then one host
(process 0 of --hosts) times, in a fresh pipeline each:

- open: the manifest and every shard's index region (`ShardedStore`), and what it holds in
  memory (document and sentence offsets, block CRCs);
- plan: epoch 0's sample plan (`full_sentences` rows at T=128, and BERT's `nsp` pairs), built from
  the whole sentence index, and its arrays' bytes;
- first batch: the rows of step 0 of this host, read and masked;
- token_windows: the same from a fresh pipeline with `sample_plan="token_windows"`, which opens
  from the manifest alone (no sentence index, no plan arrays; block checksums of the shards its
  rows touch): its whole start-up, and the bytes it read.

The last columns extrapolate linearly (per token of this run's largest size) to a 2T-token
corpus, the ModernBERT recipe's.

  python benchmarks/first_batch.py                 # 4, 16 and 64 MB (~2 minutes)
  python benchmarks/first_batch.py --mbs 8,32 --hosts 64
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

from store_throughput import _corpus  # noqa: E402  (the same repeated built-in corpus)

from bertjax import trainer  # noqa: E402
from bertjax.data import beam_prepare, corpus, make_pipeline, shard_reader, shard_writer  # noqa: E402
from bertjax.data.samples import make_plan  # noqa: E402
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402

TARGET_TOKENS = 2e12  # ModernBERT's 2T-token recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbs", default="4,16,64", help="corpus sizes in MB")
    parser.add_argument("--hosts", type=int, default=8, help="process count (this is host 0)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bertjax-first-batch-")
    os.environ["BERTJAX_CACHE_DIR"] = os.path.join(work, "cache")
    spm = train_sentencepiece(
        (s for _, d in corpus.iter_documents("builtin") for s in d),
        os.path.join(work, "spm"),
        vocab_size=8000,
    )
    tok = Tokenizer(spm, num_threads=1)
    print(f"one host of {args.hosts}, batch 256 global, T=128, local disk; shared 2-core CPU")
    print(
        "| corpus MB | tokens | sentences | open s | index MiB | plan s (full_sentences) | "
        "plan s (nsp) | plan MiB | first batch s | total s | token_windows total s | "
        "token_windows KiB read |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for mb in (float(x) for x in args.mbs.split(",")):
        config = trainer.default_run_config()
        os.makedirs(os.path.join(work, f"corpus{mb:g}"))
        config.data.corpus = _corpus(os.path.join(work, f"corpus{mb:g}"), mb)
        config.data.tokenizer_model = spm
        config.data.shard_bytes = 4 << 20
        out = os.path.join(work, f"store{mb:g}")
        items = shard_writer.work_items(config.data)
        spec = beam_prepare.make_spec(config, out, items)
        shard_writer.write_manifest([shard_writer.prepare_item(spec, i, tok) for i in items], spec)
        start = time.perf_counter()
        store = shard_reader.ShardedStore(out, "train", tok)
        opened = time.perf_counter() - start
        index_bytes = store.documents.nbytes + store.sentences.nbytes
        index_bytes += sum(c.nbytes for c in store.blocks.crcs.values())
        tokens, sentences = len(store.tokens), len(store.sentences)
        plans = {}
        for plan_name in ("full_sentences", "nsp"):
            start = time.perf_counter()
            plan = make_plan(store, plan_name, 128, 0.1, np.random.default_rng(0))
            plans[plan_name] = (time.perf_counter() - start, plan)
        plan_bytes = sum(
            getattr(plans["full_sentences"][1], f).nbytes
            for f in ("a_start", "a_end", "b_start", "b_end", "label")
        )
        c = config.copy_and_resolve_references()
        c.batch_size, c.data.store, c.data.prefetch = 256, out, 0
        c.data.update(max_seq_length=128, sample_plan="full_sentences", max_predictions=20)
        start = time.perf_counter()
        pipeline = make_pipeline(c, work, process_index=0, process_count=args.hosts)
        pipeline.batch(0)
        total = time.perf_counter() - start
        first = total - opened - plans["full_sentences"][0]
        c.data.sample_plan = "token_windows"
        start = time.perf_counter()
        windows = make_pipeline(c, work, process_index=0, process_count=args.hosts)
        windows.batch(0)
        windows_total = time.perf_counter() - start
        windows_read = windows.store.blocks.bytes_read
        rows.append((tokens, opened, index_bytes, plans["full_sentences"][0], plan_bytes, total))
        print(
            f"| {mb:g} | {tokens:,} | {sentences:,} | {opened:.2f} | {index_bytes / 2**20:.1f} | "
            f"{plans['full_sentences'][0]:.2f} | {plans['nsp'][0]:.2f} | "
            f"{plan_bytes / 2**20:.1f} | {max(first, 0.0):.2f} | {total:.2f} | "
            f"{windows_total:.2f} | {windows_read / 2**10:,.0f} |",
            flush=True,
        )
    tokens, opened, index_bytes, plan_s, plan_bytes, total = rows[-1]
    scale = TARGET_TOKENS / tokens
    print(
        f"\nlinear extrapolation to {TARGET_TOKENS:.0e} tokens (x{scale:,.0f} the largest size), "
        f"per host: open {opened * scale / 3600:,.0f} h, index {index_bytes * scale / 2**40:,.1f} "
        f"TiB, full_sentences plan {plan_s * scale / 3600:,.0f} h and "
        f"{plan_bytes * scale / 2**40:,.1f} TiB; start-up total {total * scale / 3600:,.0f} h "
        "(sentence plans); token_windows: flat, see its column"
    )


if __name__ == "__main__":
    main()
