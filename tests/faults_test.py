"""The fault-injection tier: a two-phase pretraining run (configs/phases_tiny.py, shrunk) of 2
real train.py processes reading a sharded store through storage that fails, restarted by a
supervisor (tests/fault_job.py's `Supervisor`: by exit status, as a Kubernetes Job with README's
pod failure policy would) after each fault, until it finishes. Its final parameters equal an
uninterrupted run's bit for bit, every logged number equals that run's, and no fault costs more
than the steps since the last complete checkpoint (each launch resumes from the newest one the
fault left).

The faults, one launch each, with transient storage errors (every 15th request of each process
fails with a 503) throughout:
1. SIGTERM to process 1 (a preemption): both save one step and exit 143;
2. SIGKILL of process 1: process 0 names it and exits 75 within the heartbeat timeout;
3. SIGSTOP of process 1 (a stalled host): process 0 names it and exits 75; the supervisor kills
   the stopped one, as Kubernetes does with the rest of a failed Job;
4. SIGKILL of process 0 right after it began an asynchronous save (the first at or after the
   phase switch): that save is never resumed from;
5. the newest checkpoint truncated (a file lost after the save completed): it is set aside and
   the run exits 75 to be planned again from the one before;
6. an outage longer than the storage retry budget on process 0's reads: both exit 75, one line
   naming the object;
7. the run to its end: 0.
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

PHASE_STEPS = 8  # each of the two phases
STEPS = 2 * PHASE_STEPS
SETTINGS = settings(PHASE_STEPS)


@pytest.fixture(scope="module")
def store(tmp_path_factory, small_spm) -> str:
    return build_store(tmp_path_factory.mktemp("fault_store"), small_spm)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, store):
    """The same job, uninterrupted and without faults."""
    base = tmp_path_factory.mktemp("fault_reference")
    job = Supervisor(base / "workdir", store, base, SETTINGS)
    launch = job.run("reference")
    assert launch.statuses == [0, 0], "\n".join(log[-3000:] for log in launch.logs)
    return job


@pytest.fixture(scope="module")
def faulted(tmp_path_factory, store) -> Supervisor:
    """The job through the module docstring's seven launches."""
    base = tmp_path_factory.mktemp("faulted")
    job = Supervisor(base / "workdir", store, base, SETTINGS)
    transient = (TRANSIENT, TRANSIENT)

    procs = job.start("sigterm", faults=transient)  # 1
    job.wait_for_step(procs)
    procs[1].send_signal(signal.SIGTERM)
    job.finish("sigterm", procs)

    for name, signum in (("sigkill", signal.SIGKILL), ("sigstop", signal.SIGSTOP)):  # 2, 3
        procs = job.start(name, faults=transient)
        job.wait_for_step(procs)
        procs[1].send_signal(signum)
        sent = time.monotonic()
        procs[0].wait(timeout=HEARTBEAT_S + 120)  # the supervisor sees one end, kills the rest
        job.waited[name] = time.monotonic() - sent
        procs[1].kill()
        job.finish(name, procs)

    job.run("kill_during_save", faults=transient, kill_during_save=(PHASE_STEPS, None))  # 4

    newest = max(job.checkpoints())  # 5: a file of the newest checkpoint loses its second half
    state = os.path.join(job.workdir, "checkpoints", str(newest), "state")
    files = [os.path.join(d, f) for d, _, names in os.walk(state) for f in names]
    victim = max(files, key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    job.run("truncated", faults=transient)

    trigger = str(job.logs / "outage")  # 6: every read of process 0 fails while this file exists
    procs = job.start("outage", faults=({**TRANSIENT, "while_exists": trigger}, TRANSIENT))
    job.wait_for_step(procs)
    open(trigger, "w").close()
    job.finish("outage", procs)
    os.remove(trigger)

    job.run("finish", faults=transient)  # 7
    return job


def test_each_fault_ends_the_launch_with_the_status_a_supervisor_reads(faulted):
    launches = {launch.name: launch for launch in faulted.launches}
    show = {name: launch.statuses for name, launch in launches.items()}
    assert launches["sigterm"].statuses == [143, 143], show
    assert launches["sigkill"].statuses == [75, -signal.SIGKILL], show
    assert launches["sigstop"].statuses == [75, -signal.SIGKILL], show
    assert launches["kill_during_save"].statuses[0] == -signal.SIGKILL, show
    assert launches["kill_during_save"].statuses[1] not in (0, 1, 2), show  # restart it
    assert launches["truncated"].statuses == [75, 75], show
    assert launches["outage"].statuses == [75, 75], show
    assert launches["finish"].statuses == [0, 0], show


def test_each_line_says_what_happened(faulted):
    """One line a process, naming the signal, the lost process, the unreadable checkpoint or
    the object storage did not serve; never JAX's abort for a lost process 1."""
    launches = {launch.name: launch for launch in faulted.launches}
    stopped = [log.strip().splitlines()[-1] for log in launches["sigterm"].logs]
    saved = {re.search(r"after saving step (\d+)", line).group(1) for line in stopped}
    assert len(saved) == 1 and all(line.startswith("stopped by SIGTERM") for line in stopped)
    for name in ("sigkill", "sigstop"):
        log = launches[name].logs[0]
        assert len(errors(log)) == 1, log[-3000:]
        assert errors(log)[0].startswith("error: process 1 of 2 (") and "left the run" in log
        assert "Rerun the same command on every host" in errors(log)[0]
        assert faulted.waited[name] < HEARTBEAT_S + 20, faulted.waited  # bounded, not JAX's 68 s
        assert "Check failure stack trace" not in log and "Traceback" not in log
    truncated = launches["truncated"].logs[0]
    assert "could not be read" in truncated and ".unreadable" in truncated, truncated[-3000:]
    assert "a newer checkpoint could not be read and was set aside" in errors(truncated)[-1]
    outage = launches["outage"].logs
    assert errors(outage[0])[-1].startswith("error: storage unreachable: faulty://"), outage[0]
    assert "StorageUnavailable" in errors(outage[1])[-1], outage[1][-3000:]
    own = errors(outage[0])[-1].removeprefix("error: ")  # the other process prints it whole
    assert own in errors(outage[1])[-1], (own, errors(outage[1])[-1])


def test_no_fault_costs_more_than_the_steps_since_the_last_checkpoint(faulted):
    """Each launch resumes from the newest complete checkpoint the one before left (the set-aside
    one excepted), and a launch killed during a save never resumes from that save."""
    launches = faulted.launches
    for before, launch in zip(launches, launches[1:]):
        if launch.name == "truncated":  # it sets the newest aside and stops before training
            assert launch.resumed_from == [None, None]
            assert max(launch.checkpoints_after) < max(before.checkpoints_after)
            continue
        expected = max(before.checkpoints_after)
        assert launch.resumed_from == [expected, expected], (launch.name, launch.resumed_from)
    killed = next(launch for launch in launches if launch.name == "kill_during_save")
    died_saving = int(re.findall(r"saving step (\d+), then SIGKILL", killed.logs[0])[-1])
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
