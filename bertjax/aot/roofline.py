"""Memory per chip and a roofline step time of a compiled program, each term labelled with what
it rests on.

- memory: the compiler's own report (`Compiled.memory_analysis`), measured by the compiler.
- compute: the model's FLOPs per step (the trainer's count of its matrix products) at the
  chip's published dense bf16 peak: a lower bound on the step time.
- ICI / DCN: the bytes each chip must send for the collectives the program holds
  (`hlo.collectives`: executions per step, loop trips counted, group sizes from the replica
  groups), by the bandwidth-optimal algorithm of each kind (`hlo.wire_bytes`), at the chip's
  published link bandwidth per direction (half the bidirectional figure): a lower bound.
- HBM: the bytes the program's top-level ops read and write in HBM (`hlo.hbm_traffic`, loop
  bodies times their trips) at the published HBM bandwidth: an estimate, not a bound (fusions
  that read a slice of an operand are counted whole; re-reads inside a fusion are missed).

The step-time figure is the largest term (compute and communication overlapped perfectly), and
the MFU it implies an upper bound in the same sense.
"""

from __future__ import annotations

import dataclasses

BASIS = {
    "compute_s": "bound: the model's FLOPs at the chip's peak",
    "ici_s": "bound: bytes each chip sends by the best algorithm, at the ICI bandwidth",
    "dcn_s": "bound: bytes each chip sends across slices, at its DCN share",
    "memory_s": "estimate: HBM bytes of the top-level ops, at the HBM bandwidth",
}


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
    model_flops: float,
    hbm_bytes: float,
    ici_bytes: float,
    devices: int,
    chip,
    dcn_bytes: float = 0.0,
) -> dict:
    """Step-time terms on ``devices`` chips of ``chip`` (`chips.Chip`): ``model_flops`` for the
    whole step, ``hbm_bytes`` per chip, ``ici_bytes`` and ``dcn_bytes`` sent per chip (see the
    module docstring for what each term is). The step is the largest term, MFU the compute
    term's share of it. A chip of several devices (v2) gives each its share of the chip's
    figures."""
    share = chip.devices_per_chip
    terms = {
        "compute_s": model_flops / (devices * chip.peak_bf16_flops / share),
        "memory_s": hbm_bytes / (chip.hbm_bytes_per_second / share),
        "ici_s": ici_bytes / (chip.ici_bytes_per_second / 2 / share),
        "dcn_s": dcn_bytes / chip.dcn_bytes_per_second if chip.dcn_bytes_per_second else 0.0,
    }
    bound = max(terms, key=terms.get)
    step = terms[bound]
    return {
        **terms,
        "step_s": step,
        "bound": {"compute_s": "compute", "memory_s": "HBM", "ici_s": "ICI", "dcn_s": "DCN"}[bound],
        "mfu": terms["compute_s"] / step if step else 0.0,
        "basis": dict(BASIS),
    }
