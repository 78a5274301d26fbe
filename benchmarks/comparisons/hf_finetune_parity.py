"""Fine-tuning a Hugging Face directory: bertjax (``init_from``) beside transformers' PyTorch.

  # a `python train.py` run
  python benchmarks/comparisons/hf_finetune_parity.py --pretrained=/tmp/default_run

The default run's checkpoint is exported with `to_hf` (weights, config.json and its SentencePiece
model as spiece.model): an HF directory as a user would have it. bertjax fine-tunes it with
configs/finetune_glue.py through ``--config.init_from``; transformers' BertForSequenceClassification
fine-tunes the same directory on the very same encoded rows (bertjax's TaskData: same examples,
length, batch, order), from the same initial classifier, with the same optimizer arithmetic (AdamW
with decoupled weight decay on kernels and embeddings only, eps 1e-6, global-norm clipping 1.0,
the same learning rate at every step), dropout off on both sides and layer-wise LR decay off (the
PyTorch side has no equivalent). Prints the dev accuracy of both (stdlib_families dev: 1077
examples) after the same number of steps, and how many dev examples the two label differently
(bertjax's from WORKDIR/best/dev_predictions.tsv), as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import jax
import numpy as np

from bertjax import convert, trainer
from bertjax import step as step_lib
from bertjax.interop.checkpoints import CheckpointReader
from bertjax.objectives import make_objective
from bertjax.training import sharding
from bertjax.training.run_config import resolve_paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def export(pretrained: str, directory: str) -> str:
    """The pretrained run as an HF directory with its tokenizer."""
    reader = CheckpointReader(pretrained, "--pretrained")
    params = reader.params()
    tokenizer = reader.write_tokenizer(os.path.join(directory, ".tokenizer"))
    convert.to_hf(reader.model_config(), params, directory, tokenizer_file=tokenizer)
    return directory


def finetune_config(hf_dir: str, steps: int, seed: int):
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "finetune_glue.py"))
    config.init_from = hf_dir
    config.seed = seed
    config.num_train_steps = config.optim.total_steps = steps
    config.optim.layerwise_lr_decay = 1.0
    config.eval_every = steps
    config.progress_bar = False
    return resolve_paths(config)


def bertjax_run(config, workdir: str) -> tuple[float, float]:
    """(dev accuracy after the last step, seconds)."""
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    summary = trainer.train_and_evaluate(config, workdir)
    return summary["eval/accuracy"], time.perf_counter() - start


def torch_run(config, hf_dir: str, workdir: str) -> tuple[float, float, list[str]]:
    """transformers' PyTorch fine-tuning of the same directory on bertjax's own rows:
    (dev accuracy, seconds, the predicted label of every dev example in order)."""
    import torch
    import transformers

    torch.manual_seed(config.seed)
    objective = make_objective(config)
    data = objective.make_data(config, workdir)
    model_cfg = data.model_config()
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    state = step_lib.init_train_state(config, model_cfg, mesh, jax.random.key(config.seed))
    classifier = jax.device_get(state.params["classifier"])  # bertjax's initial classifier
    model = transformers.BertForSequenceClassification.from_pretrained(
        hf_dir,
        num_labels=config.loss.num_labels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
    )
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor(np.asarray(classifier["kernel"]).T))
        model.classifier.bias.copy_(torch.tensor(np.asarray(classifier["bias"])))
    decay = [
        p for n, p in model.named_parameters() if not n.endswith("bias") and "LayerNorm" not in n
    ]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optim = config.optim
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": optim.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=0.0,
        betas=(optim.b1, optim.b2),
        eps=optim.eps,
    )
    schedule = state.learning_rate_fn  # bertjax's LR at every step
    model.train()
    start = time.perf_counter()
    for step in range(config.num_train_steps):
        batch = {k: torch.tensor(np.asarray(v)) for k, v in data.batch(step).items()}
        logits = model(
            input_ids=batch["input_ids"].long(),
            token_type_ids=batch["token_type_ids"].long(),
            attention_mask=batch["attention_mask"].long(),
        ).logits
        nll = torch.nn.functional.cross_entropy(logits, batch["labels"].long(), reduction="none")
        weights = batch["label_weights"]
        loss = (nll * weights).sum() / weights.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_norm)
        for group in optimizer.param_groups:
            group["lr"] = float(schedule(step))
        optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    correct = total = 0.0
    predicted = []
    with torch.no_grad():
        for rows in data.eval_batches(0):
            logits = model(
                input_ids=torch.tensor(rows["input_ids"]).long(),
                token_type_ids=torch.tensor(rows["token_type_ids"]).long(),
                attention_mask=torch.tensor(rows["attention_mask"]).long(),
            ).logits.numpy()
            hits = (logits.argmax(-1) == rows["labels"]) * rows["label_weights"]
            real = rows["label_weights"] > 0
            predicted += [data.labels[int(p)] for p in logits.argmax(-1)[real]]
            correct += float(hits.sum())
            total += float(rows["label_weights"].sum())
    data.close()
    return correct / total, seconds, predicted


def bertjax_predictions(workdir: str) -> list[str]:
    """The predicted column of bertjax's WORKDIR/best/dev_predictions.tsv (dev order)."""
    with open(os.path.join(workdir, "best", "dev_predictions.tsv"), encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        column = header.index("predicted")
        return [line.rstrip("\n").split("\t")[column] for line in f]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", default="/tmp/default_run")
    parser.add_argument("--workdir", default="/tmp/hf_finetune_parity")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    hf_dir = export(args.pretrained, os.path.join(args.workdir, "hf"))
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        config = finetune_config(hf_dir, args.steps, seed)
        our_dir = os.path.join(args.workdir, f"bertjax_{seed}")
        ours, our_s = bertjax_run(config, our_dir)
        theirs, their_s, their_pred = torch_run(
            config, hf_dir, os.path.join(args.workdir, f"torch_{seed}")
        )
        our_pred = bertjax_predictions(our_dir)
        if len(our_pred) != len(their_pred):
            raise SystemExit(f"{len(our_pred)} bertjax vs {len(their_pred)} torch dev predictions")
        differ = sum(a != b for a, b in zip(our_pred, their_pred))
        rows.append((seed, ours, theirs, differ, len(our_pred)))
        print(
            f"seed {seed}: bertjax {ours:.4f} ({our_s:.0f} s), transformers {theirs:.4f} "
            f"({their_s:.0f} s), {differ} of {len(our_pred)} dev predictions differ",
            flush=True,
        )
    print(
        "\n| seed | bertjax dev accuracy | transformers (PyTorch) dev accuracy | difference "
        "| dev predictions that differ |"
    )
    print("|---|---|---|---|---|")
    for seed, ours, theirs, differ, n in rows:
        print(f"| {seed} | {ours:.4f} | {theirs:.4f} | {ours - theirs:+.4f} | {differ} of {n} |")
    diffs = [ours - theirs for _, ours, theirs, _, _ in rows]
    print(
        f"\nmedian difference {np.median(diffs):+.4f}, range {min(diffs):+.4f} .. {max(diffs):+.4f}"
    )


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
