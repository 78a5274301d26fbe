"""MFU of bertjax's train step on one GPU beside Hugging Face transformers' PyTorch model on the
same GPU, with the attention kernel each layer got and what the roofline predicted for it.

  python benchmarks/step/gpu_mfu.py  # on a GPU: BERT-base T=128 and 512, ModernBERT-base
  python benchmarks/step/gpu_mfu.py --dry-run  # tiny sizes, any backend (the test runs it on CPU)

Rows: BERT-base at T=128 (B=256) and T=512 (B=64), BERT's recipe as bertjax trains it (bf16
compute, attention and hidden dropout 0.1, NSP, 15% masked, the sparse last layer), and
ModernBERT-base at T=1024 (B=8, 30% masked, no NSP); each beside transformers'
BertForPreTraining / ModernBertForMaskedLM (SDPA, bf16 autocast, fused AdamW on CUDA). MFU is
the model's FLOPs (bertjax's count, `metrics.train_flops_per_sequence`, for both sides: HF's full
MLM head is not credited) over the device's datasheet peak. The roofline is read from the very
program bertjax ran (`bertjax.aot`: its HLO's HBM bytes, one GPU so no collectives) with the
chip's published figures: the ceiling (compute) is a bound ("MFU <="), the HBM term an estimate
("MFU ~"). Off a known GPU (the dry run) the roofline uses the H100's figures, and says so.
Appends the table to docs/results/step.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import jax
from step_throughput import hf_times, single_device_state, synthetic_batch, time_steps

import bertjax
from bertjax.aot import chips, hlo, roofline
from bertjax.modeling import attention_kernels
from bertjax.training import metrics as metrics_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BERT_LOSS: dict = {}  # the default objective: MLM + NSP, the sparse last layer
MODERN_LOSS = {"next_sentence": False}
# (name, preset, T, B, mask rate, config.loss) on a GPU; --dry-run's tiny stand-ins below
CASES = [
    ("BERT-base", "base", 128, 256, 0.15, BERT_LOSS),
    ("BERT-base", "base", 512, 64, 0.15, BERT_LOSS),
    ("ModernBERT-base", "modernbert-base", 1024, 8, 0.3, MODERN_LOSS),
]
DRY_CASES = [
    ("BERT-tiny", "tiny", 32, 4, 0.15, BERT_LOSS),
    ("ModernBERT-tiny", "modernbert-tiny", 64, 2, 0.3, MODERN_LOSS),
]


def model_config(preset: str, length: int):
    cfg = bertjax.BertConfig.preset(preset, dtype="bfloat16")
    if cfg.model_type != "modernbert":
        cfg = cfg.replace(vocab_size=30522)
    return cfg.replace(max_position_embeddings=max(cfg.max_position_embeddings, length))


def chip_of(device_kind: str):
    """(the `chips.Chip` of this device, a note): the H100's figures off a known GPU."""
    for name, info in (("h200", "H200"), ("h100", "H100"), ("a100", "A100")):
        if info in device_kind:
            return chips.CHIPS[name], ""
    return chips.CHIPS["h100"], f" (H100 figures: {device_kind} is not a known GPU)"


def bertjax_row(cfg, batch: dict, loss: dict, args) -> dict:
    """bertjax's step: the kernels its layers got, the roofline of its compiled program, and its
    step times."""
    from bertjax import step

    state, mesh, device_batch = single_device_state(cfg, batch, loss)
    train, _ = step.jit_steps(state, mesh)
    rng = jax.random.key(1)
    with attention_kernels.recording() as record:
        lowered = train.lower(state, device_batch, rng)
    compiled = lowered.compile()
    predictions = batch["masked_positions"].shape[1]
    spec = step.StepSpec.from_config(_step_config(loss), cfg)
    rows = spec.objective.last_layer_rows(cfg, predictions)
    length = batch["input_ids"].shape[1]
    flops = len(batch["input_ids"]) * metrics_lib.train_flops_per_sequence(
        cfg, length, predictions, rows
    )
    chip, note = chip_of(jax.devices()[0].device_kind)
    roof = roofline.roofline(flops, hlo.hbm_traffic(compiled.as_text()), 0.0, 1, chip)
    holder = [state]

    def run():
        holder[0], metrics = compiled(holder[0], device_batch, rng)
        metrics["loss"].block_until_ready()

    times = time_steps(run, args.warmup, args.steps)
    kernels = attention_kernels.summary(record)
    return {"times": times, "flops": flops, "roofline": roof, "note": note, "kernels": kernels}


def _step_config(loss: dict):
    from step_throughput import step_config

    return step_config(loss)


def hf_modernbert_times(cfg, batch: dict, warmup: int, steps: int) -> list[float]:
    """transformers' ModernBertForMaskedLM step (SDPA, its head at the masked tokens only); on a
    CUDA device under bf16 autocast with fused AdamW."""
    import torch
    import transformers

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf_cfg = transformers.ModernBertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        local_attention=cfg.local_attention_window,
        global_attn_every_n_layers=cfg.global_attn_every_n_layers,
        sparse_prediction=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        cls_token_id=2,
        sep_token_id=3,
        attn_implementation="sdpa",
    )
    model = transformers.ModernBertForMaskedLM(hf_cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    ids = torch.tensor(batch["input_ids"], dtype=torch.long, device=device)
    labels = torch.full_like(ids, -100)
    rows = torch.arange(ids.shape[0], device=device)[:, None]
    positions = torch.tensor(batch["masked_positions"], dtype=torch.long, device=device)
    labels[rows, positions] = torch.tensor(batch["masked_ids"], dtype=torch.long, device=device)
    mask = torch.ones_like(ids)

    def run():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    return time_steps(run, warmup, steps)


def table_row(name, length, rows, times, flops, peak, reference=None, result=None) -> str:
    median = statistics.median(times)
    line = (
        f"| {name} | {length} | {rows} | {median * 1e3:.1f} | {rows * length / median:,.0f} | "
        f"{flops / median / peak:.1%} |"
    )
    if result is None:
        return line + " | | | |"
    roof = result["roofline"]
    kernels = "; ".join(f"{k} (x{n})" for k, n in result["kernels"].items())
    ratio = f"{reference / median:.2f}x" if reference else "-"
    return line + (
        f" {roof['mfu_ceiling']:.0%} ({roof['bound']}) | {roof['mfu']:.0%} "
        f"(HBM {roof['memory_s'] * 1e3:.1f} ms) | {kernels}{result['note']} | {ratio} |"
    )


HEAD = (
    "| model | T | B | median ms | tokens/s | MFU | roofline MFU <= (bound) | MFU ~ with the HBM "
    "estimate | attention (kernel: layers) | bertjax vs HF |\n|" + "---|" * 10
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes (any backend)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--time-budget", type=float, default=0, help="seconds; 0: no limit")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    peak = metrics_lib.peak_flops()
    device = jax.devices()[0]
    header = (
        f"{datetime.date.today()} — {device.device_kind} ({device.platform}) — jax "
        f"{jax.__version__} — peak {peak / 1e9:,.0f} GFLOP/s (MFU's denominator)"
    )
    print(header + "\n\n" + HEAD, flush=True)
    lines, start = [HEAD], time.perf_counter()
    for name, preset, length, rows, rate, loss in DRY_CASES if args.dry_run else CASES:
        if args.time_budget and time.perf_counter() - start > args.time_budget:
            print(f"time budget spent: {name} T={length} not run", flush=True)
            continue
        cfg = model_config(preset, length)
        batch = synthetic_batch(rows, length, max(1, round(rate * length)))
        if loss is MODERN_LOSS:
            batch = {k: v for k, v in batch.items() if k != "next_sentence_label"}
        reference = None
        try:
            if not args.no_hf:
                if loss is MODERN_LOSS:
                    hf = hf_modernbert_times(cfg, batch, args.warmup, args.steps)
                else:
                    hf = hf_times(cfg, batch, args.warmup, args.steps, "bfloat16")
                full = metrics_lib.train_flops_per_sequence(
                    cfg, length, batch["masked_positions"].shape[1]
                )
                lines.append(table_row(f"HF {name}", length, rows, hf, rows * full, peak))
                print(lines[-1], flush=True)
                reference = statistics.median(hf)
            result = bertjax_row(cfg, batch, loss, args)
            lines.append(
                table_row(
                    f"bertjax {name}",
                    length,
                    rows,
                    result["times"],
                    result["flops"],
                    peak,
                    reference,
                    result,
                )
            )
        except Exception as error:  # noqa: BLE001  (a failing row says why; the rest go on)
            lines.append(f"| {name} | {length} | {rows} | failed: {str(error)[:300]} |")
        print(lines[-1], flush=True)
    if not args.no_record:
        with open(os.path.join(ROOT, "docs", "results", "step.md"), "a") as f:
            title = "GPU MFU beside transformers (benchmarks/step/gpu_mfu.py)"
            f.write(f"\n### {title}\n\n{header}\n\n")
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
