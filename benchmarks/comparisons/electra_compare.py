"""ELECTRA-tiny vs the MLM default (configs/bert_tiny.py): step cost, a fair pretraining and
fine-tuning comparison (benchmarks/comparisons/electra_fair.py), and a probe of the discriminator
alone.

  # the full comparison
  flock /tmp/bertjax-heavy.lock python benchmarks/comparisons/electra_compare.py
  python benchmarks/comparisons/electra_compare.py --only steps --no-record  # the step table alone
  python benchmarks/comparisons/electra_compare.py --only fair --lrs 1e-3 --sweep-steps 30 \
      --steps 0 --short-steps 30 --seeds 0 --finetune-seeds 0 --finetune-steps 10 \
      --no-record  # smoke

1. Step cost, one process, interleaved rounds on one device: the MLM step of bert_tiny (MLM at
   40 of 128 positions + NSP), the ELECTRA step of electra_tiny (generator MLM at 20 positions,
   discriminator at every token), the generator's MLM step alone, and beside them HF
   transformers' PyTorch ELECTRA pair (ElectraForMaskedLM + ElectraForPreTraining sharing the
   embeddings, the same sizes; its MLM head at every position), B=16, T=128, vocab 8000.
2. The fair comparison (benchmarks/comparisons/electra_fair.py): equal tokens per step and rows made
the same
   way, each objective's LR from a small sweep, ELECTRA's fine-tuning head for both encoders and
   end-of-training dev accuracy; one long run per arm (--steps) and --seeds at --short-steps;
   diagnostics --generator-warmup, --width-ratio, --neighbour-init.
3. Probe: the discriminator alone on fakes drawn from unigram frequencies, from a random init and
   from the MLM arm's seed-0 short run's encoder (does replaced-token detection get off the
   ground at this scale?).

Appends the tables to docs/results/comparisons.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import types

import jax
import numpy as np

# step_throughput is a step benchmark (benchmarks/step/), this one's neighbour topic
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(BENCHMARKS, "step"))
from electra_fair import add_arguments, fair_comparison  # noqa: E402
from step_throughput import single_device_state  # noqa: E402

from bertjax import step, trainer  # noqa: E402
from bertjax.training import metrics as metrics_lib  # noqa: E402
from bertjax.training.run_config import model_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH, LENGTH, VOCAB = 16, 128, 8000
ELECTRA_LOSS = dict(
    objective="electra", discriminator_weight=50.0, generator_hidden_size=0.25, generator_layers=1.0
)
# The special-token ids of bertjax's SentencePiece models (BertConfig's defaults).
TOKENIZER = types.SimpleNamespace(
    vocab_size=VOCAB, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4
)


def recipe(name: str):
    return trainer.load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))


def synthetic_batch(predictions: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, LENGTH), predictions, False) for _ in range(BATCH)]), 1
    ).astype(np.int32)
    return {
        "input_ids": ids,
        "token_type_ids": np.zeros((BATCH, LENGTH), np.int32),
        "attention_mask": np.ones((BATCH, LENGTH), np.int32),
        "masked_positions": positions,
        "masked_ids": np.take_along_axis(ids, positions, 1),
        "masked_weights": np.ones((BATCH, predictions), np.float32),
        "next_sentence_label": rng.integers(0, 2, BATCH).astype(np.int32),
    }


def bertjax_step(cfg, loss: dict, predictions: int):
    """(run one step, FLOPs per step) of bertjax's jitted step for ``cfg`` under ``loss``."""
    batch = synthetic_batch(predictions)
    if loss.get("objective") == "electra" or loss.get("next_sentence") is False:
        batch.pop("next_sentence_label")
    state, mesh, device_batch = single_device_state(cfg, batch, loss)
    train, _ = step.jit_steps(state, mesh)
    holder, rng = [state], jax.random.key(1)

    def run():
        holder[0], metrics = train(holder[0], device_batch, rng)
        metrics["loss"].block_until_ready()

    objective = state.spec.objective
    flops = BATCH * objective.train_flops_per_sequence(
        cfg, LENGTH, predictions, predictions, metrics_lib.train_flops_per_sequence
    )
    return run, flops


def hf_electra_step(cfg, generator_cfg, predictions: int):
    """HF transformers' ELECTRA pair in PyTorch: the generator's MLM loss (logits at every
    position, labels at the masked ones), a multinomial sample, 50 x BCE of the discriminator
    on the corrupted input, AdamW over both; the embeddings are one module."""
    import torch
    import transformers

    torch.manual_seed(0)

    def electra_config(c):
        return transformers.ElectraConfig(
            vocab_size=VOCAB,
            embedding_size=cfg.embedding_dim,
            hidden_size=c.hidden_size,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            intermediate_size=c.intermediate_size,
            max_position_embeddings=c.max_position_embeddings,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="sdpa",
        )

    disc = transformers.ElectraForPreTraining(electra_config(cfg)).train()
    gen = transformers.ElectraForMaskedLM(electra_config(generator_cfg)).train()
    gen.electra.embeddings = disc.electra.embeddings  # shared tables and LayerNorm
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    params = list({id(p): p for m in (disc, gen) for p in m.parameters()}.values())
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    batch = synthetic_batch(predictions)
    original = torch.tensor(batch["input_ids"], dtype=torch.long)
    rows = torch.arange(BATCH)[:, None]
    positions = torch.tensor(batch["masked_positions"], dtype=torch.long)
    masked = original.clone()
    masked[rows, positions] = TOKENIZER.mask_id
    labels = torch.full_like(original, -100)
    labels[rows, positions] = original[rows, positions]
    types_ = torch.zeros_like(original)
    mask = torch.ones_like(original)

    def run():
        optimizer.zero_grad(set_to_none=True)
        out = gen(input_ids=masked, token_type_ids=types_, attention_mask=mask, labels=labels)
        with torch.no_grad():
            probs = torch.softmax(out.logits[rows, positions].reshape(-1, VOCAB), -1)
            sampled = torch.multinomial(probs, 1).reshape(BATCH, -1)
        corrupted = original.clone()
        corrupted[rows, positions] = sampled
        logits = disc(input_ids=corrupted, token_type_ids=types_, attention_mask=mask).logits
        fake = (corrupted != original).float()
        bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, fake)
        (out.loss + 50.0 * bce).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return run


def step_costs(args) -> tuple[list[str], dict]:
    """The step table and {name: median seconds}."""
    mlm_cfg = model_config(recipe("bert_tiny"), TOKENIZER)
    electra_cfg = model_config(recipe("electra_tiny"), TOKENIZER)
    objective = step.StepSpec.from_config(_loss_config(), electra_cfg).objective
    generator_cfg = objective.generator_cfg(electra_cfg)
    variants = {
        "MLM step (bert_tiny: MLM at 40 + NSP)": bertjax_step(mlm_cfg, {}, 40),
        "ELECTRA step (electra_tiny: generator MLM at 20, RTD at 128)": bertjax_step(
            electra_cfg, ELECTRA_LOSS, 20
        ),
        "its generator alone (MLM at 20)": bertjax_step(
            generator_cfg, {"next_sentence": False}, 20
        ),
    }
    runs = {name: run for name, (run, _) in variants.items()}
    if not args.no_hf:
        runs["HF PyTorch ELECTRA pair (same sizes)"] = hf_electra_step(
            electra_cfg, generator_cfg, 20
        )
    times = {name: [] for name in runs}
    for run in runs.values():  # compile / warm up
        run(), run()
    for _ in range(args.rounds):  # interleaved, so drift hits every variant alike
        for name, run in runs.items():
            for _ in range(args.steps_per_round):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    peak = metrics_lib.peak_flops(0.0)
    medians = {name: statistics.median(t) for name, t in times.items()}
    mlm = next(iter(medians.values()))
    lines = [
        f"B={BATCH}, T={LENGTH}, vocab {VOCAB}, AdamW, one device; {args.rounds} interleaved "
        f"rounds of {args.steps_per_round} steps; peak {peak / 1e9:.0f} GFLOP/s (measured)",
        "",
        "| step | median ms | p10-p90 ms | GFLOP/step | MFU | vs MLM step |",
        "|---|---|---|---|---|---|",
    ]
    for name, median in medians.items():
        flops = variants[name][1] if name in variants else None
        p10, p90 = np.percentile(times[name], [10, 90]) * 1e3
        lines.append(
            f"| {name} | {median * 1e3:.0f} | {p10:.0f}-{p90:.0f} | "
            f"{'-' if flops is None else f'{flops / 1e9:.1f}'} | "
            f"{'-' if flops is None else f'{flops / median / peak:.1%}'} | "
            f"{median / mlm:.2f}x |"
        )
    electra = list(medians.values())[1]
    generator = list(medians.values())[2]
    flops = [f for _, f in variants.values()]
    lines += [
        "",
        f"Generator's share of the ELECTRA step: {generator / electra:.0%} of its time (its MLM "
        f"step alone), {flops[2] / flops[1]:.0%} of its FLOPs.",
    ]
    return lines, {"mlm": mlm, "electra": electra}


def _loss_config():
    config = step.default_step_config()
    config.loss.update(ELECTRA_LOSS)
    return config


def probe(args) -> list[str]:
    """The discriminator alone (ElectraDiscriminator, AdamW 1e-3, the recipe's batches) on fakes
    drawn from the corpus' unigram frequencies at the masked positions, from a random init and
    from the MLM arm's encoder: held-out AUC every 100 steps. Needs the comparison's workdirs."""
    import flax.linen as nn
    import jax.numpy as jnp
    import optax

    import bertjax
    from bertjax.data import make_pipeline
    from bertjax.interop.pretrained import PretrainedSource
    from bertjax.objectives.electra import auc_from_histograms, auc_histograms

    mlm_dir, electra_dir = (
        os.path.join(args.root, f"{arm}_{args.short_steps}_seed0") for arm in ("mlm", "electra")
    )
    config = recipe("electra_tiny")
    data = make_pipeline(config, electra_dir)
    cfg = model_config(config, data.tokenizer)
    model = bertjax.ElectraDiscriminator(cfg)
    prior = np.exp(data.unigram_log_prior())
    prior /= prior.sum()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, eps=1e-6))

    def corrupt(batch, rng):
        ids, valid = batch["input_ids"].copy(), batch["masked_weights"] > 0
        rows, positions = np.nonzero(valid)[0], batch["masked_positions"][valid]
        ids[rows, positions] = batch["masked_ids"][valid]
        original = ids.copy()
        ids[rows, positions] = rng.choice(len(prior), len(rows), p=prior)
        return ids, (ids != original).astype(np.float32)

    def loss(params, ids, batch, labels):
        logits = model.apply(
            {"params": params}, ids, batch["token_type_ids"], batch["attention_mask"]
        )
        weights = batch["attention_mask"].astype(jnp.float32)
        bce = jnp.logaddexp(0.0, logits["rtd_logits"]) - labels * logits["rtd_logits"]
        return jnp.sum(bce * weights) / jnp.sum(weights), logits["rtd_logits"]

    @jax.jit
    def train(params, opt, ids, batch, labels):
        grads = jax.grad(lambda p: loss(p, ids, batch, labels)[0])(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    @jax.jit
    def auc(params, ids, batch, labels):
        logits = loss(params, ids, batch, labels)[1]
        weights = batch["attention_mask"].astype(jnp.float32)
        return auc_from_histograms(*auc_histograms(logits, labels, weights))

    held_out = [
        corrupt(b, np.random.default_rng(i)) + (b,) for i, b in enumerate(data.eval_batches(4))
    ]
    fresh = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
    encoder = {k: v for k, v in PretrainedSource(mlm_dir, "mlm").params()["bert"].items()}
    encoder.pop("pooler", None)
    starts = {"random init": fresh, "MLM run's encoder": {**fresh, "bert": encoder}}
    lines = [
        f"Probe: the discriminator alone on unigram-frequency fakes ({args.probe_steps} steps, "
        "AdamW 1e-3), held-out AUC:",
        "",
        "| start | " + " | ".join(str(s) for s in range(100, args.probe_steps + 1, 100)) + " |",
        "|---|" + "---|" * (args.probe_steps // 100),
    ]
    for name, params in starts.items():
        params = jax.tree.map(jnp.asarray, params)
        opt, rng, row = tx.init(params), np.random.default_rng(0), []
        for index in range(args.probe_steps):
            batch = data.batch(index)
            ids, labels = corrupt(batch, rng)
            params, opt = train(params, opt, ids, batch, labels)
            if (index + 1) % 100 == 0:
                row.append(np.mean([float(auc(params, i, b, lab)) for i, lab, b in held_out]))
        lines.append(f"| {name} | " + " | ".join(f"{a:.3f}" for a in row) + " |")
    data.close()
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("steps", "fair", "probe"), default=None)
    parser.add_argument("--probe-steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=6)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--finetune-steps", type=int, default=0, help="0: the config's 600")
    add_arguments(parser)
    parser.add_argument("--root", default="/tmp/electra_compare")
    parser.add_argument("--prepared", default="", help="a bert_tiny workdir's tokenizer/, store/")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    start = time.time()
    lines = []
    if args.only in (None, "steps"):
        step_lines, _ = step_costs(args)
        lines += step_lines
        print("\n".join(step_lines), flush=True)
    if args.only in (None, "fair"):
        more = fair_comparison(args)
        lines += [""] + more
        print("\n".join(more), flush=True)
    if args.only in (None, "probe"):
        more = probe(args)
        lines += [""] + more
        print("\n".join(more), flush=True)
    print(f"\n({(time.time() - start) / 60:.1f} min)")
    if not args.no_record:
        command = "python benchmarks/comparisons/electra_compare.py " + " ".join(sys.argv[1:])
        with open(os.path.join(ROOT, "docs", "results", "comparisons.md"), "a") as f:
            f.write(
                f"\n### {datetime.date.today()} — ELECTRA-tiny vs MLM, fair comparison "
                f"(`{command.strip()}`)\n\n" + "\n".join(lines) + "\n"
            )


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
