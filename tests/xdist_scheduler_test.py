"""A worker that crashes fails its test and the run goes on to its end (tests/xdist_scheduler.py);
with pytest-xdist 3.8.0's own loadscope scheduling this run never ends (killed at the timeout)."""

import subprocess
import sys
from pathlib import Path

CRASHING = """
import os
import signal


def test_before():
    pass


def test_crash():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_after():
    pass
"""
TWO = "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n"
CONFTEST = """
def pytest_xdist_make_scheduler(config, log):
    from xdist_scheduler import LoadScopeAfterCrashes

    return LoadScopeAfterCrashes(config, log)
"""


def test_a_crashed_worker_fails_its_test_and_the_run_ends(tmp_path):
    for i in range(6):  # modules the crashing worker finishes before it crashes
        (tmp_path / f"test_m{i}.py").write_text(TWO)
    (tmp_path / "test_crash.py").write_text(CRASHING)
    (tmp_path / "test_z.py").write_text("def test_single():\n    pass\n")  # a one-test module
    (tmp_path / "conftest.py").write_text(CONFTEST)
    env = {"PYTHONPATH": str(Path(__file__).parent), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-n", "2"]
    command += ["--dist", "loadscope", "-o", "addopts=", str(tmp_path)]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 15 passed" in out, out  # test_after and every other module ran, once
    assert "FAILED test_crash.py::test_crash" in out and "crashed while running" in out, out
