"""A quick check: the run compiled at two small depths and its figures extrapolated, linearly in
the number of layers, to the real depth (`python -m bertjax.compile --quick`).

Each repeat of the layer pattern adds the same parameters and optimizer state (arguments),
collectives (one more layer's gradients, gathers), FLOPs and HBM bytes. The two depths ``a`` and
``a + p`` repeat the stack's layer pattern (period ``p``: ModernBERT's global layer every third,
an MoE layer every n-th) and end on the same kind of layer as the real depth, with the same
first and last layer (the first without its attention norm in the ModernBERT shape, the last at
the masked rows only): a layer's report is ``report(a + p) - report(a)``, the real one
``report(a) + (L - a) / p`` of that. The collectives, the FLOPs and the arguments come out exact;
the temporaries do not (the compiler schedules a shallow program's buffers differently):
docs/results/compile.md measures how far they land from the full compile.
"""

from __future__ import annotations

import copy

from bertjax.aot import chips as chips_lib
from bertjax.aot import roofline
from bertjax.modeling.encoder import layer_kinds

_FIXED = {"compile_s", "hbm_per_device", "headroom", "batch", "length", "microbatches"}


def depths(cfg) -> tuple[int, int, int] | None:
    """(a, a + p, L) for the model config ``cfg``: the two depths to compile and the real one;
    None when the stack is too shallow to gain from it."""
    layers = cfg.num_hidden_layers
    if cfg.num_groups not in (1, layers):
        raise ValueError(
            f"--quick: config.model.num_hidden_groups={cfg.num_groups} shares layers in groups "
            "that do not repeat with the depth; compile without --quick"
        )
    kinds = layer_kinds(cfg) if cfg.num_groups == layers else [{}] * layers
    period = next(
        p
        for p in range(1, layers)
        if all(kinds[i] == kinds[i + p] for i in range(1, layers - p))
    ) if layers > 2 else 1  # fmt: skip
    first = 2 + (layers - 2) % period
    if first + period >= layers:
        return None
    return first, first + period, layers


def _combine(small, large, steps: float):
    """``small + steps * (large - small)`` through a report's numbers (dicts and lists alike)."""
    if isinstance(small, dict):
        keys = list(small) + [k for k in large if k not in small]
        out = {}
        for k in keys:
            if k in _FIXED or k not in small or k not in large:
                out[k] = large.get(k, small.get(k)) if k not in small else small[k]
            else:
                out[k] = _combine(small[k], large[k], steps)
        return out
    if isinstance(small, bool) or not isinstance(small, int | float):
        return small
    value = small + steps * (large - small)
    return int(round(value)) if isinstance(small, int) else value


def extrapolate(small: dict, large: dict, a: int, b: int, layers: int) -> dict:
    """The report of ``layers`` layers from those of ``a`` and ``b`` layers (see the module
    docstring): every number extrapolated, then headroom and the roofline recomputed."""
    steps = (layers - a) / (b - a)
    report = copy.deepcopy(large)
    chip = chips_lib.CHIPS[report["chip"]["name"]]
    report["programs"] = []
    for p, q in zip(small["programs"], large["programs"]):
        if "out_of_memory" in p or "out_of_memory" in q:  # the compiler refused a depth
            report["programs"].append(_refused(p, q, steps, a, b, layers))
            continue
        program = _combine(p, q, steps)
        for kind, c in program.get("collectives", {}).items():
            c["largest"] = q["collectives"][kind]["largest"]  # ops of the deeper program
        program["headroom"] = 1.0 - program["memory"]["total"] / program["hbm_per_device"]
        if "roofline" in program:
            program["roofline"] = roofline.roofline(
                program["model_flops"],
                program["hbm_traffic"],
                program["ici_bytes"],
                report["devices"],
                chip,
                dcn_bytes=program["dcn_bytes"],
            )
        program["extrapolated"] = {"from_layers": [a, b], "layers": layers}
        program["compile_s"] = p["compile_s"] + q["compile_s"]
        report["programs"].append(program)
    return report


def _refused(small: dict, large: dict, steps: float, a: int, b: int, layers: int) -> dict:
    """A program the compiler refused for want of memory at a small depth: the real depth needs
    at least as much (memory grows with the layers), extrapolated from both depths' needs."""
    program = copy.deepcopy(large if "out_of_memory" in large else small)
    needed = small["memory"]["total"] + steps * (
        large["memory"]["total"] - small["memory"]["total"]
    )
    needed = max(needed, program["memory"]["total"])
    program["memory"] = {**program["memory"], "total": int(needed)}
    program["headroom"] = 1.0 - needed / program["hbm_per_device"]
    program["extrapolated"] = {"from_layers": [a, b], "layers": layers}
    program["compile_s"] = small["compile_s"] + large["compile_s"]
    return program


def with_layers(config, layers: int):
    """A copy of ``config`` with ``layers`` encoder layers (phases cannot change the depth)."""
    config = copy.deepcopy(config)
    config.model.num_hidden_layers = layers
    return config
