"""Ctrl-C and SIGTERM in every phase of a one-process run (bertjax/training/stopping.py), on a
real process: a main thread busy in native code, a read that never returns, a second signal, and
a library caller whose process must survive. train.py's own runs are in trainer_test.py (SIGTERM
in the loop) and faults_test.py; Ctrl-C during the default job's tokenizer training is here."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, child_env

SCRIPT = r"""
import concurrent.futures, hashlib, sys, threading, time
from bertjax.training import stopping

scenario = sys.argv[1]
def native(seconds):  # C code that holds the main thread (no bytecode runs inside)
    n = max(1, int(ROUNDS * seconds))
    hashlib.pbkdf2_hmac("sha256", b"x", b"y", n)
start = time.perf_counter(); hashlib.pbkdf2_hmac("sha256", b"x", b"y", 200_000)
ROUNDS = 200_000 / (time.perf_counter() - start)
if scenario != "library":
    stopping.command_mode()
if scenario == "multihost":  # one process of a jax.distributed run: JAX's notifier owns SIGTERM
    from bertjax.training import processes
    processes.initialize(f"127.0.0.1:{sys.argv[2]}", 1, 0)
stop = stopping.StopRequests()
print("ready", flush=True)
if scenario == "native":  # nothing trained: the watcher ends the process
    native(60)
elif scenario == "unsaved":  # a trained state: wait for the main thread, which saves
    stop.unsaved = lambda: True
    try:
        native(5)
        with stop.interruptible():
            time.sleep(60)
    except stopping.Interrupted as interrupted:
        print("saved after", interrupted, flush=True)
elif scenario == "second":  # a hung read, then a slow save that a second signal cuts short
    try:
        with stop.interruptible():
            concurrent.futures.Future().result()
    except stopping.Interrupted:
        stop.unsaved = lambda: True
        print("saving", flush=True)
        native(60)
elif scenario == "library":  # no exit: a flag, Interrupted outside a step, KeyboardInterrupt
    deadline = time.time() + 30
    while not stop.reached(0) and time.time() < deadline:
        time.sleep(0.01)
    print("flag", stop.received, flush=True)
    try:
        with stop.interruptible():
            pass
    except stopping.Interrupted as interrupted:
        print("interrupted", interrupted, flush=True)
    try:
        print("waiting", flush=True)
        time.sleep(30)
    except KeyboardInterrupt:
        print("keyboard interrupt", flush=True)
    stop.restore()
elif scenario == "multihost":  # the first Ctrl-C goes to the sync point, a second leaves
    stop.training, step = True, 0
    while not stop.reached(step):
        step += 1
        time.sleep(0.01)
    print("sync point", flush=True)
    time.sleep(60)  # a save that takes long
print("end", flush=True)
"""


def _start(scenario: str, *args: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, scenario, *args], cwd=ROOT, env=child_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout.readline() == "ready\n", process.stderr.read()
    return process


def _signal_and_time(process, signum, then=None) -> float:
    """Sends ``signum`` (and ``then`` once the process printed its next line); seconds from
    the first signal to the process's exit."""
    sent = time.monotonic()
    process.send_signal(signum)
    if then is not None:
        process.stdout.readline()
        process.send_signal(then)
    process.wait(timeout=60)
    return time.monotonic() - sent


def test_a_signal_while_native_code_runs_ends_the_process_after_a_grace():
    """The main thread is inside one long C call (as in SentencePiece training or an XLA
    compile) and nothing is trained: the watcher thread ends the process with 130 (SIGINT)
    after `GRACE_S`, long before the call would return."""
    from bertjax.training.stopping import GRACE_S

    process = _start("native")
    time.sleep(1.0)  # inside the C call: a signal before it is a Python-level stop request
    elapsed = _signal_and_time(process, signal.SIGINT)
    assert process.returncode == 128 + signal.SIGINT
    assert GRACE_S - 0.5 < elapsed < GRACE_S + 10, elapsed
    err = process.stderr.read().strip().splitlines()
    assert err[-1].startswith("stopped by SIGINT while the main thread was busy in native code")
    assert "(exit status 130)" in err[-1]


def test_with_a_trained_state_the_main_thread_saves_before_leaving():
    """A trained state is unsaved: the watcher waits for the C call to return, and the signal
    then raises Interrupted where the code can save (the process ends its own way)."""
    from bertjax.training.stopping import GRACE_S

    process = _start("unsaved")
    elapsed = _signal_and_time(process, signal.SIGTERM)
    out = process.stdout.read()
    assert process.returncode == 0, process.stderr.read()
    assert "saved after SIGTERM" in out and "end" in out
    assert elapsed > GRACE_S, elapsed  # it outlived the grace: the 5-second call returned


def test_a_hung_read_is_interrupted_and_a_second_signal_leaves_at_once():
    """A read that never returns (a future waited on) is interrupted by the first Ctrl-C; while
    the run saves (a long C call), a second Ctrl-C ends the process at once."""
    process = _start("second")
    elapsed = _signal_and_time(process, signal.SIGINT, then=signal.SIGINT)
    assert process.returncode == 128 + signal.SIGINT
    assert elapsed < 10, elapsed
    assert (
        process.stderr.read()
        .strip()
        .splitlines()[-1]
        .startswith("stopped by SIGINT (a second signal)")
    )


def test_a_library_caller_keeps_its_process():
    """Outside train.py (a notebook, the GLUE harness) nothing exits: the first signal sets the
    flag a step reads (and raises Interrupted on entering an interruptible region), the second
    raises KeyboardInterrupt."""
    process = _start("library")
    process.send_signal(signal.SIGTERM)
    assert process.stdout.readline() == f"flag {int(signal.SIGTERM)}\n"
    assert process.stdout.readline() == "interrupted SIGTERM\n"
    assert process.stdout.readline() == "waiting\n"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert out.splitlines() == ["keyboard interrupt", "end"]


def test_under_multihost_a_second_ctrl_c_leaves_without_jax_s_abort():
    """In a jax.distributed run the first Ctrl-C goes through JAX's preemption sync point (every
    process stops at one step); a second, while the stop is saving, leaves at once with 130 and
    one line, not with JAX's C++ abort at interpreter exit (the coordination client's threads)."""
    from helpers import free_port

    process = _start("multihost", str(free_port()))
    elapsed = _signal_and_time(process, signal.SIGINT, then=signal.SIGINT)
    err = process.stderr.read()
    assert process.returncode == 128 + signal.SIGINT, err[-3000:]
    assert elapsed < 20, elapsed
    assert err.strip().splitlines()[-1].startswith("stopped by SIGINT (a second signal)")
    assert "Check failure" not in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_during_the_default_job_s_tokenizer_training(tmp_path):
    """`python train.py` (the default job): Ctrl-C once SentencePiece is training ends the
    process within 10 s with status 130 and one line, and leaves no tokenizer that a rerun would
    trust (only the training's own temporary directory, in the cache of trained tokenizers)."""
    workdir, cache = str(tmp_path / "default"), str(tmp_path / "cache")  # an empty cache
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py"), f"--workdir={workdir}"],
        cwd=ROOT, env=dict(child_env(), BERTJAX_CACHE_DIR=cache), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not glob.glob(f"{cache}/tokenizers/trained-*.tmp-*") and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.0)  # inside the training (its sentences are read in the first ~0.5 s)
    elapsed = _signal_and_time(process, signal.SIGINT)
    err = process.stderr.read()
    assert process.returncode == 128 + signal.SIGINT, err[-2000:]
    assert elapsed < 10, elapsed
    assert err.strip().splitlines()[-1].startswith("stopped by SIGINT")
    assert not os.path.exists(f"{workdir}/tokenizer/spm.model")
    assert not glob.glob(f"{cache}/tokenizers/trained-*/spm.model")


def test_a_stop_waits_on_a_hung_write_only_as_long_as_its_bound(caplog):
    """`stopping.bounded`, the stop path's metric writes and the save after an outage: a call
    that never returns (a write storage does not answer) is left behind after its bound; an
    error is raised, or logged when the caller goes on regardless."""
    import threading

    from bertjax.training import stopping

    never = threading.Event()
    started = time.monotonic()
    assert stopping.bounded(never.wait, 0.5, "writing the metrics of step 7") is None
    assert time.monotonic() - started < 5
    assert "writing the metrics of step 7 did not end within 0.5 s" in caplog.text
    assert stopping.bounded(lambda: 3, 5, "a quick call") == 3

    def fail():
        raise OSError("503 Service Unavailable")

    with pytest.raises(OSError, match="503"):
        stopping.bounded(fail, 5, "a write")
    assert stopping.bounded(fail, 5, "a write", raises=False) is None
    assert "a write failed: OSError: 503 Service Unavailable" in caplog.text
    never.set()
