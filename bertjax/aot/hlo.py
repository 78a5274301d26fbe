"""A compiled program's optimized HLO text, as libtpu (or XLA:GPU) writes it, read into
computations and instructions (`Module`), with how many times each computation runs per
execution of the program, the device groups of a collective, the bytes its top-level ops move
through HBM and the hand-written kernels it calls (Mosaic, cuDNN). `bertjax.aot.collectives`
counts its collectives.

An op inside a loop body (a scanned layer stack, gradient accumulation) runs once per
iteration: the trip count is read from the loop's condition (``counter < N``), the counter's
start in the loop's initial tuple (a peeled loop starts above 0) and the body's increment, with
TPU layouts such as ``s32[]{:T(128)} constant(6)`` allowed for.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4}
_BYTES |= {"u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\](\{[^}]*\})?")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_HEAD = re.compile(r"^\s*(ROOT )?%?([\w.\-]+) = ")
_CALLS = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_INSIDE = ("calls", "to_apply")  # computations run inside one op (fusions, reducers)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_NAME = re.compile(r"%([\w.\-]+)")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*(T\([\d,]*\))?\s*\{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](T\([\d,]*\))?")
_LIST_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
CHANNEL = re.compile(r"channel_id=(\d+)")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# ops that move no data of their own (views, control, tuples) in the HBM traffic estimate
_NO_TRAFFIC = {
    "parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "conditional",
    "call", "after-all", "partition-id", "replica-id", "iota", "opt-barrier",
}  # fmt: skip


def _bytes_of(dtype: str, dims: str) -> int:
    size = _BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)
    for dim in filter(None, dims.split(",")):
        size *= int(dim)
    return size


def array_bytes(shape_text: str) -> int:
    """Bytes of the arrays in an HLO result type (``bf16[8,128]``, tuples summed)."""
    return sum(_bytes_of(dtype, dims) for dtype, dims, _ in _ARRAY.findall(shape_text))


def hbm_bytes(shape_text: str) -> int:
    """Bytes of the arrays of an HLO type that live in HBM: on a TPU a layout's ``S(n)``, n > 0,
    places an array in another memory (VMEM, SMEM, ...), so it is left out."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(shape_text):
        if not any(space != "0" for space in _MEMORY_SPACE.findall(layout)):
            total += _bytes_of(dtype, dims)
    return total


def _closing(text: str, start: int) -> int:
    """Index just past the bracket group that opens at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def tuple_elements(shape_text: str) -> list[str]:
    """The top-level elements of a tuple type ``(a, (b, c), d)``; [text] for an array type."""
    text = re.sub(r"/\*.*?\*/", "", shape_text.strip())
    if not text.startswith("("):
        return [text]
    parts, depth, current = [], 0, ""
    for char in text[1:-1]:
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return parts + ([current.strip()] if current.strip() else [])


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    result: str  # the result type's text
    op: str
    arguments: str  # the text between the op's parentheses
    attributes: str  # the text after them
    root: bool

    @property
    def operands(self) -> list[str]:
        return _NAME.findall(self.arguments)

    def integer(self) -> int | None:
        """The value of a scalar integer ``constant(N)`` (None for anything else)."""
        if self.op != "constant" or not re.match(r"[su](8|16|32|64)\[\]", self.result):
            return None
        return int(self.arguments) if re.fullmatch(r"-?\d+", self.arguments.strip()) else None


def _instruction(line: str) -> Instruction | None:
    head = _HEAD.match(line)
    if not head:
        return None
    rest = line[head.end() :]
    end = _closing(rest, 0) if rest.startswith("(") else rest.find(" ")
    if end <= 0:
        return None
    result, rest = rest[:end], rest[end:].lstrip()
    match = re.match(r"([a-z][a-z0-9\-]*)\(", rest)
    if not match:
        return None
    close = _closing(rest, match.end() - 1)
    arguments = rest[match.end() : close - 1]
    return Instruction(
        head.group(2), result, match.group(1), arguments, rest[close:], bool(head.group(1))
    )


class Module:
    """An HLO module's computations and how many times each runs per execution of the
    program."""

    def __init__(self, text: str):
        self.computations: dict[str, list[Instruction]] = {}
        self.entry = None
        header = re.search(r"num_partitions=(\d+)", text.split("\n", 1)[0])
        self.partitions = int(header.group(1)) if header else 1
        name = None
        for line in text.splitlines():
            match = _COMPUTATION.match(line)
            if match:
                name = match.group(1)
                self.computations[name] = []
                if line.startswith("ENTRY"):
                    self.entry = name
            elif name is not None:
                instruction = _instruction(line)
                if instruction is not None:
                    self.computations[name].append(instruction)
        self.runs = self._executions()

    def named(self, computation: str) -> dict[str, Instruction]:
        return {i.name: i for i in self.computations.get(computation, ())}

    def root(self, computation: str) -> Instruction | None:
        return next((i for i in self.computations.get(computation, ()) if i.root), None)

    def trip_count(self, caller: str, loop: Instruction) -> int:
        """Iterations of the while ``loop`` (in computation ``caller``): ``(N - start) / step``
        from its condition's ``counter < N`` (or ``<=``), the counter's start in the loop's
        initial tuple (0 if it is not a constant there) and the body's ``counter + step``; the
        largest integer constant in the condition where that pattern is not found."""
        condition = re.search(r"condition=%?([\w.\-]+)", loop.attributes).group(1)
        body = re.search(r"body=%?([\w.\-]+)", loop.attributes).group(1)
        named = self.named(condition)
        constants = [i.integer() for i in named.values() if i.integer() is not None]
        fallback = max(constants, default=1)
        compare = self.root(condition)
        direction = re.search(r"direction=(\w+)", compare.attributes) if compare else None
        if compare is None or direction is None or direction.group(1) not in ("LT", "LE"):
            return fallback
        counter, bound = (named.get(n) for n in (compare.operands + ["", ""])[:2])
        if counter is None or bound is None or bound.integer() is None:
            return fallback
        index = re.search(r"index=(\d+)", counter.attributes)
        if counter.op != "get-tuple-element" or index is None:
            return fallback
        index = int(index.group(1))
        start = self._initial(caller, loop.operands[0] if loop.operands else "", index)
        step = self._step(body, index)
        span = bound.integer() - start + (direction.group(1) == "LE")
        return max(0, -(-span // step))

    def _initial(self, caller: str, tuple_name: str, index: int) -> int:
        named = self.named(caller)
        init = named.get(tuple_name)
        if init is None or init.op != "tuple" or index >= len(init.operands):
            return 0
        element = named.get(init.operands[index])
        value = element.integer() if element is not None else None
        return value or 0

    def _step(self, body: str, index: int) -> int:
        named, result = self.named(body), self.root(body)
        if result is None or result.op != "tuple" or index >= len(result.operands):
            return 1
        update = named.get(result.operands[index])
        if update is None or update.op != "add":
            return 1
        values = [named[n].integer() for n in update.operands if n in named]
        return next((v for v in values if v is not None and v > 0), 1)

    def _executions(self) -> dict:
        """{computation: times it runs per program run}: a loop body times its trip count,
        every other called computation (fusions, reducers) as often as its caller, and each of
        a conditional's n branches 1/n as often (one runs: cuDNN's dropout is a switch over the
        device index, every branch alike, `bertjax.ops.cudnn_dropout`)."""
        edges = collections.defaultdict(list)  # caller -> [(callee, times per caller run)]
        pending = collections.Counter()  # callers not yet counted
        for name, instructions in self.computations.items():
            for instruction in instructions:
                if instruction.op in ("async-update", "async-done"):
                    continue  # they name the computation their async-start runs
                called = _CALLS.findall(instruction.attributes)
                branches = _BRANCHES.search(instruction.attributes)
                names = _NAME.findall(branches.group(1)) if branches else []
                called += [("branch", n) for n in names]
                if instruction.op == "conditional" and not names:  # true/false computations
                    names = [n for role, n in called if role in ("true_computation",
                                                                 "false_computation")]  # fmt: skip
                for role, callee in called:
                    if callee not in self.computations or callee == name:
                        continue
                    times = 1
                    if callee in names:
                        times = 1 / len(names)
                    elif instruction.op == "while" and role == "body":
                        times = self.trip_count(name, instruction)
                    edges[name].append((callee, times))
                    pending[callee] += 1
        runs = collections.Counter({self.entry: 1} if self.entry else {})
        ready = [name for name in self.computations if pending[name] == 0]
        while ready:  # callers before callees: the call graph has no cycles
            name = ready.pop()
            for callee, times in edges[name]:
                runs[callee] += runs[name] * times
                pending[callee] -= 1
                if pending[callee] == 0:
                    ready.append(callee)
        return dict(runs)


def device_groups(attributes: str, partitions: int) -> list[list[int]]:
    """The device groups of a collective (partition ids), from any of the three replica-group
    forms: ``{{0,1},{2,3}}``, iota ``[2,2]<=[4]`` / ``[2,2]<=[2,2]T(1,0)``, and mesh axes
    ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}``; a collective-permute's source-target pairs as
    two-device groups. Empty groups mean every device together."""
    pairs = _PAIRS.search(attributes)
    if pairs:
        return [[int(d) for d in p.split(",")] for p in re.findall(r"\{(\d+,\d+)\}", pairs[1])]
    mesh = _MESH_GROUPS.search(attributes)
    if mesh:
        axes = re.findall(r"'([^']+)'=(\d+)", mesh.group(1))
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        ids = np.arange(int(np.prod(sizes))).reshape(sizes)
        if mesh.group(2):
            ids = ids.transpose([int(d) for d in re.findall(r"\d+", mesh.group(2))])
            names = [names[int(d)] for d in re.findall(r"\d+", mesh.group(2))]
        grouped = [names.index(a) for a in re.findall(r"'([^']+)'", mesh.group(3))]
        kept = [i for i in range(len(names)) if i not in grouped]
        ids = ids.transpose(kept + grouped)
        width = int(np.prod([ids.shape[len(kept) + j] for j in range(len(grouped))]))
        return ids.reshape(-1, width).tolist()
    iota = _IOTA_GROUPS.search(attributes)
    if iota:
        shape = [int(d) for d in iota.group(1).split(",")]
        dims = [int(d) for d in iota.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(d) for d in re.findall(r"\d+", iota.group(3))])
        return ids.reshape(shape[0], -1).tolist()
    listed = _LIST_GROUPS.search(attributes)
    if listed and listed.group(1):
        return [[int(d) for d in g.split(",") if d] for g in re.findall(r"\{([\d,]*)\}", listed[1])]
    return [list(range(partitions))]


_SLICES = ("slice", "dynamic-slice")


def _users(instructions) -> dict:
    users = {}
    for i in instructions:
        for operand in i.operands:
            users.setdefault(operand, []).append(i)
    return users


def _read_of(module: Module, fused: str, name: str, users: dict) -> int | None:
    """Bytes a fused computation reads of its value ``name`` when it only slices it (a layer of
    a stacked array, a row block), through views (bitcasts), nested fusions and in-place updates
    (a dynamic-update-slice of it reads nothing of it); None when it may read all of it."""
    uses = users.get(name, [])
    if not uses:
        return None
    total = 0
    for use in uses:
        if use.op in _SLICES and use.operands[0] == name:
            total += array_bytes(use.result)
        elif use.op == "dynamic-update-slice" and use.operands[0] == name:
            continue  # written in place: the update is counted as written
        elif use.op == "bitcast":
            inner = _read_of(module, fused, use.name, users)
            if inner is None:
                return None
            total += inner
        elif use.op == "fusion" and (nested := re.search(r"calls=%?([\w.\-]+)", use.attributes)):
            params = {int(p.arguments): p.name for p in module.computations.get(nested[1], ())
                      if p.op == "parameter"}  # fmt: skip
            inner_users = _users(module.computations.get(nested[1], ()))
            for index in (k for k, operand in enumerate(use.operands) if operand == name):
                inner = _read_of(module, nested[1], params.get(index, ""), inner_users)
                if inner is None:
                    return None
                total += inner
        else:
            return None
    return total


def _read_of_parameters(module: Module, fused: str) -> dict:
    """{parameter index: bytes read} for a fused computation's parameters that it only slices or
    updates in place (`_read_of`): the slices' bytes, not the whole operand's."""
    instructions = module.computations.get(fused, ())
    users = _users(instructions)
    read = {}
    for i in instructions:
        if i.op == "parameter":
            bytes_read = _read_of(module, fused, i.name, users)
            if bytes_read is not None:
                read[int(i.arguments)] = bytes_read
    return read


def _written(module: Module, fused: str, result: str) -> int:
    """HBM bytes a fusion writes: each output its bytes, but an in-place dynamic-update-slice
    (alone or in a tuple of outputs) only its update."""
    named = module.named(fused)
    root = module.root(fused)
    outputs = root.operands if root is not None and root.op == "tuple" else [root and root.name]
    parts = tuple_elements(result)
    if len(parts) != len(outputs):
        return hbm_bytes(result)
    total = 0
    for part, output in zip(parts, outputs):
        element = named.get(output)
        if element is not None and element.op == "dynamic-update-slice" and hbm_bytes(part):
            update = named.get(element.operands[1]) if len(element.operands) > 1 else None
            total += array_bytes(update.result) if update is not None else hbm_bytes(part)
        else:
            total += hbm_bytes(part)
    return total


def _moved(module: Module, i: Instruction, shapes: dict) -> int:
    """HBM bytes one execution of a top-level op reads and writes (see `hbm_traffic`)."""
    if i.op.endswith("-done"):
        return 0  # counted at its start
    if i.op.endswith("-start"):  # (operand aliases..., destination, context...)
        parts = tuple_elements(i.result)
        moved = parts[1] if len(parts) > 1 else parts[0]
        source = sum(hbm_bytes(shapes.get(n, "")) > 0 for n in i.operands[:1])
        return array_bytes(moved) * source + hbm_bytes(moved)
    if i.op in _SLICES:
        return 2 * hbm_bytes(i.result) if hbm_bytes(i.result) else array_bytes(i.result)
    if i.op == "dynamic-update-slice":  # in place: the update read and written
        return 2 * hbm_bytes(shapes.get(i.operands[1], "")) if len(i.operands) > 1 else 0
    operands = [hbm_bytes(shapes.get(n, "")) for n in i.operands]
    result = hbm_bytes(i.result)
    called = re.search(r"calls=%?([\w.\-]+)", i.attributes)
    if i.op == "fusion" and called:
        for index, read in _read_of_parameters(module, called.group(1)).items():
            if index < len(operands) and operands[index]:
                operands[index] = min(operands[index], read)
        result = _written(module, called.group(1), i.result)
    return result + sum(operands)


def hbm_traffic(hlo_text: str | Module) -> float:
    """An estimate of the bytes a chip moves through HBM per step: what each op of the entry and
    the loop bodies reads and writes in HBM (`hbm_bytes`: not VMEM/SMEM), loop bodies times
    their trip count. A fusion counts as one op (its inside stays on chip), reading only the
    slices of the operands it slices (through views and nested fusions); an async copy or slice
    counts the bytes it moves; an in-place update, alone or among a fusion's outputs (a scanned
    layer's slice of a stacked array), its update. Re-reads inside a fusion are missed: an
    estimate."""
    module = hlo_text if isinstance(hlo_text, Module) else Module(hlo_text)
    called = set()
    for instructions in module.computations.values():
        for i in instructions:
            called.update(n for role, n in _CALLS.findall(i.attributes) if role in _INSIDE)
    total = 0.0
    for name, instructions in module.computations.items():
        runs = module.runs.get(name, 0)
        if not runs or name in called:  # fused, reducer and branch computations: inside an op
            continue
        shapes = {i.name: i.result for i in instructions}
        for i in instructions:
            if i.op not in _NO_TRAFFIC:
                total += runs * _moved(module, i, shapes)
    return total


KERNEL_CALLS = {"mosaic": "tpu_custom_call", "cudnn": "__cudnn$fmha"}


def kernel_calls(hlo_text: str) -> dict:
    """How many hand-written kernels the program calls: Mosaic (Pallas TPU: splash) and cuDNN
    attention custom calls, forward and backward each."""
    targets = re.findall(r'custom_call_target="([^"]+)"', hlo_text)
    return {
        name: sum(target.startswith(prefix) for target in targets)
        for name, prefix in KERNEL_CALLS.items()
    }
