"""GLUE from the Hub (bertjax/tasks/glue_hub.py): nyu-mll/glue's parquet layout at the pinned
commit, served by the local Hub (tests/hub_server.py) to huggingface_hub's real client, reads as
the download script's TSV files do; downloaded once, then read from the cache (offline too);
every failure is one line. The end-to-end command runs in tests/glue_test.py."""

import os
import subprocess
import sys

import numpy as np
import pytest
from glue_fixtures import write_glue_dir
from glue_hub_fixtures import SCRIPT, write_glue_repo, write_parquet
from helpers import ROOT, child_env
from hub_server import use_endpoint

from bertjax.retry import StorageUnavailable
from bertjax.tasks import glue_hub, glue_tasks


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue_dir(str(tmp_path_factory.mktemp("glue_data")))


@pytest.fixture(scope="module")
def glue_repo(hub, glue_dir):
    """nyu-mll/glue on the local Hub, made from ``glue_dir``; the snapshot folder."""
    return write_glue_repo(hub.repos.root, glue_dir)


def _float32(examples):
    return [dict(e, label=float(np.float32(e["label"]))) for e in examples]


def test_the_repository_has_the_hub_s_layout(glue_repo):
    """The fixture's files are the Hub's (the README's configs; a few names spelled out)."""
    files = sorted(
        os.path.relpath(os.path.join(d, f), glue_repo)
        for d, _, names in os.walk(glue_repo)
        for f in names
    )
    shard = "-00000-of-00001.parquet"
    named = (
        "cola/train",
        "mnli/validation_matched",
        "mnli_mismatched/test",
        "ax/test",
        "stsb/test",
    )
    for name in [n + shard for n in named]:
        assert name in files
    configs = {f.split("/")[0] for f in files if "/" in f}
    assert configs == {*SCRIPT, "mnli_matched", "mnli_mismatched", "ax"}
    assert len(configs) == 12


def test_the_hub_reads_as_the_download_script_s_files_and_downloads_once(hub, glue_repo, glue_dir):
    """Every task's train and dev examples from the Hub equal those of the GLUE directory the
    repository was converted from (labels named alike; STS-B's score in the file's float32),
    MNLI's dev matched then mismatched; the first read lists the repository once and fetches
    each file once (19 files), a second read makes no request."""
    hub.reset()
    for name in glue_tasks.TASKS:
        for split in ("train", "dev"):
            ours = glue_hub.glue_examples(name, split)
            theirs = glue_tasks.glue_examples(glue_dir, name, split)
            if name == "stsb":
                ours, theirs = _float32(ours), _float32(theirs)
            assert ours == theirs, (name, split)
    assert hub.count("tree") == 1 and hub.count("info") == 0  # a pinned SHA needs no lookup
    assert hub.count("resolve") == len(glue_hub.patterns(glue_tasks.TASKS)) == 19
    hub.reset()
    for name in glue_tasks.TASKS:
        glue_hub.glue_examples(name, "train")
        glue_hub.glue_examples(name, "dev")
    assert hub.count() == 0


def test_offline_the_cache_answers_and_without_it_one_line_says_what_to_pass(
    hub, glue_repo, glue_dir, tmp_path
):
    cached = os.environ["HF_HOME"]  # the module's cache, filled above (or here)
    expected = glue_hub.glue_examples("rte", "dev")
    hub.reset()
    with use_endpoint(hub.url, cached, offline=True):
        assert glue_hub.glue_examples("rte", "dev") == expected
    with use_endpoint(hub.url, tmp_path / "empty", offline=True):
        with pytest.raises(FileNotFoundError) as stopped:
            glue_hub.glue_examples("rte", "train")
    assert hub.count() == 0
    assert str(stopped.value).startswith(
        f"GLUE from hf://datasets/nyu-mll/glue@{glue_hub.REVISION}: HF_HUB_OFFLINE is set and "
        "its files are not in the Hugging Face cache ("
    )
    assert "pass --glue_dir=DIR" in str(stopped.value) and "--glue_source=tfds" in str(
        stopped.value
    )


def test_revisions_resolve_to_their_commit_and_a_missing_one_is_one_line(hub, glue_repo, tmp_path):
    with use_endpoint(hub.url, tmp_path / "hf"):
        folder, sha = glue_hub.download(["rte"], revision="main")
        assert sha == glue_hub.REVISION and os.path.basename(folder) == sha
        for revision in ("v9", "0" * 40):
            with pytest.raises(ValueError, match="nyu-mll/glue has no such revision on the Hub"):
                glue_hub.download(["rte"], revision=revision)
        with pytest.raises(ValueError, match="config.task.glue_repo='nyu-mll/glu': no such"):
            glue_hub.download(["rte"], repo="nyu-mll/glu")
        with pytest.raises(ValueError, match="GLUE task 'rtee': GLUE tasks are"):
            glue_hub.download(["rtee"])


def test_a_hub_that_keeps_failing_is_storage_unavailable_not_bad_input(hub, glue_repo, tmp_path):
    """A 503 on the revision lookup (huggingface_hub does not retry it) with nothing cached:
    StorageUnavailable (exit status 75: rerun), not a message about the input."""
    with use_endpoint(hub.url, tmp_path / "hf"):
        hub.fail("info", 503, times=1)
        with pytest.raises(StorageUnavailable, match="hf://datasets/nyu-mll/glue@main"):
            glue_hub.download(["rte"], revision="main")
        assert glue_hub.download(["rte"], revision="main")[1] == glue_hub.REVISION  # answered


def test_files_of_another_layout_or_a_test_split_are_refused(tmp_path, glue_repo):
    test_split = os.path.join(glue_repo, "rte", "test-00000-of-00001.parquet")
    with pytest.raises(ValueError, match=r"rows with label -1 \(unlabelled, as GLUE's test"):
        glue_hub.read_split(test_split, "rte")
    rows = [{"sentence1": "a", "sentence2": "b", "label": 0, "idx": 0}]
    swapped = {"label": {"names": ["not_entailment", "entailment"], "_type": "ClassLabel"}}
    write_parquet(str(tmp_path / "swapped.parquet"), "rte", rows, swapped)
    with pytest.raises(ValueError, match=r"label names \['not_entailment', 'entailment'\], exp"):
        glue_hub.read_split(str(tmp_path / "swapped.parquet"), "rte")
    write_parquet(str(tmp_path / "qnli.parquet"), "rte", rows)  # RTE's columns, read as QNLI
    with pytest.raises(ValueError, match=r"has no column\(s\) \['question', 'sentence'\]"):
        glue_hub.read_split(str(tmp_path / "qnli.parquet"), "qnli")


def test_the_harness_pins_the_commit_and_refuses_mixed_sources(hub, glue_repo, tmp_path):
    """The harness resolves config.task.glue_revision once, before any run, and every run's
    config names that commit; --glue_dir with another source, or an unknown source, stops."""
    from bertjax.evaluation.glue import GlueHarness, _run_config, task_hparams
    from bertjax.trainer import load_config_file

    config = load_config_file(os.path.join(ROOT, "configs", "glue.py"))
    config.glue.tasks = ("rte", "mnli")
    config.task.glue_revision = "main"
    harness = GlueHarness(config, "", str(tmp_path / "out"))
    assert harness.source == {"kind": "hub", "glue_dir": "", "revision": glue_hub.REVISION}
    hp = task_hparams(config.glue, "rte")
    run = _run_config(harness.config, "rte", harness.source, hp, 1e-4, 0, "")
    assert run.task.source == "glue:rte" and run.task.glue_revision == glue_hub.REVISION
    assert tuple(run.task.labels) == glue_tasks.TASKS["rte"].labels
    with pytest.raises(ValueError, match="not with --glue_source=hub"):
        GlueHarness(config, str(tmp_path), str(tmp_path / "out"), "hub")
    with pytest.raises(ValueError, match=r"--glue_source='hf': one of \('hub', 'dir', 'tfds'\)"):
        GlueHarness(config, "", str(tmp_path / "out"), "hf")


def test_the_command_offline_with_nothing_cached_is_one_line(hub, tmp_path):
    with use_endpoint(hub.url, tmp_path / "hf", offline=True):
        env = dict(child_env(), BERTJAX_HUGEPAGE_MALLOC="0")
    command = [sys.executable, "-m", "bertjax.glue", f"--workdir={tmp_path}/out"]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: GLUE from hf://datasets/nyu-mll/glue@bcdcba79d07bc864c1c254ccf")
    assert "pass --glue_dir=DIR (the GLUE download script's folders) or --glue_source=tfds" in line
    assert not os.path.exists(tmp_path / "out" / "runs")


def test_an_unknown_task_is_one_line_before_any_request(hub):
    from bertjax.evaluation.glue import default_glue_config, validate_glue_config

    hub.reset()
    with pytest.raises(ValueError, match=r"config.task.source='glue:rtee': GLUE tasks are \["):
        glue_hub.glue_examples("rtee", "train")
    glue = default_glue_config()
    glue.tasks = ("rte", "rtee")
    with pytest.raises(
        ValueError, match=r"config.glue.tasks=\('rte', 'rtee'\): unknown \['rtee'\]"
    ):
        validate_glue_config(glue)
    assert hub.count() == 0
