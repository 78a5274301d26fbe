"""Every recipe compiled for its target by the real compiler on this CPU host (`python -m
bertjax.compile`), one subprocess per recipe: a markdown table of memory per chip, headroom,
FLOPs, collectives (bytes sent per chip over ICI / DCN), the roofline ceiling (the largest bound:
compute, ICI, DCN) with the MFU no run exceeds, and the HBM estimate with the MFU it suggests
(an estimate, not a bound), and how each program was compiled. ``--topology=h100-8`` compiles
every recipe for one 8-GPU node (the CUDA plugin, `bertjax.aot.devices`).

    python benchmarks/compile/tpu_compile.py [--recipes=bert_base,modernbert_base] [--skip_eval]
        [--how=as_is|scan|quick|auto] [--topology=h100-8] [--num_slices=2] [--out=FILE.json]

Each recipe's target is the slice its docstring names (``Slice:``; v5e-4 for the CPU-sized
recipes that name none) unless ``--topology`` is given; its vocabulary is its own
(``config.data.vocab_size``). ``--how``: ``as_is`` compiles each recipe as train.py runs it
(its own ``model.scan_layers``); ``scan`` with scanned layers; ``quick`` at two small depths,
extrapolated (`bertjax.aot.extrapolate`); ``auto`` (the default) the CPU-sized recipes as they
are, the others scanned where they can be and quick where not (ModernBERT's alternating
layers). docs/results/compile.md measures how far scanning and extrapolating move memory and
collectives. Full-size compiles take minutes each on a small CPU host; what the compiler left
is cached (``--cache_dir``), so a rerun recompiles only what changed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_TARGET = "v5e-4"  # recipes sized for a CPU name no slice


def recipes() -> list[str]:
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs/*.py")))


def recipe_target(name: str) -> str:
    """The slice a recipe's docstring names (``Slice:   v5p-128 (...)``), else SMALL_TARGET."""
    with open(os.path.join(ROOT, "configs", f"{name}.py")) as f:
        found = re.search(r"^Slice:\s+(\S+)", f.read(), re.MULTILINE)
    return found.group(1) if found else SMALL_TARGET


def compile_recipe(name: str, args, overrides=()) -> dict:
    topology = args.topology or recipe_target(name)
    command = [
        sys.executable, "-m", "bertjax.compile", f"--config=configs/{name}.py",
        f"--topology={topology}", f"--num_slices={args.num_slices}", "--json",
    ]  # fmt: skip
    if args.skip_eval:
        command.append("--skip_eval")
    if args.cache_dir is not None:
        command.append(f"--cache_dir={args.cache_dir}")
    if args.hlo_root:
        command.append(f"--hlo_dir={os.path.join(args.hlo_root, name)}")
    command += list(overrides)
    start = time.perf_counter()
    try:
        result = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {"recipe": name, "topology": topology, "error": f"over {args.timeout} s"}
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1) or not result.stdout.strip():  # 1: does not fit
        return {"recipe": name, "topology": topology, "error": _error_line(result.stderr)}
    report = json.loads(result.stdout)
    return {"recipe": name, "seconds": seconds, "overrides": list(overrides), **report}


def _error_line(stderr: str) -> str:
    """The exception's own line (``SomeError: ...``) of a failed compile, else stderr's end."""
    lines = [line.strip() for line in stderr.strip().splitlines()]
    found = [line for line in lines if re.match(r"([\w.]+(Error|Exception)|error): ", line)]
    return (found[-1] if found else stderr.strip()[-400:])[:400]


def _row(r: dict, p: dict) -> str:
    mesh = p["mesh"]
    how = "scanned" if p.get("scan_layers") else "unrolled"
    if "extrapolated" in p:
        (a, b), layers = p["extrapolated"]["from_layers"], p["extrapolated"]["layers"]
        how += f" {a}+{b} -> {layers} layers"
    if "same_as" in p:
        how += f", program of {p['same_as']}"
    elif p.get("cached"):
        how += ", cached report"
    else:
        how += f", {p['compile_s']:.0f} s"
    memory = f"{p['memory']['total'] / 2**30:.1f} GiB"
    fit = p.get("fit")
    if fit:  # bertjax.aot.fit: what the phase runs with on this target
        shards = mesh.get("dcn", 1) * mesh["data"] * mesh["fsdp"] * mesh.get("expert", 1)
        rows = p["batch"] // shards // fit["microbatches"]  # a microbatch's, a device
        skipped = f", {len(fit['ruled_out'])} ruled out" if fit.get("ruled_out") else ""
        fit = (
            f"{fit['microbatches']} x {rows} rows, remat {fit['remat']}, fsdp {fit['fsdp']}"
            f" ({'chosen' if fit['changed'] else 'as is'}, {len(fit['tried'])} compiled{skipped})"
        )
    else:
        fit = "none fits" if p.get("fit_refused") else "off"
    slices = f" x{r['num_slices']}" if r["num_slices"] > 1 else ""
    head = (
        f"| {r['recipe']} | {r['topology']}{slices} | {p['phase']} / {p['step']} | "
        f"{p['batch']} x {p['length']} | "
        f"{mesh.get('dcn', 1)}, {mesh['data']}, {mesh['fsdp']}, {mesh['tensor']} | {fit} | {how} | "
        f"{memory} | {p['hbm_per_device'] / 2**30:.0f} GiB | {p['headroom']:.0%} |"
    )
    if "out_of_memory" in p:
        return head + " does not fit | | | | | | | | |"
    roof = p["roofline"]
    kernels = ", ".join(sorted({k.split(":")[0] for k in p["kernels"]}))
    collectives = ", ".join(f"{k} x{c['count']}" for k, c in p["collectives"].items())
    sent = f"{p['ici_bytes'] / 2**20:.0f}" + (
        f" / {p['dcn_bytes'] / 2**20:.0f}" if p.get("dcn_bytes") else ""
    )
    return head + (
        f" {p['model_flops']:.2e} | {collectives or 'none'} | {sent} | {kernels} | "
        f"{roof['ceiling_s'] * 1e3:.0f} ms ({roof['bound']}) | {roof['mfu_ceiling']:.0%} | "
        f"{roof['memory_s'] * 1e3:.0f} ms | {roof['mfu']:.0%} | {r.get('seconds', 0):.0f} s |"
    )


def table(reports: list[dict]) -> str:
    head = (
        "| recipe | target | phase / step | batch x T | mesh (dcn, data, fsdp, tensor) | "
        "fit (microbatches x rows a device) | compiled | memory / chip | HBM / chip | headroom | "
        "model FLOPs | collectives | "
        "MiB sent / chip (ICI / DCN) | attention | ceiling (bound) | MFU <= | HBM estimate | "
        "MFU ~ (with it) | wall (fit + report) |\n|" + "---|" * 19
    )
    rows = [head]
    for r in reports:
        if "error" in r:
            rows.append(f"| {r['recipe']} | {r['topology']} | error: {r['error'][:160]} |")
            continue
        rows += [_row(r, p) for p in r["programs"]]
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(recipes()))
    parser.add_argument("--skip_eval", action="store_true")
    parser.add_argument("--how", default="auto", choices=("as_is", "scan", "quick", "auto"))
    parser.add_argument("--topology", default="", help="one target for every recipe")
    parser.add_argument("--num_slices", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per recipe")
    parser.add_argument("--cache_dir", default=None, help="bertjax.compile's --cache_dir")
    parser.add_argument("--hlo_root", default="", help="keep each program's HLO under here")
    parser.add_argument("--out", default="", help="also write the reports as JSON here")
    args = parser.parse_args()
    reports = []
    for name in args.recipes.split(","):
        how = args.how
        if how == "auto":
            how = "as_is" if recipe_target(name) == SMALL_TARGET else "scan"
        flags = {"as_is": [], "scan": ["--config.model.scan_layers=True"], "quick": ["--quick"]}
        report = compile_recipe(name, args, flags[how])
        if args.how == "auto" and "scan_layers" in report.get("error", ""):  # cannot scan
            how = "quick"
            report = compile_recipe(name, args, flags[how])
        if how == "quick" and "num_hidden_groups" in report.get("error", ""):  # shared layers
            report = compile_recipe(name, args, flags["as_is"])
        reports.append(report)
        print(f"{name}: done", file=sys.stderr, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(reports, f, indent=1)
    print(table(reports))


if __name__ == "__main__":
    main()
