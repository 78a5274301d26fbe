"""Fitting a recipe to the hardware (bertjax/aot/fit.py): on this process's 8 CPU devices with a
memory budget set below what the recipe's step needs, train.py's trainer chooses microbatches by
compiling candidates (the compiler's memory analysis), prints and saves the choice, keeps it in
the workdir; a run resumed with another choice (here: the fit off) continues exactly, because
the microbatches add up to the batch's gradient. The search's order and its one line when
nothing fits are checked on a measure written out (no compile)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from helpers import final_params

from bertjax import trainer
from bertjax.aot import estimate, fit, plan
from bertjax.training.run_config import model_config

GIB = 1 << 30


def _config(**overrides):
    config = trainer.load_config_file(os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "bert_tiny.py:smoke"))  # fmt: skip
    with config.unlocked():
        config.batch_size = 32  # 4 rows a device
        config.num_train_steps = 3
        config.checkpoint_every = 1
        config.keep_checkpoints = 5
        config.log_every = 1
        config.eval_every = 0
        config.progress_bar = False
        config.model.hidden_dropout_prob = 0.0  # masks depend on the microbatch: none here
        config.model.attention_probs_dropout_prob = 0.0
        for key, value in overrides.items():
            config[key] = value
    return config


def test_the_fit_chooses_microbatches_and_a_resume_without_them_continues_exactly(tmp_path, capsys):
    config = _config()
    model_cfg = model_config(config, plan._Ids(int(config.data.vocab_size)))
    devices = jax.devices()
    assert len(devices) == 8

    def measured(k):
        return fit.compiled_bytes(fit.lower_train(fit.with_settings(config, k, "none", 1),
                                                  model_cfg, devices))  # fmt: skip

    one, two = measured(1), measured(2)
    assert one > two  # microbatches need less memory: the budget falls between
    # the traced estimate (no compile) lands near what the compiler said (ratios 0.97, 1.12)
    estimated = estimate.Estimator(config, model_cfg, devices)
    for k, compiled in ((1, one), (2, two)):
        assert 0.8 < estimated(fit.with_settings(config, k, "none", 1)) / compiled < 1.3
    budget_gib = (one + two) / 2 / (1.0 - fit.HEADROOM) / GIB
    workdir = str(tmp_path / "run")
    summary = trainer.train_and_evaluate(_config(fit_memory_gib=budget_gib), workdir)
    printed = capsys.readouterr().out
    assert "fit (chosen): 2 microbatches of 2 rows a device, remat none, fsdp 1" in printed
    assert summary["step"] == 3

    meta = json.load(open(os.path.join(workdir, "checkpoints", "3", "meta", "metadata")))
    assert meta["fit"]["microbatches"] == 2 and meta["config"]["optim"]["grad_accum_steps"] == 2
    [cached] = os.listdir(os.path.join(workdir, "fit"))
    again = fit.fit_run(_config(fit_memory_gib=budget_gib), model_cfg, workdir)[1]
    assert again.cached and again.microbatches == 2  # a restart does not search again
    # as configured, then where the estimate meets the budget (without it: 1, 4, 2)
    assert [t[0] for t in again.tried] == [1, 2] and not again.ruled_out

    fitted = final_params(workdir, 3)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))
    resumed = trainer.train_and_evaluate(_config(fit="off"), workdir)  # step 3 in one batch
    assert "fit (" not in capsys.readouterr().out
    assert resumed["step"] == 3
    np.testing.assert_allclose(resumed["train/loss"], summary["train/loss"], rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        final_params(workdir, 3),
        fitted,
    )


def test_the_search_takes_microbatches_then_remat_then_fsdp_and_says_when_nothing_fits():
    """A measure written out (bytes by (microbatches, remat, fsdp)): the search's order of cost
    and its one line."""
    config = _config()
    with config.unlocked():
        config.batch_size = 64  # 8 rows a device

    def measure_of(table):
        def measure(c):
            key = (int(c.optim.grad_accum_steps), c.model.remat, int(c.mesh.fsdp))
            return table(*key)

        return measure

    # activations fall with microbatches, remat divides them (dots by 2, full by 4), FSDP shards
    # the state (40 replicated)
    def memory(k, remat, fsdp):
        return 40 + 80 // k // {"none": 1, "dots": 2, "full": 4}[remat] + 40 // fsdp

    def chosen(budget, additive=True):
        c = fit.search(config, measure_of(memory), budget, 8, 8, additive)
        return c.microbatches, c.remat, c.fsdp

    assert chosen(200) == (1, "none", 1)  # fits as configured (160)
    assert not fit.search(config, measure_of(memory), 200, 8, 8).changed
    assert chosen(100) == (4, "none", 1)  # the fewest microbatches that fit
    assert chosen(85) == (8, "dots", 1)  # one row a microbatch is not enough without remat
    assert chosen(60) == (2, "full", 4)  # nor with full remat without FSDP
    assert chosen(100, additive=False) == (1, "full", 1)  # rows that interact: no microbatches
    with config.unlocked():
        config.batch_size = 4608  # 576 rows a device, 21 divisors: the probes aim, 4 compiles
    wide = fit.search(config, measure_of(lambda k, *_: 10 + 1000 / k), 40, 8, 8)
    assert wide.microbatches == 36 and [t[0] for t in wide.tried] == [1, 576, 36, 32]
    with pytest.raises(fit.DoesNotFit, match="even one row a device") as refused:
        fit.search(config, measure_of(lambda *_: None), 60, 8, 8)
    assert "\n" not in str(refused.value)


def test_the_estimate_keeps_far_too_large_candidates_uncompiled_and_never_decides_alone():
    """A measure and an estimate written out: a recipe that fits costs one compile as before; one
    far too large is never compiled as configured (the slowest compile, for a "no"); an estimate
    that rules out what fits is overridden by compiling the cheapest candidate."""
    config = _config()
    with config.unlocked():
        config.batch_size = 4608  # 576 rows a device

    def measure_of(table):
        return lambda c: table(int(c.optim.grad_accum_steps), c.model.remat, int(c.mesh.fsdp))

    memory = lambda k, remat, fsdp: 10 + 1000 / k  # noqa: E731  (no remat or FSDP effect)
    estimate_of = lambda ratio: measure_of(lambda *key: ratio * memory(*key))  # noqa: E731

    fitted = fit.search(config, measure_of(memory), 2000, 8, 8, estimate=estimate_of(1.8))
    assert [t[0] for t in fitted.tried] == [1] and not fitted.changed  # fits: one compile

    far = fit.search(config, measure_of(memory), 40, 8, 8, estimate=estimate_of(1.8))
    assert far.microbatches == 36  # as without the estimate (1, 576, 36, 32 compiled)
    assert 1 not in [t[0] for t in far.tried] and (1, "none", 1) in [r[:3] for r in far.ruled_out]
    assert [t[0] for t in far.tried] == [96, 36, 32]  # where it meets 40, then it scaled by 96's
    assert "3 compiled, " in far.describe() and "ruled out by the estimate" in far.describe()

    wrong = fit.search(config, measure_of(memory), 40, 8, 8, estimate=estimate_of(1000))
    assert wrong.microbatches == 36  # every candidate ruled out: the cheapest compiled, it fits
    with pytest.raises(fit.DoesNotFit):
        fit.search(config, measure_of(memory), 5, 8, 8, estimate=estimate_of(1000))


def test_a_candidates_remat_reaches_the_model_train_py_built_before_the_fit():
    """train.py builds its BertConfig (remat none) before the fit: a candidate with remat full
    lowers a rematerialized step (more optimization barriers: `jax.checkpoint`'s)."""
    config = _config()
    model_cfg = model_config(config, plan._Ids(int(config.data.vocab_size)))
    assert model_cfg.remat == "none"

    def lowered(remat):
        candidate = fit.with_settings(config, 1, remat, 1)
        return fit.lower_train(candidate, model_cfg, jax.devices()).as_text()

    barriers = {r: lowered(r).count("stablehlo.optimization_barrier") for r in ("none", "full")}
    assert barriers["full"] > barriers["none"]
    assert fit.with_model_remat(model_cfg, fit.with_settings(config, 1, "dots")).remat == "dots"


def test_batch_sizes_that_do_not_split_over_the_mesh_are_named():
    """configs/phases_tiny.py warms its batch up through 4, 8 and 12 rows to 16: on 8 devices
    the fit names the sizes that do not split (train.py could not shard them either); on 4 each
    size splits and a microbatch count must divide 1, 2, 3 and 4 rows a device."""
    from bertjax.aot import search

    config = trainer.load_config_file(os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "phases_tiny.py"))  # fmt: skip
    with pytest.raises(ValueError, match=r"batch size\(s\) \[4, 12\] .* 8 batch shards"):
        search.rows_per_device(config, 8)
    assert search.rows_per_device(config, 4) == 1
    assert search.rows_per_device(config, 2) == 2
