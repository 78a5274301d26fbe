"""A warm Python for the suite's command runs: one server process per test worker (and per
import-time environment) that has imported jax, flax, optax, orbax and bertjax's training code, and
forks a child for each ``python train.py ...``, ``python -m bertjax.X ...``, ``python FILE.py`` or
``python -c CODE ...`` command instead of starting an interpreter that imports them again (~1.6 s
of CPU each; the docs pages alone run ~50 such commands).

The child is the command: it takes the command's working directory, environment, argv and
``sys.path`` (the script's directory, or the working directory for ``-m`` and ``-c``, then
PYTHONPATH), runs the script, module or code as ``__main__``, and ends as an interpreter ends
(non-daemon threads joined, atexit handlers run, output flushed) with the command's exit status.
Nothing of a backend exists in the server (jax is imported, no device is touched), so the child
creates its own CPU client from its own XLA_FLAGS. What jax reads from the environment at import
(JAX_* variables) is the server's: a command whose import-time environment differs from every
server's gets a server of its own. Another interpreter's command, or ``-m`` of a module outside
bertjax, runs as a subprocess.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

# Variables read when the server's modules are imported: a server serves only commands that
# agree with it on these. XLA_FLAGS is read when the child creates its backend, and bertjax reads
# its BERTJAX_* variables when it runs (a test script's own, when the child imports it): both free
# to differ.
IMPORT_TIME = ("JAX_", "TF_", "HF_", "PYTHON", "TPU_", "CUDA_", "LD_", "GCSFS_")
WARM_MODULES = ("bertjax.trainer",)  # defines no absl flag (train.py and compile.py do)
_SERVERS: dict[tuple, Server] = {}
_SEEN: set[tuple] = set()
MAX_SERVERS = 4  # each holds ~0.4 GB; fewer were evicted and started again within a run


def _import_env(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME)))


def warm(argv: list[str]) -> bool:
    """Whether ``argv`` is a command the warm server runs (a script or ``-m`` module of this
    interpreter)."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] == "-m":
        return len(argv) > 2 and argv[2].split(".")[0] == "bertjax"
    return argv[1] == "-c" or (argv[1].endswith(".py") and not argv[1].startswith("-"))


def run(argv, *, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``,
    in a child of a warm server when ``warm(argv)`` and its import-time environment was seen
    before (a server costs one import: one-off environments run cold)."""
    env = dict(env)
    server = _server(argv, env)
    if server is None:
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    return server.run(list(argv), str(cwd), env, timeout)


def _server(argv, env: dict):
    """The warm server for ``argv`` in ``env`` (None: run it cold)."""
    key = _import_env(env)
    seen = key in _SEEN
    if warm(argv):
        _SEEN.add(key)
    if os.environ.get("BERTJAX_TEST_WARM", "1") == "0" or not warm(argv) or not seen:
        return None
    server = _SERVERS.pop(key, None)
    if server is None or server.process.poll() is not None:
        server = Server(env)
    _SERVERS[key] = server  # the most recently used last
    while len(_SERVERS) > MAX_SERVERS:
        _SERVERS.pop(next(iter(_SERVERS))).close()
    return server


@atexit.register
def _close_all() -> None:
    for server in _SERVERS.values():
        server.close()


class Server:
    """The warm process for one import-time environment (see the module docstring)."""

    def __init__(self, env: dict):
        self.directory = tempfile.mkdtemp(prefix="bertjax-warm-")
        self.address = os.path.join(self.directory, "socket")
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.address],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.directory, "server.log"), "w"),
        )

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _connect(self) -> socket.socket:
        deadline = time.time() + 120
        while True:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                client.connect(self.address)
                return client
            except (FileNotFoundError, ConnectionRefusedError):
                client.close()
                if self.process.poll() is not None or time.time() > deadline:
                    log = open(os.path.join(self.directory, "server.log")).read()
                    raise RuntimeError(f"the warm Python server did not start:\n{log}") from None
                time.sleep(0.05)

    def run(self, argv, cwd, env, timeout) -> subprocess.CompletedProcess:
        out = tempfile.NamedTemporaryFile("w+", dir=self.directory, suffix=".out", delete=False)
        err = tempfile.NamedTemporaryFile("w+", dir=self.directory, suffix=".err", delete=False)
        process = self.start(argv, cwd, env, out.name, err.name)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        stdout, stderr = out.read(), err.read()
        for f in (out, err):
            f.close()
            os.unlink(f.name)
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    def start(self, argv, cwd, env, out: str, err: str | None) -> Process:
        """The command started, its output into the file ``out`` and its error output into
        ``err`` (None: into ``out`` too)."""
        client = self._connect()
        _send(client, dict(argv=argv, cwd=cwd, env=env, out=out, err=err))
        return Process(argv, client, int(_receive(client)["pid"]))


class Process:
    """A command running in a warm child: what a subprocess.Popen gives (pid, poll, wait, kill,
    send_signal, returncode: a signal's death as minus its number)."""

    def __init__(self, args, connection: socket.socket, pid: int):
        self.args, self.pid, self.returncode = args, pid, None
        self._connection = connection

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                self.returncode = int(_receive(self._connection)["status"])
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._connection.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _, _ = select.select([self._connection], [], [], 0)
            if ready:
                self.wait()
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


STARTED: list = []  # every process `popen` started (conftest kills those a test left running)


def popen(argv, *, cwd, env, stdout: str, stderr: str | None = None):
    """``subprocess.Popen(argv, cwd=cwd, env=env, ...)`` with its output into the file
    ``stdout`` (and its error output into ``stderr``, or ``stdout`` too): a warm `Process` when
    ``run`` would run it warm, else the Popen."""
    env = dict(env)
    server = _server(argv, env)
    if server is None:
        out = open(stdout, "w")
        err = open(stderr, "w") if stderr else subprocess.STDOUT
        try:
            process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        finally:
            out.close()
            if stderr:
                err.close()
    else:
        open(stdout, "w").close()
        if stderr:
            open(stderr, "w").close()
        process = server.start(list(argv), str(cwd), env, stdout, stderr)
    STARTED.append(process)
    return process


def kill_running(processes) -> list:
    """Kills (SIGKILL) and reaps those of ``processes`` still running; returns them."""
    running = [p for p in processes if p.poll() is None]
    for p in running:
        p.kill()
    for p in running:
        p.wait()
    return running


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _receive(sock: socket.socket) -> dict:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the warm server closed the connection")
            data += chunk
        return data

    (size,) = struct.unpack("!I", exactly(4))
    return json.loads(exactly(size))


# ---- the server side ----


def _child(request: dict) -> None:
    """Becomes the command (never returns)."""
    import runpy
    import threading
    import traceback

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        fd_in = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd_in, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            if path is None:  # the error output into the output
                os.dup2(1, 2)
                continue
            handle = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(handle, fd)
            os.close(handle)
        argv = request["argv"][1:]
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *extra, *_BASE_PATH]
            code_text = argv[1]

            def main():
                exec(compile(code_text, "<string>", "exec"), {"__name__": "__main__"})

        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *extra, *_BASE_PATH]
            main = lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True)  # noqa: E731
        else:
            script = os.path.abspath(argv[0])
            sys.argv = [argv[0], *argv[1:]]
            sys.path[:] = [os.path.dirname(script), *extra, *_BASE_PATH]
            main = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
        try:
            main()
            code = 0
        except SystemExit as stop:
            if stop.code is None:
                code = 0
            elif isinstance(stop.code, int):
                code = stop.code
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 130
        except BaseException:  # as the interpreter does: the traceback, status 1
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as at an interpreter's end: non-daemon threads joined
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


_BASE_PATH: list[str] = []


def _serve(address: str) -> None:
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    own = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    _BASE_PATH[:] = [p for p in sys.path[1:] if p not in own]
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address + ".tmp")
    os.rename(address + ".tmp", address)
    server.listen(8)
    server.settimeout(2.0)
    parent = os.getppid()
    while os.getppid() == parent:  # ends with the test worker that started it
        while True:  # reap finished monitors
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        connection.settimeout(None)
        if os.fork() == 0:  # the monitor: forks the command, reports its pid and status
            try:
                server.close()
                request = _receive(connection)
                pid = os.fork()
                if pid == 0:
                    connection.close()
                    _child(request)
                _send(connection, {"pid": pid})
                _, status = os.waitpid(pid, 0)
                _send(connection, {"status": os.waitstatus_to_exitcode(status)})
            finally:  # a client gone (a killed test) ends the monitor, never the server's loop
                os._exit(0)
        connection.close()


if __name__ == "__main__":
    _serve(sys.argv[1])
