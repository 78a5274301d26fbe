"""The collectives of a compiled program, per chip per step: kind, executions (loop trips
counted), result and operand bytes (a reduce-scatter's operand is the whole array it reduces,
its result a chip's share), group sizes, and the bytes each chip must send over ICI and,
in a multislice program, across slices (DCN), by the bandwidth-optimal algorithm of each kind.

Read from the program's HLO (`hlo.Module`). libtpu writes an asynchronous collective as a chain
of fusions (``async-collective-start`` -> ``async_collective_fusion`` parts overlapped with
compute -> ``-done``) whose called computations each hold the same op under one
``channel_id``: the chain is one collective, counted where it starts (the computation whose root
is the ``AsyncCollectiveStart`` custom call). An ``all-reduce`` inside a computation called
``all-reduce-scatter...`` is a reduce-scatter (the all-reduce and the slice each chip keeps are
one fused op): it counts as a reduce-scatter whose result is the fusion's.
"""

from __future__ import annotations

import dataclasses
import re

from bertjax.aot.hlo import (
    CHANNEL,
    COLLECTIVES,
    Module,
    array_bytes,
    device_groups,
    tuple_elements,
)


@dataclasses.dataclass
class Collective:
    """Every execution of one kind of collective in a program, per chip."""

    kind: str
    count: int = 0  # executions per step (loop iterations counted)
    bytes: int = 0  # result bytes per chip, summed over executions
    operand_bytes: int = 0  # operand bytes per chip, summed over executions
    wire_bytes: float = 0.0  # bytes each chip sends over ICI, by the algorithm (`wire_bytes`)
    dcn_bytes: float = 0.0  # bytes each chip sends across slices (`dcn_bytes`)
    group_sizes: dict = dataclasses.field(default_factory=dict)  # {devices per group: count}
    ops: list = dataclasses.field(default_factory=list)  # (bytes, group size, count, op name)


def wire_bytes(kind: str, result: int, operand: int, group: int) -> float:
    """Bytes one chip must send for a collective over ``group`` chips, bandwidth-optimal
    algorithms (the ring's figures, which no algorithm beats): an all-reduce of S bytes sends
    2(n-1)/n S, a reduce-scatter of an S-byte operand (n-1)/n S, an all-gather into an S-byte
    result (n-1)/n S, an all-to-all of S bytes (n-1)/n S, a collective-permute its buffer once."""
    if kind == "collective-permute":
        return float(result)
    if group <= 1:
        return 0.0
    share = (group - 1) / group
    return {
        "all-reduce": 2 * share * result,
        "reduce-scatter": share * operand,
        "all-gather": share * result,
        "all-to-all": share * result,
    }[kind]


def _async_parts(module: Module) -> tuple[set, set]:
    """(computations that start an async collective chain, channel ids of such chains)."""
    starts, channels = set(), set()
    for name, instructions in module.computations.items():
        root = module.root(name)
        if root is not None and 'custom_call_target="AsyncCollectiveStart"' in root.attributes:
            starts.add(name)
            for i in instructions:
                channel = CHANNEL.search(i.attributes)
                if channel and i.op in COLLECTIVES:
                    channels.add(channel.group(1))
    return starts, channels


def dcn_bytes(kind: str, result: int, operand: int, group: int, slices: int) -> float:
    """Bytes one chip sends across slices for a collective whose ``group`` chips lie in
    ``slices`` slices, done hierarchically (within each slice first, then across slices on the
    slice's share): an all-reduce sends 2(s-1)/s of its 1/m share (m = chips per slice), a
    reduce-scatter or all-gather (s-1)/s of it, an all-to-all the (s-1)/s of its buffer bound
    for other slices, a collective-permute its buffer."""
    if slices <= 1:
        return 0.0
    share, per_slice = (slices - 1) / slices, group / slices
    return {
        "all-reduce": 2 * share * result / per_slice,
        "reduce-scatter": share * operand / per_slice,
        "all-gather": share * result / per_slice,
        "all-to-all": share * result,
        "collective-permute": float(result),
    }[kind]


_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')


def _megascale(found: dict, instruction, runs: int, slices: int) -> None:
    """A transfer between TPU slices: libtpu compiles a multislice program per slice, its
    collectives over the data-center network as host transfers (``send`` with a megascale
    transfer type) of this chip's buffer."""
    kind = _MEGASCALE.search(instruction.attributes).group(1).lower().replace("_", "-")
    sent = array_bytes(tuple_elements(instruction.result)[0])
    share = (slices - 1) / slices
    factor = {"all-reduce": 2 * share, "reduce-scatter": share, "all-to-all": share}
    factor["all-gather"] = slices - 1
    entry = found.setdefault(f"{kind} (dcn)", Collective(f"{kind} (dcn)"))
    entry.count += runs
    entry.bytes += runs * sent
    entry.operand_bytes += runs * sent
    entry.dcn_bytes += runs * factor.get(kind, 1.0) * sent
    entry.group_sizes[slices] = entry.group_sizes.get(slices, 0) + runs
    entry.ops.append((sent, slices, runs, instruction.name))


def collectives(hlo_text: str | Module, slice_of=None, slices: int = 1) -> dict:
    """{kind: Collective} of a compiled program, per chip per step. ``slices``: TPU slices of a
    multislice program (its transfers between slices count as ``"<kind> (dcn)"``, their bytes
    in ``dcn_bytes``). ``slice_of``: partition id -> node (GPU nodes): a group over several
    nodes counts its in-node part in ``wire_bytes`` and its part between nodes in
    ``dcn_bytes``."""
    module = hlo_text if isinstance(hlo_text, Module) else Module(hlo_text)
    starts, async_channels = _async_parts(module)
    found: dict[str, Collective] = {}
    for name, instructions in module.computations.items():
        runs = module.runs.get(name, 0)
        if not runs:
            continue
        scatter = name.startswith("all-reduce-scatter")
        shapes = {i.name: i.result for i in instructions}
        for i in instructions:
            if i.op == "send" and _MEGASCALE.search(i.attributes):
                _megascale(found, i, runs, slices)
                continue
            kind = i.op.removesuffix("-start")
            if kind not in COLLECTIVES or i.op.endswith("-done"):
                continue
            channel = CHANNEL.search(i.attributes)
            if channel and channel.group(1) in async_channels and name not in starts:
                continue  # a later part of an async chain, counted where it started
            result = tuple_elements(i.result)
            if i.op.endswith("-start") and kind in ("all-gather", "collective-permute"):
                result = result[1:2]  # (operand, result, context...)
            result_bytes = sum(array_bytes(r) for r in result)
            operands = [shapes[n] for n in i.operands if n in shapes]
            operand_bytes = sum(array_bytes(o) for o in operands) if operands else result_bytes
            if kind == "all-reduce":
                operand_bytes = result_bytes  # the same arrays (a start's operands alias them)
            if kind == "all-reduce" and scatter:
                kind, result_bytes = "reduce-scatter", array_bytes(module.root(name).result)
            groups = device_groups(i.attributes, module.partitions)
            size = len(groups[0]) if groups else 1
            spans = max(len({slice_of(d) for d in g}) for g in groups) if slice_of else 1
            in_slice = size // spans if kind != "collective-permute" else size
            entry = found.setdefault(kind, Collective(kind))
            entry.count += runs
            entry.bytes += runs * result_bytes
            entry.operand_bytes += runs * operand_bytes
            if kind != "collective-permute" or spans == 1:
                entry.wire_bytes += runs * wire_bytes(kind, result_bytes, operand_bytes, in_slice)
            entry.dcn_bytes += runs * dcn_bytes(kind, result_bytes, operand_bytes, size, spans)
            entry.group_sizes[size] = entry.group_sizes.get(size, 0) + runs
            entry.ops.append((result_bytes, size, runs, i.name))
    return found
