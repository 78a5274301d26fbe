"""Multi-phase runs and batch-size warmup: the batch plan's counts, phases planned from one
config, batches independent of the host and device counts during warmup, and kill -9 inside a
phase (during a batch-size change) resumed through the next phases to a run bitwise equal to an
uninterrupted one (configs/phases_tiny.py, shrunk); the same at the switch
from CLM to MLM (configs/clm_mlm_tiny.py)."""

import json
import os
import signal
import sys

import jax
import numpy as np
import pytest
import warm_python
from helpers import QUIET_RUN, xla_flags

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.plans.batch_plan import BatchPlan
from bertjax.training import phases, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "phases_tiny.py")
# Both phased recipes' runs: a width-32 model, logs every 2 steps, no eval but the last.
PHASE_RUN = [
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=48",
    "--config.log_every=2",
    "--config.eval_every=1000",
    "--config.eval_batches=1",
    *QUIET_RUN,
]
# Phase 1: 12 steps at T=64, batches 4, 8, 12 for two steps each, then 16; phases 2 and 3: 6 steps.
SHRINK = [
    "--config.phases.pretrain.steps=12",
    "--config.phases.extend.steps=6",
    "--config.phases.decay.steps=6",
    "--config.batch_warmup.tokens=3072",
    "--config.checkpoint_every=4",
    *PHASE_RUN,
]
KILLER = (  # train.py, killed with SIGKILL right after step BERTJAX_TEST_KILL_AT (saved first)
    "import os, signal, sys, runpy\n"
    "from bertjax.training import trainer\n"
    "original, kill_at = trainer._Run._after_step, int(os.environ['BERTJAX_TEST_KILL_AT'])\n"
    "def after(self, done, total):\n"
    "    stop = original(self, done, total)\n"
    "    if done == kill_at:\n"
    "        self.ckpt.wait()\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "    return stop\n"
    "trainer._Run._after_step = after\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def _config(small_spm):
    config = trainer.load_config_file(CONFIG)
    config.data.tokenizer_model = small_spm
    return config


def test_batch_plan_counts_samples_and_inverts():
    config = trainer.default_run_config()
    config.batch_size = 16
    config.batch_warmup.update(tokens=64 * 2 * (4 + 8 + 12), quantum=4)
    plan = BatchPlan.from_config(config, 64)
    assert (plan.sizes, plan.stage_steps, plan.quantum) == ((4, 8, 12), (2, 2, 2), 4)
    sizes = [plan.batch(s) for s in range(10)]
    assert sizes == [4, 4, 8, 8, 12, 12, 16, 16, 16, 16]
    assert [plan.samples_before(s) for s in range(11)] == list(np.cumsum([0, *sizes]))
    for samples in range(0, 150, 7):
        step = plan.steps_for_samples(samples)
        assert plan.samples_before(step) >= samples > plan.samples_before(step - 1) or step == 0
    assert [int(plan.batch_at(s)) for s in range(8)] == sizes[:8]
    config.batch_warmup.shape = "equal_tokens"  # cramming's ramp: 4 x 4 ~ 8 x 2 ~ 12 x 1 rows
    config.batch_warmup.tokens = 64 * 48
    ramp = BatchPlan.from_config(config, 64)
    assert ramp.stage_steps == (4, 2, 1) and ramp.samples_before(7) == 44
    assert [ramp.batch(s) for s in range(8)] == [4, 4, 4, 4, 8, 8, 12, 16]
    assert [int(ramp.batch_at(s)) for s in range(8)] == [4, 4, 4, 4, 8, 8, 12, 16]
    config.batch_warmup.quantum = 5
    with pytest.raises(ValueError, match="quantum 5 must divide config.batch_size=16"):
        BatchPlan.from_config(config, 64)


def test_phases_are_planned_from_one_config(small_spm):
    config = _config(small_spm)
    planned = phases.plan_phases(config)
    assert [(p.name, p.start, p.end) for p in planned] == [
        ("pretrain", 0, 24),
        ("extend", 24, 40),
        ("decay", 40, 60),
    ]
    extend = planned[1].config
    assert (extend.data.max_seq_length, extend.model.rope_theta, extend.batch_size) == (
        128,
        160000.0,
        8,
    )
    assert planned[2].config.data.mask_rate == 0.15 and planned[0].config.data.mask_rate == 0.3
    assert [p.config.seed for p in planned] == [0, 7919, 15838]
    assert all(p.config.optim.total_steps == p.end - p.start for p in planned)
    config.phases.extend.tokens, config.phases.extend.steps = 128 * 8 * 10, 0
    assert phases.plan_phases(config)[1].end - phases.plan_phases(config)[1].start == 10
    config.phases.extend.set.model.hidden_size = 32
    with pytest.raises(ValueError, match="changes parameter shapes"):
        phases.plan_phases(config)
    config = _config(small_spm)
    config.phases.decay.set.optim.learning_rte = 1.0
    with pytest.raises(ValueError, match="learning_rte"):
        phases.plan_phases(config)


def test_batches_do_not_depend_on_host_or_device_count(small_spm, tmp_path):
    """During batch warmup the rows of step n are the same on 1 host as on 2 (each building its
    half), and the global batch on 1 device equals that on 8."""
    config = phases.plan_phases(_config(small_spm))[0].config
    config.data.cache_dir = str(tmp_path / "cache")
    config.batch_size = 32  # batches of 8, 16, 24 for two steps each, then 32 (8 devices)
    config.batch_warmup.update(quantum=8, tokens=64 * 2 * (8 + 16 + 24))
    one = make_pipeline(config, str(tmp_path), process_index=0, process_count=1)
    halves = [
        make_pipeline(config, str(tmp_path), process_index=i, process_count=2) for i in (0, 1)
    ]
    single = sharding.make_mesh(config.mesh, jax.devices()[:1])
    eight = sharding.make_mesh(config.mesh, jax.devices()[:8])
    for step in range(0, 8):
        whole = one.compute_batch(step)
        size = one.step_batch_size(step)
        assert whole["input_ids"].shape[0] == size
        parts = [h.compute_batch(step) for h in halves]
        for key, value in whole.items():
            np.testing.assert_array_equal(value, np.concatenate([p[key] for p in parts]))
        on_one = sharding.global_batch(whole, single, size)
        on_eight = sharding.global_batch(whole, eight, size)
        for key in whole:
            np.testing.assert_array_equal(np.asarray(on_one[key]), np.asarray(on_eight[key]))
    assert [one.step_batch_size(s) for s in range(8)] == [8, 8, 16, 16, 24, 24, 32, 32]


def test_a_batch_size_that_does_not_split_over_the_devices_is_named(small_spm, tmp_path):
    config = phases.plan_phases(_config(small_spm))[0].config
    config.batch_warmup.update(quantum=2, start=6)  # 6 rows over 8 devices
    config.num_train_steps = 1
    with pytest.raises(ValueError, match="is not divisible by the 8 batch shards"):
        trainer.train_and_evaluate(config, str(tmp_path))


def _train(workdir, small_spm, kill_at=None, config=CONFIG, shrink=SHRINK):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = xla_flags(1)
    command = [
        os.path.join(ROOT, "train.py"),
        f"--config={config}",
        f"--workdir={workdir}",
        f"--config.data.tokenizer_model={small_spm}",
        *shrink,
    ]
    if kill_at is not None:
        env["BERTJAX_TEST_KILL_AT"] = str(kill_at)
        command = ["-c", KILLER, *command]
    return warm_python.run([sys.executable, *command], cwd=ROOT, env=env, timeout=600)


def _params(workdir, step):
    import orbax.checkpoint as ocp

    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(path)["params"]


@pytest.mark.slow
def test_kill_while_the_batch_grows_resumes_bitwise_through_three_phases(small_spm, tmp_path):
    reference = tmp_path / "reference"
    done = _train(reference, small_spm)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout[done.stdout.index("{") :])["step"] == 24
    workdir = tmp_path / "killed"
    # step 5: in phase 1 while the batch grows (the step-4 checkpoint: batch 12 from step 4). A
    # kill at a phase's last step, saved, before the next phase begins:
    # test_kill_at_the_switch_from_clm_to_mlm_resumes_bitwise; kills inside the second phase of
    # a two-process run: tests/faults_test.py.
    killed = _train(workdir, small_spm, 5)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    finished = _train(workdir, small_spm)
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = [json.loads(line) for line in open(reference / "metrics.jsonl")]
    rates = {r["step"]: r["train/learning_rate"] for r in rows if "train/learning_rate" in r}
    # phase 2 restarts its 2-step warmup: the window of steps 12-13 averages LR 0 and 0.5 x peak
    assert rates[12] == pytest.approx(1e-3) and rates[14] == pytest.approx(0.25e-3)
    jax.tree.map(np.testing.assert_array_equal, _params(reference, 24), _params(workdir, 24))


CLM_MLM = os.path.join(ROOT, "configs", "clm_mlm_tiny.py")
CLM_MLM_SHRINK = [
    "--config.phases.clm.steps=6",
    "--config.phases.mlm.steps=4",
    "--config.checkpoint_every=3",
    *PHASE_RUN,
]


@pytest.mark.slow
def test_kill_at_the_switch_from_clm_to_mlm_resumes_bitwise(small_spm, tmp_path):
    """configs/clm_mlm_tiny.py: killed right after the CLM phase's last step (saved), the run
    resumes into the MLM phase and ends with the uninterrupted run's parameters."""
    planned = phases.plan_phases(trainer.load_config_file(CLM_MLM))
    assert [(p.name, p.config.loss.objective, p.config.data.masking) for p in planned] == [
        ("clm", "clm", "causal"),
        ("mlm", "pretraining", "token"),
    ]
    reference = tmp_path / "reference"
    done = _train(reference, small_spm, config=CLM_MLM, shrink=CLM_MLM_SHRINK)
    assert done.returncode == 0, done.stderr[-3000:]
    workdir = tmp_path / "killed"
    killed = _train(workdir, small_spm, 6, config=CLM_MLM, shrink=CLM_MLM_SHRINK)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    finished = _train(workdir, small_spm, config=CLM_MLM, shrink=CLM_MLM_SHRINK)
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert any("eval/clm_loss" in r and r["step"] == 6 for r in rows)
    assert any("eval/mlm_accuracy" in r and r["step"] == 10 for r in rows)
    jax.tree.map(np.testing.assert_array_equal, _params(reference, 10), _params(workdir, 10))
