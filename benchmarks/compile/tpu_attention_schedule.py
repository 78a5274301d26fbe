"""What attention costs inside a TPU kernel, read from the program libtpu compiles on this CPU
host (no TPU needed): the flash_dropout kernel with and without dropout beside splash (the peer:
JAX's Pallas kernel, no dropout) on one chip's rows of BERT-base (batch 16, 12 heads of 64, bf16),
forward and backward.

    python benchmarks/compile/tpu_attention_schedule.py [--lengths 128,512,1024] \
        [--topology v5e:2x2]
        [--batch 16] [--heads 12] [--head_dim 64] [--rate 0.1] [--dry_run]

libtpu writes each kernel's final VLIW schedule (``--xla_jf_dump_to``, one bundle a cycle when
nothing stalls); a grid step is one pass of its loop body, so a call costs about its grid steps
times the body's bundles. Printed per kernel and length: grid steps, bundles a step (forward /
backward), the call's bundles and its time at the chip's clock (peak bf16 FLOP/s over the MXUs'
4 x 128 x 128 multiply-adds a cycle: 1.5 GHz on v5e), and the vector-ALU operations per score
element (the keep-bits' cost is the difference between the dropout and no-dropout rows). A static
schedule leaves out DMA waits and pipeline stalls: a lower bound per step, not a measurement.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOTS = ("MXU", "XLU", "VALU", "VPOP", "EUP", "VLOAD", "VLOAD:FILL", "VSTORE", "VSTORE:SPILL")


def _compile(kernel: str, length: int, rate: float, args) -> None:
    """(child) Compile one kernel's forward and backward for one chip."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    from bertjax.ops import flash_dropout, keep_bits, splash

    devices = topologies.get_topology_desc(topology_name=args.topology, platform="tpu").devices
    mesh = jax.sharding.Mesh(np.array(devices[:1]), ("data",))
    rows = PartitionSpec("data", None, None, None)

    def step(q, k, v, segments, positions, cotangent):
        def attend(q, k, v):
            if kernel == "splash":
                return splash.attention(q, k, v, segments, segments, 0, partition=rows)
            seed = keep_bits.seed_words(jax.random.key(0)) if rate else None
            return flash_dropout.attention(
                q, k, v, segments, segments, positions, positions, seed, rate, partition=rows
            )

        out, pullback = jax.vjp(attend, q, k, v)
        return out, pullback(cotangent)

    sharded = NamedSharding(mesh, PartitionSpec("data"))
    qkv = jax.ShapeDtypeStruct(
        (args.batch, length, args.heads, args.head_dim), jnp.bfloat16, sharding=sharded
    )
    ids = jax.ShapeDtypeStruct((args.batch, length), jnp.int32, sharding=sharded)
    with jax.set_mesh(mesh):
        jax.jit(step).lower(qkv, qkv, qkv, ids, ids, qkv).compile()


def _slots(dump: str) -> dict[str, tuple[int, dict]]:
    """{kernel: (bundles, slot operations summed)} of the Mosaic kernels in an LLO dump."""
    found = {}
    for path in glob.glob(os.path.join(dump, "*final_hlo-static-per-bundle-utilization.txt")):
        name = os.path.basename(path).split("-")[1]
        if "jvp" not in name and "splash" not in name:
            continue  # XLA's own fusions
        with open(path) as f:
            rows = [line.split() for line in f if line[:1].isdigit()]
        found[name] = (len(rows), {s: sum(int(r[i]) for r in rows) for i, s in enumerate(SLOTS)})
    return found


def measure(kernel: str, length: int, rate: float, args) -> dict:
    """Compile in a child process that dumps the LLO; the forward's and backward's schedules."""
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, LIBTPU_INIT_ARGS=f"--xla_jf_dump_to={dump}", PYTHONPATH=ROOT)
        command = [sys.executable, __file__, f"--_child={kernel},{length},{rate}"]
        command += [f"--{k}={v}" for k, v in vars(args).items() if k in _SHAPE]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(result.stderr[-2000:])
        found = _slots(dump)
    backward = [k for k in found if k.startswith("transpose") or "dkv" in k]
    forward = [k for k in found if k not in backward]
    return {"forward": found[forward[0]], "backward": found[backward[0]]}


def grid_steps(kernel: str, length: int, args) -> tuple[int, int]:
    """(forward, backward) grid steps: splash a step per row, head and block pair; flash_dropout
    as many heads a step as fit 512 x 512 scores."""
    padded = -(-length // 128) * 128
    block = next(b for b in (512, 256, 128) if padded % b == 0)
    pairs = (padded // block) ** 2
    if kernel == "splash":
        return (args.batch * args.heads * pairs,) * 2
    fits = [g for g in range(1, args.heads + 1) if args.heads % g == 0 and g * block**2 <= 512**2]
    return (args.batch * args.heads // max(fits) * pairs,) * 2


_SHAPE = ("topology", "batch", "heads", "head_dim")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="128,512,1024")
    parser.add_argument("--topology", default="v5e:2x2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--clock_ghz", type=float, default=1.5, help="v5e: 197 TFLOP/s / MXUs")
    parser.add_argument("--dry_run", action="store_true", help="T=128, 2 rows, 2 heads")
    parser.add_argument("--_child", default="")
    args = parser.parse_args()
    if args._child:
        kernel, length, rate = args._child.split(",")
        return _compile(kernel, int(length), float(rate), args)
    if args.dry_run:
        args.lengths, args.batch, args.heads = "128", 2, 2
    print(
        f"{args.topology}, one chip: batch {args.batch}, {args.heads} heads of {args.head_dim}, "
        f"bf16; static schedules (bundles), {args.clock_ghz} GHz"
    )
    print("| kernel | T | grid steps | bundles a step (fwd / bwd) | fwd+bwd bundles | us | "
          "VALU ops a score (fwd / bwd) | stores+spills a step (fwd / bwd) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for length in (int(t) for t in args.lengths.split(",")):
        for kernel, rate in (("splash", 0.0), ("flash_dropout", 0.0), ("flash_dropout", args.rate)):
            found = measure(kernel, length, rate, args)
            steps = grid_steps(kernel, length, args)
            (fb, fs), (bb, bs) = found["forward"], found["backward"]
            total = steps[0] * fb + steps[1] * bb
            scores = args.batch * args.heads * length * length  # unpadded, per call
            valu = [s["VALU"] * n * 1024 / scores for s, n in ((fs, steps[0]), (bs, steps[1]))]
            stores = [s["VSTORE"] + s["VSTORE:SPILL"] for s in (fs, bs)]
            name = kernel + (f", dropout {rate}" if rate else "")
            print(
                f"| {name} | {length} | {steps[0]} | {fb} / {bb} | {total:,} | "
                f"{total / args.clock_ghz / 1e3:,.0f} | {valu[0]:.1f} / {valu[1]:.1f} | "
                f"{stores[0]} / {stores[1]} |"
            )


if __name__ == "__main__":
    main()
