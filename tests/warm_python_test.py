"""tests/warm_python.py runs a command in a forked child of a warm server as the interpreter runs
it: the same exit status, output, argv, working directory, environment and sys.path, and a
traceback for an uncaught exception."""

import os
import sys

import warm_python

SCRIPT = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0],
                  "env": os.environ.get("WARM_TEST"), "main": __name__}))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("from the script")
sys.exit(int(sys.argv[1]))
"""


def test_a_warm_child_ends_as_a_fresh_interpreter_would(tmp_path, monkeypatch):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, WARM_TEST="yes")
    monkeypatch.setattr(warm_python, "_SEEN", set())
    runs = {}
    for mode in ("cold", "warm", "warm again"):
        monkeypatch.setenv("BERTJAX_TEST_WARM", "0" if mode == "cold" else "1")
        if mode == "warm":  # the first use of an environment runs cold; its second, warm
            assert warm_python._import_env(env) in warm_python._SEEN
        runs[mode] = [
            warm_python.run([sys.executable, str(script), arg], cwd=str(cwd), env=env)
            for arg in ("3", "raise")
        ] + [warm_python.run([sys.executable, "-c", SCRIPT, "4"], cwd=str(cwd), env=env)]
    assert any(server.process.poll() is None for server in warm_python._SERVERS.values())
    for mode in ("warm", "warm again"):
        for ours, cold in zip(runs[mode], runs["cold"]):
            assert (ours.returncode, ours.stdout) == (cold.returncode, cold.stdout)
            assert ours.stderr.splitlines()[0] == cold.stderr.splitlines()[0] == "to stderr"
            assert ours.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]
    exited, raised, code = runs["warm"]
    assert code.returncode == 4 and '"argv": ["4"]' in code.stdout and '"path0": ""' in code.stdout
    assert exited.returncode == 3 and raised.returncode == 1
    assert '"argv": ["3"]' in exited.stdout and f'"cwd": "{cwd}"' in exited.stdout
    assert f'"path0": "{tmp_path}"' in exited.stdout and '"env": "yes"' in exited.stdout
    assert '"main": "__main__"' in exited.stdout
    assert "Traceback (most recent call last)" in raised.stderr
    assert raised.stderr.splitlines()[-1] == "ValueError: from the script"


def test_a_process_its_test_left_running_is_killed_when_the_test_ends(tmp_path):
    """conftest's fixture (each test's and each module's): a process started with `popen`
    during it and still running at its end is killed; one that ended is left as it was."""
    import signal

    import conftest
    import pytest

    fixture = conftest._kill_what_was_left()
    next(fixture)  # the test starts
    command = [sys.executable, "-c", "import sys, time; time.sleep(int(sys.argv[1]))"]
    env = dict(os.environ)
    left = warm_python.popen([*command, "600"], cwd=str(tmp_path), env=env, stdout=f"{tmp_path}/a")
    ended = warm_python.popen([*command, "0"], cwd=str(tmp_path), env=env, stdout=f"{tmp_path}/b")
    assert ended.wait(timeout=60) == 0
    with pytest.raises(StopIteration):
        next(fixture)  # the test ends
    assert left.poll() == -signal.SIGKILL and ended.returncode == 0
