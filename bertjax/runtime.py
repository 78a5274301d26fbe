"""Process settings that only take effect when the process starts: glibc malloc on huge pages.

XLA:CPU (and PyTorch on CPU) allocate each step's large temporaries with malloc; glibc serves
allocations above its mmap threshold with fresh mmap'd pages and unmaps them on free, so every
step page-faults its working set in again, 4 KiB at a time. Measured on a 2-core VM (glibc 2.36,
transparent huge pages in "madvise" mode): BERT-tiny's train step spent ~28% of its CPU time in
the kernel (112M minor faults in a 3000-step run); with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
(malloc madvises its mmap'd chunks for 2 MiB transparent huge pages) the step went from 445 to
295 ms (tiny) and 1223 to 963 ms (mini), see benchmarks/results.md.

glibc reads tunables once, at start-up, so `reexec_with_hugepage_malloc` restarts the
interpreter (same pid, same command line) with the tunable added. train.py and the benchmarks
call it first thing. ``BERTJAX_HUGEPAGE_MALLOC=0`` turns it off; a GLIBC_TUNABLES that already
names glibc.malloc.hugetlb is left as the user set it.
"""
from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb"
DISABLE_ENV = "BERTJAX_HUGEPAGE_MALLOC"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


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
    if TUNABLE in tunables or not hugepage_malloc_supported():
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))}


def reexec_with_hugepage_malloc() -> None:
    """Restarts this process with glibc malloc on transparent huge pages (no-op when set,
    disabled or unsupported). Call before anything else happens: nothing survives the exec."""
    env = hugepage_malloc_environment(dict(os.environ))
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    os.execve(sys.executable, argv, env)
