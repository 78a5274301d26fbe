"""Masked diffusion: the loss against a hand computation, SFT batches, the sampler's schedule, the
recipe."""

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import BertConfig, BertForPreTraining, diffusion, trainer
from bertjax.objectives import diffusion as diffusion_objective
from bertjax.objectives import diffusion_sampling, make_objective
from bertjax.trainer import default_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLS, SEP, MASK = 2, 3, 4


def _np_cross_entropy(logits, labels):
    logits = logits - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]


def _objective():
    return make_objective(diffusion.add_diffusion_config(default_run_config()))


def test_loss_matches_hand_computation():
    rng = np.random.default_rng(0)
    batch_size, length, vocab = 3, 6, 11
    logits = rng.normal(size=(batch_size, length, vocab)).astype(np.float32)
    ids = rng.integers(5, vocab, (batch_size, length)).astype(np.int32)
    weights = (rng.random((batch_size, length)) < 0.5).astype(np.float32)
    attention = np.ones((batch_size, length), np.int32)
    attention[2, 4:] = 0
    weights[2, 4:] = 0
    t = np.array([0.3, 0.9, 0.05], np.float32)
    batch = {
        "input_ids": np.where(weights > 0, MASK, ids),
        "attention_mask": attention,
        "masked_positions": np.tile(np.arange(length, dtype=np.int32), (batch_size, 1)),
        "masked_ids": ids,
        "masked_weights": weights,
        "mask_ratio": t,
    }
    objective = _objective()
    assert isinstance(objective, diffusion.MaskedDiffusion)
    outputs = {
        "mlm_logits": jnp.asarray(logits),
        "bound_tokens": jnp.asarray(attention.sum(1), jnp.float32),
    }
    sums, norms = objective.loss_sums(outputs, batch), objective.normalizers(batch)
    nll = _np_cross_entropy(logits.astype(np.float64), ids)
    expected = sum((nll[b] * weights[b]).sum() / t[b] for b in range(batch_size)) / attention.sum()
    np.testing.assert_allclose(float(objective.total_loss(sums, norms)), expected, rtol=1e-5)
    metrics = objective.metrics(sums, norms)
    np.testing.assert_allclose(
        float(metrics["mlm_loss"]), (nll * weights).sum() / weights.sum(), rtol=1e-5
    )
    assert 0.0 <= float(metrics["mlm_accuracy"]) <= 1.0


def test_maskable_tokens_skip_specials_and_padding():
    cfg = BertConfig.preset("tiny", vocab_size=20)
    ids = jnp.array([[CLS, 7, MASK, SEP, 9, SEP, 0, 0]])
    attention = jnp.array([[1, 1, 1, 1, 1, 1, 0, 0]])
    assert float(diffusion_objective.maskable_tokens(ids, attention, cfg)[0]) == 3.0


class _WordTokenizer:
    """Stand-in tokenizer: one id per word (ids 5..)."""

    cls_id, sep_id, mask_id, pad_id = CLS, SEP, MASK, 0

    def encode(self, texts):
        return [
            np.array([5 + (sum(map(ord, w)) % 40) for w in text.split()], np.int32)
            for text in texts
        ]


def test_sft_batch_never_masks_prompt_and_loss_uses_answer_length():
    pairs = [("a b c", "d e"), ("f g", "h i j k l"), ("m", "n")]
    batch = diffusion.sft_batch(_WordTokenizer(), pairs, 12, seed=3)
    ids, answer = batch["masked_ids"], batch["answer_mask"]
    for row, (prompt, _) in enumerate(pairs):
        start = len(prompt.split()) + 2
        assert ids[row, 0] == CLS and ids[row, start - 1] == SEP
        assert (answer[row, :start] == 0).all() and (answer[row, start:] == 1).all()
        assert (batch["input_ids"][row, :start] == ids[row, :start]).all()  # the prompt is intact
    assert not (batch["masked_weights"] * (1 - answer)).any()
    assert ((batch["input_ids"] == MASK) == (batch["masked_weights"] > 0)).all()
    # Loss = mean over rows of (Σ masked CE / t) / answer length.
    objective = _objective()
    logits = np.random.default_rng(1).normal(size=(3, 12, 50)).astype(np.float32)
    outputs = {
        "mlm_logits": jnp.asarray(logits),
        "bound_tokens": jnp.asarray(answer.sum(1), jnp.float32),
    }
    sums, norms = objective.loss_sums(outputs, batch), objective.normalizers(batch)
    nll = _np_cross_entropy(logits.astype(np.float64), ids) * batch["masked_weights"]
    expected = np.mean(nll.sum(1) / batch["mask_ratio"] / answer.sum(1))
    np.testing.assert_allclose(float(objective.total_loss(sums, norms)), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="pair 1"):
        diffusion.sft_batch(_WordTokenizer(), pairs, 8, seed=0)


def test_unigram_entropy_of_uniform_tokens():
    special = np.zeros(10, bool)
    special[:2] = True
    tokens = np.array([0, 1, 2, 3, 4, 5, 2, 3, 4, 5])
    assert math.isclose(diffusion_objective.unigram_entropy(tokens, special), math.log(4))


@pytest.fixture(scope="module")
def tiny_model():
    cfg = BertConfig(
        vocab_size=48,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        type_vocab_size=1,
    )
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(
        BertForPreTraining(cfg, next_sentence=False).init(jax.random.key(0), ids)["params"]
    )
    return cfg, params


PROMPT = np.array([[CLS, 10, 11, 12], [CLS, 20, 21, 22]], np.int32)


def test_sampler_follows_schedule_and_keeps_prompt(tiny_model):
    cfg, params = tiny_model
    ids, history = diffusion.generate(
        cfg,
        params,
        PROMPT,
        answer_length=8,
        steps=6,
        block_length=4,
        temperature=1.0,
        rng=jax.random.key(1),
        mask_id=MASK,
        return_history=True,
    )
    ids, history = np.asarray(ids), np.asarray(history)
    assert history.shape == (6, 2, 12) and (history[-1] == ids).all()
    assert (ids[:, :4] == PROMPT).all() and (history[:, :, :4] == PROMPT).all()
    # 2 blocks x 3 steps; a block's 4 masks commit as 2, 1, 1 (remainder first).
    masks = (history[:, :, 4:] == MASK).sum(-1)
    assert (masks == np.array([6, 5, 4, 2, 1, 0])[:, None]).all()
    assert (history[:3, :, 8:] == MASK).all()  # the second block waits for the first
    previous = np.concatenate([PROMPT, np.full((2, 8), MASK)], 1)
    for x in history:  # a committed token never changes
        kept = previous != MASK
        assert (x[kept] == previous[kept]).all()
        previous = x
    assert not np.isin(ids, [0, 1, CLS, MASK])[:, 4:].any()


def test_sampler_seeds_and_remasking(tiny_model):
    cfg, params = tiny_model

    def run(seed, **kw):
        kw = {"answer_length": 8, "steps": 8, "block_length": 4, **kw}
        return np.asarray(diffusion.generate(cfg, params, PROMPT, rng=jax.random.key(seed), **kw))

    assert (run(0, temperature=1.0) == run(0, temperature=1.0)).all()
    assert (run(0, temperature=1.0) != run(1, temperature=1.0)).any()
    assert (run(0) == run(5)).all()  # greedy with low-confidence remasking ignores the seed
    random = run(0, temperature=0.5, remasking="random")
    assert not (random == MASK).any() and (random[:, :4] == PROMPT).all()
    with pytest.raises(ValueError, match="block_length"):
        run(0, block_length=3)
    with pytest.raises(ValueError, match="steps"):
        diffusion.generate(cfg, params, PROMPT, answer_length=8, steps=3, block_length=4)


def test_gumbel_noise_from_64_bits_matches_exact_values():
    """-log(-log u) for u = (high * 2^32 + low + 1/2) / 2^64, against 40-digit mpmath, in float32
    (x64 off) and float64 (x64 on); its tail reaches ~45 where float32 uniforms stop at ~16."""
    import mpmath

    mpmath.mp.dps = 40
    rs = np.random.RandomState(0)
    top = np.uint32(2**32 - 1)
    high = np.concatenate([rs.randint(0, 2**32, 400, np.uint64), [0, top, 2**31, 2**31 - 1, top]])
    low = np.concatenate([rs.randint(0, 2**32, 400, np.uint64), [0, top, 0, top, 0]])
    high, low = high.astype(np.uint32), low.astype(np.uint32)
    want = np.array(
        [
            float(-mpmath.log(-mpmath.log((mpmath.mpf(int(h) * 2**32 + int(lo)) + 0.5) / 2**64)))
            for h, lo in zip(high, low)
        ]
    )
    got32 = np.asarray(diffusion_sampling.gumbel_from_bits(jnp.asarray(high), jnp.asarray(low)))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, rtol=3e-6, atol=3e-6)
    with jax.enable_x64(True):
        got64 = diffusion_sampling.gumbel_from_bits(
            jnp.asarray(high), jnp.asarray(low), jnp.float64
        )
        assert diffusion_sampling.sampling_dtype() == jnp.float64  # CPU with x64
    np.testing.assert_allclose(np.asarray(got64), want, rtol=1e-13, atol=1e-13)
    assert want[-4] > 45.0 and got32[-4] > 45.0  # u = 1 - 2^-65
    low_precision = jax.random.gumbel(jax.random.key(0), (1 << 20,), jnp.float32, mode="low")
    assert float(low_precision.max()) < 16.7  # jax's float32 default: the tail is cut


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_sampled_tokens_follow_softmax_at_temperature(x64):
    """At T > 0 the sampler draws from softmax(logits / T) (chi-square and per-token 5-sigma
    checks over 200k draws); at T = 0 it is the argmax."""
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -2.5, -4.0, -7.0])
    temperature, draws = 0.7, 200_000
    p = np.exp(logits / temperature - np.max(logits / temperature))
    p /= p.sum()
    with jax.enable_x64(x64):
        rows = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (draws, 1, logits.size))
        sample = jax.jit(diffusion_sampling.sample_tokens)
        ids = np.asarray(sample(rows, jnp.float32(temperature), jax.random.key(3))).ravel()
        greedy = np.asarray(sample(rows[:4], jnp.float32(0.0), jax.random.key(3)))
    counts = np.bincount(ids, minlength=logits.size)
    sigma = np.sqrt(draws * p * (1 - p))
    assert np.all(np.abs(counts - draws * p) < 5 * sigma + 1), (counts, draws * p)
    chi2 = np.sum((counts - draws * p) ** 2 / (draws * p))
    assert chi2 < 24.3, chi2  # 7 degrees of freedom: p-value 0.001
    assert (greedy == 0).all()


@pytest.mark.slow
def test_diffusion_tiny_recipe_trains_and_generates(tmp_path, capsys, small_spm):
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "diffusion_tiny.py"))
    config.batch_size, config.num_train_steps = 8, 3
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size, config.model.num_hidden_layers = 64, 2
    config.data.max_seq_length, config.data.max_predictions = 32, 6
    config.data.tokenizer_model = small_spm  # the session's 400-piece model of the built-in corpus
    config.model.max_position_embeddings = 64
    config.optim.warmup_steps = 1
    config.log_every, config.eval_every, config.eval_batches = 1, 3, 1
    config.checkpoint_every, config.progress_bar = 0, False
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    assert summary["step"] == 3 and np.isfinite(summary["train/loss"])
    assert summary["eval/nll_bound"] > 0 and 0 <= summary["eval/mlm_accuracy"] <= 1
    texts = diffusion.main(
        [
            "--workdir",
            str(tmp_path),
            "--prompt",
            "The module",
            "--answer_length",
            "8",
            "--steps",
            "4",
            "--block_length",
            "4",
        ]
    )
    assert len(texts) == 1 and "The module |||" in capsys.readouterr().out


def test_flops_count_the_head_at_every_position_whatever_the_mask_rate():
    """The step runs the MLM head at all T slots (masked_positions = 0..T-1), so the FLOP count
    (MFU, equal-compute budgets) must not scale with the row's mask rate t."""
    from bertjax.training import metrics

    cfg = BertConfig.preset("tiny", vocab_size=200)
    config = default_run_config()
    diffusion.add_diffusion_config(config)
    objective = make_objective(config)
    rows, length = 4, 32
    counts = []
    for seed in (0, 1):
        batch = objective.example_batch(cfg, rows, length, seed)
        batch["masked_weights"] = (
            (np.arange(length) < (4 if seed else 28)).astype(np.float32)[None].repeat(rows, 0)
        )
        counts.append(objective.batch_flops(cfg, batch, rows, metrics.train_flops_per_sequence))
    whole = rows * metrics.train_flops_per_sequence(cfg, length, float(length))
    assert counts[0] == counts[1] == pytest.approx(whole)
