"""Causal LM on the encoder: next-token rows, the loss against a numpy port, no information from
later positions through the full model (padded and packed rows, local and global layers), and a
tiny run that beats every unigram model on held-out text."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import BertConfig, trainer
from bertjax.data import make_pipeline
from bertjax.data.corruption.causal import causal_batch
from bertjax.modeling.embeddings import Embeddings
from bertjax.objectives import make_objective
from bertjax.objectives.causal_lm import CausalLM, add_clm_config
from bertjax.trainer import default_run_config

MASK = 4
# Row 0: one sample padded at the end; row 1: two packed samples and padding.
SEGMENTS = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 2, 2, 2, 2, 0]], np.int32)


def _np_log_softmax(logits):
    logits = logits - logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _np_clm_loss(logits, ids, segments):
    """GPT's loss, spelled out: -log p(x[t+1] | x[:t+1]) averaged over the positions whose next
    token is real and of the same sample."""
    log_probs = _np_log_softmax(logits.astype(np.float64))
    total, count = 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            if segments[b, t] > 0 and segments[b, t + 1] == segments[b, t]:
                total -= log_probs[b, t, ids[b, t + 1]]
                count += 1
    return total / count


@pytest.fixture(scope="module")
def setup():
    cfg = BertConfig.preset(
        "tiny",
        vocab_size=40,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        local_attention_window=4,  # layer 0 local, layer 1 global
        global_attn_every_n_layers=2,
    )
    rng = np.random.default_rng(0)
    ids = np.where(SEGMENTS > 0, rng.integers(5, 40, SEGMENTS.shape), 0).astype(np.int32)
    maskable = SEGMENTS > 0
    keys = np.array([11, 12], np.uint64)
    batch = causal_batch(ids, SEGMENTS, maskable, keys, 0.0, MASK)
    batch.update(attention_mask=(SEGMENTS > 0).astype(np.int32), segment_ids=SEGMENTS)
    objective = CausalLM()
    model = objective.model(cfg)
    variables = objective.init(model, {"params": jax.random.key(1)}, batch)
    return cfg, ids, batch, objective, model, variables


def test_rows_target_the_next_token_of_the_same_sample_and_mask_only_inputs():
    ids = np.arange(10, 26, dtype=np.int32).reshape(2, 8)
    keys = np.array([3, 4], np.uint64)
    plain = causal_batch(ids, SEGMENTS, SEGMENTS > 0, keys, 0.0, MASK)
    np.testing.assert_array_equal(plain["input_ids"], ids)
    expected_weights = [[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 1, 1, 0, 0]]
    np.testing.assert_array_equal(plain["masked_weights"], expected_weights)
    np.testing.assert_array_equal(plain["masked_ids"][0, :5], ids[0, 1:6])
    np.testing.assert_array_equal(plain["masked_ids"][1, [0, 1, 3, 4, 5]], ids[1, [1, 2, 4, 5, 6]])
    wide = np.tile(np.arange(10, 522, dtype=np.int32), (64, 1))
    segments = np.ones_like(wide)
    masked = causal_batch(wide, segments, segments > 0, np.arange(64, dtype=np.uint64), 0.3, MASK)
    share = (masked["input_ids"] == MASK).mean()
    assert 0.28 < share < 0.32, share
    unmasked = causal_batch(wide, segments, segments > 0, np.arange(64, dtype=np.uint64), 0, MASK)
    np.testing.assert_array_equal(masked["masked_ids"], unmasked["masked_ids"])  # targets stay


def test_loss_matches_numpy_port(setup):
    cfg, ids, batch, objective, model, variables = setup
    outputs = objective.apply(model, variables, batch, None, True)
    sums, norms = objective.sums(outputs, batch), objective.norms(batch)
    expected = _np_clm_loss(np.asarray(outputs["mlm_logits"]), ids, SEGMENTS)
    np.testing.assert_allclose(float(objective.loss(sums, norms)), expected, rtol=1e-5)
    metrics = objective.report(sums, norms)
    np.testing.assert_allclose(float(metrics["clm_perplexity"]), np.exp(expected), rtol=1e-4)


def test_no_gradient_from_later_positions_through_the_full_model(setup):
    """d loss_i / d embedding_j is exactly zero for j > i and across packed samples (and nonzero
    for j = i), through embeddings, a local and a global causal layer and the tied head."""
    cfg, ids, batch, objective, model, variables = setup
    shape = (*ids.shape, cfg.hidden_size)

    def per_position_nll(delta):
        def add_delta(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            if isinstance(context.module, Embeddings) and context.method_name == "__call__":
                out = out + delta
            return out

        with nn.intercept_methods(add_delta):
            logits = objective.apply(model, variables, batch, None, True)["mlm_logits"]
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(log_probs, batch["masked_ids"][..., None], -1)[..., 0]

    _, pullback = jax.vjp(per_position_nll, jnp.zeros(shape, jnp.float32))

    def through(i):  # d nll[:, i] / d delta, [B, T, D]
        return pullback(jnp.zeros(ids.shape).at[:, i].set(1.0))[0]

    length = ids.shape[1]
    dependence = np.abs(np.asarray(jax.jit(jax.vmap(through))(jnp.arange(length)))).sum(-1)
    for b in range(ids.shape[0]):
        for i in range(length):
            if not batch["masked_weights"][b, i]:
                continue
            for j in range(length):
                if j > i or SEGMENTS[b, j] != SEGMENTS[b, i]:
                    assert dependence[i, b, j] == 0.0, (b, i, j)
            assert dependence[i, b, i] > 0.0, (b, i)


@pytest.mark.slow
def test_tiny_clm_run_beats_every_unigram_model(tmp_path, small_spm, one_device):
    """Held-out next-token NLL below the empirical entropy of the held-out targets (what the best
    context-free predictor would reach on them), with input masking on in training."""
    config = add_clm_config(default_run_config())
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size, config.model.num_hidden_layers = 64, 2
    config.model.max_position_embeddings = 64
    config.data.max_seq_length, config.data.tokenizer_model = 32, small_spm  # 400 pieces
    config.data.sample_plan = "full_sentences"
    config.data.input_mask_rate = 0.1
    config.batch_size, config.num_train_steps = 16, 150
    config.optim.learning_rate, config.optim.warmup_steps = 3e-3, 10
    config.log_every, config.eval_every, config.eval_batches = 150, 150, 4
    config.checkpoint_every, config.progress_bar = 0, False
    assert isinstance(make_objective(config), CausalLM)
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    data = make_pipeline(config, str(tmp_path), split="eval")
    try:
        targets = np.concatenate(
            [b["masked_ids"][b["masked_weights"] > 0] for b in data.eval_batches(4)]
        )
    finally:
        data.close()
    counts = np.bincount(targets).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    entropy = float(-(p * np.log(p)).sum())
    assert summary["eval/clm_loss"] < entropy - 0.2, (summary["eval/clm_loss"], entropy)
