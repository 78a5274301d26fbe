"""What the data benchmarks share: a filesystem that behaves as object storage (a fixed latency a
request) and counts what it is asked, the real-text stores they read (Vim's help files, the
built-in corpus), prepared once into a directory kept between runs, and a reader run's figures
(`run_report`, for bertjax's reader and Grain's alike).

`LatencyFS` wraps an fsspec filesystem: every `cat_ranges` call is one round trip (its ranges in
flight together, as gcsfs's) and every `cat_file` one; it sleeps ``latency`` seconds first (the
GIL is released, so calls on several threads overlap) and counts round trips, ranges and bytes.
`install(fs)` makes the sharded reader open every store through it. ``BERTJAX_ROOT=DIR`` runs a
benchmark against the bertjax of another checkout (e.g. the commit before a change).
"""

from __future__ import annotations

import glob
import os
import resource
import sys
import threading
import time

# BERTJAX_ROOT: measure another checkout's bertjax with this harness (a "before" column)
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.environ.get("BERTJAX_ROOT") or HERE
sys.path.insert(0, ROOT)

from bertjax import trainer  # noqa: E402
from bertjax.data.store import beam_prepare, shard_writer  # noqa: E402
from bertjax.data.store import shard_format as fmt  # noqa: E402
from bertjax.data.text import corpus  # noqa: E402
from bertjax.data.tokenizer import train_sentencepiece  # noqa: E402

VIM_DOCS = "/usr/share/vim/vim*/doc/*.txt"


class LatencyFS:
    """``fs`` with ``latency`` seconds a request; counts requests (calls), ranges and bytes.

    ``per="call"``: a `cat_ranges` call is one round trip, its ranges in flight together (gcsfs,
    s3fs: asynchronous filesystems). ``per="range"``: every range is a request of its own, one
    after another within a call (fsspec's `cat_ranges` on a synchronous filesystem: a gcsfuse
    mount read as a local path); `async_impl` is False then, as such a filesystem reports."""

    def __init__(self, fs, latency: float, per: str = "call"):
        if per not in ("call", "range"):
            raise ValueError(f"per={per!r}: 'call' or 'range'")
        self.fs, self.latency, self.per = fs, latency, per
        self.async_impl = per == "call"
        self.requests = self.ranges = self.bytes = 0
        self._lock = threading.Lock()

    def _count(self, requests: int, ranges: int, data) -> None:
        with self._lock:
            self.requests += requests
            self.ranges += ranges
            self.bytes += sum(len(d) for d in data if isinstance(d, bytes))

    def cat_ranges(self, paths, starts, ends, **kwargs):
        if self.per == "range":
            return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends)]
        time.sleep(self.latency)
        out = self.fs.cat_ranges(paths, starts, ends, **kwargs)
        self._count(1, len(paths), out)
        return out

    def cat_file(self, path, start=None, end=None, **kwargs):
        time.sleep(self.latency)
        out = self.fs.cat_file(path, start=start, end=end, **kwargs)
        self._count(1, 1, [out])
        return out

    def counts(self) -> tuple[int, int, int]:
        """(requests, ranges, bytes) so far."""
        with self._lock:
            return self.requests, self.ranges, self.bytes

    def __getattr__(self, name):
        return getattr(self.fs, name)


def run_report(args, took: float, first: float, first_requests: int, counts, cpu: float) -> dict:
    """One reader run's figures (bertjax's or Grain's): tokens/s, requests, ranges and MiB a
    batch from ``counts`` (a `LatencyFS`'s, over ``args.steps`` batches), the start-up, the peak
    RSS of this process and its children, and tokens per CPU second (0 where ``cpu`` is 0)."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "tokens_per_s": args.batch * args.length * args.steps / took,
        "requests_per_batch": counts[0] / args.steps,
        "ranges_per_batch": counts[1] / args.steps,
        "mib_per_batch": counts[2] / args.steps / 2**20,
        "first_s": first,
        "first_requests": first_requests,
        "peak_mib": (usage + children) / 1024,
        "tokens_per_cpu_s": args.batch * args.length * args.steps / cpu if cpu else 0.0,
    }


def install(fs) -> None:
    """Every store the sharded reader opens from now on is read through ``fs``."""
    real = fmt.filesystem

    def through(location, real=real):
        return fs, real(location)[1]

    fmt.filesystem = through


def _corpus_file(kind: str, work: str) -> str:
    path = os.path.join(work, f"{kind}.txt")
    if os.path.exists(path):
        return path
    if kind == "vim":  # a document per paragraph, as the "sentences" format reads; four times
        files = sorted(glob.glob(VIM_DOCS))
        if not files:
            raise SystemExit(f"no Vim help files at {VIM_DOCS}: use --corpus builtin")
        text = "\n\n".join(open(f, encoding="latin-1").read() for f in files) + "\n\n"
    else:  # the built-in corpus, four times
        text = "\n\n".join("\n".join(d) for _, d in corpus.iter_documents("builtin")) + "\n\n"
    text *= 4
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


def prepared_store(kind: str, work: str, shard_bytes: int, vocab_size: int = 8000) -> tuple:
    """(corpus file, SentencePiece model, sharded store directory) of ``kind`` ("vim" or
    "builtin") under ``work``, made once (the prepare job's units in this process)."""
    os.makedirs(work, exist_ok=True)
    path = _corpus_file(kind, work)
    spm = os.path.join(work, f"spm-{kind}-{vocab_size}", "spm.model")
    if not os.path.exists(spm):
        with open(path, encoding="utf-8", errors="replace") as f:
            sentences = [line.strip() for line in f if line.strip()]
        spm = train_sentencepiece(iter(sentences), os.path.dirname(spm), vocab_size=vocab_size)
    out = os.path.join(work, f"store-{kind}-{shard_bytes}")
    if not os.path.exists(os.path.join(out, fmt.MANIFEST)):
        config = trainer.default_run_config()
        config.data.update(corpus=path, tokenizer_model=spm, shard_bytes=shard_bytes)
        items = shard_writer.work_items(config.data)
        spec = beam_prepare.make_spec(config, out, items)
        tok = shard_writer.local_tokenizer(spec)
        records = [shard_writer.prepare_item(spec, i, tok) for i in items]
        shard_writer.write_manifest(records, spec)
    return path, spm, out
