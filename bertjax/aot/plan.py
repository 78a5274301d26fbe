"""Every phase's train step and the eval step of a run config, compiled for a TPU slice (or
several) or GPU nodes on this host: the mesh from the target's abstract devices, the abstract
train state and each phase's batch as `train.py` builds them (`bertjax.training.step`,
`sharding`, `phases`); no array is allocated and nothing runs.

A pretraining run's batch is the pipeline's (`bertjax.data.batch_spec`, at the phase's final
batch size and row length); other objectives' (fine-tuning, embeddings) is their
`example_batch` at the run's batch size and length. The vocabulary is ``config.data.vocab_size``
(a recipe whose tokenizer file is given at run time carries that file's size there), or
``vocab_size``.

Phases whose lowered programs are equal up to their constants (a schedule, RoPE bases) compile
once: lowering is cheap beside compiling. A program too large for the chips' memory is reported
as not fitting (libtpu's own figures), not raised. With ``cache_dir`` what the compiler left of
each program is kept (`bertjax.aot.cache`): a second check recompiles only the programs a
changed knob changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time

import jax

from bertjax import objectives
from bertjax.aot import chips as chips_lib
from bertjax.aot import collectives as collectives_lib
from bertjax.aot import devices as devices_lib
from bertjax.aot import fit as fit_lib
from bertjax.aot import hlo, roofline
from bertjax.aot.cache import Compiled, CompiledCache
from bertjax.aot.estimate import Estimator
from bertjax.aot.shapes import AMOUNT, SCALE, abstract_batch, out_of_memory, with_sharding
from bertjax.modeling import attention_kernels
from bertjax.training import metrics, phases, sharding
from bertjax.training import step as step_lib
from bertjax.training.run_config import model_config

HEADROOM = fit_lib.HEADROOM  # of each chip's HBM left free for a program to fit


@dataclasses.dataclass(frozen=True)
class _Ids:
    """A tokenizer's sizes and ids (`run_config.model_config` reads these; shapes need only
    the size)."""

    vocab_size: int
    pad_id: int = 0
    unk_id: int = 1
    cls_id: int = 2
    sep_id: int = 3
    mask_id: int = 4


def _collectives_report(found: dict) -> dict:
    report = {}
    for kind, c in found.items():
        largest = sorted(c.ops, key=lambda op: -op[0] * op[2])[:6]
        report[kind] = {
            "count": c.count,
            "bytes": c.bytes,
            "operand_bytes": c.operand_bytes,
            "wire_bytes": c.wire_bytes,
            "dcn_bytes": c.dcn_bytes,
            "group_sizes": {str(size): n for size, n in c.group_sizes.items()},
            "largest": [
                {"bytes": b, "group": g, "times": n, "op": name} for b, g, n, name in largest
            ],
        }
    return report


def _summarize(compiled: Compiled, model_flops, target, mesh, record) -> dict:
    """A compiled program's report, read from what the compiler left (`cache.Compiled`)."""
    module = hlo.Module(compiled.text)
    memory = compiled.memory
    hbm = target.chip.hbm_per_device
    flat = list(mesh.devices.flat)
    slice_of = None
    if target.chip.platform == "gpu" and target.grid[0] > 1:  # partition p runs on flat[p]
        slice_of = lambda p: flat[p].process_index  # noqa: E731  (one process per node)
    found = collectives_lib.collectives(module, slice_of, target.num_slices)
    ici = sum(c.wire_bytes for c in found.values())
    dcn = sum(c.dcn_bytes for c in found.values())
    hbm_traffic = hlo.hbm_traffic(module)
    return {
        "compile_s": round(compiled.seconds, 1),
        "memory": dataclasses.asdict(memory) | {"total": memory.total},
        "hbm_per_device": hbm,
        "headroom": 1.0 - memory.total / hbm,
        "model_flops": model_flops,
        "xla_flops": compiled.xla_flops_per_device * len(flat),
        "collectives": _collectives_report(found),
        "collective_bytes": sum(c.bytes for c in found.values()),
        "ici_bytes": ici,
        "dcn_bytes": dcn,
        "hbm_traffic": hbm_traffic,
        "kernel_calls": hlo.kernel_calls(compiled.text),
        "kernels": attention_kernels.summary(record),
        "roofline": roofline.roofline(
            model_flops, hbm_traffic, ici, len(flat), target.chip, dcn_bytes=dcn
        ),
    }


def _does_not_fit(compiled: Compiled, target, record) -> dict:
    """The report of a program the compiler refused for want of memory: libtpu says e.g. "Ran
    out of memory on HBM, the total memory required for HLO temporaries (70.42G) exceeds
    available HBM (15.75G)" or "Used 27.62G of 15.75G hbm": what it needs, then what a chip
    has."""
    amounts = [float(n) * SCALE[unit] for n, unit in AMOUNT.findall(compiled.out_of_memory)]
    needed, usable = amounts[:2]
    return {
        "compile_s": round(compiled.seconds, 1),
        "memory": {"total": int(needed), "usable": int(usable)},
        "hbm_per_device": target.chip.hbm_per_device,
        "headroom": 1.0 - needed / target.chip.hbm_per_device,
        "out_of_memory": compiled.out_of_memory,
        "kernels": attention_kernels.summary(record),
    }


def _train_flops(config, objective, model_cfg, rows: int) -> float:
    length = int(config.data.max_seq_length)
    masked = float(config.data.get("mask_rate", 0.15)) * length
    per_sequence = objective.train_flops_per_sequence(
        model_cfg,
        length,
        masked,
        int(config.data.get("max_predictions", length)),
        metrics.train_flops_per_sequence,
    )
    return per_sequence * rows


_FLOAT_CONSTANT = re.compile(r"dense<[^>]*>(\s*:\s*tensor<(?:[0-9?]+x)*(?:bf16|f16|f32|f64)>)")


def blank_constants(lowered_text: str) -> str:
    """A lowered program's text with its floating-point constants blanked (integer ones, which
    may bound a loop, kept)."""
    return _FLOAT_CONSTANT.sub(r"dense<>\1", lowered_text)


def program_key(lowered_text: str) -> str:
    """A digest of a lowered program up to its floating-point constants: two programs with equal
    keys compile to the same buffers and collectives (a learning rate, its schedule, a mask
    rate or a RoPE base only change constants)."""
    return hashlib.sha256(blank_constants(lowered_text).encode()).hexdigest()


def compile_run(
    config,
    topology: str,
    vocab_size: int = 0,
    eval_step: bool = True,
    num_slices: int = 1,
    cache_dir: str = "",
    hlo_dir: str = "",
    quick: bool = False,
    fitted: dict | None = None,
    memo: dict | None = None,
) -> dict:
    """Compiles ``config``'s train step (every phase) and eval step for ``topology``
    (`chips.parse_slice`; ``num_slices`` TPU slices); returns what each program holds, per
    chip. ``cache_dir``: where what the compiler left of each program is kept
    (`bertjax.aot.cache`); "" keeps none. ``hlo_dir``: where each program's optimized HLO text
    is written (``PHASE.STEP.hlo.txt``; the report's ``hlo_files``), for reading what it holds.
    ``quick``: compile at two small depths and extrapolate to the real one
    (`bertjax.aot.extrapolate`); their programs go to ``hlo_dir/<depth>_layers``: the recipe's
    own depth is never compiled. ``fitted``: each phase's `bertjax.aot.fit.Choice` (or the
    line saying none fits) by name; None: chosen here by compiling candidates unless
    ``config.fit`` is "off" (`fit_phases`)."""
    target = chips_lib.parse_slice(topology, num_slices)
    memo = {} if memo is None else memo  # this check's programs, by cache key
    if fitted is None:
        fitted = fit_phases(config, topology, vocab_size, num_slices, cache_dir, quick, memo)
    if quick:
        from bertjax.aot import extrapolate

        found = extrapolate.depths(
            model_config(config, _Ids(int(vocab_size or config.data.vocab_size)))
        )
        if found is not None:
            a, b, layers = found
            args = (topology, vocab_size, eval_step, num_slices, cache_dir)
            small, large = (
                compile_run(
                    extrapolate.with_layers(config, d),
                    *args,
                    hlo_dir=hlo_dir and os.path.join(hlo_dir, f"{d}_layers"),
                    fitted=fitted,
                    memo=memo,
                )
                for d in (a, b)
            )
            report = extrapolate.extrapolate(small, large, a, b, layers)
            report["hlo_files"] = small["hlo_files"] + large["hlo_files"]
            return report
    devices = devices_lib.topology_devices(target)
    vocab = int(vocab_size or config.data.vocab_size)
    report = {
        "topology": topology,
        "grid": target.topology_name,
        "num_slices": target.num_slices,
        "devices": len(devices),
        "device_kind": devices[0].device_kind,
        "chip": dataclasses.asdict(target.chip),
        "vocab_size": vocab,
        "programs": [],
        "hlo_files": [],  # the optimized HLO texts written to ``hlo_dir``
    }
    compiled_keys = {}
    for lowered in lower_run(config, devices, vocab, eval_step, fitted):
        c, record, about = lowered.config, lowered.record, lowered.about
        key = (about["step"], program_key(lowered.text))
        if key in compiled_keys:  # the same program with other constants: its own FLOPs
            report["programs"].append(
                _same_program(compiled_keys[key], about, lowered.model_flops, target)
            )
            continue
        cache = CompiledCache(cache_dir, target, step_lib.compiler_options(c))
        cache_key = cache.key(blank_constants(lowered.text))  # a new learning rate: read back
        compiled = memo.get(cache_key)  # compiled by this check's fit
        if compiled is None:
            compiled = cache.get(cache_key)
            if compiled is not None:
                about["cached"] = True
        if compiled is None:
            start = time.perf_counter()
            try:
                executable = lowered.lowered.compile()
            except Exception as error:  # noqa: BLE001  (out of memory: a report, not a crash)
                refusal = out_of_memory(error)
                if not refusal:
                    raise
                compiled = Compiled(time.perf_counter() - start, out_of_memory=refusal)
            else:
                compiled = Compiled.of(executable, time.perf_counter() - start)
            cache.put(cache_key, compiled)
            memo[cache_key] = compiled  # the fit's candidates compile once a check
        if compiled.out_of_memory:
            summary = _does_not_fit(compiled, target, record)
        else:
            summary = _summarize(compiled, lowered.model_flops, target, lowered.mesh, record)
        if hlo_dir and compiled.text:
            os.makedirs(hlo_dir, exist_ok=True)
            path = os.path.join(hlo_dir, f"{about['phase']}.{about['step']}.hlo.txt")
            with open(path, "w") as f:
                f.write(compiled.text)
            report["hlo_files"].append(path)
        summary |= about
        report["programs"].append(summary)
        compiled_keys[key] = summary
    return report


def _same_program(earlier: dict, about: dict, model_flops: float, target) -> dict:
    """The report of a phase whose program is ``earlier``'s up to constants: its bytes and
    collectives, this phase's FLOPs (a mask rate changes them) and the roofline they give."""
    program = earlier | about | {"same_as": earlier["phase"], "model_flops": model_flops}
    if "roofline" in earlier:
        program["roofline"] = roofline.roofline(
            model_flops,
            earlier["hbm_traffic"],
            earlier["ici_bytes"],
            target.devices,
            target.chip,
            dcn_bytes=earlier["dcn_bytes"],
        )
    return program


@dataclasses.dataclass
class Lowered:
    """One step of one phase, lowered for the target's devices (not compiled)."""

    config: object  # the phase's run config
    mesh: object
    lowered: object  # jax.stages.Lowered
    text: str
    model_flops: float
    record: list  # (AttentionSpec, kernel name) of each attention traced
    about: dict


def fit_phases(config, topology, vocab_size, num_slices, cache_dir, quick, memo) -> dict:
    """Each phase's fit for the target (`bertjax.aot.fit.search`: its train step compiled, or
    with ``quick`` extrapolated, for each candidate; those far too large by the traced estimate,
    `bertjax.aot.estimate`, not compiled): {phase name: Choice, or the one line saying nothing
    fits}; {} when ``config.fit`` is "off"."""
    target = chips_lib.parse_slice(topology, num_slices)
    devices = devices_lib.topology_devices(target)
    out = {}
    for phase in phases.plan_phases(config):
        budget = fit_lib.budget_bytes(phase.config, target.chip.hbm_per_device)
        if budget is None:
            return {}

        def measure(candidate):
            report = compile_run(candidate, topology, vocab_size, False, num_slices, cache_dir,
                                 quick=quick, fitted={}, memo=memo)  # fmt: skip
            program = report["programs"][0]
            return None if "out_of_memory" in program else program["memory"]["total"]

        additive = objectives.make_objective(phase.config).microbatch_additive
        shards = fit_lib.batch_shards(phase.config, devices)
        model_cfg = model_config(phase.config, _Ids(int(vocab_size or config.data.vocab_size)))
        estimate = Estimator(phase.config, model_cfg, devices)
        try:
            out[phase.name] = fit_lib.search(
                phase.config, measure, budget, len(devices), shards, additive, estimate
            )
        except fit_lib.DoesNotFit as error:
            out[phase.name] = str(error)
    return out


def lower_run(config, devices, vocab: int, eval_step: bool = True, fitted: dict | None = None):
    """Every phase's train step (and the first phase's eval step) of ``config``, lowered for
    ``devices`` as `train.py` builds them, each phase with its fit (``fitted``, by name) applied:
    yields `Lowered`."""
    for phase in phases.plan_phases(config):
        c = phase.config
        choice = (fitted or {}).get(phase.name)
        if isinstance(choice, fit_lib.Choice):
            c = choice.apply(c)
        objective = objectives.make_objective(c)
        model_cfg = model_config(c, _Ids(vocab))
        mesh = sharding.make_mesh(c.mesh, devices)
        state, _, _ = step_lib.abstract_train_state(c, model_cfg, mesh)
        rows = int(c.batch_size)
        batch_sharding = sharding.batch_sharding(mesh)
        replicated = sharding.replicated(mesh)
        steps = step_lib.jit_steps(state, mesh, step_lib.compiler_options(c))
        rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
        jobs = [("train", steps.train, False)]
        if eval_step and phase.index == 0:
            jobs.append(("eval", steps.eval, True))
        for kind, fn, held_out in jobs:
            batch = abstract_batch(c, objective, model_cfg, rows, held_out)
            batch = with_sharding(batch, batch_sharding)
            args = (state, batch, rng) if kind == "train" else (state, batch)
            with attention_kernels.recording() as record:
                lowered = fn.lower(*args)
            flops = _train_flops(c, objective, model_cfg, rows)
            about = {
                "phase": phase.name,
                "step": kind,
                "batch": rows,
                "length": int(c.data.max_seq_length),
                "mesh": dict(mesh.shape),
                "microbatches": int(c.optim.get("grad_accum_steps", 1)),
                "remat": str(c.model.get("remat", "")),
                "scan_layers": bool(c.model.get("scan_layers", False)),
            }
            if isinstance(choice, fit_lib.Choice):
                about["fit"] = choice.to_dict()
            elif choice:
                about["fit_refused"] = choice
            flops = flops / 3.0 if kind == "eval" else flops  # eval: forward only
            yield Lowered(c, mesh, lowered, lowered.as_text(), flops, record, about)


def fits(program: dict, headroom: float = HEADROOM) -> bool:
    """Whether a compiled program leaves at least ``headroom`` of each chip's HBM free."""
    return "out_of_memory" not in program and program["headroom"] >= headroom
