"""What a compiled program holds, read from the compiler's own reports: memory per chip
(`memory_analysis`), FLOPs (`cost_analysis`), the collectives in its HLO text (kind, count,
bytes), the Mosaic (Pallas) kernels it calls, and a roofline estimate of its step time.

Collective counts and bytes are per execution of the program on one chip: an op inside a loop
body (a scanned layer stack, gradient accumulation) counts once per iteration, the iterations
read from the loop's condition (the bound it compares the counter with). XLA's
``cost_analysis`` FLOPs count a loop body once and a custom call (a Pallas kernel) as 0, so the
model's own FLOP count is printed beside it.
"""

from __future__ import annotations

import collections
import dataclasses
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4}
_BYTES |= {"u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) ([a-z][a-z0-9\-]*)\(")
_WHILE = re.compile(r"condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_CALLS = re.compile(r"\b(?:calls|body|to_apply|branch_computations)=\{?%?([\w.\-]+)")
_CONSTANT = re.compile(r"[su]32\[\] constant\((\d+)\)")


def array_bytes(shape_text: str) -> int:
    """Bytes of the arrays in an HLO result type (``bf16[8,128]``, tuples summed)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        size = _BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)
        for dim in filter(None, dims.split(",")):
            size *= int(dim)
        total += size
    return total


def _computations(hlo_text: str) -> dict:
    """{computation name: its instruction lines}; ``__entry__`` names the entry's."""
    bodies, name = {}, None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            name = match.group(1)
            bodies[name] = []
            if line.startswith("ENTRY"):
                bodies["__entry__"] = bodies[name]
        elif name is not None and line.strip() != "}":
            bodies[name].append(line)
    return bodies


def _executions(bodies: dict) -> dict:
    """{computation: times it runs per program run}: loop bodies times their trip count (the
    largest 32-bit constant in the loop's condition), called computations as their caller."""
    runs = collections.Counter()
    entry = next(name for name, lines in bodies.items() if lines is bodies["__entry__"])

    def visit(name: str, times: int, depth: int = 0):
        runs[name] += times
        if depth > 64:  # malformed text: stop rather than recurse forever
            return
        for line in bodies.get(name, ()):
            loop = _WHILE.search(line)
            if loop:
                condition, body = loop.groups()
                bounds = [int(c) for c in _CONSTANT.findall("\n".join(bodies.get(condition, ())))]
                visit(body, times * max(bounds, default=1), depth + 1)
                continue
            for called in _CALLS.findall(line):
                if called in bodies and called != name:
                    visit(called, times, depth + 1)

    visit(entry, 1)
    return runs


@dataclasses.dataclass
class Collective:
    kind: str
    count: int = 0  # executions per step (loop iterations counted)
    bytes: int = 0  # result bytes per chip, summed over executions


def collectives(hlo_text: str) -> dict:
    """{kind: Collective} of a compiled program (async start/done pairs counted once)."""
    bodies = _computations(hlo_text)
    runs = _executions(bodies)
    found = {}
    for name, lines in bodies.items():
        if name == "__entry__" or not runs.get(name):
            continue
        for line in lines:
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            result, op = match.groups()
            kind = op.removesuffix("-start")
            if kind not in COLLECTIVES or op.endswith("-done"):
                continue
            entry = found.setdefault(kind, Collective(kind))
            entry.count += runs[name]
            entry.bytes += runs[name] * array_bytes(result)
    return found


def mosaic_kernels(hlo_text: str) -> int:
    """How many Mosaic (Pallas TPU) custom calls the program holds (splash's are these)."""
    return len(re.findall(r'custom_call_target="tpu_custom_call"', hlo_text))


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per chip of a compiled program (`Compiled.memory_analysis`)."""

    arguments: int
    outputs: int
    aliased: int  # outputs written over donated arguments
    temporaries: int
    code: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    @classmethod
    def of(cls, compiled) -> Memory:
        stats = compiled.memory_analysis()
        return cls(
            stats.argument_size_in_bytes,
            stats.output_size_in_bytes,
            stats.alias_size_in_bytes,
            stats.temp_size_in_bytes,
            stats.generated_code_size_in_bytes,
        )


def roofline(
    model_flops: float, hbm_bytes: float, collective_bytes: float, chips: int, chip
) -> dict:
    """Step-time bounds on ``chips`` chips of ``chip`` (`chips.Chip`): compute (model FLOPs at
    peak bf16), memory (``hbm_bytes`` per chip at HBM bandwidth) and communication (collective
    bytes per chip at ICI bandwidth); the estimate is the largest (perfect overlap) and the MFU
    it implies."""
    compute = model_flops / (chips * chip.peak_bf16_flops)
    memory = hbm_bytes / chip.hbm_bytes_per_second
    communication = collective_bytes / chip.ici_bytes_per_second
    step = max(compute, memory, communication)
    bound = {compute: "compute", memory: "memory", communication: "ici"}[step]
    return {
        "compute_s": compute,
        "memory_s": memory,
        "ici_s": communication,
        "step_s": step,
        "bound": bound,
        "mfu": compute / step if step else 0.0,
    }
