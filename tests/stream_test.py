"""The direct stream (config.data.stream): batches read straight from a Hub corpus's files, no
store prepared. The listing is process 0's alone; every batch is a function of its step, the
same for 1 and 2 processes, each process reading only the units of its own rows, disjoint and
covering the corpus although 3 files do not divide over 2 processes; a run through a burst of
429s and 503s ends with the parameters of a run without them; and 2 real train.py processes
killed (-9) mid-epoch resume to batches bitwise equal to an uninterrupted run's."""

import gzip
import json
import os
import re
import signal
import sys
import time

import jax
import numpy as np
import pytest
import warm_python
from helpers import QUIET_RUN, ROOT, child_env, free_port

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.text import corpus
from bertjax.data.text import hub as hf

REPO = "bertjax-test/stream"
RUNNER = os.path.join(ROOT, "tests", "stream_runner.py")


def _lines(texts) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


@pytest.fixture(scope="module")
def repo(hub):
    """Three JSON Lines files of uneven sizes (one gzip), ~20,000 tokens: an epoch of a lane is
    a few dozen steps of 8 rows of 32."""
    docs = [" ".join(d) for _, (_, d) in zip(range(160), corpus.iter_documents("builtin"))]
    docs = [d[:600] for d in docs]
    files = {
        "part-0.jsonl": _lines(docs[:70]),
        "part-1.jsonl.gz": gzip.compress(_lines(docs[70:100]), mtime=0),
        "part-2.jsonl": _lines(docs[100:]),
    }
    return hub.commit(REPO, files)


@pytest.fixture(scope="module")
def small_repo(hub):
    """21 short documents in 3 files: an epoch of a lane is about a dozen steps."""
    docs = [" ".join(d)[:600] for _, (_, d) in zip(range(21), corpus.iter_documents("builtin"))]
    files = {f"part-{i}.jsonl": _lines(docs[i::3]) for i in range(3)}
    return hub.commit(SMALL, files)


SMALL = "bertjax-test/stream-small"
SETTINGS = {
    "seed": 5,
    "batch_size": 8,
    "data.corpus": f"hf://datasets/{REPO}/*.jsonl*",
    "data.corpus_format": "jsonl",
    "data.stream": True,
    "data.sample_plan": "token_windows",
    "data.max_seq_length": 32,
    "data.max_predictions": 6,
    "data.heldout_fraction": 0.05,
    "data.prefetch": 0,
}


def _config(spm, **changes):
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "bert_tiny.py:smoke"))
    for key, value in {**SETTINGS, "data.tokenizer_model": spm, **changes}.items():
        *path, name = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[name] = value
    return config


def _pipelines(config, workdir, count):
    return [
        make_pipeline(config, str(workdir), process_index=i, process_count=count)
        for i in range(count)
    ]


def _joined(pipelines, step):
    parts = [p.batch(step) for p in pipelines]
    return {k: np.concatenate([b[k] for b in parts]) for k in parts[0]}


def _equal(ours, theirs):
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


STEPS = (0, 1, 7, 60, 61, 140)  # into the second and third epochs of some lanes


def test_a_step_s_batch_is_the_same_for_1_and_2_processes_and_after_a_restart(
    hub, repo, small_spm, tmp_path
):
    hub.reset()
    hf._FILES.clear()  # as a new process: nothing listed yet
    [one] = _pipelines(_config(small_spm), tmp_path / "one", 1)
    listed = hub.count("info", "tree", "paths-info")
    assert listed == 2  # the revision, one tree page
    two = _pipelines(_config(small_spm), tmp_path / "one", 2)
    assert hub.count("info", "tree", "paths-info") == listed  # the workdir's record

    for step in STEPS:
        _equal(_joined(two, step), one.batch(step))
    restarted = _pipelines(_config(small_spm), tmp_path / "one", 2)  # a resumed run
    for step in STEPS[::-1]:
        _equal(_joined(restarted, step), one.batch(step))
    _equal(_joined(two, 200), one.batch(200))

    owned = [p.own_units() for p in two]
    assert not owned[0] & owned[1] and owned[0] | owned[1] == set(range(len(one.units)))
    assert all(p.units_read() == mine for p, mine in zip(two, owned))  # its own, all of them
    eval_one, eval_two = next(one.eval_batches(1)), [next(p.eval_batches(1)) for p in two]
    _equal({k: np.concatenate([b[k] for b in eval_two]) for k in eval_one}, eval_one)
    assert eval_one["masked_weights"].sum() > 0
    for p in [one, *two, *restarted]:
        p.close()


def test_a_resumed_stream_reads_only_the_units_at_its_place_and_eval_only_what_it_needs(
    hub, repo, small_spm, tmp_path, caplog
):
    """The token counts of the units read are kept in the workdir: a pipeline resumed there
    reads only the units at its step (a fresh workdir: every unit before it too), with the same
    batch; a count the tokens contradict stops it naming the folder; a file that is no count
    table is skipped. Held-out batches read a lane's units only until their windows are full:
    the same batch as from all of its held-out tokens."""
    from bertjax.data.stream import counts

    config = _config(small_spm)
    [first] = _pipelines(config, tmp_path / "run", 1)
    step = 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(counts, "SAVE_EVERY_S", 0.0)  # written as units are read, not only at close
        while len(first.units_read()) < len(first.units):  # until a lane reads its second unit
            first.batch(step)
            step += 1
        first._saved_counts._thread.join()
    [folder] = (tmp_path / "run" / "stream_counts").iterdir()
    assert json.loads((folder / "process-0.json").read_text())  # before the close
    expected = first.batch(step)
    first.close()  # writes the counts
    [resumed] = _pipelines(config, tmp_path / "run", 1)
    [fresh] = _pipelines(config, tmp_path / "fresh", 1)
    _equal(resumed.batch(step), expected)
    _equal(fresh.batch(step), expected)
    assert resumed.units_read() < fresh.units_read() == set(range(len(first.units)))

    (folder / "process-9.json").write_text("not a table")
    saved = json.loads((folder / "process-0.json").read_text())
    assert len(saved) == len(first.units)
    (folder / "process-0.json").write_text(json.dumps({u: n + 1 for u, n in saved.items()}))
    [damaged] = _pipelines(config, tmp_path / "run", 1)
    assert "process-9.json is not a table" in caplog.text
    with pytest.raises(ValueError, match=f"{folder} says"):
        damaged.batch(step)

    config = _config(small_spm, **{"data.heldout_fraction": 0.3})  # a lane's first unit: enough
    [few] = _pipelines(config, tmp_path / "eval", 1)
    [every] = _pipelines(config, tmp_path / "eval-all", 1)
    _equal(next(few.eval_batches(1)), next(every.eval_batches(1000)))
    assert few.units_read() < every.units_read() == set(range(len(first.units)))
    for p in (resumed, fresh, damaged, every):
        p.close()

    import threading

    from bertjax.data.stream import source

    with pytest.MonkeyPatch.context() as patch:  # a read hung in storage holds the lock
        patch.setattr(source, "CLOSE_WAIT_S", 0.1)
        few._lock.acquire()
        closing = threading.Thread(target=few.close, daemon=True)
        closing.start()
        closing.join(5)
        few._lock.release()
    assert not closing.is_alive()  # the close gave up on the counts instead of waiting


def test_a_burst_of_429s_and_503s_leaves_the_run_s_final_state_equal(
    hub, repo, small_spm, tmp_path, one_device
):
    """Two in-process runs of 6 steps streamed from the Hub, one through a burst of 429s (the
    RateLimit header's wait, by the client) and 503s (the CDN's, and the revision's: retried by
    bertjax within config.storage_retry_seconds): the same parameters, bit for bit."""
    from helpers import final_params

    def run(name, faults):
        hub.reset()
        asked = [hub.fail(kind, status, **how) for kind, status, how in faults]
        config = _config(small_spm, **{
            "num_train_steps": 6, "checkpoint_every": 6, "eval_every": 0,
            "storage_retry_seconds": 60, "data.cache_dir": str(tmp_path / name / "cache"),
            "progress_bar": False, "fast_compile": True, "peak_flops_per_device": 1e12,
        })  # fmt: skip
        trainer.train_and_evaluate(config, str(tmp_path / name / "workdir"))
        return final_params(str(tmp_path / name / "workdir"), 6), [f.hits for f in asked]

    clean, _ = run("clean", [])
    faulted, hits = run("faulted", [
        ("info", 503, {}),
        ("resolve", 429, {"times": 4, "ratelimit_reset": 0, "method": "GET"}),
        ("cdn", 503, {"times": 2}),
    ])  # fmt: skip
    assert hits == [1, 4, 2]
    for ours, theirs in zip(jax.tree.leaves(faulted), jax.tree.leaves(clean)):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow
def test_two_processes_killed_mid_epoch_resume_to_the_uninterrupted_batches(
    hub, small_repo, small_spm, tmp_path
):
    """2 train.py processes (--multihost) stream the corpus; both are killed (-9) after the
    checkpoint of step 4, mid-epoch; the same command resumes them to step 24. Every batch either
    launch made equals the one an uninterrupted run makes (computed here), the listing requests
    are process 0's alone (as many as one process makes), and each process reads only its own
    units."""
    quiet = {  # no held-out rule's look at the first documents
        "data.heldout_fraction": 0.0,
        "data.corpus": f"hf://datasets/{SMALL}/*.jsonl",
    }
    steps, settings = 24, {**SETTINGS, "data.tokenizer_model": small_spm, **quiet}
    flags = [f"--config.{k}={v}" for k, v in settings.items()]
    flags += [f"--config.num_train_steps={steps}", "--config.checkpoint_every=4",
              "--config.eval_every=0", *QUIET_RUN]  # fmt: skip
    workdir, logs = tmp_path / "workdir", tmp_path / "logs"

    def launch(name):
        port, procs, batches = free_port(), [], tmp_path / name
        batches.mkdir()
        for i in range(2):
            env = dict(child_env(), BERTJAX_BATCHES=str(batches))
            command = [
                sys.executable, RUNNER, os.path.join(ROOT, "train.py"),
                "--config=configs/bert_tiny.py:smoke", f"--workdir={workdir}", "--multihost",
                f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                f"--process_id={i}", *flags,
            ]  # fmt: skip
            log = str(logs / f"{name}{i}.log")  # output and errors
            procs.append(warm_python.popen(command, cwd=ROOT, env=env, stdout=log))
        return procs, batches

    logs.mkdir()
    hub.reset()
    procs, first = launch("first")
    checkpoint = workdir / "checkpoints" / "4" / "_CHECKPOINT_METADATA"
    deadline = time.monotonic() + 300
    while not checkpoint.exists():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, [
            (logs / f"first{i}.log").read_text()[-2000:] for i in range(2)
        ]
        time.sleep(0.1)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()
    requests = list(hub.requests)
    procs, second = launch("second")
    for i, p in enumerate(procs):
        assert p.wait(timeout=300) == 0, (logs / f"second{i}.log").read_text()[-3000:]
    resumed = re.findall(r"resumed from step (\d+)", (logs / "second0.log").read_text())
    assert resumed and 4 <= int(resumed[0]) < steps

    reference = _pipelines(_config(small_spm, **quiet), tmp_path / "reference", 2)
    made = {}
    for directory in (first, second):
        for name in os.listdir(directory):
            if name.endswith(".tmp.npz"):  # being written when its process was killed
                continue
            process, step = map(int, re.fullmatch(r"p(\d)-(\d+)\.npz", name).groups())
            with np.load(directory / name) as saved:
                _equal(dict(saved), reference[process].batch(step))
            made.setdefault(step, set()).add(process)
    assert all(made.get(step) == {0, 1} for step in range(steps)), sorted(made)
    tokens = [lane.total() for p in reference for lane in p.lanes if lane.total()]
    width = reference[0].lane_rows * reference[0].width  # tokens a lane gives a step
    assert any(int(resumed[0]) * width < n < steps * width for n in tokens)  # killed mid-epoch

    hf._FILES.clear()
    hub.reset()
    _pipelines(_config(small_spm, **quiet), tmp_path / "alone", 1)  # one process's listing
    alone = hub.count("info", "tree", "paths-info")
    listing = [r for r in requests if r.kind in ("info", "tree", "paths-info")]
    assert len(listing) == alone and all("bertjax-process/0/2" in r.headers["user-agent"]
                                         for r in listing)  # fmt: skip
    units = [p.units for p in reference]
    for process in range(2):
        mine = {units[0][u].file.rsplit("/", 1)[-1] for u in reference[process].own_units()}
        read = {r.path.rsplit("/", 1)[-1] for r in requests if r.kind in ("resolve", "cdn")
                and f"bertjax-process/{process}/2" in r.headers.get("user-agent", "")}  # fmt: skip
        assert read and read <= mine, (process, read, mine)
