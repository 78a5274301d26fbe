"""Fit a recipe to the hardware, keeping the recipe: when a phase's train step does not fit the
devices' memory with 10% headroom, choose microbatches (a divisor of each device's rows), a
rematerialization policy and FSDP, in that order of cost, by compiling candidates: the compiler's
memory analysis decides, not a formula. The global batch, the tokens, the schedule and the phases
never change: microbatches add up to the batch's gradient (`bertjax.training.step`), remat
recomputes what it dropped, FSDP shards what is replicated.

`bertjax.aot.search` is the decision, given ``measure(config) -> bytes a device`` (None: the
compiler refused it for memory) and a traced estimate (`bertjax.aot.estimate`: candidates far
too large are never compiled). `train.py` measures on the devices it runs on (`fit_run`), `python
-m bertjax.compile` on a target's abstract devices (`bertjax.aot.plan`). ``config.fit = "off"``
keeps the config as it is; ``config.fit_memory_gib`` plans for that much memory a device instead
of the device's own (a CPU has none to plan for: no fit there unless it is set). A choice is
kept per (phase config, devices, memory, versions) in ``WORKDIR/fit``, so a restart on the same
hardware does not search again; on other hardware it may choose otherwise and still resumes
exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from bertjax.aot.search import (  # noqa: F401  (the fit's names, where they were)
    GIB,
    REMATS,
    Choice,
    DoesNotFit,
    rows_per_device,
    search,
    with_settings,
)

HEADROOM = 0.10  # of a device's memory left free
# keys that cannot change a step's program (the cache key leaves them out)
_BOOKKEEPING = (
    "num_train_steps", "log_every", "eval_every", "eval_batches", "checkpoint_every",
    "keep_checkpoints", "async_checkpoints", "progress_bar", "seed", "storage_retry_seconds",
    "init_from", "fit",
)  # fmt: skip


def budget_bytes(config, device_memory: int | None) -> int | None:
    """Bytes a device the fit plans for: ``config.fit_memory_gib`` if set, else the device's
    memory, less `HEADROOM`; None: nothing to plan for (fit off, or a CPU)."""
    if str(config.get("fit", "auto")) == "off":
        return None
    own = float(config.get("fit_memory_gib", 0.0) or 0.0)
    memory = own * GIB if own > 0 else device_memory
    return int(memory * (1.0 - HEADROOM)) if memory else None


def cache_key(config, devices: list, budget: int) -> str:
    """A digest of what decides a fit: the phase config (bookkeeping keys left out), the
    devices (kind, count, processes), the budget and the compiler's versions."""
    from bertjax.aot.cache import compiler_version

    settings = {k: v for k, v in config.to_dict().items() if k not in _BOOKKEEPING}
    platform = devices[0].platform
    about = {
        "config": settings,
        "devices": [devices[0].device_kind, len(devices), len({d.process_index for d in devices})],
        "budget": budget,
        "versions": compiler_version("gpu" if platform in ("cuda", "rocm") else platform),
        "fit": 2,  # this module's search; bump when it changes
    }
    text = json.dumps(about, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def with_model_remat(model_cfg, config):
    """``model_cfg`` with ``config.model.remat`` (what a candidate or the choice sets): a run's
    BertConfig is built once, before the fit."""
    return model_cfg.replace(remat=str(config.model.get("remat", model_cfg.remat)))


def lower_train(config, model_cfg, devices: list):
    """``config``'s train step lowered for ``devices`` (real, or a target's abstract ones) as
    `train.py` builds it, at the phase's batch size: a `jax.stages.Lowered`."""
    import jax

    from bertjax import objectives
    from bertjax.aot import shapes
    from bertjax.training import sharding
    from bertjax.training import step as step_lib

    objective = objectives.make_objective(config)
    model_cfg = with_model_remat(model_cfg, config)
    mesh = sharding.make_mesh(config.mesh, devices)
    state, _, _ = step_lib.abstract_train_state(config, model_cfg, mesh)
    batch = shapes.abstract_batch(config, objective, model_cfg, int(config.batch_size), False)
    batch = shapes.with_sharding(batch, sharding.batch_sharding(mesh))
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))
    steps = step_lib.jit_steps(state, mesh, step_lib.compiler_options(config))
    return steps.train.lower(state, batch, rng)


def compiled_bytes(lowered) -> int | None:
    """Bytes a device of a lowered program (the compiler's memory analysis); None when the
    compiler refused it for memory."""
    from bertjax.aot import shapes
    from bertjax.aot.roofline import Memory

    try:
        compiled = lowered.compile()
    except Exception as error:  # noqa: BLE001  (out of memory: a verdict, not a crash)
        if shapes.out_of_memory(error):
            return None
        raise
    return Memory.of(compiled).total


def device_memory(device) -> int | None:
    """A device's memory as its runtime reports it (None on a CPU, or where it says nothing)."""
    if device.platform == "cpu":
        return None
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001  (a runtime without memory statistics)
        return None
    return stats.get("bytes_limit") or None


def batch_shards(config, devices: list) -> int:
    """How many ways the mesh ``config`` makes over ``devices`` splits the batch."""
    from bertjax.training import sharding

    shape = dict(sharding.make_mesh(config.mesh, devices).shape)
    return math.prod(shape.get(axis, 1) for axis in sharding.BATCH_AXES)


def fit_run(config, model_cfg, workdir: str, devices: list | None = None):
    """``(config, choice)`` for a phase of `train.py` on ``devices`` (default: all): the config
    with the fit applied and the `Choice` (None: no fit, the config as it is). The choice is
    read from, or written to, ``WORKDIR/fit/KEY.json`` (`cache_key`). The run's BertConfig
    takes the chosen remat from the config (`with_model_remat`)."""
    import jax

    from bertjax import objectives, paths

    devices = list(jax.devices() if devices is None else devices)
    budget = budget_bytes(config, device_memory(devices[0]))
    if budget is None:
        return config, None
    path = paths.join(workdir, "fit", cache_key(config, devices, budget) + ".json")
    if paths.exists(path):
        choice = dataclasses.replace(
            Choice.from_dict(json.loads(paths.read_text(path))), cached=True
        )
    else:
        from bertjax.aot.estimate import Estimator

        additive = objectives.make_objective(config).microbatch_additive
        choice = search(
            config,
            lambda candidate: compiled_bytes(lower_train(candidate, model_cfg, devices)),
            budget,
            len(devices),
            batch_shards(config, devices),
            additive,
            Estimator(config, model_cfg, devices),
        )
        if jax.process_index() == 0:
            paths.makedirs(paths.join(workdir, "fit"))
            paths.write_text(path, json.dumps(choice.to_dict(), indent=1))
    return choice.apply(config), choice
