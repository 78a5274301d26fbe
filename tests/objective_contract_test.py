"""The contract every registered objective keeps with the step and the trainer (a newly registered
one is picked up from `OBJECTIVES`): the train and eval steps compile once; with dropout off the
first train step reports the eval step's metrics (but those the objective declares dependent on
the step's rng); resuming from a checkpoint (plus `resume_state`) gives bitwise the same next
step; and two microbatches on a 4-device (data 2 x fsdp 2) mesh give the one-device whole-batch
step (one whole batch there for an objective whose rows interact, `microbatch_additive`). Tiny
models (one layer, T=16, B=8) and the objective's own `example_batch`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_process_worker as setup

from bertjax import step
from bertjax.objectives import OBJECTIVES
from bertjax.training import checkpoint, sharding

ROWS, LENGTH = 8, 16


def _config(name, **mesh):
    config = setup.step_config(**mesh)
    config.batch_size = ROWS
    OBJECTIVES[name].add_config(config)
    return config


def _mesh(config, devices):
    return sharding.make_mesh(config.mesh, jax.devices()[:devices])


def _batch(objective, cfg, mesh, seed):
    host = objective.example_batch(cfg, ROWS, LENGTH, seed)
    return sharding.global_batch(host, mesh, ROWS)


def _copy(state):
    return jax.tree.map(jnp.copy, state)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_objective_keeps_the_step_contract(name, tmp_path):
    cfg = setup.tiny_model_config(num_hidden_layers=1, max_position_embeddings=LENGTH)
    if name == "electra":
        cfg = cfg.replace(model_type="electra")
    config = _config(name)
    mesh = _mesh(config, 1)
    state = step.init_train_state(config, cfg, mesh, jax.random.key(0))
    objective = state.spec.objective
    assert type(objective) is OBJECTIVES[name]
    steps = step.jit_steps(state, mesh, step.FAST_COMPILE)
    batches = [_batch(objective, cfg, mesh, seed) for seed in (0, 1)]
    rng = jax.random.key(3)

    # eval equals train without dropout (both at the initial params)
    evaluated = steps.eval(state, batches[0])
    first, train_metrics = steps.train(_copy(state), batches[0], rng)
    compared = set(evaluated) - {"sums", "norms", "predictions"}
    compared -= set(objective.rng_dependent_metrics)
    assert "loss" in compared or objective.rng_dependent_metrics
    for key in sorted(compared):
        np.testing.assert_allclose(train_metrics[key], evaluated[key], rtol=2e-6, err_msg=key)

    # resume exact: step 2 from a restored checkpoint of step 1 is bitwise step 2
    second, _ = steps.train(_copy(first), batches[1], rng)
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(first, {})
    abstract, _, _ = step.abstract_train_state(config, cfg, mesh)
    restored, _ = ckpt.restore(abstract)
    ckpt.close()

    def fresh():
        return step.init_train_state(config, cfg, mesh, jax.random.key(0))

    restored = objective.resume_state(restored, None, fresh)
    restored = first.replace(  # the running step's static fields, the checkpoint's arrays
        step=restored.step,
        params=restored.params,
        opt_state=restored.opt_state,
        frozen=restored.frozen,
    )
    resumed, _ = steps.train(restored, batches[1], rng)
    for got, want in zip(
        _leaves((resumed.params, resumed.opt_state)), _leaves((second.params, second.opt_state))
    ):
        np.testing.assert_array_equal(got, want)
    assert steps.train._cache_size() == 1 and steps.eval._cache_size() == 1  # compiled once

    # two microbatches over 4 devices == the whole batch on one device
    sharded_config = _config(name, data=2, fsdp=2)
    sharded_config.optim.grad_accum_steps = 2 if objective.microbatch_additive else 1
    sharded_mesh = _mesh(sharded_config, 4)
    _, shardings, _ = step.abstract_train_state(sharded_config, cfg, sharded_mesh)
    sharded = shardings.replace(  # the same initial state, placed on 4 devices
        **{
            field: jax.device_put(getattr(state, field), getattr(shardings, field))
            for field in ("step", "params", "opt_state", "frozen")
            if getattr(state, field) is not None
        }
    )
    accumulated, accumulated_metrics = step.jit_steps(
        sharded, sharded_mesh, step.FAST_COMPILE
    ).train(sharded, _batch(objective, cfg, sharded_mesh, 0), rng)
    skipped = set(objective.rng_dependent_metrics)
    if skipped:  # microbatches fold the rng per microbatch: the gradients differ too
        skipped |= {"grad_norm", "param_norm"}
    for key in sorted(set(train_metrics) - skipped):
        np.testing.assert_allclose(
            accumulated_metrics[key], train_metrics[key], rtol=2e-5, atol=1e-6, err_msg=key
        )
    if not skipped:
        for got, want in zip(_leaves(accumulated.params), _leaves(first.params)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-6)
