"""A compile target's abstract devices, as the real compiler describes them: they compile, never
run, and no accelerator is needed.

TPU slices come from libtpu (`jax.experimental.topologies.get_topology_desc`, the ``tpu``
extra), ``num_slices`` of them for a multislice target. GPU nodes come from the CUDA plugin
(``pip install jax-cuda12-plugin==<jax version>``: its compiler alone, no CUDA libraries and no
GPU), given a target description (XLA's ``GpuTargetConfig``) written here from the GPU's
published figures (`DEVICE_INFO`).
"""

from __future__ import annotations

import contextlib
import os

from bertjax.aot.chips import Slice

# Published hardware figures of each GPU (NVIDIA's Hopper and Ampere architecture whitepapers and
# the CUDA programming guide's compute-capability table) in the fields of XLA's GpuDeviceInfo:
# the compiler's cost model and kernel emitters read them.
DEVICE_INFO = {
    "h100": dict(
        name="NVIDIA H100 80GB HBM3", core_count=132, fpus_per_core=128, cc=(9, 0),
        clock_rate_ghz=1.98, memory_bandwidth=3.35e12, device_memory_size=80 * 10**9,
        l2_cache_size=50 << 20, shared_memory_per_core=228 << 10,
        shared_memory_per_block_optin=227 << 10,
    ),
    "h200": dict(
        name="NVIDIA H200", core_count=132, fpus_per_core=128, cc=(9, 0), clock_rate_ghz=1.98,
        memory_bandwidth=4.8e12, device_memory_size=141 * 10**9, l2_cache_size=50 << 20,
        shared_memory_per_core=228 << 10, shared_memory_per_block_optin=227 << 10,
    ),
    "a100": dict(
        name="NVIDIA A100-SXM4-80GB", core_count=108, fpus_per_core=64, cc=(8, 0),
        clock_rate_ghz=1.41, memory_bandwidth=2.039e12, device_memory_size=80 * 10**9,
        l2_cache_size=40 << 20, shared_memory_per_core=164 << 10,
        shared_memory_per_block_optin=163 << 10,
    ),
    # Colab's GPUs (the datasheets; Turing and Ada Lovelace tuning guides for shared memory).
    "a100-40g": dict(
        name="NVIDIA A100-SXM4-40GB", core_count=108, fpus_per_core=64, cc=(8, 0),
        clock_rate_ghz=1.41, memory_bandwidth=1.555e12, device_memory_size=40 * 10**9,
        l2_cache_size=40 << 20, shared_memory_per_core=164 << 10,
        shared_memory_per_block_optin=163 << 10,
    ),
    "l4": dict(
        name="NVIDIA L4", core_count=58, fpus_per_core=128, cc=(8, 9), clock_rate_ghz=2.04,
        memory_bandwidth=300e9, device_memory_size=24 * 10**9, l2_cache_size=48 << 20,
        shared_memory_per_core=100 << 10, shared_memory_per_block_optin=99 << 10,
    ),
    "t4": dict(
        name="Tesla T4", core_count=40, fpus_per_core=64, cc=(7, 5), clock_rate_ghz=1.59,
        memory_bandwidth=320e9, device_memory_size=16 * 10**9, l2_cache_size=4 << 20,
        shared_memory_per_core=64 << 10, shared_memory_per_block_optin=64 << 10,
    ),
}  # fmt: skip
CUDNN_VERSION = (9, 10)  # the cuDNN the compile assumes (jax-cuda12 0.10's pinned cuDNN 9)


def gpu_target_config(chip_name: str) -> str:
    """XLA's ``GpuTargetConfig`` (text proto) for one GPU of ``chip_name``."""
    info = DEVICE_INFO[chip_name]
    major, minor = info["cc"]
    fields = {
        "threads_per_block_limit": 1024,
        "threads_per_warp": 32,
        "shared_memory_per_block": 48 << 10,
        "shared_memory_per_core": info["shared_memory_per_core"],
        "threads_per_core_limit": 2048,
        "core_count": info["core_count"],
        "fpus_per_core": info["fpus_per_core"],
        "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": int(info["memory_bandwidth"]),
        "l2_cache_size": info["l2_cache_size"],
        "clock_rate_ghz": info["clock_rate_ghz"],
        "device_memory_size": info["device_memory_size"],
        "shared_memory_per_block_optin": info["shared_memory_per_block_optin"],
        "registers_per_core_limit": 65536,
        "registers_per_block_limit": 65536,
    }
    lines = [f"  {key}: {value}" for key, value in fields.items()]
    lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor} }}")
    return "\n".join(
        [
            "gpu_device_info {",
            *lines,
            "}",
            'platform_name: "CUDA"',
            f"dnn_version_info {{ major: {CUDNN_VERSION[0]} minor: {CUDNN_VERSION[1]} }}",
            f'device_description_str: "{info["name"]}"',
        ]
    )


class CompilerMissing(RuntimeError):
    """The target's compiler is not installed here (or cannot describe the target)."""


@contextlib.contextmanager
def _libtpu_shared():
    """libtpu takes a host-wide lock file when it starts; a compile for a slice runs nothing, so
    it need not wait for another process holding it. Set only while libtpu starts here."""
    before = os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD")
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
        else:
            os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = before


def topology_devices(target: Slice) -> list:
    """The target's devices as its compiler describes them (abstract: they compile, never
    run); a multislice target's carry their ``slice_index``."""
    from jax.experimental import topologies

    if target.chip.platform == "gpu":
        nodes, per_node = target.grid
        try:
            description = topologies.get_topology_desc(
                platform="cuda",
                topology=f"1x{nodes}x{per_node}",
                target_config=gpu_target_config(target.chip.name),
            )
        except Exception as error:  # the CUDA plugin missing, or a shape it does not take
            raise CompilerMissing(
                f"the CUDA compiler could not describe {target.topology_name}: {error}. Install "
                "it with pip install jax-cuda12-plugin==<your jax version> (no GPU needed)"
            ) from error
        return list(description.devices)
    options = {"num_slices": target.num_slices} if target.num_slices > 1 else {}
    if target.chips == 1:  # a one-chip host (v5e-1, v6e-1): libtpu's default host is 2x2
        options["chips_per_host_bounds"] = [1, 1, 1]
    try:
        with _libtpu_shared():
            description = topologies.get_topology_desc(
                topology_name=target.topology_name.split(" ")[0], platform="tpu", **options
            )
    except Exception as error:  # libtpu missing, or a grid it does not know
        raise CompilerMissing(
            f"libtpu could not describe {target.topology_name}: {error}. Install the TPU "
            "compiler with pip install 'jax[tpu]' (the tpu extra)"
        ) from error
    return list(description.devices)
