"""Runs a list of training runs in one process of a multi-process run (a test helper, run as a
script by tests/multiprocess_test.py):

    python multiprocess_worker.py SPEC_JSON PROCESS_ID NUM_PROCESSES PORT OUT_DIR

SPEC_JSON holds a list of runs, each ``{"name", "config": "configs/X.py:smoke", "set": {"a.b":
value}, "workdir", "wait_for": path or null, "expect_error": an exception's name or null}``.
With NUM_PROCESSES > 1 the process joins a localhost run as train.py --multihost does
(`bertjax.training.processes.initialize`); its devices come from XLA_FLAGS. Each run is
`trainer.train_and_evaluate`, as in train.py (an error other than the expected one ends the
process as it ends train.py's, the others told). What each process saw is written to
OUT_DIR/process<ID>.json after every run: its summary, whether it raised (the error's type and
message), how often this process trained a tokenizer or built a token store, and the CPU seconds
the run took in this process. Around a run the process writes OUT_DIR/<name>.started and
<name>.done. At the end the processes leave together (`processes.finish`), as train.py's do.

Imported (tests/multiprocess_test.py): how the tier starts these workers and train.py as
processes with N CPU devices each, waits on them, and reads what their runs wrote.
"""

import functools
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _counted(module, name: str, calls: dict) -> None:
    """Counts this process's calls of ``module.name`` in ``calls[name]``."""
    original = getattr(module, name)

    @functools.wraps(original)
    def counting(*args, **kwargs):
        calls[name] += 1
        return original(*args, **kwargs)

    setattr(module, name, counting)


def _config(run: dict):
    from bertjax import trainer

    config = trainer.load_config_file(os.path.join(ROOT, run["config"]))
    for key, value in run.get("set", {}).items():
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


def _plain(value):
    """A JSON value of a summary entry (numpy and jax scalars as floats)."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return float(value)


def main(spec_path, process_id, num_processes, port, out_dir) -> None:
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from bertjax.data.store import configured as store
    from bertjax.data.tokenizer import configured as tokenizer
    from bertjax.training import processes, runtime

    runtime.fewer_gc_passes()  # as every command sets it (bertjax/cli.py parse_flags)
    process_id, num_processes = int(process_id), int(num_processes)
    if num_processes > 1:
        processes.initialize(f"127.0.0.1:{port}", num_processes, process_id, 10, 120)
    from bertjax import trainer

    with open(spec_path) as f:
        runs = json.load(f)
    results = {}
    for run in runs:
        if run.get("wait_for"):
            while not os.path.exists(run["wait_for"]):
                time.sleep(0.2)
        calls = {"train_sentencepiece": 0, "prepare_store": 0}
        counted = {"train_sentencepiece": tokenizer, "prepare_store": store}
        for name, module in counted.items():
            _counted(module, name, calls)
        open(os.path.join(out_dir, f"{run['name']}.started"), "w").close()
        result, start, unexpected = {}, resource.getrusage(resource.RUSAGE_SELF), None
        try:
            summary = trainer.train_and_evaluate(_config(run), run["workdir"])
            result["summary"] = {k: _plain(v) for k, v in summary.items()}
        except Exception as error:  # recorded: the test asserts which runs fail, and how
            result["error"] = [type(error).__name__, str(error)]
            if type(error).__name__ != run.get("expect_error"):
                unexpected = error
        finally:
            for name, module in counted.items():
                setattr(module, name, getattr(module, name).__wrapped__)
        end = resource.getrusage(resource.RUSAGE_SELF)
        cpu = end.ru_utime - start.ru_utime + end.ru_stime - start.ru_stime
        results[run["name"]] = {**result, **calls, "cpu_s": round(cpu, 1)}
        with open(os.path.join(out_dir, f"process{process_id}.json"), "w") as f:
            json.dump(results, f, indent=1)
        if unexpected is not None:  # the others stop too (naming this process), as train.py's
            processes.on_error(unexpected)
            raise unexpected
        open(os.path.join(out_dir, f"{run['name']}.done"), "w").close()
    processes.finish()


# ---- the test's side: starting processes, waiting on them, reading what they wrote ----


def start(command: list, log_path, devices: int):
    """``command`` as a JAX process with ``devices`` CPU devices, its output in ``log_path`` (a
    file: a pipe nobody reads would block the process)."""
    import warm_python
    from helpers import child_env, xla_flags

    env = dict(child_env(), XLA_FLAGS=xla_flags(devices))
    return warm_python.popen(command, cwd=ROOT, env=env, stdout=str(log_path))


def start_worker(runs: list, out, process_id: int, processes: int, port: int, devices: int):
    """This script as process ``process_id`` of ``processes`` on ``runs``, writing into ``out``."""
    spec = out / "spec.json"
    spec.write_text(json.dumps(runs))
    command = [sys.executable, __file__, spec, process_id, processes, port, out]
    return start([str(c) for c in command], out / f"process{process_id}.log", devices)


def start_train_py(recipe: str, settings: dict, workdir: str, logs, extra=(), each=None) -> list:
    """train.py --multihost as 2 processes x 4 devices on ``recipe`` with ``settings`` (config
    keys); ``extra`` flags for both, ``each`` ({process: flags}) for one. Logs: ``logs``0.log,
    ``logs``1.log."""
    from helpers import free_port

    port = free_port()
    flags = [f"--config.{k}={v}" for k, v in settings.items()]
    procs = []
    for i in range(2):
        command = [
            sys.executable, os.path.join(ROOT, "train.py"), f"--config={recipe}",
            f"--workdir={workdir}", "--multihost", f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2", f"--process_id={i}", *flags, *extra, *(each or {}).get(i, []),
        ]  # fmt: skip
        procs.append(start(command, f"{logs}{i}.log", 4))
    return procs


def wait(predicate, procs, what: str, timeout: float = 600) -> None:
    """Until ``predicate()``; fails when a process exits first or after ``timeout`` s."""
    deadline = time.time() + timeout
    while not predicate():
        running = all(p.poll() is None for p in procs)
        assert running and time.time() < deadline, f"{what}: processes exited or timed out"
        time.sleep(0.2)


def _gcs():
    """gcsfs, its listings cache dropped: other processes write the bucket meanwhile."""
    import fsspec

    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    return fs


def steps_logged(workdir: str) -> list[int]:
    """The steps in a gs:// workdir's metrics.jsonl so far ([0] before the first)."""
    fs, path = _gcs(), f"{workdir}/metrics.jsonl"
    if not fs.exists(path):
        return [0]
    return [json.loads(line)["step"] for line in fs.cat(path).decode().splitlines()] or [0]


def checkpoints(workdir: str) -> list[int]:
    """The complete checkpoint steps in a gs:// workdir (orbax's commit marker written)."""
    done = _gcs().glob(f"{workdir}/checkpoints/*/state/commit_success.txt")
    return sorted(int(path.split("/")[-3]) for path in done) or [0]


def metrics(workdir) -> list[dict]:
    """metrics.jsonl's rows, perf/* left out (timings)."""
    from bertjax import paths

    lines = paths.read_text(f"{workdir}/metrics.jsonl").splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def by_step(workdir) -> dict:
    """The logged numbers of each step (a rerun logs again from its checkpoint: the last wins)."""
    merged = {}
    for row in metrics(workdir):
        merged.setdefault(row["step"], {}).update(row)
    return merged


if __name__ == "__main__":
    main(*sys.argv[1:6])
