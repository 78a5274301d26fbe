"""Train/eval step tests: losses, compile-once, non-finite skipping, bf16. (Accumulation equals
the whole batch, for every objective: tests/objective_contract_test.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_process_worker as setup

from bertjax import step
from bertjax.objectives.pretraining import Pretraining
from bertjax.ops.loss import cross_entropy
from bertjax.training import optim, sharding


def _mesh(shape):
    config = setup.step_config(**dict(zip(sharding.MESH_AXES, shape)))
    return sharding.make_mesh(config.mesh, jax.devices()[: int(np.prod(shape))])


def _copy(state):
    """A copy to feed a step that donates its input."""
    return jax.tree.map(jnp.copy, state)


@pytest.fixture(scope="module")
def single():
    """One-device state and steps, jitted once for the whole module."""
    mesh = _mesh((1, 1, 1))
    state = step.init_train_state(
        setup.step_config(), setup.tiny_model_config(), mesh, jax.random.key(0)
    )
    return mesh, state, step.jit_steps(state, mesh, step.FAST_COMPILE)


def _batch(mesh, seed=0):
    return sharding.global_batch(setup.synthetic_batch(seed), mesh, setup.BATCH)


def test_losses_match_a_numpy_reference():
    rs = np.random.RandomState(0)
    logits = rs.randn(3, 4, 7).astype(np.float32)
    ids, weights = rs.randint(0, 7, (3, 4)), (rs.rand(3, 4) > 0.3).astype(np.float32)
    nsp_logits, labels = rs.randn(3, 2).astype(np.float32), rs.randint(0, 2, 3)
    batch = dict(masked_ids=ids, masked_weights=weights, next_sentence_label=labels)
    objective = Pretraining(nsp_weight=0.5)
    sums = objective.sums({"mlm_logits": logits, "nsp_logits": nsp_logits}, batch)
    metrics = objective.report(sums, objective.normalizers(batch))

    def nll(x, y):
        x = x - x.max(-1, keepdims=True)
        logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return -np.take_along_axis(logp, y[..., None], -1)[..., 0]

    mlm = (nll(logits, ids) * weights).sum() / weights.sum()
    nsp = nll(nsp_logits, labels).mean()
    np.testing.assert_allclose(metrics["mlm_loss"], mlm, rtol=1e-6)
    np.testing.assert_allclose(metrics["nsp_loss"], nsp, rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], mlm + 0.5 * nsp, rtol=1e-6)
    accuracy = ((logits.argmax(-1) == ids) * weights).sum() / weights.sum()
    np.testing.assert_allclose(metrics["mlm_accuracy"], accuracy, rtol=1e-6)


def test_cross_entropy_matches_float64_log_softmax_and_argmax_ties():
    rs = np.random.RandomState(3)
    logits = (rs.randn(4, 7, 50) * 8).astype(np.float32)
    logits[0, 0] = 1.5  # all tied: jnp.argmax's rule, the first index, is the prediction
    logits[1, 2, [3, 9]] = 40.0  # two-way tie at the top
    labels = rs.randint(0, 50, (4, 7))
    labels[0, 0], labels[0, 1] = 0, 1
    labels[1, 2] = 9
    nll, correct = jax.jit(cross_entropy)(logits, labels)
    x = logits.astype(np.float64)
    log_probs = x - x.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    want = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, want, rtol=1e-5, atol=1e-5)  # fp32 vs fp64
    np.testing.assert_array_equal(correct, (np.argmax(logits, -1) == labels).astype(np.float32))
    assert correct[0, 0] == 1 and correct[1, 2] == 0  # the tie went to index 3, not the label 9
    # Gradient: softmax minus the one-hot label.
    grad = jax.grad(lambda z: cross_entropy(z, labels)[0].sum())(logits)
    probs = np.exp(log_probs)
    np.testing.assert_allclose(grad, probs - np.eye(50)[labels], atol=1e-5)
    # bf16 logits (the model's): the loss in fp32 of their values, the gradient in bf16
    half = jnp.asarray(logits / 8, jnp.bfloat16)
    x = np.asarray(half, np.float64)
    log_probs = x - x.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    nll, _ = cross_entropy(half, labels)
    want = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, want, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda z: cross_entropy(z, labels)[0].sum())(half)
    assert grad.dtype == jnp.bfloat16
    want = np.exp(log_probs) - np.eye(50)[labels]
    np.testing.assert_allclose(np.asarray(grad, np.float64), want, atol=4e-3)


def test_train_step_compiles_once_and_eval_agrees(single):
    mesh, state, steps = single
    eval_metrics = steps.eval(state, _batch(mesh, 0))
    state = _copy(state)
    history = []
    for index in range(3):
        state, metrics = steps.train(state, _batch(mesh, index), jax.random.key(index))
        history.append(metrics)
    assert steps.train._cache_size() == 1
    assert steps.eval._cache_size() == 1
    assert int(state.step) == 3
    expected = {
        "loss",
        "mlm_loss",
        "mlm_accuracy",
        "nsp_loss",
        "nsp_accuracy",
        "grad_norm",
        "param_norm",
        "learning_rate",
        "nonfinite",
    }
    assert set(history[0]) == expected
    # No dropout: the first train step's loss is the eval loss at the initial params.
    for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss"):
        np.testing.assert_allclose(history[0][key], eval_metrics[key], rtol=1e-6)
    assert float(history[2]["loss"]) < float(history[0]["loss"]) + 0.5
    assert all(float(m["nonfinite"]) == 0.0 for m in history)


def test_a_fresh_state_traces_the_model_init_once(monkeypatch):
    """The shardings (from the boxed variables), the state's shapes and the jitted init share one
    trace of the model's init (it was traced twice: once more for the shardings)."""
    calls = []
    original = Pretraining.init

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Pretraining, "init", counting)
    mesh = _mesh((1, 1, 1))
    state = step.init_train_state(
        setup.step_config(), setup.tiny_model_config(), mesh, jax.random.key(0)
    )
    assert len(calls) == 1
    assert int(state.step) == 0 and jax.tree.leaves(state.params)


def test_nonfinite_loss_skips_the_update(single):
    mesh, state, steps = single
    before = jax.tree.map(np.asarray, (state.params, state.opt_state))
    bad = setup.synthetic_batch(0)
    bad["masked_weights"][0, 0] = np.nan
    after, metrics = steps.train(
        _copy(state), sharding.global_batch(bad, mesh, setup.BATCH), jax.random.key(0)
    )
    assert float(metrics["nonfinite"]) == 1.0
    assert int(after.step) == int(state.step) + 1
    for got, want in zip(jax.tree.leaves((after.params, after.opt_state)), jax.tree.leaves(before)):
        np.testing.assert_array_equal(got, want)


def test_bf16_compute_keeps_fp32_master_params_and_scales_lr():
    """bf16 activations, fp32 params/loss; MLM-only objective; sqrt batch-size LR scaling."""
    mesh = _mesh((1, 1, 1))
    config = setup.step_config()
    config.loss.next_sentence = False
    config.optim.update(lr_scaling="sqrt", base_batch_size=4)
    fp32_cfg = setup.tiny_model_config()
    state = step.init_train_state(
        config, fp32_cfg.replace(dtype="bfloat16"), mesh, jax.random.key(0)
    )
    assert "nsp_head" not in state.params and "pooler" not in state.params["bert"]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    reference = jax.jit(step.eval_step)(
        state.replace(spec=state.spec.__class__(fp32_cfg, Pretraining(next_sentence=False))),
        _batch(mesh, 0),
    )
    new_state, metrics = step.jit_steps(state, mesh, step.FAST_COMPILE).train(
        state, _batch(mesh, 0), jax.random.key(0)
    )
    assert set(metrics) == {
        "loss",
        "mlm_loss",
        "mlm_accuracy",
        "grad_norm",
        "param_norm",
        "learning_rate",
        "nonfinite",
    }
    assert metrics["loss"].dtype == jnp.float32
    np.testing.assert_allclose(metrics["loss"], reference["loss"], rtol=2e-2)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new_state.params))
    schedule = optim.make_schedule(config.optim, setup.BATCH)
    np.testing.assert_allclose(metrics["learning_rate"], 1e-3 * (setup.BATCH / 4) ** 0.5, rtol=1e-6)
    np.testing.assert_allclose(metrics["learning_rate"], schedule(0), rtol=1e-6)
