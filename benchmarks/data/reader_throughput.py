"""Finished (read, planned, masked) batches per second from a sharded store behind object
storage's latency: tokens/s, round trips (requests) and bytes a batch, and the start-up (time and
requests to the first batch), per plan and per read setting; Grain beside bertjax on the same
store (`--grain`, benchmarks/data/grain_reader.py), Hugging Face `datasets` streaming (`--hf`).

The store is real text prepared once (benchmarks/data/slow_store.py): Vim's help files (~9.5 M
tokens with an 8000-piece SentencePiece, 256 KiB shards: ~86 of them), or the built-in corpus four
times (`--corpus builtin`). Every request pays ``--latency-ms`` (`LatencyFS`: a `cat_ranges` call is
one round trip, its ranges in flight together). One host asks for ``--steps`` consecutive batches of
``--batch`` rows of T after the first one, as the trainer does. Each run is its own process (its
start-up and peak memory its own).

  python benchmarks/data/reader_throughput.py                      # every plan, defaults, ~10 min
  python benchmarks/data/reader_throughput.py --plans full_sentences,token_windows \
      --settings defaults,threads32 --grain
  python benchmarks/data/reader_throughput.py --latency-ms 0 --settings workers1,workers2  # cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import slow_store

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.store import shard_format as fmt

PLANS = ("nsp", "sop", "pairs", "full_sentences", "doc_sentences", "mlm", "token_windows")
SETTINGS = {  # config.data overrides by name ("defaults": nothing set)
    "defaults": {},
    "threads32": {"prefetch": 32, "prefetch_threads": 32},
    "serial": {"prefetch": 0},  # one batch at a time, in the asking thread: a core's rate
    "workers1": {"workers": 1},
    "workers2": {"workers": 2},
    "workers4": {"workers": 4},
}


def run_bertjax(args) -> dict:
    """One run in this process: the figures of `report`."""
    fs = slow_store.LatencyFS(fmt.filesystem(args.store)[0], args.latency_ms / 1000, args.per)
    slow_store.install(fs)
    config = trainer.default_run_config()
    config.batch_size = args.batch
    plan = {"packed": {"sample_plan": "full_sentences", "pack_rows": True}}.get(
        args.plan, {"sample_plan": args.plan}
    )
    if args.cache_mib:
        config.data.store_cache_bytes = int(args.cache_mib * 2**20)
    config.data.update(
        store=args.store,
        tokenizer_model=args.spm,
        max_seq_length=args.length,
        max_predictions=max(1, args.length * 15 // 100),
        **plan,
        **SETTINGS[args.setting],
    )
    start = time.perf_counter()
    pipeline = make_pipeline(config, args.work, process_index=0, process_count=1)
    pipeline.batch(0)
    first, first_requests = time.perf_counter() - start, fs.counts()[0]
    for step in range(1, args.warm + 1):  # worker processes started and busy
        pipeline.batch(step)
    first_counts = fs.counts()
    cpu, start = time.process_time(), time.perf_counter()
    for step in range(args.warm + 1, args.warm + args.steps + 1):
        pipeline.batch(step)
    took = time.perf_counter() - start
    counts = [b - a for a, b in zip(first_counts, fs.counts())]
    cpu = time.process_time() - cpu if not config.data.workers else float("nan")
    pipeline.close()
    return slow_store.run_report(args, took, first, first_requests, counts, cpu)


def child(args) -> None:
    if args.peer == "grain":
        import grain_reader

        result = grain_reader.run(args)
    else:
        result = run_bertjax(args)
    print("RESULT " + json.dumps(result), flush=True)


def spawn(args, plan: str, setting: str, peer: str = "bertjax") -> dict | None:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--plan",
        plan,
        "--setting",
        setting,
        "--peer",
        peer,
        "--store",
        args.store,
        "--spm",
        args.spm,
        "--work",
        args.work,
        "--batch",
        str(args.batch),
        "--length",
        str(args.length),
        "--steps",
        str(args.steps),
        "--warm",
        str(args.warm),
        "--latency-ms",
        str(args.latency_ms),
        "--per",
        args.per,
        "--cache-mib",
        str(args.cache_mib),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not lines:
        print(f"| {plan} | {peer} {setting} | failed: {done.stderr.strip()[-400:]!r} |")
        return None
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="vim", choices=("vim", "builtin"))
    parser.add_argument("--shard-bytes", type=int, default=256 << 10)
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "bertjax-bench"))
    parser.add_argument("--plans", default=",".join(PLANS))
    parser.add_argument("--settings", default="defaults")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warm", type=int, default=0, help="steps before the timed ones")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the median shown")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument(
        "--per",
        default="range",
        choices=("call", "range"),
        help="the latency is paid per cat_ranges call or per range (LatencyFS)",
    )
    parser.add_argument("--cache-mib", type=float, default=0, help="block cache (0: chosen)")
    parser.add_argument(
        "--grain",
        default="",
        help="Grain runs beside (grain_reader.py): any "
        "of grain (16 threads, 2 processes), grain-1 (no process), "
        "grain-arrayrecord (local ArrayRecord, no latency)",
    )
    parser.add_argument("--hf", action="store_true", help="HF datasets streaming beside")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("plan", "setting", "peer", "store", "spm", "work"):
        parser.add_argument(f"--{name}", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    prepared = slow_store.prepared_store(args.corpus, args.data_dir, args.shard_bytes)
    _, args.spm, args.store = prepared
    args.work = tempfile.mkdtemp(prefix="bertjax-reader-")
    manifest = fmt.read_manifest(args.store)
    train = manifest["splits"]["train"]
    print(
        f"store: {args.corpus}, {train['tokens']:,} train tokens in {len(train['shards'])} "
        f"shards; batch {args.batch} x {args.length}, {args.steps} steps after the first "
        f"{args.warm + 1}; "
        f"{args.latency_ms:g} ms a request (per {args.per}); one host; each run its own process, "
        f"the median of {args.repeat} by tokens/s"
    )
    print(
        "| plan | reader | settings | tokens/s | tokens per CPU s | requests a batch "
        "| ranges a batch | MiB a batch "
        "| start + first batch s | requests to the first batch | peak MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = [(p, s, "bertjax") for p in args.plans.split(",") for s in args.settings.split(",")]
    runs += [("token_windows", g, "grain") for g in args.grain.split(",") if g]
    for plan, setting, peer in runs:
        tries = [t for t in (spawn(args, plan, setting, peer) for _ in range(args.repeat)) if t]
        r = sorted(tries, key=lambda t: t["tokens_per_s"])[len(tries) // 2] if tries else None
        if r is not None:
            per_cpu = r["tokens_per_cpu_s"]
            per_cpu = f"{per_cpu:,.0f}" if per_cpu == per_cpu and per_cpu else "-"
            mib = f"{r['mib_per_batch']:.2f}" if peer == "bertjax" else "-"
            print(
                f"| {plan} | {peer} | {setting} | {r['tokens_per_s']:,.0f} | {per_cpu} | "
                f"{r['requests_per_batch']:.2f} | {r['ranges_per_batch']:.1f} | {mib} | "
                f"{r['first_s']:.2f} | {r['first_requests']} | {r['peak_mib']:,.0f} |",
                flush=True,
            )
    if args.hf:
        import grain_reader

        rate = grain_reader.hf_streaming(args)
        if rate is not None:
            print(
                f"| (token rows) | HF datasets streaming, local parquet, reading only | - | "
                f"{rate:,.0f} | - | - | - | - | - | - | - |"
            )


if __name__ == "__main__":
    main()
