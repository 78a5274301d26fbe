"""Which dtype inference's dense products read, chosen once per model and logged.

"auto" (the default of `python -m bertjax.predict` / `bertjax.embed` and of `Embedder`) takes
bfloat16 products that accumulate in float32 (`BertConfig.matmul_dtype`; activations, softmax,
norms and pooling stay float32) for embeddings on a CPU with bfloat16 instructions (AVX512-BF16
or AMX-BF16, read from /proc/cpuinfo): ~3x the float32 product rate there, vectors within cosine
0.9999 of float32 (docs/results/inference.md, tests/real_checkpoint_test.py). It keeps float32 on a
CPU without them, on GPUs and TPUs (their own float32 precision applies), and for labels, tags
and fill-mask scores, whose outputs were not checked in bfloat16. ``--matmul_dtype=float32`` or
``bfloat16`` forces either for any task. The activations stay float32 even then: in bfloat16
XLA:CPU rounds after every elementwise op and no call got faster (docs/results/inference.md,
2026-12-05 late); `stored_for` keeps the kernels in the products' dtype.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from bertjax.ops import platform

CHOICES = ("auto", "float32", "bfloat16")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names of the instruction sets
AUTO_TASKS = ("embed",)  # tasks whose bfloat16 outputs were checked against float32
CPUINFO = "/proc/cpuinfo"
_logged: set = set()


def cpu_bf16_flags(cpuinfo: str = "") -> tuple[str, ...]:
    """The bfloat16 instruction sets this CPU reports in ``cpuinfo`` (default `CPUINFO`; none
    where it is unreadable, as off Linux)."""
    try:
        with open(cpuinfo or CPUINFO) as f:
            text = f.read()
    except OSError:
        return ()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return tuple(name for name in BF16_CPU_FLAGS if name in flags)
    return ()


def matmul_dtype(requested: str = "auto", task: str = "embed") -> str | None:
    """`BertConfig.matmul_dtype` for a ``task`` model asked to run its products in ``requested``
    ("auto", "float32", "bfloat16"): "bfloat16", or None (the activations' float32); logged once
    per choice and reason."""
    if requested not in CHOICES:
        raise ValueError(f"--matmul_dtype={requested!r}: one of {CHOICES}")
    if requested != "auto":
        chosen, why = requested, "as asked"
    elif task not in AUTO_TASKS:
        chosen, why = "float32", f"auto: {task} outputs are checked in float32 only"
    elif not platform.on_cpu():
        chosen, why = "float32", f"auto: {platform.name()} computes float32 at its own precision"
    elif flags := cpu_bf16_flags():
        chosen, why = "bfloat16", f"auto: this CPU has {', '.join(flags)}"
    else:
        chosen, why = "float32", f"auto: this CPU has none of {', '.join(BF16_CPU_FLAGS)}"
    if (chosen, why) not in _logged:
        _logged.add((chosen, why))
        logging.info(
            "inference products in %s (%s; --matmul_dtype=%s for the other)",
            chosen,
            why,
            "float32" if chosen == "bfloat16" else "bfloat16",
        )
    return "bfloat16" if chosen == "bfloat16" else None


def stored_for(params: dict, products: str | None) -> dict:
    """``params`` with every dense kernel (a leaf named ``*kernel``) stored in the ``products``
    dtype the model reads them in: bfloat16 halves their bytes and saves a float32 -> bfloat16
    convert of each kernel at every call (perldiag, all-MiniLM, one process: ~5% of a call,
    docs/results/inference.md 2026-12-05 late). Biases, norms and embedding tables are unchanged
    (they enter float32 arithmetic)."""
    if products is None:
        return params

    def stored(path, leaf):
        name = getattr(path[-1], "key", "")
        kernel = str(name).endswith("kernel") and getattr(leaf, "ndim", 0) >= 2
        return leaf.astype(jnp.dtype(products)) if kernel else leaf

    return jax.tree_util.tree_map_with_path(stored, params)
