"""Mixture-of-experts vs dense at equal active parameters: held-out MLM loss and steps/s.

  python benchmarks/comparisons/moe_compare.py  # configs/moe_tiny.py vs num_experts=0
  # the measured one
  python benchmarks/comparisons/moe_compare.py --steps 3000 --prepared /tmp/default_run

Both runs use configs/moe_tiny.py (BERT-tiny, built-in corpus, same seed, data and
optimizer); the dense run only sets ``model.num_experts = 0``. ``--prepared DIR`` copies
an existing ``tokenizer/`` and ``store/`` (same data config) into each workdir to skip
preparation. Steps/s is the mean over log windows after the first (which holds compilation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from bertjax import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config():
    return trainer.load_config_file(os.path.join(ROOT, "configs", "moe_tiny.py"))


def _steps_per_second(workdir: str) -> float:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rates = [
            row["perf/steps_per_second"]
            for row in map(json.loads, f)
            if "perf/steps_per_second" in row
        ]
    rates = rates[1:] or rates
    return sum(rates) / len(rates)


def run(name: str, num_experts: int, args) -> dict:
    config = _config()
    config.model.num_experts = num_experts
    config.num_train_steps = config.optim.total_steps = args.steps
    config.eval_every, config.checkpoint_every = args.steps, 0
    config.progress_bar = False
    workdir = os.path.join(args.root, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    for part in ("tokenizer", "store"):
        if args.prepared and os.path.isdir(os.path.join(args.prepared, part)):
            shutil.copytree(os.path.join(args.prepared, part), os.path.join(workdir, part))
    start = time.perf_counter()
    summary = trainer.train_and_evaluate(config, workdir)
    return {
        "run": name,
        "eval_mlm_loss": summary["eval/mlm_loss"],
        "eval_mlm_accuracy": summary["eval/mlm_accuracy"],
        "steps_per_second": _steps_per_second(workdir),
        "wall_s": time.perf_counter() - start,
        "dropped": summary.get("train/moe_dropped_fraction", 0.0),
        "balance": summary.get("train/moe_balance_loss", float("nan")),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--root", default="/tmp/moe_compare")
    parser.add_argument("--prepared", default="", help="dir with tokenizer/ and store/ to reuse")
    parser.add_argument("--only", choices=("moe", "dense"), default=None)
    args = parser.parse_args()
    runs = [("moe", 4), ("dense", 0)]
    rows = [run(name, experts, args) for name, experts in runs if args.only in (None, name)]
    print(
        f"{'run':6} {'eval MLM loss':>14} {'eval MLM acc':>13} {'steps/s':>8} {'wall s':>7} "
        f"{'dropped':>8} {'balance':>8}"
    )
    for r in rows:
        print(
            f"{r['run']:6} {r['eval_mlm_loss']:14.4f} {r['eval_mlm_accuracy']:13.4f} "
            f"{r['steps_per_second']:8.2f} {r['wall_s']:7.0f} {r['dropped']:8.3f} "
            f"{r['balance']:8.3f}"
        )


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
