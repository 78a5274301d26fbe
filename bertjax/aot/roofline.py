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

Two step times follow, each with the MFU it implies: the **ceiling**, the largest of the bounds
(compute, ICI, DCN; compute and communication overlapped perfectly): no run does better, so
its MFU is an upper bound ("MFU <="); and the **estimate**, the largest of every term, the HBM
estimate included: where HBM wins it is a guess, not a bound ("MFU ~").
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
    module docstring for what each term is). ``ceiling_s`` / ``mfu_ceiling``: the largest bound
    (``bound`` names it) and the MFU no run exceeds; ``step_s`` / ``mfu``: the largest term, the
    HBM estimate included (``limit`` names it; "HBM" makes both an estimate). A DCN term needs
    the chip's DCN rate: bytes across slices on a chip without one raise. A chip of several
    devices (v2) gives each its share of the chip's figures."""
    if dcn_bytes and not chip.dcn_bytes_per_second:
        raise ValueError(
            f"{chip.name}: no published DCN rate per chip (bertjax/aot/chips.py), so the "
            "roofline cannot bound the traffic between slices; compile one slice"
        )
    share = chip.devices_per_chip
    terms = {
        "compute_s": model_flops / (devices * chip.peak_bf16_flops / share),
        "memory_s": hbm_bytes / (chip.hbm_bytes_per_second / share),
        "ici_s": ici_bytes / (chip.ici_bytes_per_second / 2 / share),
        "dcn_s": dcn_bytes / chip.dcn_bytes_per_second if dcn_bytes else 0.0,
    }
    names = {"compute_s": "compute", "memory_s": "HBM", "ici_s": "ICI", "dcn_s": "DCN"}
    bounds = ("compute_s", "ici_s", "dcn_s")
    bound = max(bounds, key=terms.get)
    limit = max(terms, key=terms.get)
    ceiling, step = terms[bound], terms[limit]
    return {
        **terms,
        "ceiling_s": ceiling,
        "bound": names[bound],
        "mfu_ceiling": terms["compute_s"] / ceiling if ceiling else 0.0,
        "step_s": step,
        "limit": names[limit],
        "mfu": terms["compute_s"] / step if step else 0.0,
        "basis": dict(BASIS),
    }
