"""Restarts in seconds: how long a restarted train.py takes to its first step, with JAX's
persistent compilation cache (bertjax/training/compile_cache.py, on by default) and without it
(``--config.compile_cache=off``), and where the time goes.

A run of the recipe is started, trained to its first logged step and stopped with SIGTERM (a
preemption: it saves, exit 143); then it is restarted ``--restarts`` times, alternating with and
without the cache, each restart stopped the same way once it has logged a step. A restart's time
is from the process's start to its first step in metrics.jsonl (log_every=1); the compile
seconds are JAX's own (its backend_compile_duration events, summed by the child and printed).

    python benchmarks/faults/restart_seconds.py [--config=configs/bert_base.py:smoke] [--restarts=6]
        [--extra="--config.peak_flops_per_device=1e12"]   # more train.py flags
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# train.py with JAX's compile time summed and printed at exit (the child's own events)
CHILD = (
    "import atexit, runpy, sys, jax\n"
    "total = [0.0, 0]\n"
    "def listen(event, duration, **kwargs):\n"
    "    if event.endswith('backend_compile_duration'):\n"
    "        total[0] += duration; total[1] += 1\n"
    "jax.monitoring.register_event_duration_secs_listener(listen)\n"
    "import os\n"
    "exit_ = os._exit\n"
    "def _exit(status):\n"
    "    print(f'compiled {total[1]} programs in {total[0]:.2f} s', flush=True)\n"
    "    exit_(status)\n"
    "os._exit = _exit\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def _lines(path: str) -> int:
    return sum(1 for line in open(path) if line.endswith("\n")) if os.path.exists(path) else 0


def command(config: str, workdir: str, extra: list[str]) -> list[str]:
    """The launch's command line: train.py, long enough never to finish, a step logged each."""
    return [sys.executable, "-c", CHILD, os.path.join(ROOT, "train.py"), f"--config={config}",
               f"--workdir={workdir}", "--config.num_train_steps=100000",
               "--config.phases.seq128.steps=100000", "--config.log_every=1",
               "--config.checkpoint_every=0", "--config.eval_every=0", "--config.budget_flops=0",
               *extra]  # fmt: skip


def launch(config: str, workdir: str, extra: list[str], timeout: float = 600) -> dict:
    """train.py until its first new logged step, then SIGTERM; seconds to that step, compile
    seconds, exit status."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    before = _lines(metrics)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("BERTJAX_COMPILE_CACHE", None)  # the workdir's own cache, train.py's default
    start = time.monotonic()
    proc = subprocess.Popen(command(config, workdir, extra), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    while _lines(metrics) <= before:
        if proc.poll() is not None or time.monotonic() - start > timeout:
            proc.kill()
            raise RuntimeError(f"no step logged:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.02)
    first = time.monotonic() - start
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    compiled = [line for line in out.splitlines() if line.startswith("compiled ")]
    programs, seconds = (compiled[-1].split()[1], compiled[-1].split()[-2]) if compiled else (0, 0)
    return {"first_step_s": first, "compile_s": float(seconds), "programs": int(programs),
            "status": proc.returncode}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "bert_base.py:smoke"))
    parser.add_argument("--restarts", type=int, default=6)
    parser.add_argument("--extra", default="", help="more train.py flags, space-separated")
    parser.add_argument("--dry_run", action="store_true", help="print the launches' flags only")
    args = parser.parse_args(argv)
    more = args.extra.split()
    if args.dry_run:
        for i in range(args.restarts + 1):
            off = ["--config.compile_cache=off"] if i and i % 2 == 0 else []
            flags = command(args.config, "WORKDIR", [*more, *off])[4:]
            print(f"{'first' if not i else f'restart {i}'}: train.py {' '.join(flags)}")
        return
    workdir = tempfile.mkdtemp(prefix="restart_seconds_")
    first = launch(args.config, workdir, more)
    print(f"first launch (compiles, fills the cache): {first}")
    rows = {"cache": [], "off": []}
    for i in range(args.restarts):
        kind = "cache" if i % 2 == 0 else "off"
        extra = more if kind == "cache" else [*more, "--config.compile_cache=off"]
        result = launch(args.config, workdir, extra)
        rows[kind].append(result)
        print(f"restart {i + 1} ({kind}): {json.dumps(result)}", flush=True)
    for kind, results in rows.items():
        firsts = [r["first_step_s"] for r in results]
        compiles = [r["compile_s"] for r in results]
        print(f"{kind}: first step median {statistics.median(firsts):.2f} s "
              f"({min(firsts):.2f}-{max(firsts):.2f}), compile median "
              f"{statistics.median(compiles):.2f} s")  # fmt: skip
    with_cache = statistics.median(r["first_step_s"] for r in rows["cache"])
    without = statistics.median(r["first_step_s"] for r in rows["off"])
    print(f"restart to first step: {without:.2f} s without the cache, {with_cache:.2f} s with it "
          f"({without / with_cache:.1f}x); workdir {workdir}")  # fmt: skip


if __name__ == "__main__":
    main()
