"""Process settings that only take effect when the process starts: glibc malloc that keeps its
memory, on huge pages.

XLA:CPU allocates each executable run's temporaries as one block (~1 GB for a BERT-mini train
step at B=32, T=128) from a worker thread; glibc serves it with fresh mmap'd pages and unmaps it
on free, so every step page-faults its whole working set in again (and, with transparent huge
pages, sometimes stalls in the kernel compacting memory). PyTorch on CPU does much the same.
What each tunable saved is measured in docs/results/step.md:
- ``glibc.malloc.hugetlb=1`` (malloc madvises its chunks for 2 MiB pages): fewer, larger faults;
- plus ``arena_max=1`` (one arena, so worker threads' big blocks come from the main heap, which
  can grow to any size), ``mmap_max=0`` (large blocks from the heap, not mmap) and a 32 GiB
  ``trim_threshold`` (freed memory stays mapped): no page faults after the first step and no
  kernel time.
The price: the process keeps its peak heap (what a training process reaches every step anyway),
and one arena serialises malloc across threads. So the last three are added only on hosts with
no GPU or TPU device files: there XLA's temporaries live on the accelerator, and a host's
input-pipeline threads should keep their own arenas.

glibc reads tunables once, at start-up, so `reexec_with_hugepage_malloc` restarts the
interpreter (same pid, same command line) with the tunables added. train.py and the benchmarks
call it first thing. ``BERTJAX_HUGEPAGE_MALLOC=0`` turns it off; a GLIBC_TUNABLES that already
names any of these tunables is left as the user set it.

`fewer_gc_passes` (every command calls it at start, in `bertjax.cli.parse_flags`) makes Python's
young-generation garbage collection run every `GC_GEN0` net allocations instead of 700: tracing
a model for jit allocates millions of short-lived objects, and at the default a small recipe's
run spent ~5% of its CPU in collections (docs/results/tests.md). Reference counting still frees
everything at once; only reference cycles wait longer.

`default_to_cpu_without_accelerator` sets ``JAX_PLATFORMS=cpu`` on a Linux host with no GPU or
TPU device file, unless the user set it: with libtpu installed (the ``tpu`` and ``test`` extras,
for `python -m bertjax.compile`) JAX otherwise starts the TPU runtime on every CPU run, which
finds no chip, prints a screen of warnings and adds ~0.5 s to start-up.
"""

from __future__ import annotations

import gc
import glob
import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb"
# Added together (the last three on CPU-only hosts); a user who set any of them keeps their own
# GLIBC_TUNABLES.
TUNABLES = (
    f"{TUNABLE}=1",
    "glibc.malloc.arena_max=1",
    "glibc.malloc.mmap_max=0",
    f"glibc.malloc.trim_threshold={32 << 30}",
)
DISABLE_ENV = "BERTJAX_HUGEPAGE_MALLOC"
GC_GEN0 = 7000  # net allocations between young-generation collections (Python's default: 700)
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
# Device files by accelerator: NVIDIA GPUs; TPUs (/dev/accelN: v2-v4, v5p; /dev/vfio/N: v5e, v6e).
_ACCELERATOR_DEVICES = {
    "gpu": ("/dev/nvidia[0-9]*",),
    "tpu": ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*"),
}


def accelerator_kind() -> str:
    """The host's accelerator by its device files: tpu, gpu, or cpu where it has none (what a
    Colab runtime is; `bertjax.install` installs for it)."""
    for kind, patterns in _ACCELERATOR_DEVICES.items():
        if any(glob.glob(pattern) for pattern in patterns):
            return kind
    return "cpu"


def accelerator_present() -> bool:
    """A GPU (/dev/nvidiaN) or TPU (/dev/accelN, /dev/vfio/N) device file exists on this host."""
    return accelerator_kind() != "cpu"


def default_to_cpu_without_accelerator(environ=os.environ) -> None:
    """``JAX_PLATFORMS=cpu`` where the user left it unset and a Linux host has no accelerator
    device file (see the module docstring). Call before JAX starts a backend: jax reads the
    variable when it is imported, so where it already is (a ``python -m bertjax.X`` module
    imports it before its ``__main__`` block runs) its config is set too."""
    if "JAX_PLATFORMS" not in environ and sys.platform.startswith("linux"):
        if not accelerator_present():
            environ["JAX_PLATFORMS"] = "cpu"
            if environ is os.environ and "jax" in sys.modules:
                sys.modules["jax"].config.update("jax_platforms", "cpu")


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def cpu_device_per_core(environ=os.environ, most: int = 8) -> None:
    """One JAX CPU device per usable core (up to ``most``) where the user chose no count (neither
    ``jax_num_cpu_devices`` nor XLA_FLAGS' --xla_force_host_platform_device_count): XLA:CPU runs
    calls on different devices side by side, so inference spreads its calls over them (one
    device keeps 2 cores only ~1.1x as busy as 1; docs/results/inference.md 2026-12-05 late). Call
    before JAX starts a backend (the inference commands do)."""
    if "xla_force_host_platform_device_count" in environ.get("XLA_FLAGS", ""):
        return
    import jax

    if jax.config.jax_num_cpu_devices < 0:
        jax.config.update("jax_num_cpu_devices", min(usable_cores(), most))


def hugepage_malloc_supported() -> bool:
    """Linux with glibc >= 2.35 (the first with glibc.malloc.hugetlb) and THP not disabled."""
    if not sys.platform.startswith("linux"):
        return False
    libc, version = platform.libc_ver()
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    if libc != "glibc" or (major, minor) < (2, 35):
        return False
    try:
        with open(_THP_MODE) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def hugepage_malloc_environment(environ: dict) -> dict | None:
    """The environment to restart with, or None when no restart is wanted."""
    if environ.get(DISABLE_ENV, "1") == "0":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    names = [tunable.split("=")[0] for tunable in TUNABLES]
    if any(name in tunables for name in names) or not hugepage_malloc_supported():
        return None
    ours = TUNABLES[:1] if accelerator_present() else TUNABLES
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, *ours]))}


def fewer_gc_passes() -> None:
    """Young-generation collections every `GC_GEN0` net allocations (the module docstring); a
    higher threshold the process already has, or collection switched off, is kept."""
    gen0, *older = gc.get_threshold()
    if 0 < gen0 < GC_GEN0:
        gc.set_threshold(GC_GEN0, *older)


def reexec_with_hugepage_malloc() -> None:
    """Restarts this process with glibc malloc that keeps its memory, on transparent huge pages
    (no-op when set, disabled or unsupported). Call before anything else happens: nothing
    survives the exec."""
    env = hugepage_malloc_environment(dict(os.environ))
    if env is None:
        return
    sys.stderr.write(
        f"bertjax: restarting once with GLIBC_TUNABLES={env['GLIBC_TUNABLES']} (glibc malloc "
        f"keeps its memory, on huge pages; {DISABLE_ENV}=0 turns this off)\n"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    os.execve(sys.executable, argv, env)
