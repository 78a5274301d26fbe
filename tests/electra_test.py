"""ELECTRA's objective: the loss against a float64 numpy port of google-research/electra's
run_pretraining.py, the sample that carries no gradient and the labels it implies, the held-out
AUC, the step on an 8-device mesh against one device, and fine-tuning from an ELECTRA workdir
(the discriminator's encoder). Exact resume of ELECTRA's state through a checkpoint:
tests/objective_contract_test.py; after SIGKILL of a train.py run: tests/trainer_test.py."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_process_worker as setup
from helpers import ROOT
from helpers import checkpoint_steps as _steps
from helpers import run as _run

from bertjax import BertForSequenceClassification, step
from bertjax.interop.pretrained import PretrainedSource
from bertjax.modeling.electra import sample_softmax
from bertjax.objectives import electra as electra_lib
from bertjax.objectives import finetune
from bertjax.objectives.electra import Electra
from bertjax.training import sharding

pytestmark = pytest.mark.usefixtures("session_tokenizer_runs")

MASK_ID = 4
ELECTRA = os.path.join(ROOT, "configs", "electra_tiny.py")


def electra_batch(seed: int, batch: int = setup.BATCH) -> dict:
    """A masked batch as the pipeline makes it: distinct positions per row (never [CLS]),
    padded slots (position 0, id 0, weight 0), padded rows, 85% of masked tokens [MASK]."""
    rs = np.random.RandomState(seed)
    base = setup.synthetic_batch(seed, batch)
    original = base["input_ids"]
    real = base["attention_mask"].sum(1)
    positions = np.zeros((batch, setup.PREDICTIONS), np.int32)
    weights = base["masked_weights"]
    for row in range(batch):
        positions[row] = np.sort(rs.choice(np.arange(1, real[row]), setup.PREDICTIONS, False))
    positions = np.where(weights > 0, positions, 0).astype(np.int32)
    masked_ids = np.where(weights > 0, np.take_along_axis(original, positions, 1), 0)
    inputs = original.copy()
    use_mask = (rs.uniform(size=positions.shape) < 0.85) & (weights > 0)
    rows = np.nonzero(use_mask)[0]
    inputs[rows, positions[use_mask]] = MASK_ID
    return {
        **base,
        "input_ids": inputs,
        "masked_positions": positions,
        "masked_ids": masked_ids.astype(np.int32),
    }


def step_config(**mesh):
    config = setup.step_config(**mesh)
    config.loss.objective = "electra"
    config.loss.discriminator_weight = 50.0
    config.loss.generator_hidden_size = 0.5  # 32 wide, 2 heads: tensor=2 splits them too
    config.loss.generator_layers = 1.0
    return config


@pytest.fixture(scope="module")
def tiny():
    """A tiny ELECTRA (discriminator 64 wide, generator 32), random params (LayerNorm scales
    around 1), a batch, and `run`: the outputs and, per loss term (MLM, BCE), each parameter's
    largest |gradient|, in one compiled function."""
    cfg = setup.tiny_model_config(model_type="electra")
    objective = Electra(generator_hidden_size=0.5)
    model = objective.model(cfg)
    batch = {k: jnp.asarray(v) for k, v in electra_batch(0).items()}
    shapes = jax.eval_shape(
        lambda key: objective.init(model, {"params": key}, objective.init_batch(cfg)),
        jax.random.key(0),
    )
    rng = np.random.default_rng(0)

    def random(path, leaf):
        base = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
        return (base + 0.05 * rng.standard_normal(leaf.shape)).astype(np.float32)

    params = jax.tree_util.tree_map_with_path(random, nn.unbox(shapes["params"]))

    @jax.jit
    def run(p, b, key):
        def terms(p):
            outputs = objective.apply(model, {"params": p}, b, {"dropout": key}, False)
            sums, norms = objective.sums(outputs, b), objective.norms(b)
            return jnp.stack([sums["mlm_loss"] / norms["mlm_weight"], sums["rtd_loss"]]), outputs

        jacobian, outputs = jax.jacrev(terms, has_aux=True)(p)
        return outputs, jax.tree.map(lambda g: jnp.abs(g).reshape(2, -1).max(1), jacobian)

    return objective, params, batch, run


def _scatter_update(sequence, updates, positions):
    """ELECTRA's pretrain_helpers.scatter_update on int ids (numpy): updates at positions,
    position 0 never written, duplicate positions averaged (floor)."""
    batch, length = sequence.shape
    summed = np.zeros((batch, length), np.int64)
    count = np.zeros((batch, length), np.int64)
    for row in range(batch):
        np.add.at(summed[row], positions[row], updates[row])
        np.add.at(count[row], positions[row], 1)
    count[:, 0] = 0
    averaged = summed // np.maximum(1, count)
    updated = np.minimum(count, 1)
    return (1 - updated) * sequence + updated * averaged, updated


def _electra_loss(batch, mlm_logits, sampled, rtd_logits, gen_weight=1.0, disc_weight=50.0):
    """run_pretraining.py in float64: get_softmax_output, _get_fake_data, the discriminator's
    sigmoid cross-entropy over input_mask, total = gen_weight * MLM + disc_weight * disc."""
    weights = batch["masked_weights"].astype(np.float64)
    positions = batch["masked_positions"] * weights.astype(np.int64)  # masked_lm_positions *= w
    shifted = mlm_logits.astype(np.float64) - mlm_logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.sum(np.exp(shifted), -1, keepdims=True))
    label_log_probs = -np.take_along_axis(log_probs, batch["masked_ids"][..., None], -1)[..., 0]
    mlm = np.sum(weights * label_log_probs) / (np.sum(weights) + 1e-6)
    # _get_fake_data: unmask (masked_lm_ids *= weights), then write the samples.
    original, _ = _scatter_update(batch["input_ids"], batch["masked_ids"] * weights, positions)
    updated, masked = _scatter_update(original, sampled, positions)
    labels = masked * (updated != original)
    input_mask = batch["attention_mask"].astype(np.float64)
    x = rtd_logits.astype(np.float64)
    losses = (np.maximum(x, 0) - x * labels + np.log1p(np.exp(-np.abs(x)))) * input_mask
    disc = np.sum(losses) / (1e-6 + np.sum(input_mask))
    preds = np.round((np.sign(x) + 1) / 2)
    return {
        "loss": gen_weight * mlm + disc_weight * disc,
        "mlm_loss": mlm,
        "rtd_loss": disc,
        "labels": labels,
        "rtd_accuracy": np.sum((preds == labels) * input_mask) / np.sum(input_mask),
        "replaced_fraction": np.sum(labels * input_mask) / np.sum(input_mask),
    }


def test_loss_matches_numpy_port_of_electra(tiny):
    objective, params, batch, run = tiny
    outputs, _ = run(params, batch, jax.random.key(3))
    host = {k: np.asarray(v) for k, v in batch.items()}
    want = _electra_loss(
        host,
        np.asarray(outputs["mlm_logits"]),
        np.asarray(outputs["sampled_ids"]),
        np.asarray(outputs["rtd_logits"]),
    )
    np.testing.assert_array_equal(np.asarray(outputs["rtd_labels"]), want["labels"])
    assert 0 < want["labels"].sum() <= (host["masked_weights"] > 0).sum()
    got = objective.report(objective.sums(outputs, batch), objective.norms(batch))
    for name in ("loss", "mlm_loss", "rtd_loss", "rtd_accuracy", "replaced_fraction"):
        np.testing.assert_allclose(float(got[name]), want[name], rtol=2e-6, err_msg=name)


def test_sample_has_no_gradient_and_labels_follow_it(tiny):
    _, params, batch, run = tiny
    key = jax.random.key(5)
    grads = jax.tree.map(np.asarray, run(params, batch, key)[1])
    mlm, disc = (jax.tree.map(lambda g, i=i: float(g[i]), grads) for i in (0, 1))
    assert max(jax.tree.leaves(disc["generator"])) == 0.0  # through the sample: nothing
    assert max(jax.tree.leaves(disc["mlm_head"])) == 0.0
    assert disc["bert"]["embeddings"]["word_embeddings"] > 0  # the shared table learns
    assert min(jax.tree.leaves(disc["rtd_head"])) > 0
    assert max(jax.tree.leaves(mlm["rtd_head"])) == 0.0
    assert max(jax.tree.leaves(mlm["bert"]["encoder"])) == 0.0
    assert mlm["generator"]["encoder"]["layer_0"]["mlp"]["output"]["kernel"] > 0
    assert mlm["bert"]["embeddings"]["word_embeddings"] > 0

    # A generator sure of token 7: every sample is 7, so a masked position is "replaced" exactly
    # where its original is not 7 (the first masked slot of row 0 is made a 7).
    host = {k: np.array(v) for k, v in batch.items()}
    row0 = host["masked_positions"][0, 0]
    host["masked_ids"][0, 0] = 7
    original = host["input_ids"].copy()
    valid = host["masked_weights"] > 0
    rows = np.nonzero(valid)[0]
    original[rows, host["masked_positions"][valid]] = host["masked_ids"][valid]
    sure = {**params, "mlm_head": {**params["mlm_head"], "bias": np.zeros(setup.VOCAB, "f4")}}
    sure["mlm_head"]["bias"][7] = 1e4
    outputs, _ = run(sure, {k: jnp.asarray(v) for k, v in host.items()}, key)
    assert np.all(np.asarray(outputs["sampled_ids"]) == 7)
    expected = np.zeros_like(original, np.float32)
    expected[rows, host["masked_positions"][valid]] = host["masked_ids"][valid] != 7
    assert expected[0, row0] == 0  # sampled the original: real
    np.testing.assert_array_equal(np.asarray(outputs["rtd_labels"]), expected)


def test_sample_softmax_draws_from_the_softmax():
    """Two-level inverse-CDF sampling: the frequencies of 40k draws match softmax(logits) (a
    5-sigma band), across blocks and in the last, padded block; zero-probability entries never
    come up."""
    probs = np.zeros(300)
    probs[[0, 5, 127, 128, 200, 299]] = [0.05, 0.15, 0.1, 0.3, 0.25, 0.15]
    logits = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), -1e4).astype(np.float32)
    draws = jax.jit(sample_softmax)(jax.random.key(0), jnp.broadcast_to(logits, (40_000, 300)))
    frequency = np.bincount(np.asarray(draws), minlength=300) / 40_000
    assert np.all(frequency[probs == 0] == 0)
    np.testing.assert_allclose(frequency, probs, atol=5 * np.sqrt(0.25 / 40_000))


def test_auc_from_logit_bins_matches_the_exact_auc():
    rng = np.random.default_rng(0)
    labels = (rng.uniform(size=(64, 48)) < 0.15).astype(np.float32)
    logits = rng.normal(size=labels.shape) * 2.5 + 2.0 * labels - 2.0
    weights = (rng.uniform(size=labels.shape) < 0.9).astype(np.float32)
    positive, negative = electra_lib.auc_histograms(
        jnp.asarray(logits, jnp.float32), jnp.asarray(labels), jnp.asarray(weights)
    )
    got = float(electra_lib.auc_from_histograms(positive, negative))
    pos = logits[(labels == 1) & (weights > 0)]
    neg = logits[(labels == 0) & (weights > 0)]
    diff = pos[:, None] - neg[None, :]  # Mann-Whitney: P(pos > neg) + P(tie) / 2
    exact = np.mean(diff > 0) + 0.5 * np.mean(diff == 0)
    assert 0.6 < exact < 0.95
    assert abs(got - exact) < 2e-3, (got, exact)


def _train(mesh_shape):
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    config = step_config(**dict(zip(sharding.MESH_AXES, mesh_shape)))
    mesh = sharding.make_mesh(config.mesh, devices)
    cfg = setup.tiny_model_config(model_type="electra")
    state = step.init_train_state(config, cfg, mesh, jax.random.key(0))
    steps = step.jit_steps(state, mesh, step.FAST_COMPILE)
    losses = []
    for index in range(2):
        batch = sharding.global_batch(electra_batch(index), mesh, setup.BATCH)
        state, metrics = steps.train(state, batch, jax.random.key(1))
        losses.append([metrics[k] for k in ("loss", "mlm_loss", "rtd_loss", "grad_norm")])
    return state, np.array(losses)


def test_sharded_step_matches_one_device():
    """data=2 x fsdp=2 x tensor=2 (the generator's heads and units split too) against one
    device; tolerances as tests/sharding_test.py (only reduction order differs)."""
    ref_state, ref_losses = _train((1, 1, 1))
    state, losses = _train((2, 2, 2))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert np.all(losses[:, 2] > 0)
    query = state.params["generator"]["encoder"]["layer_0"]["attention"]["query_kernel"]
    assert query.sharding.shard_shape(query.shape) == (16, 1, 16)  # fsdp on width, tensor heads
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(state.params), jax.tree.leaves(ref_state.params)
    ):
        np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=5e-6, err_msg=jax.tree_util.keystr(path)
        )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 12-step ELECTRA-tiny run (shrunk as tests/trainer_test.py's runs;
    checkpoints every 4 steps)."""
    workdir = str(tmp_path_factory.mktemp("electra_reference"))
    assert _run(workdir, steps=12, every=4, config=ELECTRA)["step"] == 12
    assert _steps(workdir) == [4, 8, 12]
    return workdir


@pytest.mark.slow
def test_fine_tuning_starts_from_the_discriminator(reference):
    """init_from an ELECTRA workdir: the model config in its meta builds a classifier with
    ELECTRA's head (classifier_pooling "first": no pooler the discriminator never trained) whose
    encoder is the discriminator's, and `merge_encoder` (what fine-tuning's prepare_state runs)
    takes every discriminator weight and leaves only the classifier fresh."""
    source = PretrainedSource(reference, "config.init_from")
    cfg = source.model_config()
    assert cfg.model_type == "electra" and cfg.hidden_size == 32  # the shrunk discriminator
    assert cfg.classifier_pooling == "first"
    model = BertForSequenceClassification(cfg, num_labels=4)
    ids = jnp.zeros((1, 8), jnp.int32)
    fresh = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), ids)["params"])
    assert set(fresh) == {"bert", "classifier"} and "pooler" not in fresh["bert"]
    pretrained = source.params()
    assert {"generator", "mlm_head", "rtd_head"} <= set(pretrained)
    merged = finetune.merge_encoder(fresh, pretrained["bert"], reference)
    jax.tree.map(np.testing.assert_array_equal, merged["bert"], pretrained["bert"])
