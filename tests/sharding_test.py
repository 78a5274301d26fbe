"""Sharding tests: mesh config, DP/FSDP/TP layouts, and parity with one device."""

import flax.linen as nn
import jax
import numpy as np
import pytest
import two_process_worker as setup

from bertjax import step
from bertjax.training import sharding

STEPS = 2
MESHES = {"dp": (8, 1, 1), "fsdp": (1, 8, 1), "fsdp_tp": (1, 2, 4), "dp_fsdp_tp": (2, 2, 2)}
# Where each logical parameter axis must be split, as (data, fsdp, tensor) index.
SPLIT_AXIS = {"embed": 1, "vocab": 2, "heads": 2, "mlp": 2}


def _run(mesh_shape):
    """State after STEPS train steps on the given mesh ((data, fsdp, tensor) sizes, or a dict of
    mesh axis sizes), plus per-step losses."""
    axes = mesh_shape if isinstance(mesh_shape, dict) else dict(zip(sharding.MESH_AXES, mesh_shape))
    devices = jax.devices()[: int(np.prod(list(axes.values())))]
    config = setup.step_config(**axes)
    mesh = sharding.make_mesh(config.mesh, devices)
    state = step.init_train_state(config, setup.tiny_model_config(), mesh, jax.random.key(0))
    initial = jax.tree.map(lambda x: x.sharding, state)
    steps = step.jit_steps(state, mesh, step.FAST_COMPILE)
    losses = []
    for index in range(STEPS):
        batch = sharding.global_batch(setup.synthetic_batch(index), mesh, setup.BATCH)
        state, metrics = steps.train(state, batch, jax.random.key(1))
        losses.append([metrics["loss"], metrics["grad_norm"]])
    return state, initial, np.array(losses), batch


@pytest.fixture(scope="module")
def reference():
    state, _, losses, _ = _run((1, 1, 1))
    return jax.tree.map(np.asarray, state.params), losses


@pytest.fixture(scope="module")
def logical_specs():
    config = setup.step_config()
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    shapes, _, _ = step.abstract_train_state(config, setup.tiny_model_config(), mesh)
    model = step.StepSpec.from_config(config, setup.tiny_model_config()).model()
    ids = np.zeros((1, 8), np.int32)
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, masked_positions=ids[:, :1]))
    return nn.get_partition_spec(boxed)["params"]


def test_mesh_shape_fills_and_validates():
    config = sharding.default_mesh_config()
    assert sharding.mesh_shape(config, 8) == (8, 1, 1, 1)
    config.update(data=-1, fsdp=2, tensor=2)
    assert sharding.mesh_shape(config, 8) == (2, 2, 2, 1)
    config.update(data=3, fsdp=1, tensor=2)
    with pytest.raises(ValueError, match="needs 6 devices but 8"):
        sharding.mesh_shape(config, 8)
    config.update(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="only one axis may be -1"):
        sharding.mesh_shape(config, 8)
    config.update(data=-1, fsdp=3, tensor=1)
    with pytest.raises(ValueError, match="config.mesh.data=-1"):
        sharding.mesh_shape(config, 8)
    config.update(fsdp=0)
    with pytest.raises(ValueError, match="config.mesh.fsdp=0"):
        sharding.mesh_shape(config, 8)


def test_every_logical_name_has_a_rule(logical_specs):
    names = {
        n
        for spec in jax.tree.leaves(
            logical_specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
        )
        for n in spec
        if n
    }
    names |= {"act_batch", "act_len", "act_embed", "act_heads", "act_kv", "act_mlp", "act_vocab"}
    ruled = {name for name, _ in sharding.logical_axis_rules()}
    assert names <= ruled, names - ruled


def _expected_shard(shape, names, mesh_shape):
    used, shard = set(), []
    for size, name in zip(shape, names):
        axis = SPLIT_AXIS.get(name)
        if axis is None or axis in used:
            shard.append(size)
        else:
            used.add(axis)
            shard.append(size // mesh_shape[axis])
    return tuple(shard)


@pytest.mark.parametrize("strategy", list(MESHES))
def test_same_loss_and_params_as_one_device(strategy, reference, logical_specs):
    mesh_shape = MESHES[strategy]
    state, initial, losses, batch = _run(mesh_shape)
    ref_params, ref_losses = reference
    # fp32 with "highest" matmuls; only the order of cross-device reductions differs, so losses
    # and gradient norms agree to 1e-5 relative. Parameters get atol 5e-6 = 0.5% of one Adam
    # step (lr 1e-3): Adam's g / (sqrt(v) + eps) magnifies that noise where g is nearly 0.
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(state.params), jax.tree.leaves(ref_params)
    ):
        np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=5e-6, err_msg=jax.tree_util.keystr(path)
        )

    # Each strategy's promise, checked on the arrays the init created (not resharded later).
    spec_leaves = jax.tree.leaves(
        logical_specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    mu = state.opt_state[1].mu  # chain(clip, scale_by_adam, ...): its first moment mirrors params
    for (path, param), names, init_sharding, moment in zip(
        jax.tree_util.tree_leaves_with_path(state.params),
        spec_leaves,
        jax.tree.leaves(initial.params),
        jax.tree.leaves(mu),
    ):
        want = _expected_shard(param.shape, names, mesh_shape)
        where = jax.tree_util.keystr(path)
        assert init_sharding.shard_shape(param.shape) == want, where
        assert param.sharding.shard_shape(param.shape) == want, where
        assert moment.sharding.shard_shape(moment.shape) == want, where
        if strategy == "dp":
            assert param.sharding.is_fully_replicated, where
    params = state.params["bert"]
    layer = params["encoder"]["layer_0"]
    shard = lambda x: x.sharding.shard_shape(x.shape)  # noqa: E731
    if strategy == "fsdp":  # ZeRO-3: the large weights live in eighths
        assert shard(params["embeddings"]["word_embeddings"]) == (128, 8)
        assert shard(layer["mlp"]["intermediate"]["kernel"]) == (8, 128)
        assert shard(layer["attention"]["query_kernel"]) == (8, 4, 16)
    if strategy == "fsdp_tp":  # Megatron: heads and MLP units over tensor=4
        assert shard(layer["attention"]["query_kernel"]) == (32, 1, 16)
        assert shard(layer["attention"]["output_kernel"]) == (1, 16, 32)
        assert shard(layer["mlp"]["intermediate"]["kernel"]) == (32, 32)
        assert shard(layer["mlp"]["output"]["kernel"]) == (32, 32)
    data_shards = mesh_shape[0] * mesh_shape[1]
    assert batch["input_ids"].sharding.shard_shape(batch["input_ids"].shape) == (
        setup.BATCH // data_shards,
        setup.LENGTH,
    )


def test_slices_are_the_first_mesh_axis_and_split_the_batch():
    config = setup.step_config(dcn=2, fsdp=2)
    mesh = sharding.make_mesh(config.mesh)
    assert dict(mesh.shape) == {"dcn": 2, "data": 2, "fsdp": 2, "tensor": 1, "expert": 1}
    # CPU devices carry no slice: the first half of the devices is slice 0, the rest slice 1
    assert [d.id for d in mesh.devices[0].flat] == [d.id for d in jax.devices()[:4]]
    assert sharding.batch_sharding(mesh).spec == jax.sharding.PartitionSpec(sharding.BATCH_AXES)
    assert sharding.mesh_shape(config.mesh, 4) == (2, 2, 1, 1)  # within a slice
    with pytest.raises(ValueError, match="config.mesh.dcn=3: must divide the 8 devices"):
        sharding.make_mesh(setup.step_config(dcn=3).mesh)


def test_two_slices_train_as_one_device(reference):
    """Data parallel across two slices (dcn), FSDP within each: the same losses and parameters
    as one device."""
    state, _, losses, batch = _run({"dcn": 2, "fsdp": 4})
    ref_params, ref_losses = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-6)
    embeddings = state.params["bert"]["embeddings"]["word_embeddings"]
    assert embeddings.sharding.shard_shape(embeddings.shape)[1] == embeddings.shape[1] // 4
    rows = batch["input_ids"].sharding.shard_shape(batch["input_ids"].shape)[0]
    assert rows == setup.BATCH // 8


def test_global_batch_rejects_wrong_rows():
    config = setup.step_config(data=-1)
    mesh = sharding.make_mesh(config.mesh)
    batch = setup.synthetic_batch(0, batch=setup.BATCH // 2)
    with pytest.raises(ValueError, match="batch\\['input_ids'\\]"):
        sharding.global_batch(batch, mesh, setup.BATCH)
    with pytest.raises(ValueError, match="config.batch_size=12"):
        sharding.process_batch_rows(mesh, 12)
