"""The multi-process tier: real JAX processes on this machine (jax.distributed on localhost,
gloo collectives), 2 processes x 2 CPU devices against 1 process x 4 (a tiny model's step costs
CPU by the device: 4 and 8 devices took 12% more of it for the same points).

One pair of processes (tests/multiprocess_worker.py: train.py's code, several runs in a row)
runs pretraining from a sharded store on gs:// (the GCS emulator), a two-phase recipe whose
tokenizer and token store the processes prepare from a corpus, fine-tuning with task metrics and
a best checkpoint, embeddings with in-batch negatives from the whole mesh, distillation from the
pretrained teacher, and (the pair only, after the two-phase run) a run that diverges. One
process with 4 devices runs the same list beside it. Then train.py itself, as 2 processes started
with a flag missing on one process. SIGTERM to one process, kills, stalls and reruns of train.py
processes, resumed bitwise: the fault tier (tests/faults_test.py).
"""

import dataclasses
import json
import os
import subprocess
import sys

import multiprocess_worker as mp
import numpy as np
import pytest
from helpers import child_env, free_port

from bertjax import paths

pytestmark = pytest.mark.slow

ROOT = mp.ROOT
RECIPE = "configs/bert_tiny.py:smoke"
STEPS, EVERY = 12, 4  # the pretraining run; a checkpoint every 4 steps, held-out metrics at 6, 12
HEARTBEAT_S = 5  # the SIGKILL run's heartbeat timeout (train.py's default: 30 s)
QUICK = {"peak_flops_per_device": 1e12}  # no CPU matmul peak measured at start (~1 s)


def _pretraining(store: str, budget: float) -> dict:
    """configs/bert_tiny.py:smoke from the sharded store, for a FLOP budget of STEPS steps."""
    return {
        **QUICK,
        "data.store": store,
        "budget_flops": budget,
        "checkpoint_every": EVERY,
        "eval_every": STEPS // 2,
        "eval_batches": 2,
    }


@pytest.fixture(scope="module")
def budget(small_spm) -> float:
    """config.budget_flops that buys STEPS steps of the pretraining run (as cramming counts it:
    the trainer's FLOPs per sequence times the rows), so the run's end is a budget's end."""
    from bertjax import objectives, trainer
    from bertjax.data.tokenizer import Tokenizer
    from bertjax.training.metrics import train_flops_per_sequence
    from bertjax.training.run_config import model_config

    config = trainer.load_config_file(os.path.join(ROOT, RECIPE))
    length, objective = int(config.data.max_seq_length), objectives.make_objective(config)
    per_sequence = objective.train_flops_per_sequence(
        model_config(config, Tokenizer(small_spm)), length, config.data.mask_rate * length,
        int(config.data.max_predictions), train_flops_per_sequence,
    )  # fmt: skip
    return (STEPS * config.batch_size - 0.5) * per_sequence


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> str:
    """240 built-in documents in 4 files (a glob)."""
    from bertjax.data.text import corpus

    root = tmp_path_factory.mktemp("mp_corpus")
    docs = [doc for _, (_, doc) in zip(range(240), corpus.iter_documents("builtin"))]
    for i in range(4):
        (root / f"part{i}.txt").write_text("\n\n".join("\n".join(d) for d in docs[i::4]) + "\n")
    return str(root / "part*.txt")


@pytest.fixture(scope="module")
def store(gcs_bucket, small_spm, corpus_files):
    """A sharded store of the corpus files on gs:// (tests/fault_job.py), with the session's
    400-piece tokenizer."""
    from fault_job import write_store

    return write_store(corpus_files, small_spm, f"{gcs_bucket}/mp_store")


@dataclasses.dataclass
class Runs:
    """What the `runs` fixture leaves: where, what each process saw, the pair's logs."""

    base: object  # the tmp directory of the runs' local workdirs and logs
    results: list  # each pair process's multiprocess_worker.py results
    reference: dict  # the single process's
    logs: list  # each pair process's output
    pretraining: dict  # its config keys (and the pretraining run's)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, store, budget, corpus_files, gcs_bucket) -> Runs:
    """The pair's and the single process's runs (see the module docstring)."""
    base = tmp_path_factory.mktemp("multiprocess")
    (base / "pair").mkdir()
    (base / "single").mkdir()
    pretraining = _pretraining(store, budget)

    def planned(side: str) -> list:
        """The runs of one side ("pair" or "single"), in order."""
        teacher = base / "pair-pretrain"
        out = [
            dict(name="pretrain", config=RECIPE, set=pretraining),
            dict(name="phases", config="configs/phases_tiny.py:smoke",
                 set={**QUICK, "phase_order": ["pretrain", "extend"], "data.corpus": corpus_files,
                      "data.cache_dir": str(base / f"{side}-cache")}),
            dict(name="finetune", config="configs/finetune_glue.py:smoke",
                 set={**QUICK, "task.source": "builtin:stdlib_word_order", "loss.num_labels": 2,
                      "task.train_examples": 512, "num_train_steps": 4, "eval_every": 2,
                      "eval_batches": 4}),
            dict(name="embed", config="configs/embed_tiny.py:smoke",
                 set={**QUICK, "eval_batches": 4}),
            dict(name="distill", config="configs/distilbert.py:smoke",
                 set={**QUICK, "loss.teacher": str(teacher)},
                 wait_for=str(base / "pair" / "pretrain.done")),
        ]  # fmt: skip
        for run in out:  # the phases run's tokenizer goes through a URL workdir
            local = str(base / f"{side}-{run['name']}")
            run["workdir"] = f"{gcs_bucket}/{side}-phases" if run["name"] == "phases" else local
        if side == "pair":
            diverging = {
                **pretraining,
                "optim.learning_rate": 1e30,
                "skip_nonfinite_updates": False,
            }
            out.insert(2, dict(name="nonfinite", config=RECIPE,
                               set={**diverging, "budget_flops": 0.0, "num_train_steps": 4},
                               workdir=str(base / "pair-nonfinite"),
                               expect_error="FloatingPointError"))  # fmt: skip
        return out

    port = free_port()
    pair = [mp.start_worker(planned("pair"), base / "pair", i, 2, port, 2) for i in range(2)]
    single = mp.start_worker(planned("single"), base / "single", 0, 1, 0, 4)
    try:
        codes = [p.wait(timeout=600) for p in pair]
        assert single.wait(timeout=600) == 0, (base / "single/process0.log").read_text()[-3000:]
    finally:
        for p in [*pair, single]:
            p.kill()
    logs = [(base / "pair" / f"process{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    results = [json.loads((base / "pair" / f"process{i}.json").read_text()) for i in range(2)]
    reference = json.loads((base / "single" / "process0.json").read_text())
    return Runs(base, results, reference, logs, pretraining)


@pytest.mark.parametrize("name", ["pretrain", "phases", "finetune", "embed", "distill"])
def test_two_processes_log_what_one_process_logs(runs, gcs_bucket, name):
    """Every logged number but perf/* (held-out baselines, task and retrieval metrics included)
    equals the single process's to 1e-5 (and 5e-8 absolute: a distillation KL of ~1e-4 is a
    difference of near-equal float32 terms; with the held-out split of content-named documents
    the pair's KL was 1.4e-8 off the single process's), and each process of the pair ends with
    the same summary (process 0 writes it)."""
    base, results, reference = runs.base, runs.results, runs.reference
    for result in [*results, reference]:
        assert "error" not in result[name], result[name]["error"]
    side = {s: f"{base}/{s}-{name}" for s in ("pair", "single")}
    if name == "phases":
        side = {s: f"{gcs_bucket}/{s}-phases" for s in ("pair", "single")}
    ours, theirs = mp.metrics(side["pair"]), mp.metrics(side["single"])
    assert [r["step"] for r in ours] == [r["step"] for r in theirs]
    assert len(ours) >= 3 and len({k for r in ours for k in r}) > 5  # numbers to compare
    for mine, other in zip(ours, theirs):
        assert mine.keys() == other.keys(), mine["step"]
        np.testing.assert_allclose(
            [mine[k] for k in sorted(mine)], [other[k] for k in sorted(mine)], rtol=1e-5,
            atol=5e-8, err_msg=f"{name} step {mine['step']}: {sorted(mine)}",
        )  # fmt: skip
    summaries = [{k: v for k, v in r[name]["summary"].items() if "perf/" not in k} for r in results]
    assert summaries[0] == summaries[1]


def test_held_out_baselines_and_task_scores_count_every_host_s_rows(runs):
    """The numbers a host computes from its own rows are summed over the processes: the MLM
    majority baseline (from held_out_counts), the task and retrieval metrics of every dev row,
    and the best checkpoint chosen from them, the same on both processes and in the single one;
    the FLOP budget ends the pretraining run at one step everywhere."""
    base, results, reference = runs.base, runs.results, runs.reference
    assert [r["pretrain"]["summary"]["step"] for r in [*results, reference]] == [STEPS] * 3
    for name, keys in {
        "pretrain": ["eval/majority_baseline", "eval/perplexity"],
        "finetune": ["eval/accuracy", "eval/f1", "eval/matthews"],
        "embed": ["eval/ndcg@10", "eval/mrr@10"],
    }.items():
        ours = [results[i][name]["summary"] for i in range(2)]
        for key in keys:
            assert ours[0][key] == ours[1][key], (name, key)
            np.testing.assert_allclose(ours[0][key], reference[name]["summary"][key], rtol=1e-5)
    best = [
        json.loads(open(f"{base}/{s}-finetune/best/best.json").read()) for s in ("pair", "single")
    ]
    assert best[0]["step"] == best[1]["step"] and best[0]["metric"] == best[1]["metric"]
    assert os.path.isfile(f"{base}/pair-finetune/best/dev_predictions.tsv")


def test_two_processes_prepare_one_tokenizer_and_one_store(runs, gcs_bucket):
    """From a corpus, process 0 trains the tokenizer (into a URL workdir, or a local one) and
    both read it; the two processes of this host build one token store, not two."""
    base, results, reference = runs.base, runs.results, runs.reference
    for name, tokenizers, stores in (("phases", 1, 1), ("finetune", 1, 0), ("embed", 1, 0)):
        assert [r[name]["train_sentencepiece"] for r in results] == [tokenizers, 0], name
        assert sum(r[name]["prepare_store"] for r in results) == stores, name
        assert reference[name]["train_sentencepiece"] == tokenizers
    assert paths.isfile(f"{gcs_bucket}/pair-phases/tokenizer/spm.model")
    stores = os.listdir(base / "pair-cache" / "stores")
    assert len([s for s in stores if not s.endswith(".lock")]) == 1, stores


def test_a_non_finite_loss_stops_both_processes_at_one_step(runs):
    """Diverging (learning rate 1e30, no skipping): both processes raise the same error, naming
    the same step, before the next collective (the runs after it, fine-tuning on, ran on)."""
    results = runs.results
    errors = [r["nonfinite"].get("error") for r in results]
    assert errors[0] == errors[1] and errors[0][0] == "FloatingPointError", errors
    assert "non-finite loss or gradient at or before step" in errors[0][1]
    assert all("error" not in r[name] for r in results for name in ("finetune", "distill"))


def test_processes_started_with_different_configs_stop_naming_the_keys(runs):
    """A flag missing on one host: both processes stop before their first step (nothing is
    written), exit 2 (bad input), and say which key differs and what each process has."""
    base = runs.base
    workdir, each = str(base / "mismatch"), {0: ["--config.optim.learning_rate=5e-4"]}
    procs = mp.start_train_py(RECIPE, runs.pretraining, workdir, base / "mismatch", each=each)
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [2, 2]  # bad input (bertjax/cli.py)
    for i in range(2):
        last = (base / f"mismatch{i}.log").read_text().strip().splitlines()[-1]
        assert last.startswith("error: the 2 processes were started with different configs")
        assert "config.optim.learning_rate: process 0: 0.0005, process 1: 0.0014" in last
    assert not os.path.exists(f"{workdir}/checkpoints")


def test_multihost_without_a_cluster_or_coordinator_says_what_to_give(tmp_path):
    """Where JAX detects no cluster (this machine), --multihost alone stops with one line naming
    the flags to give."""
    command = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--multihost",
        f"--workdir={tmp_path}",
    ]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --multihost could not join a run")
    assert "--coordinator_address=HOST:PORT" in last and "--num_processes" in last


SIGINT_SCRIPT = """
import os, signal, sys, time
from bertjax.training import processes
from bertjax.training.stopping import StopRequests
processes.initialize(f"127.0.0.1:{sys.argv[1]}", 1, 0)
stop = StopRequests()
os.kill(os.getpid(), signal.SIGINT)
step = 0
while not stop.reached(step):
    step += 1
    time.sleep(0.01)
print("stopped at", step, "synced", stop.synced)
processes.finish()
"""


def test_ctrl_c_goes_through_jax_s_preemption_sync_like_sigterm():
    """Under --multihost, SIGINT is handed to JAX's notifier as a SIGTERM of the process (so
    Ctrl-C on one host stops all, as SIGTERM does in the tests above): here one process, whose
    sync point comes a few steps after the signal."""
    command = [sys.executable, "-c", SIGINT_SCRIPT, str(free_port())]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    assert words[:2] == ["stopped", "at"] and int(words[2]) > 0 and words[-1] == "True"
