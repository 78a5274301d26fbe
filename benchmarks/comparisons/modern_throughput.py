"""Train-step throughput and memory of bertjax's ModernBERT shape beside transformers' PyTorch
ModernBertForMaskedLM, at T=1024 and T=8192.

Same config on both sides (the ModernBERT preset at the given size, vocab 50368, window 128,
every third layer global, 30% of tokens masked, attention-output dropout 0.1), AdamW, the same
8192 tokens per step (B=8 at 1024, B=1 at 8192). HF runs its default attention (SDPA) with
``sparse_prediction=True`` (the head and decoder only at the masked tokens, as bertjax's MLM
head; bertjax's last layer also runs only at those rows). Each row runs in its own process: peak
RSS is that process's (its imports included: the "idle" row says how much they take); for
bertjax also XLA's temporary buffer size of the compiled step.

  python benchmarks/comparisons/modern_throughput.py  # modernbert-tiny, ettin-17m
  python benchmarks/comparisons/modern_throughput.py --sizes ettin-17m --lengths 1024 --steps 3 \
      --no-record

Appends the table to docs/results/comparisons.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENS = 8192


def _cfg(size: str, length: int):
    import bertjax

    return bertjax.BertConfig.preset(
        size, pad_token_id=0, unk_token_id=1, cls_token_id=2, sep_token_id=3, mask_token_id=4
    ).replace(max_position_embeddings=max(length, 1024))


def _batch(length: int, vocab: int):
    import numpy as np

    batch = TOKENS // length
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (batch, length)).astype(np.int32)
    predictions = int(0.3 * length)
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, length), predictions, replace=False) for _ in ids]), -1
    ).astype(np.int32)
    return {
        "input_ids": ids,
        "token_type_ids": np.zeros_like(ids),
        "attention_mask": np.ones_like(ids),
        "masked_positions": positions,
        "masked_ids": np.take_along_axis(ids, positions, 1),
        "masked_weights": np.ones(positions.shape, np.float32),
    }


def _bertjax_row(size: str, length: int, warmup: int, steps: int) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "step"))
    import jax
    from step_throughput import single_device_state, time_steps

    from bertjax import step
    from bertjax.training import metrics as metrics_lib

    cfg = _cfg(size, length)
    batch = _batch(length, cfg.vocab_size)
    loss = {"next_sentence": False}
    state, mesh, device_batch = single_device_state(cfg, batch, loss)
    train, _ = step.jit_steps(state, mesh)
    rng = jax.random.key(1)
    temp = train.lower(state, device_batch, rng).compile().memory_analysis().temp_size_in_bytes
    holder = [state]

    def run():
        holder[0], metrics = train(holder[0], device_batch, rng)
        metrics["loss"].block_until_ready()

    times = time_steps(run, warmup, steps)
    p = batch["masked_positions"].shape[1]
    spec = step.StepSpec.from_config(_step_config(loss), cfg)
    rows = spec.objective.last_layer_rows(cfg, p)
    flops = batch["input_ids"].shape[0] * metrics_lib.train_flops_per_sequence(cfg, length, p, rows)
    return {"times": times, "flops": flops, "temp_gib": temp / 2**30}


def _step_config(loss):
    from bertjax import step

    config = step.default_step_config()
    config.loss.update(loss)
    return config


def _hf_row(size: str, length: int, warmup: int, steps: int) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "step"))
    import torch
    import transformers
    from step_throughput import time_steps

    from bertjax.training import metrics as metrics_lib

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    cfg = _cfg(size, length)
    batch = _batch(length, cfg.vocab_size)
    hf_cfg = transformers.ModernBertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        local_attention=cfg.local_attention_window,
        global_attn_every_n_layers=cfg.global_attn_every_n_layers,
        attention_dropout=cfg.hidden_dropout_prob,
        sparse_prediction=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        cls_token_id=2,
        sep_token_id=3,
        attn_implementation="sdpa",
    )
    model = transformers.ModernBertForMaskedLM(hf_cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    labels = torch.full_like(ids, -100)
    rows = torch.arange(ids.shape[0])[:, None]
    positions = torch.tensor(batch["masked_positions"], dtype=torch.long)
    labels[rows, positions] = torch.tensor(batch["masked_ids"], dtype=torch.long)
    mask = torch.ones_like(ids)

    def run():
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    times = time_steps(run, warmup, steps)
    p = batch["masked_positions"].shape[1]
    flops = ids.shape[0] * metrics_lib.train_flops_per_sequence(cfg, length, p)
    return {"times": times, "flops": flops, "temp_gib": None}


def _child(args) -> None:
    """One row in this process; prints its JSON result last."""
    if args.row == "idle":
        import jax  # noqa: F401
        import torch  # noqa: F401

        result = {}
    else:
        fn = _bertjax_row if args.row == "bertjax" else _hf_row
        result = fn(args.size, args.length, args.warmup, args.steps)
    result["rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps(result))


def _run_child(row: str, size: str, length: int, args) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", row, "--size", size]
    command += ["--length", str(length), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == -signal.SIGKILL:  # on this host, the kernel's OOM killer
        return {"killed": True}
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="modernbert-tiny,ettin-17m")
    parser.add_argument("--lengths", default="1024,8192")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.row = args.child
        return _child(args)
    sys.path.insert(0, ROOT)
    from bertjax.training import metrics as metrics_lib

    peak = metrics_lib.peak_flops()
    idle = _run_child("idle", "", 0, args)["rss_gib"]
    lines = [
        f"### {datetime.date.today()} — {platform.node()} — modern_throughput — peak "
        f"{peak / 1e9:,.0f} GFLOP/s — {TOKENS} tokens per step, 30% masked; RSS of a process "
        f"that only imports jax and torch: {idle:.2f} GiB",
        "",
        "| model | T | B | median ms | tokens/s | MFU | peak RSS GiB | XLA temp GiB | "
        "bertjax vs HF |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    rates = {}
    for size in args.sizes.split(","):
        for length in (int(x) for x in args.lengths.split(",")):
            reference = None
            rows = (["hf"] if not args.no_hf else []) + ["bertjax"]
            for row in rows:
                result = _run_child(row, size, length, args)
                if result.get("killed"):
                    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
                    lines.append(
                        f"| {'HF' if row == 'hf' else 'bertjax'} {size} | {length} | "
                        f"{TOKENS // length} | killed (SIGKILL; {memory:.0f} GiB host, OOM?) "
                        "| | | | | |"
                    )
                    print(lines[-1], flush=True)
                    continue
                median = statistics.median(result["times"])
                if row == "hf":
                    reference = median
                else:
                    rates[(size, length)] = TOKENS / median
                name = (
                    "HF ModernBertForMaskedLM (SDPA, sparse prediction)"
                    if row == "hf"
                    else ("bertjax")
                )
                temp = "-" if result["temp_gib"] is None else f"{result['temp_gib']:.2f}"
                ratio = f"{reference / median:.2f}x" if row == "bertjax" and reference else ""
                lines.append(
                    f"| {name} {size} | {length} | {TOKENS // length} | {median * 1e3:.0f} | "
                    f"{TOKENS / median:,.0f} | {result['flops'] / median / peak:.1%} | "
                    f"{result['rss_gib']:.2f} | {temp} | {ratio} |"
                )
                print(lines[-1], flush=True)
    for size in args.sizes.split(","):
        if (size, 8192) in rates and (size, 1024) in rates:
            lines.append(
                f"\n{size}: bertjax tokens/s at 8192 / at 1024 = "
                f"{rates[(size, 8192)] / rates[(size, 1024)]:.2f}"
            )
            print(lines[-1], flush=True)
    if not args.no_record:
        with open(os.path.join(ROOT, "docs", "results", "comparisons.md"), "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
