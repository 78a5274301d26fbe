"""Workdirs on object storage: a ``file://`` workdir and a ``gs://`` one on a local GCS emulator
(what orbax's TensorStore and epath both speak) train, resume bitwise after kill -9, and
fine-tune from it; nothing lands in a local folder named after a URL scheme.

The gs:// run is killed once its first checkpoint is complete (a preemption between saves).
A kill in the middle of a save is tested on local disk (tests/trainer_test.py); on object
storage orbax marks complete steps with commit files, and the emulator could not rewrite the
OCDBT files a killed save left behind (see bertjax.training.checkpoint._remove_unfinished)."""

import os
import signal
import subprocess

import jax
import numpy as np
import pytest
import warm_python
from helpers import ROOT
from helpers import command as _command
from helpers import env as _env
from helpers import final_params as _final_params
from helpers import wait_for as _wait_for

from bertjax import paths, trainer
from bertjax.objectives.finetune import add_finetune_config

pytestmark = pytest.mark.slow  # end-to-end runs

STEPS, EVERY = 20, 10


@pytest.fixture(scope="module")
def runs(tmp_path_factory, gcs_bucket, small_spm):
    """An uninterrupted file:// run and a gs:// run killed after its first checkpoint, then
    resumed; the same tokenizer and seed."""
    extra = (f"--config.data.tokenizer_model={small_spm}",)
    reference = f"file://{tmp_path_factory.mktemp('file_run')}"
    first = warm_python.run(
        _command(reference, steps=STEPS, every=EVERY, extra=extra), cwd=ROOT, env=_env()
    )
    assert first.returncode == 0, first.stderr[-3000:]
    remote = f"{gcs_bucket}/run"
    process = subprocess.Popen(
        _command(remote, steps=STEPS, every=EVERY, extra=extra),
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    done = [f"{remote}/checkpoints/{EVERY}/{item}/commit_success.txt" for item in ("state", "meta")]
    _wait_for(lambda: all(paths.exists(path) for path in done), process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    resumed = warm_python.run(
        _command(remote, steps=STEPS, every=EVERY, extra=extra), cwd=ROOT, env=_env()
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return reference, remote


def test_a_killed_remote_run_resumes_bitwise(runs):
    reference, remote = runs
    local = paths.resolve(reference)  # file://DIR is DIR
    assert os.path.isdir(os.path.join(local, "checkpoints", str(STEPS)))
    jax.tree.map(
        np.testing.assert_array_equal, _final_params(local, STEPS), _final_params(remote, STEPS)
    )
    steps = [
        int(line.split('"step": ')[1].split(",")[0])
        for line in paths.read_text(f"{remote}/metrics.jsonl").splitlines()
    ]
    assert steps[-1] == STEPS and STEPS in steps
    assert any(p.name.startswith("events.out.tfevents") for p in paths.Path(remote).iterdir())
    for where in (ROOT, os.getcwd()):
        assert not {"gs:", "file:"} & set(os.listdir(where)), where


def test_fine_tuning_starts_from_a_remote_checkpoint(runs, gcs_bucket, tmp_path):
    _, remote = runs
    config = add_finetune_config(trainer.default_run_config(), "classification", num_labels=4)
    config.init_from = remote
    config.batch_size, config.num_train_steps, config.progress_bar = 8, 2, False
    config.data.max_seq_length = 32
    config.optim.warmup_steps, config.log_every, config.eval_every = 1, 1, 2
    config.eval_batches, config.checkpoint_every = 2, 0
    config.peak_flops_per_device = 1e12
    workdir = f"{gcs_bucket}/finetune"
    summary = trainer.train_and_evaluate(config, workdir)
    assert summary["step"] == 2 and 0.0 <= summary["eval/accuracy"] <= 1.0
    assert paths.isfile(f"{workdir}/best/best.json")
    assert paths.read_text(f"{workdir}/best/dev_predictions.tsv").startswith("text\t")
