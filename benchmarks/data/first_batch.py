"""Time, requests and bytes to the first batch against the store size, for every sample plan: does
a host's start-up grow with the corpus? (It must not: DESIGN.md "Start-up never grows".)

Each store is synthetic (`SyntheticStore`): a filesystem that computes every byte asked for, of
shards of up to 2^27 tokens whose documents are 5 sentences of 51 tokens and a [SEP], so a store
of any size costs nothing to make. For each size and plan, one host (process 0 of --hosts) times a
fresh `make_pipeline(...)` and `batch(0)` (global batch 256, T=128, the read settings chosen for
a URL store), and reports the requests (ranges) and bytes it read from the store, the manifest
included, and the bytes of piece indexes and plans it holds. `--latency-ms` adds that much to
every range (slow_store.LatencyFS, a range a request, as a synchronous filesystem).

  python benchmarks/data/first_batch.py                         # 2 M .. 2^42 tokens, every plan
  python benchmarks/data/first_batch.py --shards 100,1000,4096 --latency-ms 50   # flat in shards?
  python benchmarks/data/first_batch.py --tokens 2e6,1e8 --plans nsp,full_sentences --hosts 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import slow_store  # noqa: E402

from bertjax import trainer  # noqa: E402
from bertjax.data import make_pipeline  # noqa: E402
from bertjax.data.store import shard_format as fmt  # noqa: E402
from bertjax.data.text import corpus  # noqa: E402
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402

DOC, SENTENCE, SENTENCES, BLOCK, FIRST_ID = 256, 51, 5, 16 << 10, 10
SHARD_TOKENS = 1 << 27  # 0.4 GB of data a shard, about the prepare job's default 0.5 GiB
PLANS = ("nsp", "sop", "pairs", "full_sentences", "doc_sentences", "mlm", "packed",
         "token_windows")  # fmt: skip


class SyntheticStore:
    """A filesystem of ``tokens`` tokens in shards of SHARD_TOKENS (the last shorter), computed on
    the fly; it counts the bytes it serves."""

    def __init__(self, tok, tokens: int):
        self.served = 0
        q = np.arange(BLOCK) % DOC
        ids = np.where(q == DOC - 1, tok.sep_id, FIRST_ID + q)
        self.block = ids.astype("<u2").tobytes() + np.ones(BLOCK, np.uint8).tobytes()
        self.crc = zlib.crc32(self.block)
        sizes = [SHARD_TOKENS] * (tokens // SHARD_TOKENS) + [tokens % SHARD_TOKENS]
        self.entries, self.layouts = {}, {}
        shards = []
        for k, size in enumerate(s for s in sizes if s):
            size -= size % BLOCK  # whole blocks of whole documents
            entry = {"documents": size // DOC, "sentences": size // DOC * SENTENCES, "tokens": size}
            layout = fmt.index_layout(entry, tok.vocab_size, BLOCK, 2)
            path = f"train/{k:06d}.shard"
            self.layouts[path] = layout
            shards.append(dict(entry, path=path, bytes=layout["file_bytes"], sha256="",
                               index_crc32=0))  # fmt: skip
        eval_shard = dict(shards[0], path="eval/000000.shard")
        self.layouts[eval_shard["path"]] = self.layouts[shards[0]["path"]]
        self.manifest = json.dumps({
            "format_version": fmt.FORMAT_VERSION, "tokenizer_fingerprint": tok.fingerprint(),
            "tokenizer_file": "tokenizer/spm.model", "language": "en", "lowercase": True,
            "vocab_size": tok.vocab_size, "token_dtype": "uint16", "block_tokens": BLOCK,
            "splits": {"train": {"shards": shards}, "eval": {"shards": [eval_shard]}},
        }).encode()  # fmt: skip

    def _elements(self, name, lo, hi) -> bytes:
        i = np.arange(lo, hi, dtype=np.int64)
        if name == "documents":
            return (i * SENTENCES).astype("<i8").tobytes()
        if name == "sentences":
            start = (i // 2 // SENTENCES) * DOC + (i // 2 % SENTENCES) * SENTENCE
            return (start + SENTENCE * (i % 2)).astype("<i8").tobytes()
        if name == "token_counts":
            return np.ones(len(i), "<i8").tobytes()
        return np.full(len(i), self.crc, "<u4").tobytes()

    def _range(self, path, start, end) -> bytes:
        layout, out = self.layouts[path.split("store/", 1)[1]], []
        for name, size in (("documents", 8), ("sentences", 8), ("token_counts", 8),
                           ("block_crc32", 4)):  # fmt: skip
            lo, hi = layout[name]
            a, b = max(start, lo), min(end, hi)
            if a < b:
                first, last = (a - lo) // size, -(-(b - lo) // size)
                out.append(self._elements(name, first, last)[a - lo - first * size :][: b - a])
        index = layout["index_bytes"]
        if end > index:
            first = max(start, index) - index
            skip = first % len(self.block)
            count = (end - index - first + skip) // len(self.block) + 1
            out.append((self.block * count)[skip : skip + end - index - first])
        self.served += end - start
        return b"".join(out)

    def cat_file(self, path, start=None, end=None):
        if start is not None:
            return self._range(path, start, end)
        self.served += len(self.manifest)
        return self.manifest

    def cat_ranges(self, paths, starts, ends):
        return [self._range(p, s, e) for p, s, e in zip(paths, starts, ends)]


def held_bytes(pipeline) -> int:
    """Bytes of the piece indexes and plans the host holds (0 for token_windows)."""
    pieces = pipeline._split.pieces
    if pieces is None:
        return 0
    plans = getattr(pieces, "_plans", None) or pieces._cache  # before issue 55: _cache
    total = sum(v.documents.nbytes + v.sentences.nbytes for v in pieces._views.values())
    for plan, order, packing in plans.values():
        total += order.nbytes + sum(getattr(plan, n).nbytes for n in ("a_start", "a_end",
                                    "b_start", "b_end", "label"))  # fmt: skip
        total += sum(a.nbytes for a in packing) if packing else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2e6,1.6e7,1.28e8,1.024e9,4.398e12")
    parser.add_argument("--shards", default="", help="instead of --tokens: shards of 2^27 tokens")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--plans", default=",".join(PLANS))
    parser.add_argument("--hosts", type=int, default=8, help="process count (this is host 0)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bertjax-first-batch-")
    spm = train_sentencepiece(
        (s for _, d in corpus.iter_documents("builtin") for s in d),
        os.path.join(work, "spm"),
        vocab_size=400,
    )
    tok = Tokenizer(spm, num_threads=1)
    print(f"one host of {args.hosts}, batch 256 global, T=128, synthetic store (shards of 2^27 "
          f"tokens), {args.latency_ms:g} ms a range; shared 2-core CPU")  # fmt: skip
    print("| plan | tokens | shards | start-up + first batch s | requests (ranges) | MiB read "
          "| MiB held |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    sizes = [int(float(t)) for t in args.tokens.split(",")]
    if args.shards:
        sizes = [int(n) * SHARD_TOKENS for n in args.shards.split(",")]
    for plan in args.plans.split(","):
        for tokens in sizes:
            fake = SyntheticStore(tok, tokens)
            slow = slow_store.LatencyFS(fake, args.latency_ms / 1000, per="range")
            fmt.filesystem = lambda url, slow=slow: (slow, url.split("://", 1)[-1])
            config = trainer.default_run_config()
            config.batch_size = 256
            config.data.update(store="synthetic://store", tokenizer_model=spm,
                               max_seq_length=128, max_predictions=20)  # fmt: skip
            if plan == "packed":
                config.data.update(sample_plan="full_sentences", pack_rows=True)
            else:
                config.data.sample_plan = plan
            start = time.perf_counter()
            pipeline = make_pipeline(config, work, process_index=0, process_count=args.hosts)
            pipeline.batch(0)
            took = time.perf_counter() - start
            _, ranges, _ = slow.counts()
            served = fake.served
            pipeline.close()
            shards = len(pipeline.store.shards)
            print(f"| {plan} | {tokens:.3g} | {shards:,} | {took:.2f} | {ranges} | "
                  f"{served / 2**20:,.1f} | {held_bytes(pipeline) / 2**20:,.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
