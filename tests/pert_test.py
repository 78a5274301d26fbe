"""PERT: shuffled batches against the paper's definition, the position loss against numpy, a tiny
run whose loss falls, and fine-tuning from its checkpoint."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import first_device_only

from bertjax import trainer
from bertjax.data import keys, make_pipeline
from bertjax.data.corruption import masking, permutation
from bertjax.interop.pretrained import PretrainedSource
from bertjax.objectives import finetune, make_objective
from bertjax.objectives.pert import PermutedLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERT_NGRAMS = (0.4, 0.3, 0.2, 0.1)  # PERT §3.2: 1-4 word spans at 40/30/20/10%
STEPS = 150  # the tiny run


def _synthetic_rows(batch, width, seed=0):
    """[CLS] A [SEP] B [SEP] [PAD].. rows of distinct random pieces, 70% of them word starts."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(width // 2, width + 1, batch)
    t = np.arange(width)[None, :]
    real = t < lengths[:, None]
    ids = np.stack([rng.permutation(np.arange(5, 5 + width)) for _ in range(batch)])
    ids = np.where(real, ids, 0).astype(np.int32)
    rows = np.arange(batch)
    ids[:, 0], ids[rows, lengths // 2], ids[rows, lengths - 1] = 2, 3, 3
    return ids, real & (ids >= 5), rng.random((batch, width)) < 0.7


def _pert(ids, maskable, starts, index=None, permute_prob=0.9, predictions=20):
    spec = masking.MaskSpec(
        mode="pert", max_predictions=predictions, ngram_probs=PERT_NGRAMS, permute_prob=permute_prob
    )
    index = np.arange(len(ids)) if index is None else index
    return masking.mask_batch(
        ids,
        maskable,
        starts,
        keys.row_keys(0, 0, "mask", index),
        spec,
        mask_id=4,
        normal_ids=np.arange(5, 1000, dtype=np.int32),
    )


def test_pert_batches_follow_the_paper_definition():
    ids, maskable, starts = _synthetic_rows(3000, 128)
    out = _pert(ids, maskable, starts)
    new, positions, targets = out["input_ids"], out["masked_positions"], out["target_positions"]
    valid = out["masked_weights"] > 0
    assert not (new == 4).any()  # no [MASK]: every token of the row is still there ...
    np.testing.assert_array_equal(np.sort(new, 1), np.sort(ids, 1))
    chosen = np.zeros(ids.shape, bool)
    chosen[np.nonzero(valid)[0], positions[valid]] = True
    np.testing.assert_array_equal(new[~chosen], ids[~chosen])  # ... moved only among the selected
    # The target at a selected position i is where its original token now is: gathering the
    # shuffled row at the targets restores the text (README: "位置2（明）→位置3（表）").
    rows = np.nonzero(valid)[0]
    np.testing.assert_array_equal(new[rows, targets[valid]], ids[rows, positions[valid]])
    for r in range(200):  # the targets of a row are its selected positions, each once
        np.testing.assert_array_equal(np.sort(targets[r][valid[r]]), positions[r][valid[r]])
    # 90% of the selected tokens are shuffled (a uniform permutation among them), 10% kept:
    # E[moved] = sum over rows of 0.9 n - P(at least one shuffled) (one fixed point on average).
    n = valid.sum(1)
    moved = (targets != positions) & valid
    expected = (0.9 * n - (1 - 0.1**n)).sum()
    assert abs(moved.sum() / expected - 1) < 0.02, (moved.sum(), expected)
    # Selection: 15% of the input (budget k), whole-word spans of 1-4 words at 40/30/20/10%.
    spec = masking.MaskSpec(mode="pert", max_predictions=20, ngram_probs=PERT_NGRAMS)
    k = masking.budget(maskable, spec)
    assert 0.9 * k.sum() <= n.sum() <= k.sum() * 1.01
    row_keys = keys.row_keys(0, 0, "mask", np.arange(3000))
    _, words, _ = masking.select(maskable, starts, row_keys, spec)
    shares = np.bincount(words[words > 0], minlength=5)[1:] / (words > 0).sum()
    np.testing.assert_allclose(shares, PERT_NGRAMS, atol=0.02)
    part = np.array([3, 1500, 2999])  # a pure function of the row key
    alone = _pert(ids[part], maskable[part], starts[part], index=part)
    for key in ("input_ids", "masked_positions", "target_positions"):
        np.testing.assert_array_equal(alone[key], out[key][part])


def test_a_three_cycle_points_at_the_original_tokens_new_place():
    # Slots 0,1,2 at positions 4,7,9; whatever the shuffle, position p's target holds ids[p].
    ids = np.arange(20, dtype=np.int32)[None, :] + 5
    positions = np.array([[4, 7, 9]], np.int32)
    for seed in range(20):
        row_keys = keys.row_keys(seed, 0, "m", np.arange(1))
        new, targets = permutation.permute(
            ids, positions, np.ones((1, 3), bool), row_keys, 1.0, (9, 10)
        )
        np.testing.assert_array_equal(new[0, targets[0]], ids[0, positions[0]])
        moved_from = {int(new[0, p]) - 5: int(p) for p in positions[0]}  # token -> new place
        assert [moved_from[int(p)] for p in positions[0]] == targets[0].tolist()


def _np_position_loss(logits, real, targets, weights):
    logits = np.where(real[:, None, :] > 0, logits.astype(np.float64), -1e9)
    logits = logits - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    return (nll * weights).sum() / weights.sum()


def test_position_loss_matches_numpy():
    rng = np.random.default_rng(0)
    b, p, t = 3, 4, 7
    logits = rng.normal(size=(b, p, t)).astype(np.float32)
    real = np.ones((b, t), np.int32)
    real[1, 5:] = 0
    targets = rng.integers(0, 5, (b, p)).astype(np.int32)
    weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    batch = {"target_positions": targets, "masked_weights": weights, "input_ids": real}
    masked = np.where(real[:, None, :] > 0, logits, -1e9)  # what PositionHead hands the loss
    objective = PermutedLM()
    sums = objective.loss_sums({"position_logits": jnp.asarray(masked)}, batch)
    norms = objective.normalizers(batch)
    loss = float(objective.total_loss(sums, norms))
    np.testing.assert_allclose(loss, _np_position_loss(logits, real, targets, weights), rtol=1e-5)


def _pert_config(spm):
    from bertjax.trainer import load_config_file

    config = load_config_file(os.path.join(ROOT, "configs", "pert_zh.py"))
    config.data.language, config.data.corpus, config.data.tokenizer_model = "en", "builtin", spm
    config.model.update(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=64,
        dtype="float32",
    )
    config.batch_size, config.num_train_steps = 16, STEPS
    config.data.max_seq_length, config.data.max_predictions = 64, 10
    config.optim.update(name="adamw", learning_rate=2e-3, warmup_steps=5, base_batch_size=16)
    config.log_every, config.eval_every, config.eval_batches = 10, STEPS, 2
    config.checkpoint_every, config.progress_bar = STEPS, False
    return config


@pytest.fixture(scope="module")
def pert_run(tmp_path_factory, small_spm):
    workdir = str(tmp_path_factory.mktemp("pert"))
    with first_device_only():  # 150 steps: one device, not the worker's eight
        summary = trainer.train_and_evaluate(_pert_config(small_spm), workdir)
    return workdir, summary


def _guess_loss(batches):
    """Held-out loss of the best guess that ignores the text: its own position with the share s
    of targets that point at themselves (kept tokens, fixed points), else uniform over the row's
    other real positions."""
    own, real = [], []
    for b in batches:
        v = b["masked_weights"] > 0
        own.append((b["target_positions"] == b["masked_positions"])[v])
        real.append(np.broadcast_to(b["attention_mask"].sum(1)[:, None], v.shape)[v])
    own, real = np.concatenate(own), np.concatenate(real).astype(np.float64)
    s = own.mean()
    return -(s * np.log(s) + (1 - s) * np.log((1 - s) / (real - 1))).mean()


@pytest.mark.slow
def test_pert_loss_falls_on_the_builtin_corpus(pert_run, small_spm, tmp_path):
    workdir, summary = pert_run
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        losses = [r["train/pert_loss"] for r in map(json.loads, f) if "train/pert_loss" in r]
    assert summary["step"] == STEPS and losses[-1] < 0.6 * losses[0], losses
    config = _pert_config(small_spm)
    data = make_pipeline(config, str(tmp_path), process_index=0, process_count=1)
    guess = _guess_loss(data.eval_batches(config.eval_batches))
    # Below the text-blind guess: the model tells displaced tokens from kept ones.
    assert summary["eval/pert_loss"] < guess - 0.1, (summary["eval/pert_loss"], guess)
    assert "eval/mlm_loss" not in summary and "eval/majority_baseline" not in summary


@pytest.mark.slow
def test_fine_tuning_starts_from_a_pert_checkpoint(pert_run, tmp_path):
    workdir, _ = pert_run
    pert = PretrainedSource(workdir, "config.init_from").params()
    assert "position_head" in pert and "pooler" not in pert["bert"]
    config = finetune.add_finetune_config(trainer.default_run_config(), "classification", 4)
    config.init_from = workdir  # a PERT workdir, as any bertjax pretraining workdir
    config.batch_size, config.num_train_steps, config.progress_bar = 8, 1, False
    config.data.max_seq_length, config.eval_batches, config.peak_flops_per_device = 32, 1, 1e12
    config.optim.learning_rate = 1e-30  # the saved step-1 encoder is the one it started from
    config.eval_every, config.checkpoint_every, config.log_every = 1, 0, 1
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    assert summary["step"] == 1 and 0.0 <= summary["eval/accuracy"] <= 1.0
    tuned = PretrainedSource(str(tmp_path), "fine-tuned").params()
    assert "classifier" in tuned and "pooler" in tuned["bert"]  # fresh: PERT has no pooler
    encoder = _leaves(tuned["bert"])
    for path, leaf in _leaves(pert["bert"]).items():
        np.testing.assert_array_equal(encoder[path], leaf, err_msg=path)


def _leaves(tree):
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}


def test_pert_objective_and_masking_come_together(small_spm):
    config = _pert_config(small_spm)
    assert isinstance(make_objective(config), PermutedLM)
    config.data.masking = "ngram"
    with pytest.raises(ValueError, match="config.data.masking='pert'"):
        make_objective(config)
    config.data.masking, config.loss.objective = "pert", "pretraining"
    with pytest.raises(ValueError, match="config.loss.objective='pert'"):
        make_objective(config)
