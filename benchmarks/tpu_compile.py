"""Every web-scale recipe compiled for its target TPU slice by the real TPU compiler on this CPU
host (`python -m bertjax.compile`), one subprocess per recipe: a markdown table of memory per
chip, headroom, FLOPs, collective bytes and the roofline step time / MFU of each program.

    python benchmarks/tpu_compile.py [--recipes=bert_base,modernbert_base] [--skip_eval]
        [--out=FILE.json]

The peer beside each figure is the chip's published capacity and peak (bertjax/aot/chips.py).
Each recipe's slice is the one its docstring names ("Slice:"); the vocabulary is its
tokenizer's (a real run reads it from the tokenizer file). Full-size compiles take minutes each
on a small CPU host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# recipe: (slice, tokenizer vocabulary)
RECIPES = {
    "modernbert_base": ("v5p-128", 50368),
    "bert_base": ("v5e-16", 30522),
    "bert_large": ("v5e-64", 30522),
    "roberta_base": ("v5p-128", 50265),
    "albert_base": ("v5p-128", 30000),
    "bert_wwm_zh": ("v5p-32", 21128),
    "macbert_zh": ("v5p-32", 21128),
    "pert_zh": ("v5e-16", 21128),
    "roberta_zh_long": ("v5e-16", 21128),
    "modernbert_large": ("v5p-16", 50368),
    "electra_base": ("v5e-32", 30522),
    "diffusion_base": ("v5e-16", 32000),
    "clm_mlm_base": ("v5p-64", 50368),
    "distilbert": ("v5e-4", 30522),
    "cramming": ("v5e-8", 32768),
    "embed_modernbert_base": ("v5p-128", 50368),
}
# --scan compiles one layer's program (config.model.scan_layers=True): several times faster to
# compile on a small host; the activations kept per layer are the same.


def compile_recipe(name: str, skip_eval: bool, timeout: int, overrides=()) -> dict:
    topology, vocab = RECIPES[name]
    command = [
        sys.executable, "-m", "bertjax.compile", f"--config=configs/{name}.py",
        f"--topology={topology}", f"--vocab_size={vocab}", "--json",
    ]  # fmt: skip
    if skip_eval:
        command.append("--skip_eval")
    command += list(overrides)
    start = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"recipe": name, "topology": topology, "error": f"over {timeout} s"}
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1) or not result.stdout.strip():  # 1: does not fit
        return {"recipe": name, "topology": topology, "error": result.stderr.strip()[-400:]}
    return {"recipe": name, "seconds": seconds, **json.loads(result.stdout)}


def table(reports: list[dict]) -> str:
    head = (
        "| recipe | slice | phase / step | batch x T | mesh (data, fsdp, tensor) | "
        "memory / chip | HBM / chip | headroom | model FLOPs | XLA FLOPs | collectives / chip | "
        "attention kernels | roofline step | MFU |\n|" + "---|" * 14
    )
    rows = [head]
    for r in reports:
        if "error" in r:
            rows.append(f"| {r['recipe']} | {r['topology']} | error: {r['error'][:120]} |")
            continue
        for p in r["programs"]:
            mesh = p["mesh"]
            kernels = ", ".join(sorted({k.split(":")[0] for k in p["kernels"]}))
            rows.append(
                f"| {r['recipe']} | {r['topology']} | {p['phase']} / {p['step']} | "
                f"{p['batch']} x {p['length']} | {mesh['data']}, {mesh['fsdp']}, "
                f"{mesh['tensor']} | {p['memory']['total'] / 2**30:.1f} GiB | "
                f"{p['hbm_per_device'] / 2**30:.0f} GiB | {p['headroom']:.0%} | "
                f"{p['model_flops']:.2e} | {p['xla_flops']:.2e} | "
                f"{p['collective_bytes'] / 2**30:.2f} GiB | {kernels} | "
                f"{p['roofline']['step_s'] * 1e3:.0f} ms ({p['roofline']['bound']}) | "
                f"{p['roofline']['mfu']:.0%} |"
            )
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--skip_eval", action="store_true")
    parser.add_argument("--scan", action="store_true", help="compile with scanned layers")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per recipe")
    parser.add_argument("--out", default="", help="also write the reports as JSON here")
    args = parser.parse_args()
    reports = []
    for name in args.recipes.split(","):
        overrides = ["--config.model.scan_layers=True"] if args.scan else []
        report = compile_recipe(name, args.skip_eval, args.timeout, overrides)
        if overrides and "need scan_layers=False" in report.get("error", ""):  # ModernBERT
            report = compile_recipe(name, args.skip_eval, args.timeout)
        reports.append(report)
        print(f"{name}: done", file=sys.stderr, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(reports, f, indent=1)
    print(table(reports))


if __name__ == "__main__":
    main()
