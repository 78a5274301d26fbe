"""Checkpointer saves on host (CPU) devices: whole shards, no per-shape ``jit(slice)`` programs,
the array metadata store kept, and an orbax without the private attributes left alone; what a
fault leaves (an unreadable step, a full disk, storage that does not answer) is never lost."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint import type_handlers

from bertjax.retry import StorageUnavailable
from bertjax.training import checkpoint


@pytest.fixture
def compiled_names():
    """Names of the programs XLA compiles while the test runs (every thread: orbax's too)."""
    names, active = [], [True]

    def listen(event, duration, **kwargs):
        if active[0] and event.endswith("backend_compile_duration"):
            names.append(kwargs.get("fun_name", ""))

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield names
    active[0] = False  # jax has no public unregister; the listener goes quiet


@struct.dataclass
class _State:  # the fields a checkpoint holds (a train state's others stay out)
    step: jax.Array
    params: dict
    opt_state: dict


def _replicated_state():
    """Arrays replicated over 8 devices, with leading dims the replicas can split."""
    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices()[:8])
    rep = NamedSharding(mesh, P())

    def put(x):
        return jax.device_put(x, rep)

    return _State(
        step=put(jnp.int32(1)),
        params={"w": put(jnp.arange(64.0).reshape(16, 4)), "b": put(jnp.arange(8.0))},
        opt_state={"m": put(jnp.ones((8, 2, 2)))},
    )


def test_save_on_cpu_devices_writes_whole_shards_without_slice_programs(tmp_path, compiled_names):
    state = _replicated_state()
    default = type_handlers.ArrayHandler()  # orbax's own: replica-parallel off GPUs
    assert default._use_replica_parallel
    type_handlers.register_type_handler(jax.Array, default, override=True)

    # orbax's default handler splits each replicated array among the replicas: slice programs
    plain = checkpoint.ocp.StandardCheckpointer()
    plain.save(tmp_path / "plain", {"params": state.params})
    plain.wait_until_finished()
    assert any("slice" in n for n in compiled_names), compiled_names

    compiled_names.clear()
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    handler = type_handlers.get_type_handler(jax.Array)
    assert handler is not default and not handler._use_replica_parallel
    assert handler._array_metadata_store is default._array_metadata_store
    ckpt.save(state, {"note": "x"})
    ckpt.close()
    assert not [n for n in compiled_names if "slice" in n], compiled_names

    restored, meta = checkpoint.Checkpointer(str(tmp_path / "ckpt"), async_save=False).restore(
        state
    )
    assert meta == {"note": "x"}
    for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(got, want)


def test_an_orbax_without_the_private_attributes_keeps_its_handler():
    class Handler(type_handlers.ArrayHandler):
        pass

    before = type_handlers.get_type_handler(jax.Array)
    stripped = Handler()
    del stripped._array_metadata_store  # as an orbax that renamed it would have
    type_handlers.register_type_handler(jax.Array, stripped, override=True)
    try:
        checkpoint._whole_shards_on_host_devices()
        assert type_handlers.get_type_handler(jax.Array) is stripped
    finally:
        type_handlers.register_type_handler(jax.Array, before, override=True)


def _saved_steps(directory, steps=(1, 2, 3)):
    """Checkpoints at ``steps`` of random params (incompressible: a truncated file is short)."""
    ckpt = checkpoint.Checkpointer(str(directory), keep=5, async_save=True)
    for step in steps:
        key = jax.random.key(step)
        ckpt.save(
            _State(step=jnp.int32(step), params={"w": jax.random.normal(key, (64, 64))},
                   opt_state={"m": jnp.full((8,), float(step))}),
            {"step": step},
        )  # fmt: skip
    ckpt.close()
    return jax.eval_shape(lambda: _State(jnp.int32(0), {"w": jnp.zeros((64, 64))},
                                         {"m": jnp.zeros((8,))}))  # fmt: skip


def _abstract(shapes):
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)


def _largest_file(directory):
    files = [p for p in directory.rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["array data", "meta"])
def test_an_unreadable_newest_checkpoint_is_set_aside_and_the_previous_one_restored(
    tmp_path, damage, caplog
):
    """A listed step with a truncated array file (or its meta lost): the run resumes from the
    step before, names the bad one, and keeps it aside (STEP.unreadable), out of the listing, so
    that the resumed run saves that step afresh."""
    abstract = _abstract(_saved_steps(tmp_path))
    if damage == "array data":
        victim = _largest_file(tmp_path / "3" / "state")
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    else:
        (tmp_path / "3" / "meta" / "metadata").unlink()
    ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5)
    with caplog.at_level("WARNING"):
        state, meta = ckpt.restore_newest(abstract, check=lambda meta: None)
    assert int(state.step) == 2 and meta == {"step": 2}
    np.testing.assert_array_equal(state.opt_state["m"], np.full((8,), 2.0))
    assert ckpt.all_steps() == [1, 2] and (tmp_path / "3.unreadable").is_dir()
    assert f"checkpoint step 3 in {tmp_path} could not be read" in caplog.text
    assert "resumed from step 2" in caplog.text and "3.unreadable" in caplog.text
    ckpt.close()


def test_a_second_set_aside_of_a_step_keeps_the_first(tmp_path):
    """A step set aside before (3.unreadable, from an earlier damaged save of step 3) stays when
    the step saved again is damaged too: the new one is kept as 3.unreadable.2."""
    abstract = _abstract(_saved_steps(tmp_path))
    (tmp_path / "3.unreadable").mkdir()
    (tmp_path / "3.unreadable" / "earlier").write_text("kept")
    (tmp_path / "3" / "meta" / "metadata").write_text("{not json")  # unreadable metadata
    ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5)
    state, _ = ckpt.restore_newest(abstract, check=lambda meta: None)
    assert int(state.step) == 2 and ckpt.all_steps() == [1, 2]
    assert (tmp_path / "3.unreadable" / "earlier").read_text() == "kept"
    assert (tmp_path / "3.unreadable.2" / "meta").is_dir()
    ckpt.close()


@pytest.mark.parametrize("times", [1, 2])
def test_a_restore_that_fails_without_damage_is_tried_again_and_never_set_aside(
    tmp_path, monkeypatch, times
):
    """An error that shows no damage (out of memory: one host's trouble, not the bytes') is
    tried once more: once, the step restores; twice, the error is reported and every step stays
    where it was (the run does not quietly train from an older one)."""
    abstract = _abstract(_saved_steps(tmp_path))
    restore, calls = checkpoint.Checkpointer.restore, []

    def fail_first(self, abstract_state, step=None):
        calls.append(step)
        if len(calls) <= times:
            raise MemoryError("out of host memory while restoring")
        return restore(self, abstract_state, step)

    monkeypatch.setattr(checkpoint.Checkpointer, "restore", fail_first)
    ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5)
    if times == 1:
        state, _ = ckpt.restore_newest(abstract, check=lambda meta: None)
        assert int(state.step) == 3 and calls == [3, 3]
    else:
        with pytest.raises(MemoryError):
            ckpt.restore_newest(abstract, check=lambda meta: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3"]
    ckpt.close()


@pytest.mark.parametrize("stage", ["meta", "state"])
def test_a_checkpoint_storage_does_not_serve_is_not_set_aside(tmp_path, monkeypatch, stage):
    """TensorStore's UNAVAILABLE (a ValueError, after its own retries) while restoring the newest
    step, as orbax raises it or wrapped in our "does not fit" message: `StorageUnavailable`
    (exit 75, rerun) naming the step, and every step stays where it was (not known to be bad)."""
    abstract = _abstract(_saved_steps(tmp_path))
    unavailable = ValueError(
        f'UNAVAILABLE: Error reading "{tmp_path}/3/state/d/0": connection reset [source '
        "locations='tensorstore/kvstore/gcs_http/gcs_key_value_store.cc:612']"
    )

    def fail(*args, **kwargs):
        if stage == "meta":
            raise unavailable
        raise ValueError("checkpoint does not fit this model") from unavailable

    name = "read_meta" if stage == "meta" else "restore"
    monkeypatch.setattr(checkpoint.Checkpointer, name, fail)
    ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5)
    with pytest.raises(StorageUnavailable, match=f"{tmp_path}/3 .checkpoint restore. .*UNAVAIL"):
        ckpt.restore_newest(abstract, check=lambda meta: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3"]
    ckpt.close()


def test_a_save_storage_does_not_serve_is_storage_unavailable(tmp_path):
    """A save that fails because storage does not answer: `StorageUnavailable`, not bad input."""
    ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5)
    with pytest.raises(StorageUnavailable, match="/7 .checkpoint save. .*DEADLINE_EXCEEDED"):
        with ckpt._writing(7):
            raise ValueError("DEADLINE_EXCEEDED: writing gs://b/c/7/state/d/0 timed out")
    with pytest.raises(ValueError, match="INVALID_ARGUMENT"):  # a bad request stays itself
        with ckpt._writing(7):
            raise ValueError("INVALID_ARGUMENT: bad shape")
    ckpt.close()


def test_a_checkpoint_that_does_not_suit_the_run_is_not_skipped(tmp_path):
    """A meta check that fails (another model shape) is raised at once: older checkpoints of
    the same run would not suit either, and nothing is set aside."""
    abstract = _abstract(_saved_steps(tmp_path, steps=(1, 2)))

    def refuse(meta):
        raise ValueError(f"different model shape at {meta['step']}")

    with pytest.raises(ValueError, match="different model shape at 2"):
        checkpoint.Checkpointer(str(tmp_path)).restore_newest(abstract, check=refuse)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


FULL_DISK = r"""
import os, sys
import jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[2])
import checkpoint_test as t
from bertjax.retry import StorageUnavailable
from bertjax.training import checkpoint
directory = sys.argv[1]
ckpt = checkpoint.Checkpointer(directory, keep=5, async_save=True)
def state(step):
    return t._State(jnp.int32(step), {"w": jax.random.normal(jax.random.key(step), (256, 256))},
                    {"m": jnp.zeros((8,))})
ckpt.save(state(1), {"step": 1})
ckpt.wait()
free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
with open(os.path.join(directory, "..", "filler"), "wb") as f:  # the disk fills up
    f.write(b"\0" * max(0, free - 64 * 1024))
try:
    ckpt.save(state(2), {"step": 2})
    ckpt.save(state(3), {"step": 3})  # the async save's error comes out here at the latest
    ckpt.wait()
    print("no error")
except checkpoint.CheckpointWriteError as error:
    print("error:", error)
os.remove(os.path.join(directory, "..", "filler"))
restored, meta = checkpoint.Checkpointer(directory).restore(
    jax.eval_shape(lambda: state(0)), step=1)
print("restored", int(restored.step), meta)
"""


def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_is_intact(tmp_path):
    """A checkpoint that cannot be written for lack of room (a 2 MB tmpfs filled up, in a mount
    namespace of its own) stops with one line naming the step, the directory and the intact
    checkpoint (CheckpointWriteError, exit status 2 through bertjax/cli.py); step 1 restores."""
    import os
    import subprocess
    import sys

    from helpers import ROOT, child_env

    mount, script = tmp_path / "disk", tmp_path / "full_disk.py"
    mount.mkdir()
    script.write_text(FULL_DISK)
    tests = os.path.dirname(os.path.abspath(__file__))
    command = (
        f"mount -t tmpfs -o size=2m tmpfs {mount} && "
        f"{sys.executable} {script} {mount}/checkpoints {tests}"
    )
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", command], cwd=ROOT, env=child_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == (
        f"error: cannot write checkpoint step 2 to {mount}/checkpoints: no space left on device; "
        "step 1 is intact. Make room (or give another --workdir), then rerun the same command"
    ), result.stdout
    assert lines[1] == "restored 1 {'step': 1}"
