"""Distilled vs plain 1-layer student on the built-in corpus, from a trained BERT-tiny teacher.

  # a `python
  python benchmarks/comparisons/distill_compare.py --teacher=/tmp/default_run --steps=500
  train.py` workdir

Every run uses configs/distilbert.py with the teacher's tokenizer, the same student shape, seed,
data order, steps and held-out batches. Variants: "distilled" (teacher-layer init + DistilBERT's
triple loss, the KL at every real token), "mlm_only" (random init, plain MLM: the same student
without the teacher) and, with --init_only, "teacher_init" (teacher-layer init, plain MLM); with
--masked_kl, "distilled_masked_kl" (the KL at masked positions only). --seeds runs each variant
once per seed and reports the median and range. Prints held-out MLM accuracy of each and teacher
vs student forward throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import jax
import jax.numpy as jnp

from bertjax import (
    BertForPreTraining,
    trainer,
)
from bertjax.interop.pretrained import PretrainedSource
from bertjax.objectives import distill

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(args, variant: str, seed: int = 0):
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "distilbert.py"))
    config.seed = seed
    config.num_train_steps = config.optim.total_steps = args.steps
    config.eval_every = config.checkpoint_every = args.steps
    config.progress_bar = False
    config.data.tokenizer_model = os.path.join(args.teacher, "tokenizer", "spm.model")
    teacher_cfg = PretrainedSource(args.teacher, "--teacher").model_config()
    for key in ("hidden_size", "num_attention_heads", "intermediate_size"):
        config.model[key] = getattr(teacher_cfg, key)
    config.model.num_hidden_layers = args.student_layers
    if variant.startswith("distilled"):
        config.loss.teacher = args.teacher
        config.loss.restrict_ce_to_mask = variant == "distilled_masked_kl"
    else:  # plain MLM on the same student; "teacher_init" still starts from teacher layers
        config.loss.teacher = args.teacher if variant == "teacher_init" else ""
        config.loss.alpha_ce = config.loss.alpha_cos = 0.0
        config.loss.alpha_mlm = 1.0
    return config, teacher_cfg


def _summary(workdir: str, steps: int):
    """Final held-out MLM metrics and mean train steps/s from a run's metrics.jsonl (None:
    unfinished)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(line) for line in open(path)]
    final = [r for r in rows if r["step"] == steps and "eval/mlm_accuracy" in r]
    speeds = [r["perf/steps_per_second"] for r in rows if "perf/steps_per_second" in r]
    if not final:
        return None
    return {
        "eval_mlm_accuracy": final[-1]["eval/mlm_accuracy"],
        "eval_mlm_loss": final[-1]["eval/mlm_loss"],
        "train_steps_per_s": sum(speeds) / len(speeds),
    }


def _run(args, variant: str, seed: int) -> dict:
    config, _ = _config(args, variant, seed)
    workdir = os.path.join(args.workdir, f"{variant}_seed{seed}")
    if args.reuse and _summary(workdir, args.steps):
        return _summary(workdir, args.steps)
    shutil.rmtree(workdir, ignore_errors=True)
    if variant == "mlm_only":  # no teacher at all: plain MLM (the NSP head is built but weighted 0)
        with config.loss.unlocked():
            for key in distill.Distillation.extra_config_keys:
                del config.loss[key]
        config.loss.objective, config.loss.nsp_weight = "pretraining", 0.0
    trainer.train_and_evaluate(config, workdir)
    return _summary(workdir, args.steps)


def _forward_speed(cfg, batch: int, length: int, preds: int, repeats: int = 20) -> float:
    """Forward passes per second of BertForPreTraining(cfg) at [batch, length]."""
    model = BertForPreTraining(cfg, next_sentence=False)
    ids = jnp.ones((batch, length), jnp.int32)
    positions = jnp.zeros((batch, preds), jnp.int32)
    params = model.init(jax.random.key(0), ids, None, None, None, positions)["params"]
    fn = jax.jit(
        lambda p, i: model.apply({"params": p}, i, None, None, None, positions)["mlm_logits"]
    )
    fn(params, ids).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(params, ids).block_until_ready()
    return repeats / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--teacher", default="/tmp/default_run", help="bertjax workdir of the teacher"
    )
    parser.add_argument("--workdir", default="/tmp/distill_compare")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--student_layers", type=int, default=1)
    parser.add_argument("--init_only", action="store_true", help="also run teacher_init (MLM only)")
    parser.add_argument("--masked_kl", action="store_true", help="also the masked-only KL")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, one run each")
    parser.add_argument("--reuse", action="store_true", help="keep variants already run to --steps")
    args = parser.parse_args()
    variants = ["distilled", "mlm_only"]
    variants += (["distilled_masked_kl"] if args.masked_kl else []) + (
        ["teacher_init"] if args.init_only else []
    )
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {}
    for variant in variants:
        runs = [_run(args, variant, seed) for seed in seeds]
        summary = {"runs": runs}
        for key in ("eval_mlm_accuracy", "eval_mlm_loss"):
            values = [r[key] for r in runs]
            summary[key] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
        results[variant] = summary
    config, teacher_cfg = _config(args, "distilled")
    student_cfg = teacher_cfg.replace(num_hidden_layers=args.student_layers)
    length, preds = int(config.data.max_seq_length), int(config.data.max_predictions)
    teacher_fps = _forward_speed(teacher_cfg, int(config.batch_size), length, preds)
    student_fps = _forward_speed(student_cfg, int(config.batch_size), length, preds)
    results["forward_per_s"] = {
        "teacher": teacher_fps,
        "student": student_fps,
        "speedup": student_fps / teacher_fps,
    }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
