"""Compile a run for a TPU slice (or several) or GPU nodes on this host, before renting them:
``python -m bertjax.compile --config=configs/X.py --topology=v5p-128 [--num_slices=2]
[--config.k=v ...] [--json]`` (``--topology=h100-8`` for one 8-GPU node).

The real compiler (libtpu, the ``tpu`` extra; for GPUs the CUDA plugin, ``pip install
jax-cuda12-plugin``, no GPU needed) compiles every phase's train step and the eval step for the
target's devices (`bertjax.aot.plan`), and this prints per chip: arguments, temporaries,
outputs and code against the chip's HBM (fits with >= 10% headroom or not, and the knobs that
shrink it), the model's FLOPs per step beside XLA's count, the collectives (kind, count, bytes,
bytes sent over ICI and DCN), the attention kernel each layer got, and a roofline from the
chip's published figures (`bertjax.aot.chips.CHIPS`): the ceiling of the bounds ("MFU <=") and
the HBM estimate ("MFU ~"), each term marked a bound or an estimate. ``--json`` prints the
same as JSON. Exit status: 0 fits, 1 does not fit, 2 bad input. Reports of compiled programs
are kept in ``--cache_dir``: a second check recompiles only what changed.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import cli
from bertjax.recipes import recipe_path

DEFAULT_CONFIG = recipe_path("bert_tiny.py")
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "bertjax", "compile")

if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiles for the target; runs nothing here
    from bertjax.training.run_config import check_config_overrides

    check_config_overrides(sys.argv, DEFAULT_CONFIG)

_CONFIG = config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG, "Run config file.", lock_config=True
)
_TOPOLOGY = flags.DEFINE_string(
    "topology", "v5p-128", "TPU slice (v5p-128, v5e-256, v5e:2x2, ...) or GPU nodes (h100-8, ...)."
)
_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "TPU slices joined by the data-center network (multislice)."
)
_VOCAB = flags.DEFINE_integer(
    "vocab_size", 0, "Vocabulary size (0: config.data.vocab_size, the recipe's tokenizer's)."
)
_JSON = flags.DEFINE_bool("json", False, "Print the report as JSON.")
_NO_EVAL = flags.DEFINE_bool("skip_eval", False, "Compile the train steps only.")
_CACHE = flags.DEFINE_string(
    "cache_dir",
    os.environ.get("BERTJAX_COMPILE_CACHE", DEFAULT_CACHE),
    "Where compiled programs' reports are kept ('' keeps none).",
)

_QUICK = flags.DEFINE_bool(
    "quick",
    False,
    "Compile at two small depths and extrapolate to the real one: collectives, FLOPs and the "
    "state's memory come out exact, temporaries only roughly (docs/results/compile.md).",
)
_HLO = flags.DEFINE_string(
    "hlo_dir",
    "",
    "Also write each compiled program's optimized HLO text here (with --quick: the two small "
    "depths', under DIR/<depth>_layers).",
)

KNOBS = (
    "--config.model.remat=full|dots, --config.mesh.fsdp=N (ZeRO-3), "
    "--config.optim.grad_accum_steps=K (microbatches), --config.batch_size, a larger slice"
)


def _gib(n: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _collectives_line(p: dict) -> str:
    parts = [
        f"{k} x{c['count']} {_gib(c['bytes'])} (groups of "
        f"{'/'.join(str(g) for g in sorted(c['group_sizes'], key=int))})"
        for k, c in p["collectives"].items()
    ]
    sent = f"; sent per chip: ICI {_gib(p['ici_bytes'])}" if parts else ""
    if p.get("dcn_bytes"):
        sent += f", DCN {_gib(p['dcn_bytes'])}"
    return "  collectives per chip: " + (", ".join(parts) or "none") + sent


def _roofline_line(roof: dict, hbm_traffic: float) -> str:
    """The ceiling (bounds only: "MFU <=") and, where the HBM estimate is larger, the estimate
    ("MFU ~"), then every term marked a bound or an estimate."""
    line = (
        f"  roofline: ceiling {roof['ceiling_s'] * 1e3:.1f} ms/step ({roof['bound']}-bound), "
        f"MFU <= {roof['mfu_ceiling']:.0%}"
    )
    if roof["limit"] == "HBM":
        line += (
            f"; with the HBM estimate {roof['step_s'] * 1e3:.1f} ms/step, MFU ~ {roof['mfu']:.0%}"
        )
    line += (
        f": compute {roof['compute_s'] * 1e3:.1f} ms (bound), ICI {roof['ici_s'] * 1e3:.1f} ms "
        "(bound)"
    )
    if roof["dcn_s"]:
        line += f", DCN {roof['dcn_s'] * 1e3:.1f} ms (bound)"
    return line + f", HBM {roof['memory_s'] * 1e3:.1f} ms (estimate: {_gib(hbm_traffic)})"


def _program_lines(p: dict, plan) -> list[str]:
    head = (
        f"\n[{p['phase']}] {p['step']} step: batch {p['batch']} x {p['length']}, mesh "
        f"{p['mesh']}, microbatches {p['microbatches']}, remat {p['remat'] or 'none'}, "
        f"{'scanned' if p['scan_layers'] else 'unrolled'} layers"
    )
    if "same_as" in p:
        head += f": the program of [{p['same_as']}] (other constants)"
        if "roofline" not in p:
            return [head]
        return [
            head,
            f"  FLOPs per step: model {p['model_flops']:.3e} (this phase's)",
            _roofline_line(p["roofline"], p["hbm_traffic"]),
        ]
    if "extrapolated" in p:
        (a, b), layers = p["extrapolated"]["from_layers"], p["extrapolated"]["layers"]
        head += f" (extrapolated to {layers} layers from {a} and {b}: {p['compile_s']:.0f} s)"
    elif p.get("cached"):
        head += " (report cached)"
    else:
        head += f" (compiled in {p['compile_s']} s)"
    m = p["memory"]
    verdict = "fits" if plan.fits(p) else f"DOES NOT FIT with 10% headroom: try {KNOBS}"
    if "out_of_memory" in p:
        return [
            head,
            f"  memory per chip: {_gib(m['total'])} needed, {_gib(m['usable'])} usable of "
            f"{_gib(p['hbm_per_device'])} ({verdict})",
            f"  compiler: {p['out_of_memory']}",
        ]
    roof = p["roofline"]
    return [
        head,
        f"  memory per chip: {_gib(m['total'])} of {_gib(p['hbm_per_device'])} "
        f"({p['headroom']:.0%} free, {verdict}): arguments {_gib(m['arguments'])}, "
        f"temporaries {_gib(m['temporaries'])}, outputs {_gib(m['outputs'])} "
        f"({_gib(m['aliased'])} donated), code {_gib(m['code'])}",
        f"  FLOPs per step: model {p['model_flops']:.3e}; XLA {p['xla_flops']:.3e} "
        "(loop bodies once, Pallas kernels 0)",
        _collectives_line(p),
        "  attention: "
        + "; ".join(f"{k} (x{n})" for k, n in p["kernels"].items())
        + "; kernel calls in the program: "
        + (", ".join(f"{k} {n}" for k, n in p["kernel_calls"].items() if n) or "none"),
        _roofline_line(roof, p["hbm_traffic"]),
    ]


def format_report(report: dict) -> str:
    """The human-readable report of `bertjax.aot.plan.compile_run`."""
    from bertjax.aot import plan

    chip = report["chip"]
    link = "NVLink" if chip["platform"] == "gpu" else "ICI"
    slices = f" x {report['num_slices']} slices" if report["num_slices"] > 1 else ""
    lines = [
        f"{report['topology']}{slices} ({report['grid']}, {report['devices']} x "
        f"{report['device_kind']}; {chip['peak_bf16_flops'] / 1e12:.0f} TFLOP/s bf16, "
        f"{chip['hbm_bytes_per_second'] / 1e9:.0f} GB/s HBM, "
        f"{chip['ici_bytes_per_second'] / 1e9:.0f} GB/s {link} per chip), vocab "
        f"{report['vocab_size']}"
    ]
    for p in report["programs"]:
        lines += _program_lines(p, plan)
    if report.get("hlo_files"):
        quick = any("extrapolated" in p for p in report["programs"])
        lines.append("\noptimized HLO written: " + ", ".join(report["hlo_files"]))
        if quick:
            lines.append(
                "  (--quick: the two small depths it compiled, not the recipe's depth; drop "
                "--quick to write that program)"
            )
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # the kernel choices are in the report
        logging.set_verbosity(logging.WARNING)
    from bertjax.aot import devices, plan

    with cli.input_errors(cli.absl_verbose()):  # bad input: one line (bertjax/cli.py)
        try:
            report = plan.compile_run(
                _CONFIG.value,
                _TOPOLOGY.value,
                _VOCAB.value,
                not _NO_EVAL.value,
                num_slices=_SLICES.value,
                cache_dir=_CACHE.value,
                hlo_dir=_HLO.value,
                quick=_QUICK.value,
            )
        except devices.CompilerMissing as error:
            cli.fail(str(error).splitlines()[0])
    print(json.dumps(report, indent=1) if _JSON.value else format_report(report))
    return 0 if all(plan.fits(p) for p in report["programs"]) else 1


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
