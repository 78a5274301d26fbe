"""bertjax.training.runtime: the restart with glibc malloc on transparent huge pages; the garbage
collection every command sets."""

import gc
import os
import subprocess
import sys

from bertjax.training import runtime

PROBE = (
    "import os, sys; from bertjax.training.runtime import reexec_with_hugepage_malloc; "
    "print('start', flush=True); reexec_with_hugepage_malloc(); "
    "print(os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:])"
)


def test_environment_adds_the_tunable_once_and_respects_the_user(monkeypatch):
    monkeypatch.setattr(runtime, "hugepage_malloc_supported", lambda: True)
    monkeypatch.setattr(runtime, "accelerator_present", lambda: False)
    ours = (
        "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
        "glibc.malloc.trim_threshold=34359738368"
    )
    assert runtime.hugepage_malloc_environment({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": ours}
    # Other tunables are kept; a user's own setting of any of ours (even hugetlb=0) and the
    # opt-out win.
    env = runtime.hugepage_malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=9"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=9:" + ours
    assert runtime.hugepage_malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert (
        runtime.hugepage_malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}) is None
    )
    assert runtime.hugepage_malloc_environment({"BERTJAX_HUGEPAGE_MALLOC": "0"}) is None
    # A GPU/TPU host keeps glibc's arenas and trimming: only the huge pages.
    monkeypatch.setattr(runtime, "accelerator_present", lambda: True)
    assert runtime.hugepage_malloc_environment({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    monkeypatch.setattr(runtime, "hugepage_malloc_supported", lambda: False)
    assert runtime.hugepage_malloc_environment({}) is None


def test_process_restarts_once_with_the_same_arguments():
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("GLIBC_TUNABLES", "BERTJAX_HUGEPAGE_MALLOC")
    }
    run = subprocess.run(
        [sys.executable, "-c", PROBE, "--flag=x"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = run.stdout.splitlines()
    if runtime.hugepage_malloc_supported():  # this machine: glibc 2.36, THP "madvise"
        ours = ":".join(runtime.TUNABLES[:1] if runtime.accelerator_present() else runtime.TUNABLES)
        assert out == ["start", "start", ours + " ['--flag=x']"]
        # the restart says so, once, naming the tunables and how to turn it off
        said = [line for line in run.stderr.splitlines() if line.startswith("bertjax: restarting")]
        assert len(said) == 1 and ours in said[0] and "BERTJAX_HUGEPAGE_MALLOC=0" in said[0]
    else:
        assert out == ["start", " ['--flag=x']"]
    off = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**env, "BERTJAX_HUGEPAGE_MALLOC": "0"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    assert off == ["start", " []"]


FAULTS = """
import resource, threading
import numpy as np

def touch():  # a 256 MiB temporary, written and freed, from a worker thread (as XLA:CPU does)
    np.ones(1 << 25)

touch_twice = [threading.Thread(target=touch) for _ in range(2)]
for thread in touch_twice:
    thread.start(); thread.join()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    thread = threading.Thread(target=touch); thread.start(); thread.join()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_tunables_keep_freed_memory_mapped():
    """Under our tunables a big freed block is reused without page faults; glibc's defaults
    unmap it on free and fault it in again (the per-step cost the restart removes)."""
    if not runtime.hugepage_malloc_supported():
        return  # not glibc >= 2.35 with THP: nothing is restarted, nothing to check
    env = {k: v for k, v in __import__("os").environ.items() if k != "GLIBC_TUNABLES"}

    def faults(tunables):
        run_env = dict(env, **({"GLIBC_TUNABLES": tunables} if tunables else {}))
        return int(
            subprocess.run(
                [sys.executable, "-c", FAULTS],
                env=run_env,
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )

    assert faults(":".join(runtime.TUNABLES)) < 50
    # 3 x 256 MiB faulted in again: 3 x 128 faults in 2 MiB pages (numpy madvises big arrays
    # for huge pages), ~196k in 4 KiB pages.
    assert faults("") > 3 * 100


def test_cpu_platform_default_only_without_accelerator_and_user_setting(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime, "accelerator_present", lambda: False)
    environ = {}
    runtime.default_to_cpu_without_accelerator(environ)
    assert environ == {"JAX_PLATFORMS": "cpu"}
    environ = {"JAX_PLATFORMS": "tpu"}  # the user's choice stands
    runtime.default_to_cpu_without_accelerator(environ)
    assert environ == {"JAX_PLATFORMS": "tpu"}
    monkeypatch.setattr(runtime, "accelerator_present", lambda: True)
    environ = {}
    runtime.default_to_cpu_without_accelerator(environ)
    assert environ == {}


def test_cpu_platform_default_reaches_jax_when_it_is_already_imported(monkeypatch):
    """`python -m bertjax.predict` imports jax before its __main__ block runs, and jax reads
    JAX_PLATFORMS when imported: its config is set as well as the variable."""
    import jax

    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime, "accelerator_present", lambda: False)
    monkeypatch.setenv("JAX_PLATFORMS", "")  # restored after the test, whatever it was
    monkeypatch.delenv("JAX_PLATFORMS")
    updates = []
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
    runtime.default_to_cpu_without_accelerator()
    assert os.environ["JAX_PLATFORMS"] == "cpu" and updates == [("jax_platforms", "cpu")]


def test_one_cpu_device_per_core_unless_the_user_chose_a_count(monkeypatch):
    """The inference commands' device count: the usable cores up to ``most``; none set where
    XLA_FLAGS already forces a count (this test process's does: jax_num_cpu_devices stays -1)."""
    import jax

    set_to = []
    monkeypatch.setattr(jax.config, "update", lambda name, value: set_to.append((name, value)))
    monkeypatch.setattr(runtime, "usable_cores", lambda: 12)
    runtime.cpu_device_per_core({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert set_to == []
    runtime.cpu_device_per_core({}, most=8)
    runtime.cpu_device_per_core({}, most=16)
    assert set_to == [("jax_num_cpu_devices", 8), ("jax_num_cpu_devices", 12)]


def test_every_command_collects_young_objects_less_often_and_keeps_a_users_setting():
    """`fewer_gc_passes` raises Python's young-generation threshold (700 by default) to GC_GEN0;
    a higher one, or collection switched off by a 0 threshold, stays; a command's flag parsing
    (the start of train.py and every ``python -m bertjax.X``) calls it."""
    from absl import flags

    from bertjax import cli

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        runtime.fewer_gc_passes()
        assert gc.get_threshold() == (runtime.GC_GEN0, 10, 10)
        for kept in ((50_000, 3, 4), (0, 10, 10)):
            gc.set_threshold(*kept)
            runtime.fewer_gc_passes()
            assert gc.get_threshold() == kept
        gc.set_threshold(700, 10, 10)
        assert cli.parse_flags(["train.py"], flags.FlagValues()) == ["train.py"]
        assert gc.get_threshold()[0] == runtime.GC_GEN0
    finally:
        gc.set_threshold(*saved)
