"""Train-step throughput of bertjax beside Hugging Face transformers' PyTorch BertForPreTraining.

Same model sizes, batch, masked positions (full-length rows, 15% masked), NSP and AdamW on
both sides, measured in one run. bertjax runs its real jitted, donated step from
`bertjax.step`; the HF side is the plain PyTorch training loop most people run (its MLM head
computes logits at every position, bertjax's only at the masked ones). MFU is against the
matmul peak measured in this run (or the datasheet peak of a known accelerator).

  python benchmarks/step/step_throughput.py  # tiny, mini, small at T=128 and 512
  python benchmarks/step/step_throughput.py --sizes base --lengths 128 --batch 8
  python benchmarks/step/step_throughput.py --variants            # fast paths on/off for one size
  python benchmarks/step/step_throughput.py --sizes mini --bf16-matmuls  # + bf16-product rows (CPU)
  # accelerators
  python benchmarks/step/step_throughput.py --no-hf --dtype bfloat16 --attention cudnn

Appends the table to docs/results/step.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import sys
import time

import jax
import numpy as np

import bertjax
from bertjax import step
from bertjax.training import metrics as metrics_lib
from bertjax.training import sharding

VOCAB = 30522
FULL = {"sparse_last_layer": False}  # config.loss of a step whose last layer computes every row


def synthetic_batch(batch: int, length: int, predictions: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, (batch, length)).astype(np.int32)
    positions = np.sort(
        np.stack(
            [rng.choice(np.arange(1, length), predictions, replace=False) for _ in range(batch)]
        ),
        axis=1,
    ).astype(np.int32)
    return {
        "input_ids": ids,
        "token_type_ids": (np.arange(length) >= length // 2)
        .astype(np.int32)[None]
        .repeat(batch, 0),
        "attention_mask": np.ones((batch, length), np.int32),
        "masked_positions": positions,
        "masked_ids": np.take_along_axis(ids, positions, 1),
        "masked_weights": np.ones((batch, predictions), np.float32),
        "next_sentence_label": rng.integers(0, 2, batch).astype(np.int32),
    }


def time_steps(run, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def step_config(loss: dict | None = None):
    """The step config the rows run: the defaults, plus ``loss`` overrides of config.loss."""
    config = step.default_step_config()
    config.loss.update(loss or {})
    return config


def single_device_state(cfg, batch: dict, loss: dict | None = None):
    """(train state, mesh, device batch) for ``cfg`` on the first device: AdamW at 1e-4."""
    config = step_config(loss)
    config.batch_size = batch["input_ids"].shape[0]
    config.mesh.update(data=1)
    config.optim.update(learning_rate=1e-4, warmup_steps=10, total_steps=1000)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    state = step.init_train_state(config, cfg, mesh, jax.random.key(0))
    return state, mesh, sharding.global_batch(batch, mesh, config.batch_size)


def bertjax_times(
    cfg,
    batch: dict,
    warmup: int,
    steps: int,
    prng: str = "threefry2x32",
    profile_dir: str = "",
    loss: dict | None = None,
) -> list[float]:
    state, mesh, device_batch = single_device_state(cfg, batch, loss)
    train, _ = step.jit_steps(state, mesh)
    rng = jax.random.key(1, impl=prng)  # the dropout key; its impl picks the bit generator
    holder = [state]

    def run():
        holder[0], metrics = train(holder[0], device_batch, rng)
        metrics["loss"].block_until_ready()

    times = time_steps(run, warmup, steps)
    if profile_dir:  # three more steps under the profiler (benchmarks/step/profile_summary.py)
        with jax.profiler.trace(profile_dir):
            for _ in range(3):
                run()
    return times


def hf_times(cfg, batch: dict, warmup: int, steps: int, dtype: str = "float32") -> list[float]:
    """HF's BertForPreTraining step; on a CUDA device with bf16 autocast, SDPA and fused AdamW."""
    import torch
    import transformers

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
        attn_implementation="sdpa",
    )
    model = transformers.BertForPreTraining(hf_cfg).to(device).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, weight_decay=0.01, fused=device == "cuda"
    )
    autocast = torch.autocast(device, dtype=getattr(torch, dtype), enabled=dtype != "float32")
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    labels = torch.full_like(ids, -100)
    rows = torch.arange(ids.shape[0])[:, None]
    positions = torch.tensor(batch["masked_positions"], dtype=torch.long)
    labels[rows, positions] = torch.tensor(batch["masked_ids"], dtype=torch.long)
    inputs = dict(
        input_ids=ids,
        token_type_ids=torch.tensor(batch["token_type_ids"]).long(),
        attention_mask=torch.tensor(batch["attention_mask"]).long(),
        labels=labels,
        next_sentence_label=torch.tensor(batch["next_sentence_label"]).long(),
    )
    inputs = {k: v.to(device) for k, v in inputs.items()}

    def run():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    return time_steps(run, warmup, steps)


def peak_memory() -> str:
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return "-" if peak is None else f"{peak / 2**30:.1f}"


def row(name, cfg, batch, times, peak, reference=None, memory="-", loss=None):
    """A table row. MFU counts the FLOPs bertjax's step computes under that config.loss (a
    sparse last layer's fewer); HF's rows pass {"sparse_last_layer": False}: a full last layer
    (HF's MLM head also runs at every position, which no row counts)."""
    b, t = batch["input_ids"].shape
    p = batch["masked_positions"].shape[1]
    rows = step.StepSpec.from_config(step_config(loss), cfg).objective.last_layer_rows(cfg, p)
    flops = b * metrics_lib.train_flops_per_sequence(cfg, t, p, rows)
    best, median = min(times), statistics.median(times)
    line = (
        f"| {name} | {t} | {b} | {best * 1e3:.0f} | {median * 1e3:.0f} | "
        f"{b * t / median:,.0f} | {flops / median / peak:.1%} | {memory} |"
    )
    ratio = "" if reference is None else f" {reference / median:.2f}x |"
    return line + (ratio if reference is not None else " |")


def bf16_rows(cfg, batch: dict, size: str, args, peak: float) -> list[str]:
    """HF under bf16 autocast beside bertjax with matmul_dtype=bfloat16, MFU against ``peak``,
    the bf16 (fp32-accumulating) matmul peak."""
    tag = f"(MFU vs bf16 peak {peak / 1e9:,.0f} GFLOP/s)"
    lines, reference = [], None
    if not args.no_hf:
        hf = hf_times(cfg, batch, args.warmup, args.steps, "bfloat16")
        reference = statistics.median(hf)
        lines.append(row(f"HF {size} bf16 autocast {tag}", cfg, batch, hf, peak, loss=FULL))
        print(lines[-1], flush=True)
    variant = cfg.replace(matmul_dtype="bfloat16")
    times = bertjax_times(variant, batch, args.warmup, args.steps, args.prng)
    lines.append(
        row(
            f"bertjax {size} matmul_dtype=bfloat16 {tag}",
            variant,
            batch,
            times,
            peak,
            reference,
            peak_memory(),
        )
    )
    print(lines[-1], flush=True)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,mini,small")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batch", type=int, default=0, help="0: 32 at T=128, 8 at T=512")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attention", default=None, help="dot_product_attention implementation")
    parser.add_argument("--remat", default="none")
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument(
        "--attention-variants",
        default="",
        help="e.g. cudnn,xla: each implementation, and the first with scan+remat",
    )
    parser.add_argument(
        "--variants", action="store_true", help="fast paths on/off for the first size and length"
    )
    parser.add_argument(
        "--prng",
        default="threefry2x32",
        help="bit generator of the dropout key, e.g. rbg (a variant row with --attention-variants)",
    )
    parser.add_argument(
        "--bf16-matmuls",
        action="store_true",
        help="two more rows per size: HF under bf16 autocast, and bertjax with "
        "matmul_dtype=bfloat16 (ratio between them; MFU vs the measured "
        "bf16 matmul peak)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=0,
        help="seconds: start no new row after this (0: no limit)",
    )
    parser.add_argument(
        "--profile",
        default="",
        help="folder: trace 3 more steps of each bertjax row into a subfolder",
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if jax.default_backend() == "cpu" and not args.no_hf:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    peak = metrics_lib.peak_flops()
    bf16_peak = metrics_lib.measured_matmul_peak("bfloat16") if args.bf16_matmuls else 0.0
    measured = (
        ""
        if jax.default_backend() == "cpu"
        else (
            f" (measured {args.dtype} matmul "
            f"{metrics_lib.measured_matmul_peak(args.dtype) / 1e12:,.0f} TFLOP/s)"
        )
    )
    header = [
        f"### {datetime.date.today()} — {platform.node()} — {jax.devices()[0].device_kind} "
        f"x{jax.device_count()} — jax {jax.__version__} — peak {peak / 1e9:,.0f} GFLOP/s"
        f"{measured} — GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r} (both frameworks)",
        "",
        "| model | T | B | min ms | median ms | tokens/s | MFU | peak GiB | bertjax vs HF |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(header), flush=True)
    lines = list(header)
    lengths = [int(x) for x in args.lengths.split(",")]
    for size in args.sizes.split(","):
        for length in lengths:
            batch_size = args.batch or (32 if length <= 128 else 8)
            if args.batch and length > 128:
                batch_size = max(1, args.batch * 128 // length)  # same tokens per step
            cfg = bertjax.BertConfig.preset(
                size,
                vocab_size=VOCAB,
                dtype=args.dtype,
                attention_implementation=args.attention,
                remat=args.remat,
                scan_layers=args.scan,
                hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.0,
            )
            batch = synthetic_batch(batch_size, length, max(1, round(0.15 * length)))
            variants = [("bertjax", cfg, args.prng, None)]
            if args.attention_variants:
                impls = args.attention_variants.split(",")
                variants = [
                    (
                        f"bertjax attention={impl}",
                        cfg.replace(attention_implementation=impl),
                        args.prng,
                        None,
                    )
                    for impl in impls
                ]
                if args.prng != "threefry2x32":
                    variants += [
                        (
                            f"bertjax attention={impls[0]} dropout threefry2x32",
                            cfg.replace(attention_implementation=impls[0]),
                            "threefry2x32",
                            None,
                        )
                    ]
                variants += [
                    (
                        f"bertjax attention={impls[0]} remat=full",
                        cfg.replace(
                            attention_implementation=impls[0], remat="full", scan_layers=True
                        ),
                        args.prng,
                        None,
                    )
                ]
            if args.variants:
                variants += [
                    ("- sparse last layer (every row)", cfg, args.prng, FULL),
                    (
                        "+ attention dropout",
                        cfg.replace(attention_probs_dropout_prob=0.1),
                        args.prng,
                        None,
                    ),
                    ("+ scan", cfg.replace(scan_layers=True), args.prng, None),
                    (
                        "+ scan + remat full",
                        cfg.replace(scan_layers=True, remat="full"),
                        args.prng,
                        None,
                    ),
                    ("+ bf16 compute", cfg.replace(dtype="bfloat16"), args.prng, None),
                ]
            hf_median = None
            if not args.no_hf:
                hf = hf_times(cfg, batch, args.warmup, args.steps, args.dtype)
                hf_median = statistics.median(hf)
                lines.append(row(f"HF {size}", cfg, batch, hf, peak, None, loss=FULL))
                print(lines[-1], flush=True)
            for name, variant, prng, loss in variants:
                if args.time_budget and time.perf_counter() - start > args.time_budget:
                    print(f"skipped (time budget): {name} {size} T={length}", flush=True)
                    continue
                trace = os.path.join(args.profile, re.sub(r"\W+", "_", f"{name}_{size}_{length}"))
                try:
                    times = bertjax_times(
                        variant,
                        batch,
                        args.warmup,
                        args.steps,
                        prng,
                        trace if args.profile else "",
                        loss,
                    )
                except Exception as error:  # one failing variant must not lose the other rows
                    if not args.attention_variants:
                        raise
                    print(
                        f"failed: {name} {size} T={length}: {type(error).__name__}: "
                        f"{str(error)[:400]}",
                        flush=True,
                    )
                    continue
                lines.append(
                    row(
                        f"{name} {size}",
                        variant,
                        batch,
                        times,
                        peak,
                        hf_median,
                        peak_memory(),
                        loss,
                    )
                )
                print(lines[-1], flush=True)
                print(f"# {time.perf_counter() - start:.0f} s since start", flush=True)
            if args.bf16_matmuls:
                lines += bf16_rows(cfg, batch, size, args, bf16_peak)
        if args.variants:
            break
    if not args.no_record:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.path.join(root, "docs", "results", "step.md")
        with open(path, "a") as f:
            f.write(
                "\n"
                + " ".join(sys.argv[1:]).join(["<!-- args: ", " -->\n"])
                + "\n".join(lines)
                + "\n"
            )


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
