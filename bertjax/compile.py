"""Compile a run for a TPU slice on this host, before renting the slice:
``python -m bertjax.compile --config=configs/X.py --topology=v5p-128 [--config.k=v ...] [--json]``.

The real TPU compiler (libtpu, the ``tpu`` extra) compiles every phase's train step and the
eval step for the slice's devices (`bertjax.aot.plan`), and this prints per chip: arguments,
temporaries, outputs and code against the chip's HBM (fits with >= 10% headroom or not, and the
knobs that shrink it), the model's FLOPs per step beside XLA's count, the collectives (kind,
count, bytes), the attention kernel each layer got, and a roofline step time and MFU from the
chip's published figures (`bertjax.aot.chips.CHIPS`). ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import cli

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "bert_tiny.py")

if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiles for the slice; runs nothing here
    from bertjax.training.run_config import check_config_overrides

    check_config_overrides(sys.argv, DEFAULT_CONFIG)

_CONFIG = config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG, "Run config file.", lock_config=True
)
_TOPOLOGY = flags.DEFINE_string("topology", "v5p-128", "TPU slice: v5p-128, v5e-256, v5e:2x2, ...")
_VOCAB = flags.DEFINE_integer(
    "vocab_size", 0, "Vocabulary size (the tokenizer's in a real run; 0: config.data.vocab_size)."
)
_JSON = flags.DEFINE_bool("json", False, "Print the report as JSON.")
_NO_EVAL = flags.DEFINE_bool("skip_eval", False, "Compile the train steps only.")

KNOBS = (
    "--config.model.remat=full|dots, --config.mesh.fsdp=N (ZeRO-3), "
    "--config.optim.grad_accum_steps=K (microbatches), --config.batch_size"
)


def _gib(n: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def format_report(report: dict) -> str:
    """The human-readable report of `bertjax.aot.plan.compile_run`."""
    chip = report["chip"]
    lines = [
        f"{report['topology']} ({report['grid']}, {report['devices']} x {report['device_kind']}; "
        f"{chip['peak_bf16_flops'] / 1e12:.0f} TFLOP/s bf16, "
        f"{chip['hbm_bytes_per_second'] / 1e9:.0f} GB/s HBM, "
        f"{chip['ici_bytes_per_second'] / 1e9:.0f} GB/s ICI per chip), vocab {report['vocab_size']}"
    ]
    for p in report["programs"]:
        m = p["memory"]
        verdict = (
            "fits" if p["headroom"] >= 0.10 else f"DOES NOT FIT with 10% headroom: try {KNOBS}"
        )
        roof = p["roofline"]
        lines += [
            f"\n[{p['phase']}] {p['step']} step: batch {p['batch']} x {p['length']}, mesh "
            f"{p['mesh']}, microbatches {p['microbatches']}, remat {p['remat'] or 'none'} "
            f"(compiled in {p['compile_s']} s)",
            f"  memory per chip: {_gib(m['total'])} of {_gib(p['hbm_per_device'])} "
            f"({p['headroom']:.0%} free, {verdict}): arguments {_gib(m['arguments'])}, "
            f"temporaries {_gib(m['temporaries'])}, outputs {_gib(m['outputs'])} "
            f"({_gib(m['aliased'])} donated), code {_gib(m['code'])}",
            f"  FLOPs per step: model {p['model_flops']:.3e}; XLA {p['xla_flops']:.3e} "
            "(loop bodies once, Pallas kernels 0)",
            "  collectives per chip: "
            + (
                ", ".join(
                    f"{k} x{c['count']} {_gib(c['bytes'])}" for k, c in p["collectives"].items()
                )
                or "none"
            ),
            "  attention: "
            + "; ".join(f"{k} (x{n})" for k, n in p["kernels"].items())
            + f"; Mosaic kernels in the program: {p['mosaic_kernels']}",
            f"  roofline: {roof['step_s'] * 1e3:.1f} ms/step ({roof['bound']}-bound: compute "
            f"{roof['compute_s'] * 1e3:.1f}, HBM {roof['memory_s'] * 1e3:.1f}, ICI "
            f"{roof['ici_s'] * 1e3:.1f} ms), MFU <= {roof['mfu']:.0%}",
        ]
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # the kernel choices are in the report
        logging.set_verbosity(logging.WARNING)
    from bertjax.aot.plan import compile_run

    with cli.input_errors(cli.absl_verbose()):  # bad input: one line (bertjax/cli.py)
        report = compile_run(_CONFIG.value, _TOPOLOGY.value, _VOCAB.value, not _NO_EVAL.value)
    print(json.dumps(report, indent=1) if _JSON.value else format_report(report))
    return 0 if all(p["headroom"] >= 0.10 for p in report["programs"]) else 1


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
