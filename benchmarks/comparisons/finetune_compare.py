"""Does pretraining help? The default encoder vs a random init on both built-in sequence tasks.

  # a `python train.py` run
  python benchmarks/comparisons/finetune_compare.py --pretrained=workdir/bert_tiny
  python benchmarks/comparisons/finetune_compare.py  # pretrains the default job first (3000 steps)

Tasks (configs/finetune_glue.py, its LR, steps and batch; only the task and label count change):
`stdlib_families` (docstring sentence -> library family; a bag of words solves most of it) and
`stdlib_word_order` (sentence as written or with a span of inner words permuted: both classes
have the same bag of words). Each (task, init) pair runs once per seed; the two inits share the
tokenizer (the pretrained run's), model shape, seed and data order, so only the encoder's
initial weights differ (the random encoder is drawn from the seed). Prints the best dev metric
of each run and the median and range over seeds, as a markdown table for
docs/results/comparisons.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import numpy as np

from bertjax import paths, trainer
from bertjax.training.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Built-in sequence tasks and their label counts.
TASKS = {"stdlib_families": 4, "stdlib_word_order": 2}


def _load_config(name: str):
    return trainer.load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))


def _pretrain(workdir: str, steps: int) -> None:
    config = _load_config("bert_tiny")
    if steps:
        config.num_train_steps = config.optim.total_steps = steps
    trainer.train_and_evaluate(config, workdir)


def _finetune(args, task: str, seed: int, init_from: str, tokenizer: str, model: dict, workdir):
    config = _load_config(args.task_config)
    config.task.source = f"builtin:{task}"
    config.loss.num_labels = TASKS[task]
    config.seed = seed
    config.num_train_steps = config.optim.total_steps = args.steps
    config.eval_every = args.eval_every
    config.init_from = init_from
    config.task.train_examples = args.train_examples
    if args.learning_rate:
        config.optim.learning_rate = args.learning_rate
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, never a resume
    config.data.tokenizer_model = tokenizer
    config.model.update(model)
    config.progress_bar = False
    start = time.time()
    trainer.train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, "best", "best.json")) as f:
        best = json.load(f)
    best["seconds"] = time.time() - start
    return best


def _encoder(args) -> tuple[str, dict]:
    """The pretrained run's tokenizer file and model shape (pretraining it first if needed)."""
    checkpoints = os.path.join(args.pretrained, "checkpoints")
    if not (
        os.path.isdir(checkpoints) and Checkpointer(checkpoints, async_save=False).latest_step()
    ):
        _pretrain(args.pretrained, args.pretrain_steps)
    ckpt = Checkpointer(checkpoints, async_save=False)
    meta = ckpt.read_meta()
    ckpt.close()
    from bertjax.interop.checkpoints import write_tokenizer

    tokenizer = write_tokenizer(meta, os.path.join(args.workdir, "tokenizer"))
    shape = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    )
    return tokenizer, {k: meta["model_config"][k] for k in shape}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", default="/tmp/bertjax_default_encoder")
    parser.add_argument(
        "--pretrain-steps", type=int, default=0, help="if --pretrained has no checkpoint (0: 3000)"
    )
    parser.add_argument("--workdir", default="/tmp/finetune_compare")
    parser.add_argument("--task-config", default="finetune_glue")
    parser.add_argument("--tasks", default=",".join(TASKS), help="built-in tasks, comma-separated")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=0.0, help="0 = the config's")
    parser.add_argument(
        "--train-examples", type=int, default=0, help="0 = all (else a seeded subset)"
    )
    args = parser.parse_args()
    # resolved once, here (relative to the current directory, ~ expanded): orbax and the runs'
    # config.init_from see absolute paths
    args.pretrained = paths.resolve(args.pretrained, "--pretrained")
    args.workdir = paths.resolve(args.workdir, "--workdir")
    tokenizer, model = _encoder(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for task in args.tasks.split(","):
        for init, init_from in (("pretrained", args.pretrained), ("random", "")):
            runs = []
            for seed in seeds:
                workdir = os.path.join(args.workdir, task, init, f"seed{seed}")
                # the pretrained run reads its checkpoint's tokenizer; the random one the same file
                best = _finetune(args, task, seed, init_from, "" if init_from else tokenizer,
                                 model, workdir)  # fmt: skip
                runs.append(best)
                print(f"{task} {init} seed {seed}: {best['metric']}={best['value']:.4f} "
                      f"(step {best['step']}, {best['seconds']:.0f}s)", flush=True)  # fmt: skip
            rows.append((task, init, runs))
    lr = args.learning_rate or "the config's"
    print(
        f"\nbest dev metric over {args.steps} steps (eval every {args.eval_every}), lr {lr}, "
        f"seeds {seeds}, train examples {args.train_examples or 'all'}\n"
    )
    print("| task | init | metric | median | range | per seed | s/run |")
    print("|---|---|---|---|---|---|---|")
    for task, init, runs in rows:
        values = np.array([r["value"] for r in runs])
        seconds = np.median([r["seconds"] for r in runs])
        per_seed = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"| {task} | {init} | {runs[0]['metric']} | {np.median(values):.3f} | "
            f"{values.min():.3f}-{values.max():.3f} | {per_seed} | {seconds:.0f} |"
        )


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
