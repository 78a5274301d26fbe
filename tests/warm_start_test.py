"""Pretraining from a pretrained model (config.init_from): a bertjax run's checkpoint copied into a
new run's state, a checkpoint tiled into a wider and deeper model (ModernBERT-large from base),
shapes that do not fit named, and a run whose tokenizer comes from the source; plus the FLOP
budget and cramming's triangle schedule."""

import os

import jax
import numpy as np
import pytest
from flax import linen as nn

from bertjax import step, trainer
from bertjax.interop.tiling import tile_params
from bertjax.objectives.warm_start import warm_start
from bertjax.training import metrics, optim, phases, sharding
from bertjax.training.run_config import model_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(small_spm, **model):
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "modernbert_tiny.py"))
    config.model.update(num_hidden_layers=2, hidden_size=32, intermediate_size=48, **model)
    config.data.update(tokenizer_model=small_spm, max_seq_length=32, max_predictions=8)
    config.batch_size, config.num_train_steps, config.eval_batches = 8, 2, 1
    config.optim.update(warmup_steps=1)
    config.log_every, config.eval_every, config.checkpoint_every = 1, 2, 0
    config.progress_bar, config.peak_flops_per_device = False, 1e12
    return config


@pytest.fixture(scope="module")
def source_run(small_spm, tmp_path_factory):
    """A finished 2-step modernbert-tiny run (its workdir is an init_from source)."""
    workdir = str(tmp_path_factory.mktemp("source"))
    trainer.train_and_evaluate(_config(small_spm), workdir)
    return workdir


def _fresh(config):
    from bertjax.data.tokenizer import Tokenizer

    cfg = model_config(config, Tokenizer(config.data.tokenizer_model))
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    return cfg, step.init_train_state(config, cfg, mesh, jax.random.key(7))


def _source_params(workdir):
    from bertjax.interop.pretrained import PretrainedSource

    source = PretrainedSource(workdir, "config.init_from")
    return source.model_config(), source.params()


@pytest.mark.slow
def test_init_from_copies_a_checkpoint_into_a_fresh_state(small_spm, source_run):
    cfg, state = _fresh(_config(small_spm))
    started = warm_start(state, source_run, cfg)
    _, want = _source_params(source_run)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(started.params), want)
    assert jax.tree.structure(started.params) == jax.tree.structure(state.params)


@pytest.mark.slow
def test_init_from_tiles_into_a_larger_model(small_spm, source_run):
    config = _config(small_spm)
    config.model.update(num_hidden_layers=3, hidden_size=48, num_attention_heads=3)
    config.model.intermediate_size = 64
    cfg, state = _fresh(config)
    with pytest.raises(ValueError, match="init_tiling=True"):
        warm_start(state, source_run, cfg)
    started = warm_start(state, source_run, cfg, tiling=True)
    small_cfg, small = _source_params(source_run)
    want = tile_params(small_cfg, small, cfg, jax.device_get(nn.unbox(state.params)))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(started.params), want)
    # layer 2 of 3 takes source layer round(2 * 2 / 3) = 1; its query kernel's centre is layer 1's
    q_small = small["bert"]["encoder"]["layer_1"]["attention"]["query_kernel"].reshape(32, 32)
    q_large = np.asarray(started.params["bert"]["encoder"]["layer_2"]["attention"]["query_kernel"])
    np.testing.assert_array_equal(q_large.reshape(48, 48)[8:40, 8:40], q_small)


@pytest.mark.slow
def test_a_pretraining_run_starts_from_a_checkpoint_with_its_tokenizer(
    small_spm, source_run, tmp_path
):
    config = _config(small_spm)
    config.data.tokenizer_model = ""  # taken from the source's checkpoint
    config.init_from = source_run
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    assert summary["step"] == 2 and 0.0 <= summary["eval/mlm_accuracy"] <= 1.0
    from bertjax.interop.pretrained import PretrainedSource

    ran, source = (PretrainedSource(d, "config.init_from") for d in (str(tmp_path), source_run))
    assert ran.tokenizer_fingerprint == source.tokenizer_fingerprint is not None


def test_a_flop_budget_sets_the_run_length(small_spm):
    config = _config(small_spm)
    cfg, _ = _fresh(config)
    objective = step.StepSpec.from_config(config, cfg).objective
    per_sequence = objective.train_flops_per_sequence(
        cfg, 32, 0.3 * 32, 8, metrics.train_flops_per_sequence
    )
    config.budget_flops = 10.5 * 8 * per_sequence  # 84 rows: 10.5 batches of 8
    budgeted = phases.apply_flop_budget(config, cfg, objective)
    assert budgeted.num_train_steps == budgeted.optim.total_steps == 11
    config.batch_warmup.update(budget_fraction=0.5, quantum=4, shape="equal_tokens")
    warm = phases.apply_flop_budget(config, cfg, objective)
    assert warm.batch_warmup.tokens == int(0.5 * 84 * 32)


def test_the_triangle_schedule_is_crammings():
    """cramming's get_budget_triangle (base_percentage 0.25, falloff 0.25), ported in float64."""
    config = optim.default_optim_config()
    config.update(schedule="triangle", total_steps=200, learning_rate=1e-3, warmup_fraction=0.0)
    schedule = optim.make_schedule(config, 256)
    x = np.arange(0, 201) / 200.0
    reference = 1e-3 * np.minimum(0.25 + x, 4.0 * (1.0 - x))
    got = np.asarray(jax.vmap(schedule)(np.arange(0, 201)))
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-6 * 1e-3)  # float32 near x = 1
    assert np.argmax(got) == 150  # the peak at 75% of the budget
