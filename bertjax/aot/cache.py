"""What the compiler said about each program, kept on disk so that a second check compiles only
the programs a changed knob changed: the optimized HLO text, the memory analysis, XLA's FLOP
count and the compile time (or the out-of-memory message), under a digest of the lowered program
(its floating-point constants blanked: a new learning rate or mask rate is the same program), the
target, the compiler options (``XLA_FLAGS`` and ``LIBTPU_INIT_ARGS`` too) and the compiler's
version, one gzip-compressed JSON file an entry (``KEY.json.gz``). Reports are read anew from
these each time, so a change in how bertjax reads them needs no recompile.

JAX's own persistent compilation cache cannot serve here: an executable compiled for abstract
devices cannot be loaded back without a client of that platform ("PjRtCompiler must be
constructed with a Client to call DeserializeLoadedExecutable").
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import tempfile
import zlib

import jax

from bertjax.aot.roofline import Memory

ENTRY = ".json.gz"  # an entry's file: KEY.json.gz


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One program as the compiler left it (or its refusal, ``out_of_memory``)."""

    seconds: float
    text: str = ""
    memory: Memory | None = None
    xla_flops_per_device: float = 0.0
    out_of_memory: str = ""

    @classmethod
    def of(cls, compiled, seconds: float) -> Compiled:
        cost = compiled.cost_analysis() or {}
        return cls(seconds, compiled.as_text(), Memory.of(compiled), float(cost.get("flops", 0.0)))


# The packages that hold each platform's compiler, by name: libtpu (``libtpu``, ``libtpu-nightly``)
# the CUDA plugins (``jax-cuda12-plugin`` and ``-pjrt``, ``jax-cuda13-*``, ...) and, for the host
# CPU, jaxlib.
COMPILER_PACKAGES = {
    "tpu": r"libtpu(-nightly)?",
    "gpu": r"jax-cuda\d+-(plugin|pjrt)",
    "cpu": r"jaxlib",
}


def compiler_version(platform: str) -> str:
    """The versions of whatever installed packages provide ``platform``'s compiler, and JAX's:
    part of the cache key, so a new compiler never reads an old compiler's programs."""
    pattern = re.compile(COMPILER_PACKAGES.get(platform, "jaxlib"), re.IGNORECASE)
    found = {
        dist.metadata["Name"].lower(): dist.version
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"] and pattern.fullmatch(dist.metadata["Name"])
    }
    return ", ".join([*(f"{n} {v}" for n, v in sorted(found.items())), f"jax {jax.__version__}"])


class CompiledCache:
    """`Compiled` programs in ``directory`` ("" keeps none)."""

    def __init__(self, directory: str, target, options):
        self.directory = directory
        flags = [os.environ.get(name, "") for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")]
        self.salt = repr((target, options, compiler_version(target.chip.platform)))
        if any(flags):  # the compiler reads these too
            self.salt += repr(flags)

    def key(self, lowered_text: str) -> str:
        return hashlib.sha256((self.salt + lowered_text).encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + ENTRY)

    def get(self, key: str) -> Compiled | None:
        """The entry of ``key``; None when there is none, or when it cannot be read whole (a
        truncated or corrupted file: a miss, which the compile that follows replaces)."""
        if not self.directory:
            return None
        try:
            with gzip.open(self._path(key), "rt") as f:
                facts = json.loads(f.read())  # gzip checks its length and CRC-32 at the end
            memory = Memory(**facts["memory"]) if facts.get("memory") else None
            return Compiled(facts["seconds"], facts["text"], memory,
                            facts["xla_flops_per_device"], facts["out_of_memory"])  # fmt: skip
        except FileNotFoundError:
            return None
        except (OSError, EOFError, ValueError, KeyError, TypeError, zlib.error) as error:
            logging.warning("compile cache: entry %s cannot be read (%r): compiling it again", key,
                            error)  # fmt: skip
            return None

    def put(self, key: str, compiled: Compiled) -> None:
        """Writes the entry of ``key``, one file (the program and what the compiler said of it),
        under a temporary name of its own (compile jobs sharing the cache never write into one
        file), then renamed: a reader gets one writer's whole entry, or a miss."""
        if not self.directory:
            return
        os.makedirs(self.directory, exist_ok=True)
        data = gzip.compress(json.dumps(dataclasses.asdict(compiled)).encode(), mtime=0)
        handle, tmp = tempfile.mkstemp(prefix=f".{key}{ENTRY}.", dir=self.directory)
        try:
            with os.fdopen(handle, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(key))
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
