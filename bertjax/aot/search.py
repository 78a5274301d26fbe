"""The fit's search (`bertjax.aot.fit`): the cheapest (microbatches, remat, FSDP) whose train step
fits a device's memory, given ``measure(config) -> bytes a device`` (the compiler's memory
analysis; None: refused for memory) and, optionally, ``estimate(config) -> bytes`` (traced, no
compile: `bertjax.aot.estimate`). Nothing compiles here: tests run it on measures written out.

Order of cost: the recipe's own settings; then, with its remat and FSDP, the fewest microbatches
that fit (a divisor of each device's rows), fewer than the recipe's too when those fit (more
rows a microbatch: a faster step); then remat ``dots`` and ``full``, each with the fewest
microbatches; then FSDP over 2, 4, ... devices with full remat. Each search over microbatch
counts starts where the estimate, scaled by the bytes compiled so far, meets the budget (without
an estimate: at the most microbatches), then probes where memory = a + b / microbatches through
the points measured meets it. Candidates estimated above `FAR` times the budget are never
compiled; "nothing fits" is always the compiler's verdict (the cheapest candidate compiled).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

import ml_collections

REMATS = ("none", "dots_no_batch", "dots", "full")  # least recomputation first
GIB = 1 << 30
FAR = 4.0  # candidates estimated above FAR x the budget are not compiled


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
    ruled_out: tuple = ()  # (microbatches, remat, fsdp, estimated bytes) never compiled

    def apply(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        return with_settings(
            config, self.microbatches, self.remat, self.fsdp if self.changed_fsdp else None
        )

    def describe(self) -> str:
        """The plan line's words: "fit: 4 microbatches of 8 rows a device, remat none, fsdp 1:
        61.20 GiB of 67.06 GiB a device (3 compiled)"."""
        how = "the config as it is" if not self.changed else "chosen"
        searched = f"{len(self.tried)} compiled"
        if self.ruled_out:
            searched += f", {len(self.ruled_out)} ruled out by the estimate"
        return (
            f"fit ({how}): {self.microbatches} microbatch{'es' if self.microbatches > 1 else ''} "
            f"of {self.rows} rows a device, remat {self.remat}, fsdp {self.fsdp}: "
            f"{self.memory / GIB:.2f} GiB of {self.budget / GIB:.2f} GiB a device usable "
            f"({'cached' if self.cached else searched})"
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["tried"] = [list(t) for t in self.tried]
        out["ruled_out"] = [list(t) for t in self.ruled_out]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Choice:
        lists = {key: tuple(tuple(t) for t in d.get(key, ())) for key in ("tried", "ruled_out")}
        return cls(**{**d, **lists})


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
    uneven = sorted(size for size in sizes if size % batch_shards)
    if uneven:
        raise ValueError(
            f"config.batch_size={config.batch_size}: the run's batch size(s) {uneven} (its "
            f"config.batch_warmup included) do not split over the mesh's {batch_shards} batch "
            "shards; make every size a multiple of that (config.batch_warmup.quantum) or use "
            "fewer devices"
        )
    return math.gcd(*(size // batch_shards for size in sizes))


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
    estimate: Callable | None = None,
) -> Choice:
    """The cheapest (microbatches, remat, fsdp) whose program fits ``budget`` bytes a device
    (``measure(config) -> bytes | None``), in the order of the module docstring; raises
    `DoesNotFit` (one line) when none does. ``estimate(config) -> bytes`` (no compile:
    `bertjax.aot.estimate`): candidates it puts above ``FAR`` x the budget are not compiled, and
    each search over microbatch counts starts where it (scaled by what was compiled) meets the
    budget; "nothing fits" is always a compiler's verdict."""
    tried: list = []
    ruled: list = []
    measured: dict = {}
    estimated: dict = {}
    own_k = int(config.optim.grad_accum_steps)
    own_remat = str(config.model.get("remat", "none"))
    own_fsdp = int(config.mesh.get("fsdp", 1))
    own_fsdp = own_fsdp if own_fsdp > 0 else devices  # -1: over every device the others leave
    trusted = [estimate is not None]  # the estimate may rule candidates out

    def settings(k, remat, fsdp):
        return with_settings(config, k, remat, None if fsdp == own_fsdp else fsdp)

    def memory(k, remat, fsdp):
        key = (k, remat, fsdp)
        if key not in measured:
            found = measure(settings(*key))
            measured[key] = found
            tried.append((k, remat, fsdp, found))
            logging.info("fit: %d microbatches, remat %s, fsdp %d: %s bytes", *key, found)
        return measured[key]

    def estimated_bytes(k, remat, fsdp):
        key = (k, remat, fsdp)
        if estimate is None:
            return None
        if key not in estimated:
            estimated[key] = estimate(settings(*key))
        return estimated[key]

    def far(k, remat, fsdp):
        """Estimated above FAR x the budget (and not compiled): left out."""
        found = estimated_bytes(k, remat, fsdp) if trusted[0] else None
        if found is None or found <= FAR * budget or (k, remat, fsdp) in measured:
            return False
        if all(r[:3] != (k, remat, fsdp) for r in ruled):
            ruled.append((k, remat, fsdp, found))
        return True

    def fits(k, remat, fsdp):
        if far(k, remat, fsdp):
            return False
        found = memory(k, remat, fsdp)
        return found is not None and found <= budget

    def choice(k, remat, fsdp, shards):
        rows = int(config.batch_size) // shards // k  # at the phase's (final) batch size
        changed = (k, remat, fsdp) != (own_k, own_remat, own_fsdp)
        found = memory(k, remat, fsdp)
        kept = tuple(r for r in ruled if r[:3] not in measured)
        return Choice(
            k, remat, fsdp, rows, found, budget, tuple(tried), changed, fsdp != own_fsdp,
            ruled_out=kept,
        )  # fmt: skip

    def scaled(ks, lo, hi, remat, fsdp):
        """The first index in ks[lo:hi] whose estimate, scaled by the compiled bytes of the
        nearest measured count over it (1 when none), meets the budget; None without one."""
        if estimate is None:
            return None
        points = {k: m for (k, r, f), m in measured.items() if (r, f) == (remat, fsdp) and m}
        near = [k for k in points if k >= ks[hi]]
        ratio = 1.0
        if near:
            k = min(near)
            ratio = points[k] / max(estimated_bytes(k, remat, fsdp), 1)
        return next(
            (i for i in range(lo, hi) if ratio * estimated_bytes(ks[i], remat, fsdp) <= budget),
            None,
        )

    def guess(ks, lo, hi, remat, fsdp):
        """The index in ks[lo:hi] where memory = a + b / k (through the nearest measured
        points either side of the budget) meets the budget; else where the scaled estimate
        does; else the middle."""
        points = {k: m for (k, r, f), m in measured.items() if (r, f) == (remat, fsdp) and m}
        over = [k for k, m in points.items() if m > budget and k < ks[hi]]
        under = [k for k, m in points.items() if m <= budget and k >= ks[hi]]
        mid = (lo + hi) // 2
        if not over or not under:  # the scaled estimate: where it meets the budget, or
            if estimate is None:  # (when only ks[hi] does) the count just below
                return mid
            found = scaled(ks, lo, hi, remat, fsdp)
            return hi - 1 if found is None else found
        k_over, k_under = max(over), min(under)
        slope = (points[k_over] - points[k_under]) / (1 / k_over - 1 / k_under)
        if slope <= 0:
            return mid
        base = points[k_under] - slope / k_under
        needed = slope / (budget - base) if budget > base else ks[hi]
        found = next((i for i in range(lo, hi) if ks[i] >= needed), hi - 1)
        return min(max(found, lo), hi - 1)

    def fewest(ks, remat, fsdp):
        """The fewest microbatches in ``ks`` (ascending) that fit, or None: a search whose
        first probe is where the estimate meets the budget (without one: the most
        microbatches), then of the bracket whose probes `guess` places (memory falls as
        1 / microbatches, roughly)."""
        ks = [k for k in ks if not far(k, remat, fsdp)]
        if not ks:
            return None
        first = len(ks) - 1
        if estimate is not None:
            found = scaled(ks, 0, len(ks) - 1, remat, fsdp)
            first = len(ks) - 1 if found is None else found
        if fits(ks[first], remat, fsdp):
            lo, hi = 0, first
        elif first == len(ks) - 1 or not fits(ks[-1], remat, fsdp):
            return None
        else:
            lo, hi = first + 1, len(ks) - 1
        while lo < hi:  # ks[hi] fits
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
    widths = _fsdp_sizes(devices, config)
    for _ in range(2):  # again without ruling out, if the estimate ruled out what fits
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
        for fsdp in widths:
            k = fewest(ks, "full", fsdp)
            if k is not None:
                return choice(k, "full", fsdp, batch_shards)
        cheapest = (ks[-1], "full", widths[-1] if widths else own_fsdp)
        if not ruled or cheapest in measured:  # the compiler's verdict: nothing fits
            break
        trusted[0] = False  # the estimate ruled out the cheapest candidate: compile it
        if not fits(*cheapest):
            break
    least = min((m for *_, m in tried if m is not None), default=None)
    need = f"{least / GIB:.2f} GiB at best" if least is not None else "more than the compiler had"
    raise DoesNotFit(
        f"fit: even one row a device ({ks[-1]} microbatches), full remat and FSDP over "
        f"{devices} devices need {need}, over {budget / GIB:.2f} GiB a device usable: use more "
        "devices, a smaller config.batch_size or config.data.max_seq_length (the recipe's "
        "science), or --config.fit=off to run as configured"
    )
