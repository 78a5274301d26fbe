"""Every phase's train step and the eval step of a run config, compiled for a TPU slice on this
host: the mesh from the slice's abstract devices, the abstract train state and each phase's
batch as `train.py` builds them (`bertjax.training.step`, `sharding`, `phases`); no array is
allocated and nothing runs.

A pretraining run's batch is the pipeline's (`bertjax.data.batch_spec`, at the phase's final
batch size and row length); other objectives' (fine-tuning, embeddings) is their
`example_batch` at the run's batch size and length. The vocabulary comes from the tokenizer in
a real run: here it is ``vocab_size`` (default ``config.data.vocab_size``).
"""

from __future__ import annotations

import dataclasses
import time

import jax

from bertjax import objectives
from bertjax.aot import chips as chips_lib
from bertjax.aot import hlo
from bertjax.data.batch_spec import pipeline_batch_shapes
from bertjax.modeling import attention_kernels
from bertjax.training import metrics, phases, sharding
from bertjax.training import step as step_lib
from bertjax.training.run_config import model_config


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


def _abstract_batch(config, objective, model_cfg, rows: int, held_out: bool) -> dict:
    length = int(config.data.max_seq_length)
    if objective.corruptions is not None:  # a pretraining corruption: the pipeline's batch
        shapes = pipeline_batch_shapes(config.data, rows, length, held_out)
    else:
        example = objective.example_batch(model_cfg, 2, length, 0)
        shapes = {k: ((rows, *v.shape[1:]), v.dtype) for k, v in example.items()}
    return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}


def _with_sharding(tree: dict, sharding_) -> dict:
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding_), tree)


def _summarize(compiled, seconds, model_flops, tpu_slice, devices, record) -> dict:
    text = compiled.as_text()
    memory = hlo.Memory.of(compiled)
    per_device_hbm = tpu_slice.chip.hbm_bytes * tpu_slice.chips // len(devices)
    cost = compiled.cost_analysis() or {}
    found = hlo.collectives(text)
    collective_bytes = sum(c.bytes for c in found.values())
    hbm_traffic = max(float(cost.get("bytes accessed", 0.0)), memory.total)
    return {
        "compile_s": round(seconds, 1),
        "memory": dataclasses.asdict(memory) | {"total": memory.total},
        "hbm_per_device": per_device_hbm,
        "headroom": 1.0 - memory.total / per_device_hbm,
        "model_flops": model_flops,
        "xla_flops": float(cost.get("flops", 0.0)) * len(devices),
        "collectives": {k: dataclasses.asdict(c) for k, c in found.items()},
        "collective_bytes": collective_bytes,
        "mosaic_kernels": hlo.mosaic_kernels(text),
        "kernels": attention_kernels.summary(record),
        "roofline": hlo.roofline(
            model_flops, hbm_traffic, collective_bytes, tpu_slice.chips, tpu_slice.chip
        ),
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


def _program_key(c, model_cfg) -> str:
    """What decides a step's program (the LR schedule and RoPE bases are only constants)."""
    model = {k: v for k, v in model_cfg.to_dict().items() if "rope_theta" not in k}
    optimizer = (c.optim.name, c.optim.grad_accum_steps)
    return repr((model, c.batch_size, c.data.to_dict(), c.mesh.to_dict(), optimizer))


def compile_run(config, topology: str, vocab_size: int = 0, eval_step: bool = True) -> dict:
    """Compiles ``config``'s train step (every phase) and eval step for the TPU slice
    ``topology`` (`chips.parse_slice`); returns what each program holds (`hlo`), per chip."""
    tpu_slice = chips_lib.parse_slice(topology)
    devices = chips_lib.topology_devices(tpu_slice)
    vocab = int(vocab_size or config.data.vocab_size)
    report = {
        "topology": topology,
        "grid": tpu_slice.topology_name,
        "devices": len(devices),
        "device_kind": devices[0].device_kind,
        "chip": dataclasses.asdict(tpu_slice.chip),
        "vocab_size": vocab,
        "programs": [],
    }
    compiled_shapes = {}
    for phase in phases.plan_phases(config):
        c = phase.config
        objective = objectives.make_objective(c)
        model_cfg = model_config(c, _Ids(vocab))
        # A phase that changes only the schedule (or RoPE bases) compiles the program of an
        # earlier one with other constants: its memory, FLOPs and collectives are that one's.
        shapes = _program_key(c, model_cfg)
        if shapes in compiled_shapes:
            earlier = compiled_shapes[shapes]
            report["programs"].append(dict(earlier, phase=phase.name, same_as=earlier["phase"]))
            continue
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
            batch = _abstract_batch(c, objective, model_cfg, rows, held_out)
            batch = _with_sharding(batch, batch_sharding)
            args = (state, batch, rng) if kind == "train" else (state, batch)
            start = time.perf_counter()
            with attention_kernels.recording() as record:
                lowered = fn.lower(*args)
            compiled = lowered.compile()
            seconds = time.perf_counter() - start
            flops = _train_flops(c, objective, model_cfg, rows)
            if kind == "eval":
                flops /= 3.0  # forward only
            summary = _summarize(compiled, seconds, flops, tpu_slice, devices, record)
            summary |= {
                "phase": phase.name,
                "step": kind,
                "batch": rows,
                "length": int(c.data.max_seq_length),
                "mesh": dict(mesh.shape),
                "microbatches": int(c.optim.get("grad_accum_steps", 1)),
                "remat": str(c.model.get("remat", "")),
            }
            report["programs"].append(summary)
            if kind == "train":
                compiled_shapes[shapes] = summary
    return report


def fits(program: dict, headroom: float = 0.10) -> bool:
    """Whether a compiled program leaves at least ``headroom`` of each chip's HBM free."""
    return program["headroom"] >= headroom
