"""Which platform the computation runs on: the one switch the per-platform fast paths read."""

from __future__ import annotations

import jax


def on_cpu() -> bool:
    """Whether JAX computes on XLA:CPU, where the hand-written backward passes were measured."""
    return jax.default_backend() == "cpu"


def on_tpu() -> bool:
    """Whether JAX computes on a TPU (the Pallas splash-attention kernel's platform)."""
    return jax.default_backend() == "tpu"


def current() -> str:
    """The platform, "cpu", "tpu" or "gpu" (any other accelerator), that the attention kernels'
    automatic choice reads (tests simulate platforms by patching this or `on_cpu`)."""
    if on_cpu():
        return "cpu"
    return "tpu" if on_tpu() else "gpu"
