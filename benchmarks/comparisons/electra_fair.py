"""The fair ELECTRA-tiny vs MLM comparison behind ``benchmarks/comparisons/electra_compare.py --only
fair``.

What makes it fair (issue 38), against the 2026-12-01 entry of docs/results/comparisons.md:
- rows made the same way and equal tokens per step: both arms read ``full_sentences`` rows
  (contiguous text packed to the full T=128, no padding, no sentence pairs) at the same batch, so
  every step sees B x 128 real tokens; the MLM arm is bert_tiny's MLM without NSP (NSP needs
  pairs), each arm keeps its own masking (bert_tiny 30% / 40 slots, ELECTRA 15% / 20);
- each objective's own learning rate: a small sweep (``--lrs``, ``--sweep-steps``, seed 0) picks
  the MLM arm's by held-out MLM accuracy and the ELECTRA arm's by held-out RTD AUC;
- the fixed head: both encoders fine-tune with ELECTRA's head (``--head first``: first token ->
  classifier, no untrained pooler in either), dev accuracy at the end of training (one
  evaluation), median and range over seeds;
- budgets: ``--steps`` for one long run per arm, ``--short-steps`` for ``--seeds`` seeds.

Diagnostics (each an option on the ELECTRA arm): ``--generator-warmup N`` trains the generator
alone (discriminator weight 0) for the first N steps; ``--width-ratio`` sets the generator's width
fraction (ELECTRA: 1/4 to 1/2); ``--neighbour-init off`` drops layer 0's neighbour-attention init
from the discriminator. Each run also reports, on held-out original rows: the share of layer 0's
attention on the left and right neighbour, the mean cosine between the final layer's token
outputs in a row, and for ELECTRA the RTD loss against the entropy of the replaced fraction (the
loss of a discriminator that only knows the prior).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics

import jax.numpy as jnp
import numpy as np

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.interop.pretrained import PretrainedSource
from bertjax.training.run_config import model_config

ARMS = ("mlm", "electra")


def _recipe(name: str):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return trainer.load_config_file(os.path.join(root, "configs", f"{name}.py"))


def arm_config(arm: str, args, lr: float, steps: int, seed: int):
    """The pretraining config of one arm (module docstring), at ``lr`` for ``steps``."""
    if arm == "mlm":
        config = _recipe("bert_tiny")  # full_sentences rows: no NSP head (no pairs)
    else:
        config = _recipe("electra_tiny")
        config.loss.generator_hidden_size = float(args.width_ratio)
        if args.neighbour_init == "off":
            config.model.local_attention_offsets = ()
    config.data.sample_plan = "full_sentences"
    config.seed = int(seed)
    config.batch_size = config.optim.base_batch_size = int(args.batch)
    config.optim.learning_rate = float(lr)
    config.num_train_steps = config.optim.total_steps = int(steps)
    config.optim.warmup_steps = min(100, steps // 10)
    config.log_every = min(config.log_every, max(1, steps // 6))
    every = max(1, steps // 6 // config.log_every) * config.log_every
    config.eval_every = config.checkpoint_every = every
    config.progress_bar = False
    return config


def pretrain(config, workdir: str, prepared: str, generator_warmup: int = 0) -> dict:
    """Trains ``config`` in a fresh ``workdir`` (tokenizer and store copied from ``prepared``);
    with ``generator_warmup`` an ELECTRA run first trains N steps with discriminator weight 0,
    then resumes with the configured weight (the LR schedule spans the whole run)."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    for part in ("tokenizer", "store"):
        if prepared and os.path.isdir(os.path.join(prepared, part)):
            shutil.copytree(os.path.join(prepared, part), os.path.join(workdir, part))
    if generator_warmup and config.loss.objective == "electra":
        warm = config.copy_and_resolve_references()
        warm.loss.discriminator_weight = 0.0
        warm.num_train_steps = int(generator_warmup)
        trainer.train_and_evaluate(warm, workdir)
    return trainer.train_and_evaluate(config, workdir)


def selection_metric(arm: str, summary: dict) -> float:
    """What the LR sweep maximises: held-out MLM accuracy (MLM arm), RTD AUC (ELECTRA arm)."""
    return float(summary["eval/mlm_accuracy" if arm == "mlm" else "eval/rtd_auc"])


def finetune(init_from: str, seed: int, steps: int, head: str, workdir: str) -> float:
    """configs/finetune_glue.py from ``init_from`` with ``head``; dev accuracy at the end."""
    config = _recipe("finetune_glue")
    config.init_from, config.seed = init_from, int(seed)
    config.task.classifier_pooling = head
    if steps:
        config.num_train_steps = config.optim.total_steps = int(steps)
    config.eval_every = config.num_train_steps  # one evaluation, after the last step
    config.progress_bar = False
    shutil.rmtree(workdir, ignore_errors=True)
    return float(trainer.train_and_evaluate(config, workdir)["eval/accuracy"])


def _original_rows(config, workdir: str, batches: int = 2) -> tuple[list[dict], object]:
    """Held-out rows with the masked tokens put back (the text as written), and the tokenizer."""
    data = make_pipeline(config, workdir)
    out = []
    for batch in data.eval_batches(batches):
        ids, valid = batch["input_ids"].copy(), batch["masked_weights"] > 0
        rows = np.nonzero(valid)[0]
        ids[rows, batch["masked_positions"][valid]] = batch["masked_ids"][valid]
        out.append({**batch, "input_ids": ids})
    tokenizer = data.tokenizer
    data.close()
    return out, tokenizer


def neighbour_share(cfg, params: dict, batch: dict) -> float:
    """Mean attention mass layer 0's heads put on the left and right neighbour (interior real
    tokens; post-LN BERT: LayerNorm of the summed embeddings, then Q, K; nan for embeddings
    projected to another width)."""
    if "projection" in params["embeddings"]:
        return float("nan")
    tables = params["embeddings"]
    emb = {k: np.asarray(v, np.float64) for k, v in tables.items() if k != "layer_norm"}
    norm = {k: np.asarray(v, np.float64) for k, v in params["embeddings"]["layer_norm"].items()}
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    length = ids.shape[1]
    x = emb["word_embeddings"][ids] + emb["position_embeddings"][None, :length]
    if "token_type_embeddings" in emb:
        x = x + emb["token_type_embeddings"][types]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + cfg.layer_norm_eps)
    x = x * norm["scale"] + norm["bias"]
    attention = {
        k: np.asarray(v, np.float64) for k, v in params["encoder"]["layer_0"]["attention"].items()
    }
    q = np.einsum("btd,dnh->btnh", x, attention["query_kernel"]) + attention["query_bias"]
    k = np.einsum("btd,dnh->btnh", x, attention["key_kernel"]) + attention["key_bias"]
    scores = np.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask[:, None, None, :] > 0, scores, -1e30)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    t = np.arange(1, length - 1)
    share = probs[:, :, t, t - 1] + probs[:, :, t, t + 1]  # [B, N, T-2]
    interior = (mask[:, :-2] * mask[:, 1:-1] * mask[:, 2:]) > 0
    return float(share.mean(1)[interior].mean())


def output_cosine(cfg, params: dict, batch: dict) -> float:
    """Mean cosine between different real tokens' final-layer outputs within a row."""
    import bertjax

    x, _ = bertjax.BertModel(cfg, add_pooler=False).apply(
        {"params": params},
        jnp.asarray(batch["input_ids"]),
        jnp.asarray(batch["token_type_ids"]),
        jnp.asarray(batch["attention_mask"]),
    )
    x = np.asarray(x, np.float64)
    x /= np.linalg.norm(x, axis=-1, keepdims=True) + 1e-12
    values = []
    for row, mask in zip(x, batch["attention_mask"] > 0):
        real = row[mask]
        gram = real @ real.T
        n = len(real)
        values.append((gram.sum() - np.trace(gram)) / max(1, n * (n - 1)))
    return float(np.mean(values))


def diagnostics(arm: str, config, workdir: str, summary: dict) -> dict:
    """The module docstring's per-run diagnostics of the run in ``workdir``."""
    rows, tokenizer = _original_rows(config, workdir)
    cfg = model_config(config, tokenizer)
    params = PretrainedSource(workdir, "diagnostics").params()["bert"]
    out = {
        "neighbour_share": float(np.mean([neighbour_share(cfg, params, b) for b in rows])),
        "output_cosine": float(np.mean([output_cosine(cfg, params, b) for b in rows])),
    }
    if arm == "electra":
        p = float(summary["eval/replaced_fraction"])
        out["rtd_loss"] = float(summary["eval/rtd_loss"])
        out["prior_entropy"] = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    return out


def fair_comparison(args) -> list[str]:
    """Sweep, long runs, short seeded runs, fine-tuning and diagnostics; the report's lines."""
    root, prepared = args.root, args.prepared
    lines = [
        f"Rows: full_sentences (T=128 real tokens) for both arms, B={args.batch}; MLM arm = "
        "bert_tiny without NSP (30% masking), ELECTRA arm = electra_tiny (15%, generator width "
        f"{args.width_ratio}, neighbour init {args.neighbour_init}, generator-only warm-up "
        f"{args.generator_warmup} steps); fine-tuning head {args.head!r}, dev accuracy at the end.",
        "",
        f"LR sweep ({args.sweep_steps} steps, seed 0; MLM by held-out MLM accuracy, ELECTRA by "
        "held-out RTD AUC):",
        "",
        "| arm | LR | selection metric |",
        "|---|---|---|",
    ]
    best = {}
    for arm in ARMS:
        scores = {}
        for lr in args.lrs:
            workdir = os.path.join(root, f"sweep_{arm}_{lr:g}")
            config = arm_config(arm, args, lr, args.sweep_steps, 0)
            summary = pretrain(config, workdir, prepared, args.generator_warmup * (arm != "mlm"))
            prepared = prepared or workdir
            scores[lr] = selection_metric(arm, summary)
            lines.append(f"| {arm} | {lr:g} | {scores[lr]:.3f} |")
        best[arm] = max(scores, key=scores.get)
    lines += ["", f"Chosen LRs: {best}", ""]
    header = (
        "| arm | budget | seed | MLM acc | RTD acc (all-original) | RTD AUC | RTD loss (prior) "
        "| neighbour share | output cosine | fine-tuned dev acc (median, range) |"
    )
    lines += [header, "|---|---|---|---|---|---|---|---|---|---|"]
    budgets = [(args.steps, [0])] if args.steps else []
    budgets += [(args.short_steps, args.seeds)] if args.short_steps else []
    for steps, seeds in budgets:
        for arm in ARMS:
            for seed in seeds:
                workdir = os.path.join(root, f"{arm}_{steps}_seed{seed}")
                config = arm_config(arm, args, best[arm], steps, seed)
                warmup = args.generator_warmup * (arm != "mlm")
                summary = pretrain(config, workdir, prepared, warmup)
                diag = diagnostics(arm, config, workdir, summary)
                accuracy = [
                    finetune(workdir, s, args.finetune_steps, args.head, f"{workdir}_ft{s}")
                    for s in args.finetune_seeds
                ]
                rtd = "-"
                if arm == "electra":
                    all_original = 1 - summary["eval/replaced_fraction"]
                    rtd = f"{summary['eval/rtd_accuracy']:.3f} ({all_original:.3f})"
                auc = f"{summary['eval/rtd_auc']:.3f}" if arm == "electra" else "-"
                loss = "-"
                if "rtd_loss" in diag:
                    loss = f"{diag['rtd_loss']:.3f} ({diag['prior_entropy']:.3f})"
                lines.append(
                    f"| {arm} | {steps} | {seed} | {summary['eval/mlm_accuracy']:.3f} | {rtd} | "
                    f"{auc} | {loss} | {diag['neighbour_share']:.2f} | "
                    f"{diag['output_cosine']:.2f} | {statistics.median(accuracy):.3f} "
                    f"({min(accuracy):.3f}-{max(accuracy):.3f}) |"
                )
                with open(os.path.join(workdir, "fair_result.json"), "w") as f:
                    json.dump({"summary": summary, "diagnostics": diag, "finetune": accuracy}, f)
                print(lines[-1], flush=True)
    return lines


def add_arguments(parser) -> None:
    """The fair comparison's options (electra_compare.py's parser)."""
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--lrs", type=floats, default=[5e-4, 1.4e-3, 3e-3], help="LR sweep")
    parser.add_argument("--sweep-steps", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=20000, help="the long run (0: none)")
    parser.add_argument("--short-steps", type=int, default=3000, help="the seeded runs (0: none)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--finetune-seeds", type=ints, default=[0, 1, 2])
    parser.add_argument("--head", default="first", choices=("first", "pooler", "electra_hf"))
    parser.add_argument("--generator-warmup", type=int, default=0)
    parser.add_argument("--width-ratio", type=float, default=0.25)
    parser.add_argument("--neighbour-init", default="on", choices=("on", "off"))
