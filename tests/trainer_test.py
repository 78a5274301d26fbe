"""The trainer end to end: exact resume after SIGKILL (mid-training and mid-save),
SIGTERM checkpointing (exit status 143), resume on another device count, metrics, and bad-input
errors.

Each run is a real `train.py` subprocess on a shrunken BERT-tiny (the built-in corpus,
a 400-piece SentencePiece model, T=32, B=8), so signals hit a real process.
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import warm_python
from helpers import ROOT, SHRINK
from helpers import checkpoint_steps as _steps
from helpers import command as _command
from helpers import env as _env
from helpers import final_params as _final_params
from helpers import run as _run
from helpers import wait_for as _wait_for

pytestmark = [pytest.mark.usefixtures("session_tokenizer_runs"), pytest.mark.slow]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 30-step run."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    summary = _run(workdir)
    assert summary["step"] == 30 and _steps(workdir)[-1] == 30
    return workdir


def test_metrics_are_written_for_tensorboard_and_jsonl(reference):
    from tensorboard.backend.event_processing import event_accumulator

    records = [json.loads(line) for line in open(os.path.join(reference, "metrics.jsonl"))]
    assert [r["step"] for r in records if "train/loss" in r] == [5, 10, 15, 20, 25, 30]
    acc = event_accumulator.EventAccumulator(reference)
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    np.testing.assert_allclose(
        losses, [r["train/loss"] for r in records if "train/loss" in r], rtol=1e-6
    )
    # it learns: below the loss of a uniform guess over the 400-piece vocabulary, where the
    # initial model starts (30 steps at batch 8 are too few to order the 5-step windows)
    assert max(losses[-2:]) < np.log(400)
    assert {"perf/tokens_per_second", "perf/mfu", "train/learning_rate"} <= set(records[0])


def test_sigkill_mid_training_and_mid_save_resumes_bitwise(reference, tmp_path):
    """The process dies mid-training while the step-20 checkpoint is being written
    asynchronously: the resumed run starts from step 10, the last complete checkpoint, and ends
    with the uninterrupted run's parameters. (One run covers the kill between saves too: it
    resumes from the same last complete checkpoint.)"""
    workdir = str(tmp_path)
    killer = (
        "import os, signal, sys, runpy\n"
        "from bertjax.training import checkpoint\n"
        "original = checkpoint.Checkpointer.save\n"
        "def save(self, state, meta, force=False):\n"
        "    started = original(self, state, meta, force=force)\n"
        "    if int(state.step) == 20:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return started\n"
        "checkpoint.Checkpointer.save = save\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    result = warm_python.run(
        [sys.executable, "-c", killer] + _command(workdir)[1:],
        env=_env(),
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert 20 not in _steps(workdir) and 10 in _steps(workdir)
    summary = _run(workdir)
    assert summary["step"] == 30
    import jax

    jax.tree.map(
        np.testing.assert_array_equal, _final_params(reference, 30), _final_params(workdir, 30)
    )


def test_sigterm_saves_the_current_step(tmp_path):
    workdir = str(tmp_path)
    process = subprocess.Popen(
        _command(workdir, steps=2000, every=1000),
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    jsonl = os.path.join(workdir, "metrics.jsonl")
    _wait_for(lambda: os.path.exists(jsonl) and os.path.getsize(jsonl) > 0, process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]  # saved, not done: restart
    summary = json.loads(out[out.index("{") :])
    assert 0 < summary["step"] < 2000
    assert _steps(workdir) == [summary["step"]]
    last = err.strip().splitlines()[-1]
    assert last == (
        f"stopped by SIGTERM after saving step {summary['step']} in {workdir}: rerun the same "
        "command to resume (exit status 143)"
    )
    # the kernel each attention got (the global layers, the MLM rows of the last), said once
    assert out.count("attention: ") == 1
    assert "attention: cpu_dense: global, T=32; cpu_dense: global, gathered rows\n" in out


def test_saved_on_four_devices_resumes_on_two(tmp_path):
    workdir = str(tmp_path)
    # A zero MLM bias and a higher LR make the first 20 steps fall far (learning token
    # frequencies), so a resume is told apart from a restart by its loss level.
    fast = ["--config.mlm_bias_init=zeros", "--config.optim.learning_rate=5e-3"]
    first = _run(workdir, devices=4, steps=20, extra=["--config.mesh.fsdp=2", *fast])
    assert first["step"] == 20
    second = _run(workdir, devices=2, steps=30, extra=fast)
    assert second["step"] == 30
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    losses = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
    # The resumed run continues from the saved loss level instead of starting over.
    assert losses[25] < losses[5] and abs(losses[25] - losses[20]) < 0.5 * (losses[5] - losses[20])


def test_unknown_config_key_is_rejected(tmp_path):
    result = warm_python.run(
        _command(str(tmp_path), extra=["--config.optim.lr=1e-3"]), cwd=ROOT, env=_env()
    )
    assert result.returncode == 2  # bad input: a supervisor does not restart it
    assert "unknown config key 'config.optim.lr'" in result.stderr
    assert "learning_rate" in result.stderr  # the message lists the keys that do exist


def _in_process_config(**changes):
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import bert_tiny

    config = bert_tiny.get_config()
    config.batch_size, config.num_train_steps = 8, 6
    config.data.max_seq_length, config.data.max_predictions = 32, 5
    config.data.tokenizer_model = next(
        a.split("=", 1)[1] for a in SHRINK if a.startswith("--config.data.tokenizer_model=")
    )
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size = 64
    config.optim.warmup_steps, config.log_every, config.eval_every = 1, 2, 0
    config.progress_bar = False
    for key, value in changes.items():
        target = config
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return config


def test_missing_corpus_and_unwritable_workdir_are_named(tmp_path):
    from bertjax import trainer

    with pytest.raises(FileNotFoundError, match="no_such_corpus"):
        trainer.train_and_evaluate(
            _in_process_config(**{"data.corpus": str(tmp_path / "no_such_corpus*.txt")}),
            str(tmp_path / "w1"),
        )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        trainer.train_and_evaluate(_in_process_config(), str(blocker / "sub"))
    with pytest.raises(ValueError, match="next_sentence"):  # an NSP head without pairs
        trainer.train_and_evaluate(
            _in_process_config(
                **{"data.sample_plan": "full_sentences", "loss.next_sentence": True}
            ),
            str(tmp_path / "w2"),
        )


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    from bertjax import trainer

    workdir = str(tmp_path)
    good = _in_process_config(checkpoint_every=2, num_train_steps=2)
    trainer.train_and_evaluate(good, workdir)
    bad = _in_process_config(
        **{
            "checkpoint_every": 2,
            "num_train_steps": 8,
            "skip_nonfinite_updates": False,
            "optim.learning_rate": 1e30,
        }
    )
    with pytest.raises(FloatingPointError, match="last good checkpoint \\(2\\)"):
        trainer.train_and_evaluate(bad, workdir)
    assert _steps(workdir) == [2]


def test_a_stopped_run_takes_its_cancel_token_with_it_and_a_plan_change_refuses_to_resume(
    tmp_path, monkeypatch
):
    """A library caller's run stopped by SIGTERM cancels its own `retry.Cancel` token at the
    signal (storage requests waiting out a backoff give up: nothing on the way out waits on
    storage), saves, and takes the token with it when it returns: the next run in the same
    process retries for its whole budget again (no flag leaks from one run to the next).
    That next run is of a bertjax whose data plans read other rows (bertjax/data/
    plan_version.py): it refuses to continue the checkpoint in one line naming both versions
    and how to go on on purpose; with config.data.allow_plan_change it resumes, and its
    checkpoint records the new version."""
    import signal
    import threading
    import time

    from bertjax import retry, trainer
    from bertjax.data import pipeline as pipeline_lib
    from bertjax.data import plan_version

    workdir = str(tmp_path)
    metrics = os.path.join(workdir, "metrics.jsonl")
    seen = {}

    def stop_after_the_first_log():
        deadline = time.monotonic() + 120
        while not (os.path.exists(metrics) and os.path.getsize(metrics)):  # a step was logged
            assert time.monotonic() < deadline
            time.sleep(0.05)
        seen["token"] = retry.current().token  # the run's, installed for its duration
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_after_the_first_log, daemon=True).start()
    summary = trainer.train_and_evaluate(
        _in_process_config(num_train_steps=400, log_every=1, checkpoint_every=0), workdir
    )
    assert summary["stopped_by_signal"] and summary["step"] < 400
    assert seen["token"] is not None and seen["token"].cancelled()
    assert retry.current().token is None and not retry.current().cancelled()
    assert _steps(workdir) == [summary["step"]]

    version = plan_version.PLAN_VERSION
    monkeypatch.setattr(pipeline_lib.Pipeline, "plan_version", version + 1)
    more = {"num_train_steps": summary["step"] + 1, "log_every": 1}
    with pytest.raises(ValueError) as refused:
        trainer.train_and_evaluate(_in_process_config(**more), workdir)
    (line,) = str(refused.value).splitlines()
    assert (
        f"saved with data plan version {version}, this bertjax plans version {version + 1}"
        in (line)
        and "--config.data.allow_plan_change=True" in line
    )
    assert _steps(workdir) == [summary["step"]]  # nothing moved or set aside
    again = trainer.train_and_evaluate(
        _in_process_config(**more, **{"data.allow_plan_change": True}), workdir
    )
    assert again["step"] == summary["step"] + 1
    meta = os.path.join(workdir, "checkpoints", str(again["step"]), "meta", "metadata")
    assert json.load(open(meta))[plan_version.KEY] == version + 1


def test_a_run_whose_setup_fails_closes_what_it_opened(tmp_path, monkeypatch):
    """Setup that fails after the data and the checkpoints were opened (here restoring: as a
    checkpoint set aside makes the run plan again) closes both before the error leaves, and
    leaves the run's retry token uncancelled for the run planned again."""
    from bertjax import retry, trainer
    from bertjax.data import pipeline as pipeline_lib
    from bertjax.training import checkpoint
    from bertjax.training import trainer as trainer_lib

    closed, tokens = [], []
    for owner, name in ((pipeline_lib.Pipeline, "pipeline"), (checkpoint.Checkpointer, "ckpt")):
        close = owner.close
        monkeypatch.setattr(owner, "close", lambda self, *a, _c=close, _n=name, **k: (
            closed.append(_n), _c(self, *a, **k))[1])  # fmt: skip

    def restore_fails(*args, **kwargs):
        tokens.append(retry.current().token)
        raise RuntimeError("restoring failed")

    monkeypatch.setattr(trainer_lib, "restore_or_init", restore_fails)
    with pytest.raises(RuntimeError, match="restoring failed"):
        trainer.train_and_evaluate(_in_process_config(num_train_steps=2), str(tmp_path))
    assert "pipeline" in closed and "ckpt" in closed
    assert tokens and not tokens[0].cancelled()
