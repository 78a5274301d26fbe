"""Which platform the computation runs on: the one switch the per-platform fast paths read."""

from __future__ import annotations

import jax


def on_cpu() -> bool:
    """Whether JAX computes on XLA:CPU, where the hand-written backward passes were measured."""
    return jax.default_backend() == "cpu"


def on_tpu() -> bool:
    """Whether JAX computes on a TPU (the Pallas splash-attention kernel's platform)."""
    return jax.default_backend() == "tpu"
