"""Checkpointer saves on host (CPU) devices: whole shards, no per-shape ``jit(slice)`` programs,
the array metadata store kept, and an orbax without the private attributes left alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint import type_handlers

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
