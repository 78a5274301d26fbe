"""The modern recipe against the classic one at a fixed token budget, on the built-in corpus:
configs/bert_tiny.py as it is (AdamW, a fixed batch of 16, linear warmup and decay) vs the same
model and data with StableAdamW, a batch-size warmup (4, 8, 12, then 16 over the first 20% of
the tokens) and a warmup-stable-decay schedule whose last 20% decays as 1 - sqrt (ModernBERT's
three pieces). Held-out MLM loss (BERT's 15% masking, the same rows) against tokens seen; the
tokens the modern recipe needs to reach the classic one's final loss; the largest rise of the
training loss between two log points (spikes). Median and range over --seeds.

  # ~25 min on 2 cores
  flock /tmp/bertjax-heavy.lock python benchmarks/comparisons/recipe_compare.py
  python benchmarks/comparisons/recipe_compare.py --tokens 200000 --seeds 0 --no-record

Both arms see the same number of tokens (rows x 128), so the modern arm takes more, smaller steps
during its batch warmup. StableAdamW's weight decay is set to the classic arm's per-step decay at
peak LR (AdamW's 0.01 x lr), its decoupled form. Appends the table to docs/results/comparisons.md
unless
--no-record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics

import numpy as np

from bertjax import trainer
from bertjax.data.plans.batch_plan import BatchPlan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LENGTH = 128


def arm(name: str, tokens: int, seed: int):
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "bert_tiny.py"))
    config.seed = seed
    rows = tokens // LENGTH
    if name == "modern":
        peak = config.optim.learning_rate
        config.optim.update(name="stableadamw", weight_decay=config.optim.weight_decay * peak)
        config.batch_warmup.update(tokens=int(0.2 * tokens), quantum=4)
        config.optim.update(schedule="wsd", decay_shape="1-sqrt", decay_fraction=0.2)
    plan = BatchPlan.from_config(config, LENGTH)
    steps = plan.steps_for_samples(rows)
    config.num_train_steps = config.optim.total_steps = steps
    config.optim.warmup_steps = max(1, steps // 30)
    config.log_every = 20
    config.eval_every = max(20, steps // 10 // 20 * 20)
    config.checkpoint_every, config.progress_bar = 0, False
    return config, plan


def run(name: str, tokens: int, seed: int, root: str, prepared: str) -> dict:
    config, plan = arm(name, tokens, seed)
    workdir = os.path.join(root, f"{name}_{seed}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    if prepared and os.path.isdir(os.path.join(prepared, "tokenizer")):
        shutil.copytree(os.path.join(prepared, "tokenizer"), os.path.join(workdir, "tokenizer"))
    trainer.train_and_evaluate(config, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    evals = [(r["step"], r["eval/mlm_loss"]) for r in rows if "eval/mlm_loss" in r]
    train = [r["train/loss"] for r in rows if "train/loss" in r]
    return {
        "tokens": [plan.samples_before(s) * LENGTH for s, _ in evals],
        "loss": [loss for _, loss in evals],
        "spike": max(0.0, *np.diff(train)) if len(train) > 1 else 0.0,
        "steps": config.num_train_steps,
        "workdir": workdir,
    }


def tokens_to_reach(curve: dict, target: float) -> float | None:
    """Tokens at which the held-out loss first reaches ``target`` (linear between evals)."""
    tokens, loss = curve["tokens"], curve["loss"]
    for i, value in enumerate(loss):
        if value <= target:
            if i == 0:
                return float(tokens[0])
            t0, t1, l0, l1 = tokens[i - 1], tokens[i], loss[i - 1], loss[i]
            return float(t0 + (t1 - t0) * (l0 - target) / (l0 - l1))
    return None


def _cell(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "not reached"
    return f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_048_000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--root", default="/tmp/bertjax_recipe_compare")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    curves = {"classic": [], "modern": []}
    prepared = ""
    for seed in seeds:
        for name in curves:
            curves[name].append(run(name, args.tokens, seed, args.root, prepared))
            prepared = prepared or curves[name][-1]["workdir"]
            print(name, seed, curves[name][-1]["loss"], flush=True)
    lines = [
        f"### {datetime.date.today()} — recipe_compare — bert_tiny, {args.tokens:,} tokens, "
        f"median (range) over seeds {seeds}",
        "",
        "| recipe | steps | final held-out MLM loss | tokens to the classic final loss | "
        "largest train-loss rise |",
        "|---|---|---|---|---|",
    ]
    for name, runs in curves.items():
        targets = [c["loss"][-1] for c in curves["classic"]]
        reach = [tokens_to_reach(c, t) for c, t in zip(runs, targets)]
        lines.append(
            f"| {name} | {runs[0]['steps']} | {_cell([c['loss'][-1] for c in runs])} | "
            f"{_cell(reach)} | {_cell([c['spike'] for c in runs])} |"
        )
    lines += ["", "held-out MLM loss by tokens seen (seed 0):", ""]
    for name, runs in curves.items():
        points = ", ".join(
            f"{t / 1e6:.2f}M: {v:.3f}" for t, v in zip(runs[0]["tokens"], runs[0]["loss"])
        )
        lines.append(f"- {name}: {points}")
    print("\n".join(lines))
    if not args.no_record:
        with open(os.path.join(ROOT, "docs", "results", "comparisons.md"), "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
