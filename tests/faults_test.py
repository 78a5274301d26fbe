"""The fault-injection tier: a two-phase pretraining run (configs/phases_tiny.py, shrunk) of 3
real train.py processes (a pod has 4 or more hosts: a lost one leaves several survivors) reading
a sharded store through storage that fails, restarted by a supervisor (tests/fault_job.py's
`Supervisor`, by bertjax/errors.py's exit table as the templates in launch/ do) after each fault,
until it finishes. Its final parameters equal an uninterrupted run's bit for bit, every logged
number equals that run's, and no fault costs more than the steps since the last complete
checkpoint (each launch resumes from the newest one the fault left). Every launch after the
first loads its compiled programs from the compile cache (bertjax/training/compile_cache.py).

The faults, one launch each, with transient storage errors (every 15th request of each process
fails with a 503) throughout:
1. SIGTERM to process 1 (a preemption): all three save one step and exit 143;
2. a stop during an outage: from the third batch of the launch every read of processes 0 and 2
   fails (a budget of 120 s: ridden out) and process 1's hangs; SIGTERM to process 2 reaches the
   others through JAX's preemption notice, their reads give up, and all three, stuck at one
   step, save it and exit 143 within 30 s (process 1 leaves its hung read behind);
3. SIGKILL of process 2 right after it began an asynchronous save (the first at or after the
   phase switch): processes 0 and 1 both name it and exit 75 within the heartbeat timeout
   (neither takes the other's failed collective for a bug), and that save is never resumed
   from;
4. the newest checkpoint truncated (a file lost after the save completed): it is set aside and
   the run exits 75 to be planned again from the one before;
5. an outage longer than the storage retry budget on process 0's reads, from the third batch of
   the launch (inside the training loop): all exit 75, one line naming the object;
6. the run to its end: 0.
(A stalled host, SIGSTOP, is the soak's: benchmarks/faults/fault_soak.py.)
"""

import os
import re
import signal
import time

import jax
import numpy as np
import pytest
from fault_job import (
    HEARTBEAT_S,
    PROCESSES,
    TRANSIENT,
    Supervisor,
    build_store,
    by_step,
    errors,
    params,
    settings,
    storage_counts,
)

pytestmark = pytest.mark.slow

PHASE_STEPS = 6  # each of the two phases
STEPS = 2 * PHASE_STEPS
GRACE_S = 30  # a pod's grace window after SIGTERM (Kubernetes' default)
STUCK_AT = 2  # the outages: reads fail (hang) from this batch of the launch


@pytest.fixture(scope="module")
def store(tmp_path_factory, small_spm) -> str:
    return build_store(tmp_path_factory.mktemp("fault_store"), small_spm)


@pytest.fixture(scope="module")
def job_settings(tmp_path_factory) -> list[str]:
    """The job's flags; the reference and the faulted job share one compile cache."""
    cache = tmp_path_factory.mktemp("compile_cache")
    return [*settings(PHASE_STEPS), f"--config.compile_cache={cache}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, store, job_settings):
    """The same job, uninterrupted and without faults."""
    base = tmp_path_factory.mktemp("fault_reference")
    job = Supervisor(base / "workdir", store, base, job_settings)
    launch = job.run("reference")
    assert launch.statuses == [0] * PROCESSES, "\n".join(log[-3000:] for log in launch.logs)
    return job


def _stuck_step(resumed: int) -> int:
    """The step launch 2 trains up to before its reads fail: STUCK_AT steps past the checkpoint
    it resumed from (its first batch, computed at once, and the next, read ahead, come before
    the outage's). A phase reads nothing ahead past its last step (`DataSource.end_at`), so the
    count runs on through the phase switch; where the launch resumes depends on where launch
    1's stop landed (a loaded machine moves it by a few steps)."""
    return resumed + STUCK_AT


def _wait_for_lines(job, name: str, lines: list[str], procs, timeout: float = 300) -> None:
    """Until process i's log of launch ``name`` holds ``lines[i]``."""
    deadline = time.monotonic() + timeout
    while not all(line in job.log(name, i) for i, line in enumerate(lines)):
        assert all(p.poll() is None for p in procs), "a process ended"
        assert time.monotonic() < deadline, [job.log(name, i)[-2000:] for i in range(len(lines))]
        time.sleep(0.1)


def _wait_all(procs, timeout: float) -> float:
    """Seconds until every process of ``procs`` has ended (at most ``timeout``)."""
    start = time.monotonic()
    for p in procs:
        p.wait(timeout=max(1, timeout - (time.monotonic() - start)))
    return time.monotonic() - start


@pytest.fixture(scope="module")
def faulted(tmp_path_factory, store, job_settings, reference) -> Supervisor:
    """The job through the module docstring's six launches (after the reference: its compiled
    programs are in the cache)."""
    base = tmp_path_factory.mktemp("faulted")
    job = Supervisor(base / "workdir", store, base, job_settings)
    transient = [TRANSIENT] * PROCESSES

    procs = job.start("sigterm", faults=transient)  # 1
    job.wait_for_step(procs)
    procs[1].send_signal(signal.SIGTERM)
    job.finish("sigterm", procs)

    faults = [{**TRANSIENT, "outage_from_batch": STUCK_AT}, {**TRANSIENT, "hang_from_batch":
              STUCK_AT}, {**TRANSIENT, "outage_from_batch": STUCK_AT}]  # fmt: skip  # 2
    resumed = max(job.checkpoints())  # where the launch resumes (later ones: its own saves)
    procs = job.start("stuck", faults=faults, extra=["--config.storage_retry_seconds=600"])
    marks = [f"faulty_fs: {w} from batch {STUCK_AT} on" for w in ("outage", "hang", "outage")]
    _wait_for_lines(job, "stuck", marks, procs)
    deadline = time.monotonic() + 300
    while _stuck_step(resumed) not in job.steps_logged():  # every process trained up to the fault
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.1)
    procs[2].send_signal(signal.SIGTERM)  # (each is past JAX's sync point for that step)
    job.waited["stuck"] = _wait_all(procs, timeout=120)
    job.finish("stuck", procs)

    kill = [None] * (PROCESSES - 1) + [PHASE_STEPS]  # 3: process 2 dies as its save is written
    procs = job.start("kill_during_save", faults=transient, kill_during_save=kill)
    procs[2].wait(timeout=300)
    killed = time.monotonic()
    _wait_all(procs[:2], timeout=HEARTBEAT_S + 120)
    job.waited["kill_during_save"] = time.monotonic() - killed
    job.finish("kill_during_save", procs)

    newest = max(job.checkpoints())  # 4: a file of the newest checkpoint loses its second half
    state = os.path.join(job.workdir, "checkpoints", str(newest), "state")
    files = [os.path.join(d, f) for d, _, names in os.walk(state) for f in names]
    victim = max(files, key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    job.run("truncated", faults=transient)

    outage = [{**TRANSIENT, "outage_from_batch": STUCK_AT}, *transient[1:]]  # 5
    job.run("outage", faults=outage)

    job.run("finish", faults=transient)  # 6
    print("launch seconds:", {launch.name: round(launch.wall_s) for launch in job.launches})
    return job


def test_each_fault_ends_the_launch_with_the_status_a_supervisor_reads(faulted):
    launches = {launch.name: launch for launch in faulted.launches}
    show = {name: launch.statuses for name, launch in launches.items()}
    assert launches["sigterm"].statuses == [143] * PROCESSES, show
    assert launches["stuck"].statuses == [143] * PROCESSES, show
    assert launches["kill_during_save"].statuses == [75, 75, -signal.SIGKILL], show
    assert launches["truncated"].statuses == [75] * PROCESSES, show
    assert launches["outage"].statuses == [75] * PROCESSES, show
    assert launches["finish"].statuses == [0] * PROCESSES, show


def _stopped(log: str) -> int:
    """The step a process says it saved when it stopped."""
    line = log.strip().splitlines()[-1]
    assert line.startswith("stopped by SIGTERM after saving step "), log[-3000:]
    return int(re.search(r"after saving step (\d+)", line).group(1))


def test_each_line_says_what_happened(faulted):
    """One line a process, naming the signal, the lost process, the unreadable checkpoint or
    the object storage did not serve; never JAX's abort for a lost process 2, and never a
    survivor's status 1 for a collective that failed because process 2 was gone."""
    launches = {launch.name: launch for launch in faulted.launches}
    assert len({_stopped(log) for log in launches["sigterm"].logs}) == 1
    for log in launches["kill_during_save"].logs[:2]:
        assert len(errors(log)) == 1, log[-3000:]
        assert errors(log)[0].startswith(f"error: process 2 of {PROCESSES} ("), log[-3000:]
        assert "left the run" in log and "Rerun the same command on every host" in log
        assert "Check failure stack trace" not in log and "Traceback" not in log
    assert faulted.waited["kill_during_save"] < HEARTBEAT_S + 20, faulted.waited  # not JAX's 68 s
    truncated = launches["truncated"].logs[0]
    assert "could not be read" in truncated and ".unreadable" in truncated, truncated[-3000:]
    assert "a newer checkpoint could not be read and was set aside" in errors(truncated)[-1]
    outage = launches["outage"].logs
    assert errors(outage[0])[-1].startswith("error: storage unreachable: faulty://"), outage[0]
    own = errors(outage[0])[-1].removeprefix("error: ")  # the others print it whole
    for log in outage[1:]:
        assert "StorageUnavailable" in errors(log)[-1] and own in errors(log)[-1], log[-3000:]


def _left_at(log: str) -> int:
    """Launch 2: the step a process saved when it stopped, or, when the stop came while another
    process was still opening the second phase (launch 2 stuck at the first phase's end, the
    step already saved: a resume two steps before it, `_stuck_step`), the step it says the run
    resumes from, nothing lost (`bertjax.training.stopping.StoppedApart`, status 143; process 1,
    whose read hung, names the others' such stops)."""
    line = log.strip().splitlines()[-1]
    if line.startswith("stopped by SIGTERM after saving step "):
        return _stopped(log)
    apart = re.search(
        r"did not come .*?: nothing was lost; rerun the same command to resume from step (\d+)",
        line,
    )
    assert apart, log[-3000:]
    return int(apart.group(1))


def test_a_stop_during_an_outage_saves_the_step_every_process_is_stuck_at(faulted):
    """Launch 2: the processes trained two steps past their checkpoint (`_stuck_step`), then
    their reads failed (0, 2) or hung (1); the stop saved that step on all three within the
    grace window."""
    stuck = next(launch for launch in faulted.launches if launch.name == "stuck")
    stuck_at = _stuck_step(stuck.resumed_from[0] or 0)
    assert [_left_at(log) for log in stuck.logs] == [stuck_at] * PROCESSES
    assert stuck_at in stuck.checkpoints_after
    assert faulted.waited["stuck"] < GRACE_S, faulted.waited


def test_no_fault_costs_more_than_the_steps_since_the_last_checkpoint(faulted):
    """Each launch resumes from the newest complete checkpoint the one before left (the set-aside
    one excepted), and a launch killed during a save never resumes from that save."""
    launches = faulted.launches
    for before, launch in zip(launches, launches[1:]):
        if launch.name == "truncated":  # it sets the newest aside and stops before training
            assert launch.resumed_from == [None] * PROCESSES
            assert max(launch.checkpoints_after) < max(before.checkpoints_after)
            continue
        expected = max(before.checkpoints_after)
        assert launch.resumed_from == [expected] * PROCESSES, (launch.name, launch.resumed_from)
    killed = next(launch for launch in launches if launch.name == "kill_during_save")
    died_saving = int(re.findall(r"saving step (\d+), then SIGKILL", killed.logs[2])[-1])
    assert died_saving >= PHASE_STEPS and died_saving not in killed.checkpoints_after


def test_the_faulted_run_ends_bitwise_equal_to_the_uninterrupted_one(faulted, reference):
    assert faulted.steps_logged()[-1] == STEPS
    ours, theirs = params(faulted.workdir, STEPS), params(reference.workdir, STEPS)
    assert len(jax.tree.leaves(ours)) > 10
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    assert by_step(faulted.workdir) == by_step(reference.workdir)
    failed, recovered = storage_counts(faulted.workdir)  # every 15th request of each process
    assert failed > 10 and 0 < recovered <= failed, (failed, recovered)
    assert storage_counts(reference.workdir) == (0, 0)
