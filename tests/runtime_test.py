"""bertjax.runtime: the restart with glibc malloc on transparent huge pages."""
import subprocess
import sys

from bertjax import runtime

PROBE = ("import os, sys; from bertjax.runtime import reexec_with_hugepage_malloc; "
         "print('start', flush=True); reexec_with_hugepage_malloc(); "
         "print(os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:])")


def test_environment_adds_the_tunable_once_and_respects_the_user(monkeypatch):
    monkeypatch.setattr(runtime, "hugepage_malloc_supported", lambda: True)
    assert runtime.hugepage_malloc_environment({"A": "1"}) == {
        "A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    # Other tunables are kept; a user's own hugetlb setting (even 0) and the opt-out win.
    env = runtime.hugepage_malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert runtime.hugepage_malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert runtime.hugepage_malloc_environment({"BERTJAX_HUGEPAGE_MALLOC": "0"}) is None
    monkeypatch.setattr(runtime, "hugepage_malloc_supported", lambda: False)
    assert runtime.hugepage_malloc_environment({}) is None


def test_process_restarts_once_with_the_same_arguments():
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("GLIBC_TUNABLES", "BERTJAX_HUGEPAGE_MALLOC")}
    out = subprocess.run([sys.executable, "-c", PROBE, "--flag=x"], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout.splitlines()
    if runtime.hugepage_malloc_supported():  # this machine: glibc 2.36, THP "madvise"
        assert out == ["start", "start", "glibc.malloc.hugetlb=1 ['--flag=x']"]
    else:
        assert out == ["start", " ['--flag=x']"]
    off = subprocess.run([sys.executable, "-c", PROBE], env={**env, "BERTJAX_HUGEPAGE_MALLOC": "0"},
                         capture_output=True, text=True, check=True, timeout=120).stdout.splitlines()
    assert off == ["start", " []"]
