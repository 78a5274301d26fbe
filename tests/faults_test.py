"""The fault-injection tier: a two-phase pretraining run (configs/phases_tiny.py, shrunk) of 2
real train.py processes reading a sharded store through storage that fails, restarted by a
supervisor (`_Supervisor`: by exit status, as a Kubernetes Job with README's pod failure policy
would) after each fault, until it finishes. Its final parameters equal an uninterrupted run's
bit for bit, every logged number equals that run's, and no fault costs more than the steps since
the last complete checkpoint (each launch resumes from the newest one the fault left).

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

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers import QUIET_RUN, ROOT, child_env, free_port

pytestmark = pytest.mark.slow

RUNNER = os.path.join(ROOT, "tests", "fault_runner.py")
RECIPE = os.path.join(ROOT, "configs", "phases_tiny.py")
PHASE_STEPS = 8  # each of the two phases
STEPS = 2 * PHASE_STEPS
HEARTBEAT_S = 5  # the processes' heartbeat timeout (train.py's default: 30 s)
BUDGET_S = 2  # config.storage_retry_seconds: an outage past it stops the run
TRANSIENT = {"every": 15}  # every 15th request of a process fails (503)
SETTINGS = [
    "--config.phase_order=('pretrain', 'extend')",
    f"--config.phases.pretrain.steps={PHASE_STEPS}",
    f"--config.phases.extend.steps={PHASE_STEPS}",
    "--config.batch_size=8",
    "--config.batch_warmup.tokens=0",
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=48",
    "--config.checkpoint_every=2",
    "--config.log_every=1",
    "--config.eval_every=0",
    f"--config.storage_retry_seconds={BUDGET_S}",
    f"--heartbeat_timeout_seconds={HEARTBEAT_S}",
    *QUIET_RUN,
]


@pytest.fixture(scope="module")
def store(tmp_path_factory, small_spm) -> str:
    """A sharded store of 240 built-in documents on local disk (small shards: many objects)."""
    from bertjax import trainer
    from bertjax.data.store import beam_prepare, shard_writer
    from bertjax.data.text import corpus

    root = tmp_path_factory.mktemp("fault_store")
    docs = [doc for _, (_, doc) in zip(range(240), corpus.iter_documents("builtin"))]
    (root / "corpus.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    config = trainer.default_run_config()
    config.data.corpus, config.data.tokenizer_model = str(root / "corpus.txt"), small_spm
    config.data.heldout_fraction = 0.1
    config.data.shard_bytes, config.data.block_tokens = 16 << 10, 256
    url = str(root / "store")
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, url, items)
    tokenizer = shard_writer.local_tokenizer(spec)
    shard_writer.write_manifest(
        [shard_writer.prepare_item(spec, i, tokenizer) for i in items], spec
    )
    return url


@dataclasses.dataclass
class Launch:
    """One start of the job: what each process got, what it printed, how it ended."""

    name: str
    statuses: list
    logs: list
    resumed_from: list  # the step each process resumed from (None: a fresh start)
    checkpoints_after: list  # the complete checkpoints when it ended


class _Supervisor:
    """Starts the 2 processes of the job on ``workdir``, faults chosen per launch, and keeps
    what each launch did."""

    def __init__(self, workdir, store: str, logs):
        self.workdir, self.store, self.logs = str(workdir), store, logs
        self.launches: list[Launch] = []
        self.waited: dict[str, float] = {}  # seconds from a fault to process 0's exit

    def start(self, name: str, faults=({}, {}), kill_during_save=(None, None)) -> list:
        port = free_port()
        procs = []
        for i in range(2):
            env = dict(child_env(), BERTJAX_HUGEPAGE_MALLOC="0")
            env["BERTJAX_FAULTS"] = json.dumps(faults[i])
            if kill_during_save[i] is not None:
                env["BERTJAX_KILL_DURING_SAVE"] = str(kill_during_save[i])
            command = [
                sys.executable, RUNNER, os.path.join(ROOT, "train.py"), f"--config={RECIPE}:smoke",
                f"--workdir={self.workdir}", f"--config.data.store=faulty://{self.store}",
                "--multihost", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                f"--process_id={i}", *SETTINGS,
            ]  # fmt: skip
            log = open(self.logs / f"{name}{i}.log", "w")
            procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))  # fmt: skip
        return procs

    def finish(self, name: str, procs: list, timeout: float = 300) -> Launch:
        """Waits for both processes (killing what is left after ``timeout``); records them."""
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        logs = [(self.logs / f"{name}{i}.log").read_text() for i in range(2)]
        resumed = [_resumed_from(log) for log in logs]
        launch = Launch(name, [p.returncode for p in procs], logs, resumed, self.checkpoints())
        self.launches.append(launch)
        return launch

    def run(self, name: str, **faults) -> Launch:
        return self.finish(name, self.start(name, **faults))

    def steps_logged(self) -> list[int]:
        """The steps in metrics.jsonl, in the order logged (a launch logs after the last)."""
        path = os.path.join(self.workdir, "metrics.jsonl")
        if not os.path.exists(path):
            return []
        return [json.loads(line)["step"] for line in open(path) if line.endswith("\n")]

    def wait_for_step(self, procs: list, timeout: float = 300) -> int:
        """Until this launch (started with ``procs``) logs a step past the checkpoint it
        resumed from; that step."""
        before, after = len(self.steps_logged()), max(self.checkpoints() or [0])
        deadline = time.monotonic() + timeout
        while not [s for s in self.steps_logged()[before:] if s > after]:
            running = all(p.poll() is None for p in procs)
            assert running and time.monotonic() < deadline, "the job ended or timed out"
            time.sleep(0.1)
        return self.steps_logged()[-1]

    def checkpoints(self) -> list[int]:
        directory = os.path.join(self.workdir, "checkpoints")
        names = os.listdir(directory) if os.path.isdir(directory) else []
        done = [n for n in names if os.path.exists(f"{directory}/{n}/_CHECKPOINT_METADATA")]
        return sorted(int(n) for n in done if n.isdigit())


def _resumed_from(log: str):
    """The step a launch resumed from (a later phase's start resumes too: the first line)."""
    found = re.findall(r"resumed from step (\d+) in ", log)
    return int(found[0]) if found else None


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("error:")]


def _params(workdir, step):
    import orbax.checkpoint as ocp

    path = os.path.join(str(workdir), "checkpoints", str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    meta = checkpointer.metadata(path).item_metadata.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    return checkpointer.restore(path, restore_args=as_numpy)["params"]


def _by_step(workdir) -> dict:
    """metrics.jsonl's numbers by step, perf/* left out (a rerun logs a step again: last wins)."""
    merged = {}
    for line in open(os.path.join(str(workdir), "metrics.jsonl")):
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(
            {k: v for k, v in row.items() if not k.startswith("perf/")}
        )
    return merged


@pytest.fixture(scope="module")
def reference(tmp_path_factory, store):
    """The same job, uninterrupted and without faults."""
    base = tmp_path_factory.mktemp("fault_reference")
    job = _Supervisor(base / "workdir", store, base)
    launch = job.run("reference")
    assert launch.statuses == [0, 0], "\n".join(log[-3000:] for log in launch.logs)
    return job


@pytest.fixture(scope="module")
def faulted(tmp_path_factory, store) -> _Supervisor:
    """The job through the module docstring's seven launches."""
    base = tmp_path_factory.mktemp("faulted")
    job = _Supervisor(base / "workdir", store, base)
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
        assert len(_errors(log)) == 1, log[-3000:]
        assert _errors(log)[0].startswith("error: process 1 of 2 (") and "left the run" in log
        assert "Rerun the same command on every host" in _errors(log)[0]
        assert faulted.waited[name] < HEARTBEAT_S + 20, faulted.waited  # bounded, not JAX's 68 s
        assert "Check failure stack trace" not in log and "Traceback" not in log
    truncated = launches["truncated"].logs[0]
    assert "could not be read" in truncated and ".unreadable" in truncated, truncated[-3000:]
    assert "a newer checkpoint could not be read and was set aside" in _errors(truncated)[-1]
    outage = launches["outage"].logs
    assert _errors(outage[0])[-1].startswith("error: storage unreachable: faulty://"), outage[0]
    assert "StorageUnavailable" in _errors(outage[1])[-1], outage[1][-3000:]


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
    ours, theirs = _params(faulted.workdir, STEPS), _params(reference.workdir, STEPS)
    assert len(jax.tree.leaves(ours)) > 10
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    assert _by_step(faulted.workdir) == _by_step(reference.workdir)
