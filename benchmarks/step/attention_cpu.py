"""Attention forward + backward on the CPU: the ways bertjax can compute it, side by side.

Times ``--layers`` layers of self-attention (gradients of a loss of the outputs with respect to
q, k and v; B, T, N, H as given) for: autodiff of `jax.nn.dot_product_attention` (XLA), autodiff
of `bertjax.modeling.attention.exact_attention`, and `bertjax.ops.attention.attention` (hand-written
backward) with
1, 2 and 4 row chains; and one batched [B, N, T, H] x [B, N, H, T] product alone, to show the
rate XLA:CPU gets from such small matrices. Medians after one warm-up call.

  python benchmarks/step/attention_cpu.py                        # BERT-mini's shapes, 4 layers
  python benchmarks/step/attention_cpu.py --batch 8 --length 512
  python benchmarks/step/attention_cpu.py --long                 # dense vs blocked, T = 512 .. 8192

``--long``: one layer at ModernBERT-tiny's heads (N=2, H=64), the same 8192 tokens per call at
every T: global attention dense (`ops.attention`) vs blocked (`ops.blocked_attention.
flash_attention`, key blocks of 256 / 512 / 1024), local attention (half-window ``--half-window``)
dense on a windowed mask vs banded (`local_attention`, blocks of 64 / 128 / 256); ms and the
compiled step's temporary memory (XLA's memory analysis). The thresholds in
bertjax/modeling/attention.py (LOCAL_BLOCK, FLASH_FROM, FLASH_BLOCK) come from this table.
"""

from __future__ import annotations

import argparse
import statistics

from bertjax.training import runtime

runtime.reexec_with_hugepage_malloc()  # before jax starts: the imports below come after it

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from step_throughput import time_steps  # noqa: E402  (benchmarks/, this script's folder)

from bertjax.modeling.attention import AttentionMask, exact_attention  # noqa: E402
from bertjax.ops import attention as products  # noqa: E402
from bertjax.ops import blocked_attention as blocked  # noqa: E402


def median_ms(fn, *args, repeats: int) -> float:
    """Median ms of ``fn(*args)`` over ``repeats`` calls after one warm-up call."""
    return 1e3 * statistics.median(time_steps(lambda: jax.block_until_ready(fn(*args)), 1, repeats))


def _long_variants(b: int, t: int, half: int) -> list:
    """(name, attend(q, k, v)) of the ``--long`` table at one (B, T)."""
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = AttentionMask.build(None, None, positions)
    seg_q, seg_k, chains = mask.query_segments, mask.key_segments, products.cpu_chains(b)

    def dense(window):
        return lambda q, k, v: products.attention(q, k, v, mask.dense(window), chains=chains)

    def flash(block):
        return lambda q, k, v: blocked.flash_attention(
            q, k, v, seg_q, seg_k, positions, positions, 0, block
        )

    def banded(block):
        return lambda q, k, v: blocked.local_attention(
            q, k, v, seg_q, seg_k, positions, half, block, chains
        )

    variants = [("global, dense ops.attention", dense(0))]
    variants += [(f"global, flash block {k}", flash(k)) for k in (256, 512, 1024) if k <= t]
    variants += [(f"local +-{half}, dense windowed mask", dense(half))]
    variants += [
        (f"local +-{half}, banded block {k}", banded(k)) for k in (64, 128, 256) if half <= k < t
    ]
    return variants


def long_rows(args) -> None:
    """The ``--long`` table (module docstring)."""
    n, h = 2, args.head_dim
    print(f"| one layer, N={n} H={h}, 8192 tokens, fwd + bwd | T | B | ms | temp MiB |")
    print("|---|---|---|---|---|")
    for t in (512, 1024, 2048, 4096, 8192):
        b = max(1, 8192 // t)
        rng = np.random.default_rng(0)
        q, k, v = (jnp.asarray(rng.normal(size=(b, t, n, h)) * 0.3, jnp.float32) for _ in range(3))
        for name, attend in _long_variants(b, t, args.half_window):
            if "dense" in name and t > args.dense_up_to:
                continue
            grad = jax.jit(jax.grad(lambda q, k, v, f=attend: jnp.sum(f(q, k, v) ** 2), (0, 1, 2)))
            temp = grad.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
            ms = median_ms(grad, q, k, v, repeats=args.repeats)
            print(f"| {name} | {t} | {b} | {ms:.1f} | {temp / 2**20:.0f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="dense vs blocked at long rows")
    parser.add_argument("--half-window", type=int, default=64)
    parser.add_argument("--dense-up-to", type=int, default=4096, help="--long: longest dense T")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if args.long:
        return long_rows(args)
    b, t, n, h = args.batch, args.length, args.heads, args.head_dim
    rng = np.random.default_rng(0)
    qkv = [
        tuple(jnp.asarray(rng.normal(size=(b, t, n, h)) * 0.3, jnp.float32) for _ in range(3))
        for _ in range(args.layers)
    ]
    mask = jnp.ones((b, 1, 1, t), bool)

    def fused(q, k, v):
        return jax.nn.dot_product_attention(
            q, k, v, mask=jnp.broadcast_to(mask, (b, 1, t, t)), implementation="xla"
        )

    variants = [
        ("autodiff of jax.nn.dot_product_attention (xla)", fused),
        ("autodiff of exact_attention", lambda q, k, v: exact_attention(q, k, v, mask)),
    ]
    variants += [
        (
            f"ops.attention, {c} chain{'s' if c > 1 else ''}",
            lambda q, k, v, c=c: products.attention(q, k, v, mask, chains=c),
        )
        for c in (1, 2, 4)
        if b % c == 0
    ]
    flops = args.layers * 3 * 2 * (2 * b * n * t * t * h)  # 2 products forward, 4 backward
    print(f"| {args.layers} layers, B={b} T={t} N={n} H={h}, forward + backward | ms | GFLOP/s |")
    print("|---|---|---|")
    for name, attend in variants:

        def loss(layers, attend=attend):
            return sum(jnp.sum(attend(q, k, v) ** 2) for q, k, v in layers)

        ms = median_ms(jax.jit(jax.grad(loss)), qkv, repeats=args.repeats)
        print(f"| {name} | {ms:.1f} | {flops / ms / 1e6:.0f} |", flush=True)
    q, k = (jnp.transpose(a, (0, 2, 1, 3)) for a in qkv[0][:2])
    product = jax.jit(lambda x, y: jax.lax.dot_general(x, y, (((3,), (3,)), ((0, 1), (0, 1)))))
    ms = median_ms(product, q, k, repeats=args.repeats)
    print(
        f"| one batched [B,N,T,H] x [B,N,S,H] product, forward only | {ms:.2f} | "
        f"{2 * b * n * t * t * h / ms / 1e6:.0f} |"
    )


if __name__ == "__main__":
    main()
