"""What one host computes and reads per step as the pod grows at a fixed per-host batch: flat from
1 to 64 hosts? (issue 55: without lanes every host planned every window of pieces the whole
job read, so its planning grew with the host count.)

Host 0 of H hosts, --rows rows each (a global batch of H x rows), T=128, on a synthetic store of
4096 shards of 2^27 tokens (benchmarks/data/first_batch.py's `SyntheticStore`, computed on the fly),
the read settings chosen for a URL store but no batches ahead (so the CPU time is the host's own
work, measured with `time.process_time` over --steps steps after the first): CPU ms per step,
KiB read per step, pieces planned over those steps, in lanes of --lane-rows (the default's);
beside it the same with config.data.lane_rows = 0 (one lane: the order before lanes).

  python benchmarks/data/per_host.py --steps 200  # 1, 4, 16, 64 hosts; nsp, full_sentences
  python benchmarks/data/per_host.py --plans token_windows --steps 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import first_batch
import slow_store  # noqa: F401 (puts this checkout's bertjax on the path)

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.plans import piece_plans
from bertjax.data.store import shard_format as fmt
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece


def measure(tok, spm, work, plan, hosts: int, rows: int, steps: int, lane_rows: int, piece_tokens):
    fake = first_batch.SyntheticStore(tok, 4096 * first_batch.SHARD_TOKENS)
    fmt.filesystem = lambda url: (fake, url.split("://", 1)[-1])
    config = trainer.default_run_config()
    config.batch_size = rows * hosts
    config.data.update(store="synthetic://store", tokenizer_model=spm, max_seq_length=128,
                       max_predictions=20, prefetch=0, lane_rows=lane_rows,
                       piece_tokens=piece_tokens)  # fmt: skip
    if plan == "packed":
        config.data.update(sample_plan="full_sentences", pack_rows=True)
    else:
        config.data.sample_plan = plan
    built, real = [0], piece_plans.PieceSplit._build

    def counted(self, *args):
        built[0] += 1
        return real(self, *args)

    piece_plans.PieceSplit._build = counted
    try:
        pipeline = make_pipeline(config, work, process_index=0, process_count=hosts)
        pipeline.batch(0)
        built[0], served, cpu = 0, fake.served, time.process_time()
        for step in range(1, steps + 1):
            pipeline.batch(step)
        cpu = time.process_time() - cpu
    finally:
        piece_plans.PieceSplit._build = real
    return 1000 * cpu / steps, (fake.served - served) / steps / 1024, built[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,4,16,64")
    parser.add_argument("--rows", type=int, default=32, help="rows per host a step")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--plans", default="nsp,full_sentences")
    parser.add_argument("--lane-rows", type=int,
                        default=trainer.default_run_config().data.lane_rows)  # fmt: skip
    parser.add_argument("--piece-tokens", type=int, default=1 << 16,
                        help="small pieces, so that windows turn over within --steps")  # fmt: skip
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bertjax-per-host-")
    sentences = (s for _, d in corpus.iter_documents("builtin") for s in d)
    spm = train_sentencepiece(sentences, os.path.join(work, "spm"), vocab_size=400)
    tok = Tokenizer(spm, num_threads=1)
    print(
        f"host 0 of H, {args.rows} rows a host a step, T=128, {args.steps} steps after the "
        f"first, synthetic store of 4096 shards, lanes of {args.lane_rows} rows; shared 2-core "
        "CPU (compare within a run)"
    )
    print(
        "| plan | hosts | global batch | CPU ms a step | KiB read a step | pieces planned | "
        "CPU ms a step, one lane | KiB read a step, one lane | pieces planned, one lane |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for plan in args.plans.split(","):
        for hosts in (int(h) for h in args.hosts.split(",")):
            common = (tok, spm, work, plan, hosts, args.rows, args.steps)
            lanes = measure(*common, args.lane_rows, args.piece_tokens)
            one = measure(*common, 0, args.piece_tokens)
            print(
                f"| {plan} | {hosts} | {hosts * args.rows} | {lanes[0]:.1f} | {lanes[1]:,.0f} | "
                f"{lanes[2]} | {one[0]:.1f} | {one[1]:,.0f} | {one[2]} |",
                flush=True,
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
