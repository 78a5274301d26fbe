"""The TPU notebook's run (colab/pretrain_tpu.ipynb: its config cells as written, QUICK off,
sized for the target's devices) compiled for Colab's runtimes on this CPU host: the dtype the
notebook picks there, the batch, memory per device against the device's, whether it fits
(`plan.fits`: 10% headroom), the compile time. TPUs through libtpu (the tpu extra); GPUs through
the CUDA plugin where it is installed (``pip install jax-cuda12-plugin==<jax version>``, or on
``PYTHONPATH``), else that row names what is missing.

  python benchmarks/compile/colab_fit.py  # v5e-1, v6e-1, v2-8, t4-1, l4-1, a100-40g-1
  # the real depth, not two extrapolated
  python benchmarks/compile/colab_fit.py --targets t4-1 --full
  python benchmarks/compile/colab_fit.py --targets v5e-1 --tiny # 2 layers of width 32: a dry run

By default the step is compiled at 2 and 3 layers and extrapolated to BERT-base's 12
(`plan.compile_run(quick=True)`): BERT-base's whole step takes the TPU compiler minutes here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiles for the target; runs nothing here
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from bertjax.aot import chips, plan  # noqa: E402
from bertjax.aot import devices as devices_lib  # noqa: E402

NOTEBOOK = os.path.join(ROOT, "colab", "pretrain_tpu.ipynb")
TARGETS = ("v5e-1", "v6e-1", "v2-8", "t4-1", "l4-1", "a100-40g-1")


def notebook_config(devices):
    """The run config the notebook's config and corpus cells build on ``devices``."""
    with open(NOTEBOOK, encoding="utf-8") as f:
        code = ["".join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    names = {"QUICK": False, "DEVICES": devices, "jax": jax}
    for cell in code:
        if "config = trainer.default_run_config()" in cell or "config.data.corpus" in cell:
            exec(cell, names)  # the notebook's own cells, as Colab runs them
    return names["config"]


def row(target: str, tiny: bool, full: bool) -> str:
    try:
        devices = devices_lib.topology_devices(chips.parse_slice(target))
    except devices_lib.CompilerMissing as error:
        return f"| {target} | - | - | - | - | {str(error).split('. ')[-1]} |"
    config = notebook_config(devices)
    if tiny:
        config.model.update(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64
        )
        config.data.vocab_size = 512
    start = time.perf_counter()
    try:
        report = plan.compile_run(config, target, eval_step=False, quick=not (tiny or full))
    except Exception as error:  # noqa: BLE001  (a compiler's refusal is this row's result)
        refusal = str(error).splitlines()[0][:160]
        return f"| {target} | {config.model.dtype} | - | - | refused by the compiler: {refusal} | |"
    (program,) = report["programs"]
    need, have = program["memory"]["total"], program["hbm_per_device"]
    verdict = "fits" if plan.fits(program) else "DOES NOT FIT"
    return (
        f"| {target} ({report['device_kind']} x {report['devices']}) | {config.model.dtype} | "
        f"{config.batch_size} x {config.data.max_seq_length} | {need / 2**30:.2f} GiB of "
        f"{have / 2**30:.2f} | {verdict} | {time.perf_counter() - start:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--tiny", action="store_true", help="width 32, 512 pieces: a dry run")
    parser.add_argument("--full", action="store_true", help="compile the real depth")
    args = parser.parse_args()
    print("| target | dtype | batch | memory per device | fits | compile |")
    print("|---|---|---|---|---|---|")
    for target in args.targets.split(","):
        print(row(target, args.tiny, args.full), flush=True)


if __name__ == "__main__":
    main()
