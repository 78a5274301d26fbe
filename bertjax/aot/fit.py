"""Fit a recipe to the hardware, keeping the recipe: when a phase's train step does not fit the
devices' memory with 10% headroom, choose microbatches (a divisor of each device's rows), a
rematerialization policy and FSDP, in that order of cost, by compiling candidates: the compiler's
memory analysis decides, not a formula. The global batch, the tokens, the schedule and the phases
never change: microbatches add up to the batch's gradient (`bertjax.training.step`), remat
recomputes what it dropped, FSDP shards what is replicated.

`search` is the decision, given ``measure(config) -> bytes a device`` (None: the compiler refused
it for memory). `train.py` measures on the devices it runs on (`fit_run`), `python -m
bertjax.compile` on a target's abstract devices (`bertjax.aot.plan`). ``config.fit = "off"``
keeps the config as it is; ``config.fit_memory_gib`` plans for that much memory a device instead
of the device's own (a CPU has none to plan for: no fit there unless it is set).

The search, cheapest first: the recipe's own settings; then, with its remat and FSDP, the
fewest microbatches that fit (a search over the divisors, each probe placed where memory = a +
b / microbatches through the points measured so far meets the budget),
fewer than the recipe's too when those fit (more rows a microbatch: a faster step); then remat
``dots`` and ``full``, each with the fewest microbatches; then FSDP over 2, 4, ... devices with
full remat. A choice is kept per (phase config, devices, memory, versions) in ``WORKDIR/fit``,
so a restart on the same hardware does not search again; on other hardware it may choose
otherwise and still resumes exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable

import ml_collections

HEADROOM = 0.10  # of a device's memory left free
REMATS = ("none", "dots_no_batch", "dots", "full")  # least recomputation first
GIB = 1 << 30
# keys that cannot change a step's program (the cache key leaves them out)
_BOOKKEEPING = (
    "num_train_steps", "log_every", "eval_every", "eval_batches", "checkpoint_every",
    "keep_checkpoints", "async_checkpoints", "progress_bar", "seed", "storage_retry_seconds",
    "init_from", "fit",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a phase runs with: ``microbatches`` of ``rows`` rows a device each, ``remat``,
    ``fsdp``; ``memory``: the chosen program's bytes a device of ``budget``; ``tried``: the
    candidates compiled, (microbatches, remat, fsdp, bytes or None)."""

    microbatches: int
    remat: str
    fsdp: int
    rows: int
    memory: int
    budget: int
    tried: tuple = ()
    changed: bool = True  # False: the config as it was (it fits)
    changed_fsdp: bool = False  # FSDP over another width than the config's
    cached: bool = False

    def apply(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        return with_settings(
            config, self.microbatches, self.remat, self.fsdp if self.changed_fsdp else None
        )

    def describe(self) -> str:
        """The plan line's words: "fit: 4 microbatches of 8 rows a device, remat none, fsdp 1:
        61.20 GiB of 67.06 GiB a device (3 compiled)"."""
        how = "the config as it is" if not self.changed else "chosen"
        return (
            f"fit ({how}): {self.microbatches} microbatch{'es' if self.microbatches > 1 else ''} "
            f"of {self.rows} rows a device, remat {self.remat}, fsdp {self.fsdp}: "
            f"{self.memory / GIB:.2f} GiB of {self.budget / GIB:.2f} GiB a device usable "
            f"({'cached' if self.cached else f'{len(self.tried)} compiled'})"
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["tried"] = [list(t) for t in self.tried]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Choice:
        return cls(**{**d, "tried": tuple(tuple(t) for t in d.get("tried", ()))})


class DoesNotFit(ValueError):
    """Even one row a device, full remat and FSDP over every device do not fit."""


def with_settings(config, microbatches: int, remat: str, fsdp: int | None = None):
    """A copy of ``config`` with these microbatches, remat and FSDP (None: the config's own;
    another width makes the data axis fill the rest of the mesh); nothing else changes."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.optim.grad_accum_steps = int(microbatches)
        config.model.remat = remat
        if fsdp is not None and int(fsdp) != int(config.mesh.get("fsdp", 1)):
            config.mesh.fsdp = int(fsdp)
            config.mesh.data = -1
    return config


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def rows_per_device(config, batch_shards: int) -> int:
    """Each batch shard's rows, at every batch size the run has (batch warmup): their gcd, so
    a microbatch count that divides it divides them all."""
    from bertjax.data.plans.batch_plan import BatchPlan

    length = int(config.data.max_seq_length) if "data" in config else 1
    plan = BatchPlan.from_config(config, length)
    sizes = {*plan.sizes, plan.final, int(config.batch_size)}
    rows = [size // batch_shards for size in sizes if size % batch_shards == 0]
    if len(rows) != len(sizes):
        raise ValueError(
            f"config.batch_size={config.batch_size}: every batch size must split over the "
            f"{batch_shards} batch shards of the mesh"
        )
    return math.gcd(*rows)


def _fsdp_sizes(devices: int, config) -> list[int]:
    """FSDP widths to try after the recipe's: powers of two dividing what the other axes
    leave (tensor and expert axes are the recipe's)."""
    fixed = max(1, int(config.mesh.get("tensor", 1))) * max(1, int(config.mesh.get("expert", 1)))
    room = devices // fixed
    own = int(config.mesh.get("fsdp", 1))
    own = own if own > 0 else room
    return [2**i for i in range(1, 31) if 2**i <= room and room % 2**i == 0 and 2**i > own]


def search(
    config,
    measure: Callable,
    budget: int,
    devices: int,
    batch_shards: int,
    additive: bool = True,
) -> Choice:
    """The cheapest (microbatches, remat, fsdp) whose program fits ``budget`` bytes a device
    (``measure(config) -> bytes | None``), in the order of the module docstring; raises
    `DoesNotFit` (one line) when none does."""
    tried: list = []
    measured: dict = {}
    own_k = int(config.optim.grad_accum_steps)
    own_remat = str(config.model.get("remat", "none"))
    own_fsdp = int(config.mesh.get("fsdp", 1))
    own_fsdp = own_fsdp if own_fsdp > 0 else devices  # -1: over every device the others leave

    def memory(k, remat, fsdp):
        key = (k, remat, fsdp)
        if key not in measured:
            found = measure(with_settings(config, k, remat, None if fsdp == own_fsdp else fsdp))
            measured[key] = found
            tried.append((k, remat, fsdp, found))
            logging.info("fit: %d microbatches, remat %s, fsdp %d: %s bytes", *key, found)
        return measured[key]

    def fits(k, remat, fsdp):
        found = memory(k, remat, fsdp)
        return found is not None and found <= budget

    def choice(k, remat, fsdp, shards):
        rows = int(config.batch_size) // shards // k  # at the phase's (final) batch size
        changed = (k, remat, fsdp) != (own_k, own_remat, own_fsdp)
        found = memory(k, remat, fsdp)
        return Choice(k, remat, fsdp, rows, found, budget, tuple(tried), changed, fsdp != own_fsdp)

    def guess(ks, lo, hi, remat, fsdp):
        """The index in ks[lo:hi] where memory = a + b / k (through the nearest measured
        points either side of the budget) meets the budget; the middle without two such."""
        points = {k: m for (k, r, f), m in measured.items() if (r, f) == (remat, fsdp) and m}
        over = [k for k, m in points.items() if m > budget and k < ks[hi]]
        under = [k for k, m in points.items() if m <= budget and k >= ks[hi]]
        mid = (lo + hi) // 2
        if not over or not under:
            return mid
        k_over, k_under = max(over), min(under)
        slope = (points[k_over] - points[k_under]) / (1 / k_over - 1 / k_under)
        if slope <= 0:
            return mid
        base = points[k_under] - slope / k_under
        needed = slope / (budget - base) if budget > base else ks[hi]
        found = next((i for i in range(lo, hi) if ks[i] >= needed), hi - 1)
        return min(max(found, lo), hi - 1)

    def fewest(ks, remat, fsdp):
        """The fewest microbatches in ``ks`` (ascending) that fit, or None: a search of the
        bracket whose probes `guess` places (memory falls as 1 / microbatches, roughly)."""
        if not ks or not fits(ks[-1], remat, fsdp):
            return None
        lo, hi = 0, len(ks) - 1  # ks[hi] fits
        while lo < hi:
            mid = guess(ks, lo, hi, remat, fsdp)
            if fits(ks[mid], remat, fsdp):
                hi = mid
            else:
                lo = mid + 1
        return ks[hi]

    rows = rows_per_device(config, batch_shards)
    ks = _divisors(rows) if additive else [own_k]
    if own_k not in ks:
        ks = sorted({*ks, own_k}) if not additive else ks
    first = own_k if own_k in ks else next((k for k in ks if k > own_k), ks[-1])
    if fits(first, own_remat, own_fsdp):  # as configured (or the nearest valid count)
        k = fewest([k for k in ks if k < first], own_remat, own_fsdp) or first
        return choice(k, own_remat, own_fsdp, batch_shards)
    larger = [k for k in ks if k > first]
    k = fewest(larger, own_remat, own_fsdp)
    if k is not None:
        return choice(k, own_remat, own_fsdp, batch_shards)
    stronger = REMATS[REMATS.index(own_remat) + 1 :] if own_remat in REMATS else ()
    for remat in (r for r in stronger if r != "dots_no_batch"):
        k = fewest(ks, remat, own_fsdp)
        if k is not None:
            return choice(k, remat, own_fsdp, batch_shards)
    remat = "full"
    for fsdp in _fsdp_sizes(devices, config):
        k = fewest(ks, remat, fsdp)
        if k is not None:
            return choice(k, remat, fsdp, batch_shards)
    least = min((m for *_, m in tried if m is not None), default=None)
    need = f"{least / GIB:.2f} GiB at best" if least is not None else "more than the compiler had"
    raise DoesNotFit(
        f"fit: even one row a device ({ks[-1]} microbatches), full remat and FSDP over "
        f"{devices} devices need {need}, over {budget / GIB:.2f} GiB a device usable: use more "
        "devices, a smaller config.batch_size or config.data.max_seq_length (the recipe's "
        "science), or --config.fit=off to run as configured"
    )


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
        "fit": 1,  # this module's search; bump when it changes
    }
    text = json.dumps(about, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def lower_train(config, model_cfg, devices: list):
    """``config``'s train step lowered for ``devices`` (real, or a target's abstract ones) as
    `train.py` builds it, at the phase's batch size: a `jax.stages.Lowered`."""
    import jax

    from bertjax import objectives
    from bertjax.aot import plan
    from bertjax.training import sharding
    from bertjax.training import step as step_lib

    objective = objectives.make_objective(config)
    mesh = sharding.make_mesh(config.mesh, devices)
    state, _, _ = step_lib.abstract_train_state(config, model_cfg, mesh)
    batch = plan.abstract_batch(config, objective, model_cfg, int(config.batch_size), False)
    batch = plan.with_sharding(batch, sharding.batch_sharding(mesh))
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))
    steps = step_lib.jit_steps(state, mesh, step_lib.compiler_options(config))
    return steps.train.lower(state, batch, rng)


def compiled_bytes(lowered) -> int | None:
    """Bytes a device of a lowered program (the compiler's memory analysis); None when the
    compiler refused it for memory."""
    from bertjax.aot import plan
    from bertjax.aot.roofline import Memory

    try:
        compiled = lowered.compile()
    except Exception as error:  # noqa: BLE001  (out of memory: a verdict, not a crash)
        if plan.out_of_memory(error):
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
    read from, or written to, ``WORKDIR/fit/KEY.json`` (`cache_key`)."""
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
        additive = objectives.make_objective(config).microbatch_additive
        choice = search(
            config,
            lambda candidate: compiled_bytes(lower_train(candidate, model_cfg, devices)),
            budget,
            len(devices),
            batch_shards(config, devices),
            additive,
        )
        if jax.process_index() == 0:
            paths.makedirs(paths.join(workdir, "fit"))
            paths.write_text(path, json.dumps(choice.to_dict(), indent=1))
    return choice.apply(config), choice
