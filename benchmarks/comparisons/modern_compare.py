"""ModernBERT-tiny vs the default run (configs/bert_tiny.py: BERT-tiny with the local-attention
init) at equal wall time on the built-in corpus: held-out MLM accuracy after 1, 2, 3 and 4 minutes
of training (each run's schedule spans --minutes; same tokenizer and token store, the same
held-out rows at BERT's 15% masking), median and range over --seeds.

  # ~30 min on 2 cores
  flock /tmp/bertjax-heavy.lock python benchmarks/comparisons/modern_compare.py
  python benchmarks/comparisons/modern_compare.py --minutes 1 --seeds 0 --no-record

Steps per run: each config's training rate is measured once in a short calibration run (the
steady log windows, compilation excluded), then ``minutes x 60 x rate`` steps. The minute marks
are the run's quarter points (at 1, 2, 3, 4 minutes of a 4-minute run, not four separate runs).
Appends the table to docs/results/comparisons.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics

from electra_compare import _evals, recipe

from bertjax import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NAMES = ("bert_tiny", "modernbert_tiny")


def run(name: str, steps: int, seed: int, workdir: str, prepared: str, evals: int) -> None:
    """Trains ``name`` for ``steps`` with ``evals`` evenly spaced held-out evals."""
    config = recipe(name)
    config.seed = seed
    config.num_train_steps = config.optim.total_steps = steps
    config.optim.warmup_steps = min(config.optim.warmup_steps, steps // 10)
    config.eval_every = config.log_every = max(1, steps // evals)
    config.checkpoint_every, config.progress_bar = 0, False
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    for part in ("tokenizer", "store"):
        if prepared and os.path.isdir(os.path.join(prepared, part)):
            shutil.copytree(os.path.join(prepared, part), os.path.join(workdir, part))
    trainer.train_and_evaluate(config, workdir)


def steps_per_second(workdir: str) -> float:
    """The training rate of the log windows after the first (compilation excluded)."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rates = [row["perf/steps_per_second"] for row in map(json.loads, f) if "perf/mfu" in row]
    return statistics.median(rates[1:] or rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--root", default="/tmp/bertjax_modern_compare")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    prepared = os.path.join(args.root, "calibrate_bert_tiny")
    rates = {}
    for name in NAMES:  # calibration: 160 steps, rate of the steady windows
        workdir = os.path.join(args.root, f"calibrate_{name}")
        run(name, 160, 0, workdir, prepared if name != NAMES[0] else "", 4)
        rates[name] = steps_per_second(workdir)
    marks = 4
    accuracy = {name: {m: [] for m in range(1, marks + 1)} for name in NAMES}
    for seed in seeds:
        for name in NAMES:
            steps = int(args.minutes * 60 * rates[name]) // marks * marks
            workdir = os.path.join(args.root, f"{name}_{seed}")
            run(name, steps, seed, workdir, prepared, marks)
            evals = _evals(workdir)
            for mark in range(1, marks + 1):
                accuracy[name][mark].append(evals[steps * mark // marks]["eval/mlm_accuracy"])
            print(name, seed, steps, [round(a[-1], 4) for a in accuracy[name].values()], flush=True)
    minutes = [args.minutes * m / marks for m in range(1, marks + 1)]
    lines = [
        f"### {datetime.date.today()} — modern_compare — held-out MLM accuracy (15% masking) at "
        f"equal wall time, median (range) over seeds {seeds}; one {args.minutes:g}-minute "
        "schedule per run",
        "",
        "| config | steps/s | steps | " + " | ".join(f"{m:g} min" for m in minutes) + " |",
        "|---|---|---|" + "---|" * marks,
    ]
    for name in NAMES:
        steps = int(args.minutes * 60 * rates[name]) // marks * marks
        cells = [
            f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
            for v in accuracy[name].values()
        ]
        lines.append(f"| {name} | {rates[name]:.2f} | {steps} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if not args.no_record:
        with open(os.path.join(ROOT, "docs", "results", "comparisons.md"), "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
