"""The fault tier's job (tests/faults_test.py, benchmarks/faults/fault_soak.py): a two-phase
pretraining run (configs/phases_tiny.py, shrunk) of `PROCESSES` real train.py processes
(tests/fault_runner.py) over a sharded store read through ``faulty://`` storage
(tests/faulty_fs.py), started again by a `Supervisor` after each fault, and what each launch did.
A launch's data is read one batch a round, two batches ahead, by one prefetch thread, in the
computing thread (read_steps, prefetch, prefetch_threads, read_threads), so that a fault keyed
by batch (faulty_fs counts batches in the order their computing begins: with several prefetch
threads, two batches begun together could take either number) meets every process at one
step."""

import dataclasses
import json
import os
import re
import sys
import time

import jax
import numpy as np
import warm_python
from helpers import QUIET_RUN, ROOT, child_env, free_port

RUNNER = os.path.join(ROOT, "tests", "fault_runner.py")
RECIPE = os.path.join(ROOT, "configs", "phases_tiny.py")
PROCESSES = 3  # a pod has 4 or more hosts: a lost one leaves several survivors
ROWS = 4  # each process's rows of a batch
HEARTBEAT_S = 5  # the processes' heartbeat timeout (train.py's default: 30 s)
BUDGET_S = 2  # config.storage_retry_seconds: an outage past it stops the run
TRANSIENT = {"every": 15}  # every 15th request of a process fails (503)


def settings(phase_steps: int, checkpoint_every: int = 2, processes: int = PROCESSES) -> list[str]:
    """train.py's flags for the job: two phases of ``phase_steps`` steps each."""
    return [
        "--config.phase_order=('pretrain', 'extend')",
        f"--config.phases.pretrain.steps={phase_steps}",
        f"--config.phases.extend.steps={phase_steps}",
        f"--config.batch_size={ROWS * processes}",
        f"--config.phases.extend.set.batch_size={ROWS * processes}",
        "--config.batch_warmup.tokens=0",
        "--config.model.hidden_size=32",
        "--config.model.intermediate_size=48",
        f"--config.checkpoint_every={checkpoint_every}",
        "--config.log_every=1",
        "--config.eval_every=0",
        f"--config.storage_retry_seconds={BUDGET_S}",
        f"--heartbeat_timeout_seconds={HEARTBEAT_S}",
        *QUIET_RUN,
        "--config.data.prefetch=2",
        "--config.data.read_steps=1",
        "--config.data.prefetch_threads=1",
        "--config.data.read_threads=1",
    ]


def write_store(corpus: str, spm: str, url: str) -> str:
    """A sharded store of ``corpus`` at ``url`` (small shards: many objects), written by the
    units python -m bertjax.data.prepare runs on Beam (shard_writer, here without an engine),
    tokenized with ``spm``; its URL."""
    from bertjax import trainer
    from bertjax.data.store import beam_prepare, shard_writer

    config = trainer.default_run_config()
    config.data.corpus, config.data.tokenizer_model = corpus, spm
    config.data.heldout_fraction = 0.1
    config.data.shard_bytes, config.data.block_tokens = 16 << 10, 256
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, url, items)
    tokenizer = shard_writer.local_tokenizer(spec)
    shard_writer.write_manifest(
        [shard_writer.prepare_item(spec, i, tokenizer) for i in items], spec
    )
    return url


def build_store(root, spm: str) -> str:
    """`write_store` of 240 built-in documents under ``root`` (a pathlib directory)."""
    from bertjax.data.text import corpus

    docs = [doc for _, (_, doc) in zip(range(240), corpus.iter_documents("builtin"))]
    (root / "corpus.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    return write_store(str(root / "corpus.txt"), spm, str(root / "store"))


@dataclasses.dataclass
class Launch:
    """One start of the job: what each process got, what it printed, how it ended."""

    name: str
    statuses: list
    logs: list
    resumed_from: list  # the step each process resumed from (None: a fresh start)
    checkpoints_after: list  # the complete checkpoints when it ended
    wall_s: float = 0.0  # from its start to its end


class Supervisor:
    """Starts the processes of the job on ``workdir``, faults chosen per launch, and keeps what
    each launch did."""

    def __init__(self, workdir, store: str, logs, settings: list[str], processes: int = PROCESSES):
        self.workdir, self.store, self.logs = str(workdir), store, logs
        self.settings, self.processes = settings, processes
        self.launches: list[Launch] = []
        self.waited: dict[str, float] = {}  # seconds from a fault to the survivors' exits
        self.started: dict[str, float] = {}

    def start(self, name: str, faults=None, kill_during_save=None, extra=()) -> list:
        """The processes of one launch: ``faults``, a faulty_fs plan a process;
        ``kill_during_save``, a step a process (None: not killed); ``extra``, more flags."""
        faults = faults or [{}] * self.processes
        kill_during_save = kill_during_save or [None] * self.processes
        port = free_port()
        procs = []
        for i in range(self.processes):
            env = dict(child_env(), BERTJAX_HUGEPAGE_MALLOC="0")
            env["BERTJAX_FAULTS"] = json.dumps(faults[i])
            if kill_during_save[i] is not None:
                env["BERTJAX_KILL_DURING_SAVE"] = str(kill_during_save[i])
            command = [
                sys.executable, RUNNER, os.path.join(ROOT, "train.py"), f"--config={RECIPE}:smoke",
                f"--workdir={self.workdir}", f"--config.data.store=faulty://{self.store}",
                "--multihost", f"--coordinator_address=127.0.0.1:{port}",
                f"--num_processes={self.processes}", f"--process_id={i}", *self.settings, *extra,
            ]  # fmt: skip
            log = str(self.logs / f"{name}{i}.log")  # output and errors
            procs.append(warm_python.popen(command, cwd=ROOT, env=env, stdout=log))
        self.started[name] = time.monotonic()
        return procs

    def finish(self, name: str, procs: list, timeout: float = 300) -> Launch:
        """Waits for every process (killing what is left after ``timeout``); records them."""
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            warm_python.kill_running(procs)
        logs = [(self.logs / f"{name}{i}.log").read_text() for i in range(len(procs))]
        resumed = [resumed_from(log) for log in logs]
        wall = time.monotonic() - self.started.get(name, time.monotonic())
        statuses = [p.returncode for p in procs]
        launch = Launch(name, statuses, logs, resumed, self.checkpoints(), wall)
        self.launches.append(launch)
        return launch

    def log(self, name: str, i: int) -> str:
        path = self.logs / f"{name}{i}.log"
        return path.read_text() if path.exists() else ""

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


def resumed_from(log: str):
    """The step a launch resumed from (a later phase's start resumes too: the first line)."""
    found = re.findall(r"resumed from step (\d+) in ", log)
    return int(found[0]) if found else None


def errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("error:")]


def params(workdir, step):
    import orbax.checkpoint as ocp

    path = os.path.join(str(workdir), "checkpoints", str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    meta = checkpointer.metadata(path).item_metadata.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    return checkpointer.restore(path, restore_args=as_numpy)["params"]


def by_step(workdir) -> dict:
    """metrics.jsonl's numbers by step, perf/* and storage/* left out (timings, the faults' own
    counts; a rerun logs a step again: last wins)."""
    merged = {}
    for line in open(os.path.join(str(workdir), "metrics.jsonl")):
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(
            {k: v for k, v in row.items() if not k.startswith(("perf/", "storage/"))}
        )
    return merged


def storage_counts(workdir) -> tuple[int, int]:
    """The failed and the recovered storage requests metrics.jsonl counts, every row summed."""
    rows = [json.loads(line) for line in open(os.path.join(str(workdir), "metrics.jsonl"))]
    return tuple(sum(r.get(f"storage/{k}_requests", 0) for r in rows)
                 for k in ("failed", "recovered"))  # fmt: skip
