"""Soak: the fault tier's job through many random faults, restarted by exit status until it ends.

The job is tests/fault_job.py's (3 real train.py processes of a two-phase pretraining run over a
sharded store read through ``faulty://`` storage, every 15th request of each process failing
with a 503 throughout; compiled programs from the run's compile cache after the first launch).
Each launch draws one fault, seeded: SIGTERM to one process (a preemption), SIGKILL or SIGSTOP
of one (a lost or stalled host; the supervisor kills what is left, as Kubernetes does with a
failed Job's pods), a SIGKILL right after an asynchronous save began, the newest checkpoint
truncated before the launch, a storage outage past the retry budget on one process, or one
shorter than the budget (ridden out, then a SIGTERM ends the launch), at a random step. The
supervisor restarts the job by bertjax's exit table (`bertjax.errors.job_restarts`, the rule
launch/'s templates follow); a status the table does not restart (1, 2) ends the soak as a
failure (a fault told as a bug or as bad input).

Per seed it reports the launches and faults, the storage requests the run counted as failed and
retried (metrics.jsonl's storage/*), the steps trained again (those after the last checkpoint a
fault left), the wall time beside the uninterrupted run's, and whether the final parameters and
every logged number equal the uninterrupted run's bit for bit.

    python benchmarks/faults/fault_soak.py [--seeds=0,1,2] [--launches=12] [--phase_steps=24]
        [--compile_cache=off]   # every launch compiles its programs again
    python benchmarks/faults/fault_soak.py --dry_run  # the fault plans only (no process is started)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import signal
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the comparisons run on the CPU: no TPU is sought

from bertjax import errors  # noqa: E402  (after the path)

KINDS = ("sigterm", "sigkill", "sigstop", "kill_during_save", "truncated", "outage",
         "short_outage")  # fmt: skip
PROCESSES = 3


def plan(seed: int, launches: int) -> list[tuple[str, int, int]]:
    """The faults of a seed's launches: (kind, the process it hits, steps to train first)."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(launches):
        kind = rng.choice(KINDS)
        victim = rng.randrange(1 if kind == "sigstop" else 0, PROCESSES)  # a stalled 0: JAX aborts
        drawn.append((kind, victim, rng.randint(0, 3)))
    return drawn


def _wait_steps(job, procs, extra: int, timeout: float = 300) -> bool:
    """Until this launch logs ``extra`` steps past the first step after its checkpoint; False
    when the job ended first."""
    before, after = len(job.steps_logged()), max(job.checkpoints() or [0])
    deadline = time.monotonic() + timeout
    while True:
        new = [s for s in job.steps_logged()[before:] if s > after]
        if len(new) > extra:
            return True
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _truncate_newest(job) -> None:
    newest = max(job.checkpoints())
    state = os.path.join(job.workdir, "checkpoints", str(newest), "state")
    files = [os.path.join(d, f) for d, _, names in os.walk(state) for f in names]
    victim = max(files, key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)


def launch_with(job, name: str, fault: tuple[str, int, int], fj):
    """One launch of ``job`` with ``fault``; its `Launch`."""
    kind, victim, extra = fault
    if kind == "truncated" and not job.checkpoints():
        kind = "sigterm"  # nothing to truncate yet
    faults = [dict(fj.TRANSIENT) for _ in range(PROCESSES)]
    if kind == "kill_during_save":
        at = max(job.checkpoints() or [0]) + 1 + extra
        kill = [at if i == victim else None for i in range(PROCESSES)]
        return job.run(name, faults=faults, kill_during_save=kill)
    if kind == "truncated":
        _truncate_newest(job)
        return job.run(name, faults=faults)
    trigger = str(job.logs / f"{name}.outage")
    if kind in ("outage", "short_outage"):
        faults[victim]["while_exists"] = trigger
    procs = job.start(name, faults=faults)
    if not _wait_steps(job, procs, extra):
        return job.finish(name, procs)
    if kind in ("sigterm", "sigkill", "sigstop"):
        signum = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}.get(kind, signal.SIGSTOP)
        procs[victim].send_signal(signum)
        if kind != "sigterm":  # the supervisor sees the others end and kills the rest
            for i, proc in enumerate(procs):
                if i != victim:
                    proc.wait(timeout=fj.HEARTBEAT_S + 120)
            procs[victim].kill()
    elif kind in ("outage", "short_outage"):
        open(trigger, "w").close()
        if kind == "short_outage":  # shorter than the budget: ridden out, then a preemption
            time.sleep(fj.BUDGET_S / 2)
            os.remove(trigger)
            _wait_steps(job, procs, 1)
            procs[victim].send_signal(signal.SIGTERM)
    launch = job.finish(name, procs)
    if os.path.exists(trigger):
        os.remove(trigger)
    return launch


def soak(seed: int, launches: int, store: str, base: pathlib.Path, settings, fj) -> dict:
    """The job through ``launches`` faulted launches, then launches without faults to its end."""
    root = base / f"seed{seed}"
    root.mkdir()
    job = fj.Supervisor(root / "workdir", store, root, settings, PROCESSES)
    start, kinds, outcome = time.monotonic(), [], "finished"
    for n, fault in enumerate(plan(seed, launches) + [("none", 0, 0)] * 4):
        launch = (job.run(f"l{n}", faults=[fj.TRANSIENT] * PROCESSES) if fault[0] == "none"
                  else launch_with(job, f"l{n}", fault, fj))  # fmt: skip
        kinds.append((fault[0], fault[1], launch.statuses))
        restart = errors.job_restarts(launch.statuses)
        if restart is None:  # finished
            break
        if not restart:
            outcome = f"stopped: {fault[0]} gave {launch.statuses}"
            print("\n".join(log[-3000:] for log in launch.logs), file=sys.stderr)
            break
    else:
        outcome = "not finished"
    return {"job": job, "kinds": kinds, "wall": time.monotonic() - start, "outcome": outcome}


def _spm(directory: str) -> str:
    from bertjax.data.text import corpus
    from bertjax.data.tokenizer import train_sentencepiece

    sentences = (s for _, d in corpus.iter_documents("builtin") for s in d)
    return train_sentencepiece(sentences, directory, vocab_size=400)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--launches", type=int, default=12, help="faulted launches a seed")
    parser.add_argument("--phase_steps", type=int, default=24)
    parser.add_argument("--dry_run", action="store_true", help="print the plans only")
    parser.add_argument(
        "--compile_cache",
        default="on",
        choices=("on", "off"),
        help="off: every launch compiles (the cache's effect on the wall)",
    )
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.dry_run:
        for seed in seeds:
            print(f"seed {seed}: " + ", ".join(f"{k}@p{v}+{e}" for k, v, e in
                                                plan(seed, args.launches)))  # fmt: skip
        return
    # Each launch starts its interpreters as a supervisor does (the suite's warm forks,
    # tests/warm_python.py, would take the imports out of the walls measured here).
    os.environ.setdefault("BERTJAX_TEST_WARM", "0")
    import fault_job as fj
    import jax
    import numpy as np

    settings = fj.settings(args.phase_steps, processes=PROCESSES)
    if args.compile_cache == "off":
        settings.append("--config.compile_cache=off")
    total = 2 * args.phase_steps
    base = pathlib.Path(tempfile.mkdtemp(prefix="fault_soak_"))
    store = fj.build_store(base, _spm(str(base / "spm")))
    reference = fj.Supervisor(base / "reference", store, base, settings, PROCESSES)
    began = time.monotonic()
    assert reference.run("reference").statuses == [0] * PROCESSES, "the uninterrupted run failed"
    reference_wall = time.monotonic() - began
    ref_params = fj.params(reference.workdir, total)
    rows = []
    print("| seed | launches | faults (kind@process: statuses) | storage requests failed / "
          "recovered | steps trained (again) | wall s (x uninterrupted) | s a launch (median) "
          "| params, logged numbers | outcome |")  # fmt: skip
    print("|---:|---:|---|---:|---:|---:|---:|---|---|")
    for seed in seeds:
        result = soak(seed, args.launches, store, base, settings, fj)
        job = result["job"]
        steps = job.steps_logged()
        equal = "-"
        if result["outcome"] == "finished":
            same = jax.tree.leaves(jax.tree.map(np.array_equal, fj.params(job.workdir, total),
                                                ref_params))  # fmt: skip
            logged = fj.by_step(job.workdir) == fj.by_step(reference.workdir)
            equal = f"{'equal' if all(same) else 'DIFFER'}, {'equal' if logged else 'DIFFER'}"
        failed, recovered = fj.storage_counts(job.workdir)
        faults = "; ".join(f"{k}@{v}: {s}" for k, v, s in result["kinds"])
        again = len(steps) - total
        rows.append((again, result["wall"] / reference_wall))
        per_launch = statistics.median(launch.wall_s for launch in job.launches)
        print(f"| {seed} | {len(job.launches)} | {faults} | {failed:.0f} / {recovered:.0f} | "
              f"{len(steps)} ({again}) | {result['wall']:.0f} "
              f"({result['wall'] / reference_wall:.1f}x) | {per_launch:.1f} | {equal} | "
              f"{result['outcome']} |", flush=True)  # fmt: skip
    again = sorted(r[0] for r in rows)
    ratio = sorted(r[1] for r in rows)
    print(
        f"\nsteps trained again: median {statistics.median(again)} (range {again[0]}-"
        f"{again[-1]}); wall vs the uninterrupted run ({reference_wall:.0f} s): median "
        f"{statistics.median(ratio):.1f}x (range {ratio[0]:.1f}-{ratio[-1]:.1f}x); "
        f"{len(seeds)} seeds, {total} steps each; the uninterrupted run's launch "
        f"{reference.launches[0].wall_s:.1f} s; workdirs in {base}"
    )


if __name__ == "__main__":
    main()
