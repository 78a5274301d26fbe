"""Test session set-up: 8 fake CPU devices for sharding tests, fp32 matmuls."""

import os

# Must happen before jax is imported anywhere: sharding tests need several devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
