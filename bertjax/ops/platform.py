"""Which platform the computation runs on: the one switch the per-platform fast paths read.

It is the platform of the devices the step is compiled for: the abstract mesh's device while a
mesh is set (`jax.sharding.use_abstract_mesh` / `jax.set_mesh`, as the step's jits and the
state's init trace), else JAX's default backend. So a step compiled on a CPU host for a TPU
topology (`python -m bertjax.compile`) takes the TPU kernels, as the run on the slice would.
"""

from __future__ import annotations

import jax


def name() -> str:
    """The XLA platform ("cpu", "tpu", "gpu", ...) of the devices being compiled for."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if device is not None:
        return device.platform
    return jax.default_backend()


def on_cpu() -> bool:
    """Whether the step computes on XLA:CPU, where the hand-written backward passes were
    measured."""
    return name() == "cpu"


def on_tpu() -> bool:
    """Whether the step computes on a TPU (the Pallas splash-attention kernel's platform)."""
    return name() == "tpu"


def current() -> str:
    """The platform, "cpu", "tpu" or "gpu" (any other accelerator), that the attention kernels'
    automatic choice reads (tests simulate platforms by patching this or `on_cpu`)."""
    if on_cpu():
        return "cpu"
    return "tpu" if on_tpu() else "gpu"
