"""The contract every registered objective keeps with the step and the trainer (a newly registered
one is picked up from `OBJECTIVES`): the train and eval steps compile once; with dropout off the
first train step reports the eval step's metrics (but those the objective declares dependent on
the step's rng); resuming from a checkpoint (plus `resume_state`) gives bitwise the same next
step; and two microbatches on a 4-device (data 2 x fsdp 2) mesh give the one-device whole-batch
step (one whole batch there for an objective whose rows interact, `microbatch_additive`); the
metric names it declares mean what they say (its `token_nll` metric is the unsmoothed per-token
NLL of the model's outputs, recomputed in float64; its headline metrics are among its held-out
metrics). Tiny models (one layer, T=16, B=8) and the objective's own `example_batch`. Below it:
a subclass cannot skip its parents' checks, and the metric checks catch a misnamed metric."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_process_worker as setup

from bertjax import step
from bertjax.objectives import OBJECTIVES
from bertjax.objectives.base import TokenNLL
from bertjax.objectives.pretraining import Pretraining
from bertjax.training import checkpoint, sharding
from bertjax.training import step as training_step

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


def token_nll_reference(logits, targets, weights) -> float:
    """`TokenNLL`'s definition in float64: sum(w * -log softmax(logits)[target]) / sum(w)."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, np.asarray(targets)[..., None], -1)[..., 0]
    weights = np.asarray(weights, np.float64)
    return float(np.sum(-picked * weights) / np.sum(weights))


def check_declared_metrics(objective, reported: dict, host_batch: dict, outputs: dict) -> None:
    """The metric names an objective's declarations rely on: its `token_nll` metric is reported
    and equals the NLL its declaration defines on ``outputs``; every headline metric is among
    the held-out metrics (`held_out_metrics` of the report), but those the data's task scoring
    adds (objectives with `predictions`)."""
    metrics = {
        k: float(v) for k, v in reported.items() if k not in ("sums", "norms", "predictions")
    }
    label = type(objective).__name__
    nll = objective.token_nll
    if nll is not None:
        assert nll.metric in metrics, (
            f"{label}.token_nll names {nll.metric!r}, which it does not report: {sorted(metrics)}"
        )
        want = token_nll_reference(
            outputs[nll.logits], host_batch[nll.targets], host_batch[nll.weights]
        )
        np.testing.assert_allclose(
            metrics[nll.metric],
            want,
            rtol=2e-5,
            err_msg=f"{label}: {nll.metric!r} is not the unsmoothed per-token NLL its token_nll "
            "declares (report a smoothed loss under another name)",
        )
    if "predictions" not in reported:
        held = objective.held_out_metrics(metrics, objective.held_out_counts(host_batch))
        missing = [m for m in objective.headline_metrics if m not in held]
        assert not missing, f"{label}.headline_metrics {missing} not in {sorted(held)}"


def _outputs(state, mesh, batch, key: str) -> dict:
    """``key`` of the model's deterministic outputs on ``batch`` (as the eval step computes)."""

    def forward(state, batch):
        outputs = training_step._forward(state.spec, state.params, batch, None, True, state.frozen)
        return outputs[key]

    jitted = jax.jit(training_step._on_mesh(forward, mesh), compiler_options=step.FAST_COMPILE)
    return {key: np.asarray(jitted(state, batch))}


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

    # the declared metric names: the token NLL recomputed from the outputs, headline metrics
    nll = objective.token_nll
    outputs = {} if nll is None else _outputs(state, mesh, batches[0], nll.logits)
    host = objective.example_batch(cfg, ROWS, LENGTH, 0)
    check_declared_metrics(objective, evaluated, host, outputs)

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


def test_data_parallel_microbatches_reduce_once_and_equal_one_device():
    """On an all-data mesh the microbatch loop runs per replica under shard_map (each chip's
    partial gradients, one reduction: tests/compile_test.py counts it): two microbatches on 4
    data-parallel devices equal the whole batch on one device, without dropout."""
    cfg = setup.tiny_model_config(num_hidden_layers=1, max_position_embeddings=LENGTH)
    config = _config("pretraining")
    mesh = _mesh(config, 1)
    state = step.init_train_state(config, cfg, mesh, jax.random.key(0))
    rng = jax.random.key(3)
    want, want_metrics = step.jit_steps(state, mesh, step.FAST_COMPILE).train(
        _copy(state), _batch(state.spec.objective, cfg, mesh, 0), rng
    )
    sharded_config = _config("pretraining", data=4)
    sharded_config.optim.grad_accum_steps = 2
    sharded_mesh = _mesh(sharded_config, 4)
    with jax.sharding.use_abstract_mesh(sharded_mesh.abstract_mesh):
        assert "data" in training_step._replica_axes()  # the shard_map'd loop, not the other
    _, shardings, _ = step.abstract_train_state(sharded_config, cfg, sharded_mesh)
    sharded = shardings.replace(
        **{
            f: jax.device_put(getattr(state, f), getattr(shardings, f))
            for f in ("step", "params", "opt_state")
        }
    )
    got, got_metrics = step.jit_steps(sharded, sharded_mesh, step.FAST_COMPILE).train(
        sharded, _batch(state.spec.objective, cfg, sharded_mesh, 0), rng
    )
    for key in sorted(want_metrics):
        np.testing.assert_allclose(
            got_metrics[key], want_metrics[key], rtol=2e-5, atol=1e-6, err_msg=key
        )
    for a, b in zip(_leaves(got.params), _leaves(want.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=5e-6)


# ---- what a new objective's author cannot get wrong silently (no model: fast) ----


class _Forgetful(Pretraining):
    """Its own ``__post_init__`` and ``validate``, neither calling ``super()``."""

    extra_weight: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "extra_weight", float(self.extra_weight))

    def validate(self):
        if self.extra_weight < 0:
            raise ValueError(f"config.loss.extra_weight={self.extra_weight}: must be >= 0")


def test_a_subclass_cannot_skip_its_parents_checks():
    with pytest.raises(ValueError, match="config.loss.mlm_weight=-1.0: must be >= 0"):
        _Forgetful(mlm_weight=-1.0)
    with pytest.raises(ValueError, match="config.loss.extra_weight"):
        _Forgetful(extra_weight=-2)
    assert _Forgetful(extra_weight=2).extra_weight == 2.0


class _SmoothedUnderMLMLoss(Pretraining):
    """Label-smoothed MLM whose smoothed loss is reported as "mlm_loss" (the inherited
    declaration says that name is the unsmoothed NLL): the mistake the contract catches."""

    label_smoothing: float = 0.1

    def loss_sums(self, outputs, batch):
        sums = super().loss_sums(outputs, batch)
        uniform_BP = -jnp.mean(jax.nn.log_softmax(outputs["mlm_logits"]), -1)
        smooth = jnp.sum(uniform_BP * batch["masked_weights"])
        sums["mlm_loss"] = (1 - self.label_smoothing) * sums["mlm_loss"] + (
            self.label_smoothing * smooth
        )
        return sums


class _MisnamedHeadline(Pretraining):
    headline_metrics = ("mlm_acc",)


class _MisnamedNLL(Pretraining):
    token_nll = TokenNLL("mlm_nll")


def test_the_metric_checks_catch_a_misnamed_metric():
    """The contract's metric check passes BERT's objective and fails a smoothed loss under the
    NLL's name, a headline metric never reported, and a token_nll naming no metric; on random
    logits (no model)."""
    cfg = setup.tiny_model_config(num_hidden_layers=1, max_position_embeddings=LENGTH)
    host = Pretraining().example_batch(cfg, ROWS, LENGTH, 0)
    slots = host["masked_positions"].shape[1]
    logits = np.random.RandomState(0).normal(0, 2, (ROWS, slots, cfg.vocab_size))
    outputs = {
        "mlm_logits": jnp.asarray(logits, jnp.float32),
        "nsp_logits": jnp.asarray(logits[:, 0, :2], jnp.float32),
    }

    def check(objective):
        reported = objective.report(objective.sums(outputs, host), objective.norms(host))
        check_declared_metrics(objective, reported, host, outputs)

    check(Pretraining())
    with pytest.raises(AssertionError, match="'mlm_loss' is not the unsmoothed per-token NLL"):
        check(_SmoothedUnderMLMLoss())
    with pytest.raises(AssertionError, match=r"headline_metrics \['mlm_acc'\]"):
        check(_MisnamedHeadline())
    with pytest.raises(AssertionError, match="names 'mlm_nll', which it does not report"):
        check(_MisnamedNLL())
