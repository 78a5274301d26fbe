"""What the compiler said about each program, kept on disk so that a second check compiles only
the programs a changed knob changed: the optimized HLO text, the memory analysis, XLA's FLOP
count and the compile time (or the out-of-memory message), under a digest of the lowered program
(its floating-point constants blanked: a new learning rate or mask rate is the same program), the
target, the compiler options (``XLA_FLAGS`` and ``LIBTPU_INIT_ARGS`` too) and the compiler's
version. Reports are read anew from these each
time, so a change in how bertjax reads them needs no recompile.

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
import os
import re

import jax

from bertjax.aot.roofline import Memory


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
# and the CUDA plugins (``jax-cuda12-plugin`` and ``-pjrt``, ``jax-cuda13-*``, ...).
COMPILER_PACKAGES = {"tpu": r"libtpu(-nightly)?", "gpu": r"jax-cuda\d+-(plugin|pjrt)"}


def compiler_version(platform: str) -> str:
    """The versions of whatever installed packages provide ``platform``'s compiler, and JAX's:
    part of the cache key, so a new compiler never reads an old compiler's programs."""
    pattern = re.compile(COMPILER_PACKAGES[platform], re.IGNORECASE)
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

    def _path(self, key: str, suffix: str) -> str:
        return os.path.join(self.directory, key + suffix)

    def get(self, key: str) -> Compiled | None:
        if not self.directory:
            return None
        try:
            with open(self._path(key, ".json")) as f:
                facts = json.load(f)
            text = ""
            if not facts.get("out_of_memory"):
                with gzip.open(self._path(key, ".hlo.gz"), "rt") as f:
                    text = f.read()
        except (OSError, ValueError, KeyError):
            return None
        memory = Memory(**facts["memory"]) if facts.get("memory") else None
        return Compiled(
            facts["seconds"], text, memory, facts["xla_flops_per_device"], facts["out_of_memory"]
        )

    def put(self, key: str, compiled: Compiled) -> None:
        if not self.directory:
            return
        os.makedirs(self.directory, exist_ok=True)
        if compiled.text:  # written first: a report is never read without its program
            with gzip.open(self._path(key, ".hlo.gz.tmp"), "wt") as f:
                f.write(compiled.text)
            os.replace(self._path(key, ".hlo.gz.tmp"), self._path(key, ".hlo.gz"))
        facts = dataclasses.asdict(compiled)
        del facts["text"]
        with open(self._path(key, ".json.tmp"), "w") as f:
            json.dump(facts, f)
        os.replace(self._path(key, ".json.tmp"), self._path(key, ".json"))
