"""docs/hub.md's commands run as written, against a local Hub (tests/hub_server.py) holding the
repositories they name, in their layout: FineWeb-Edu's sample/10BT Parquet files and Wikipedia's
card-listed subsets. As README's test does (tests/readme_test.py), every ``python train.py`` gets
overrides appended that shrink it to a few steps of a small model on the session's tokenizer
(and the prepare command that tokenizer), and the commands run from a copy of the repository
root with ``my_corpus/`` in it."""

import io
import json
import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, xla_flags
from readme_test import readme_blocks, shell_commands, shrunken

from bertjax.data.text import corpus

DOC = os.path.join(ROOT, "docs", "hub.md")
FINEWEB_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*/*
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
---
"""
WIKIPEDIA_CARD = """---
configs:
- config_name: 20231101.en
  data_files:
  - split: train
    path: 20231101.en/train-*
- config_name: 20231101.fr
  data_files:
  - split: train
    path: 20231101.fr/train-*
---
"""


def _parquet(texts, **columns) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"text": texts, **columns}), out, row_group_size=16)
    return out.getvalue()


def _scratch_root(directory) -> str:
    """``directory`` with a symlink to each entry of the repository root but workdir/ and
    hidden files: the commands' relative paths land in it."""
    for name in os.listdir(ROOT):
        if not name.startswith((".", "workdir")):
            os.symlink(os.path.join(ROOT, name), os.path.join(directory, name))
    return str(directory)


def _env() -> dict:
    return dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")  # and HF_ENDPOINT


def _blocks():
    with open(DOC, encoding="utf-8") as f:
        return [b for b in readme_blocks(f.read()) if b.runnable]


@pytest.fixture(scope="module")
def results(hub, tmp_path_factory, small_spm):
    """Every runnable block of docs/hub.md run in order: (block, [(command, result)])."""
    texts = [" ".join(d) for _, (_, d) in zip(range(690), corpus.iter_documents("builtin"))]
    ids = {"id": [f"<urn:uuid:{i}>" for i in range(300)]}  # each file's held-out documents
    hub.commit(  # make NSP rows in the prepared store's pieces (a file each)
        "HuggingFaceFW/fineweb-edu",
        {
            "README.md": FINEWEB_CARD,
            "sample/10BT/000_00000.parquet": _parquet(texts[:300], **ids),
            "sample/10BT/001_00000.parquet": _parquet(texts[300:600], **ids),
        },
    )
    titles = {"title": [t[:20] for t in texts[600:]]}
    hub.commit(
        "wikimedia/wikipedia",
        {
            "README.md": WIKIPEDIA_CARD,
            "20231101.en/train-00000-of-00001.parquet": _parquet(texts[600:], **titles),
            "20231101.fr/train-00000-of-00001.parquet": _parquet(["Bonjour."] * 90, **titles),
        },
    )
    root = _scratch_root(tmp_path_factory.mktemp("docs_hub_root"))
    os.makedirs(os.path.join(root, "my_corpus"))
    for part in range(2):
        with open(os.path.join(root, "my_corpus", f"part-{part}.jsonl"), "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[part:90:2])
    out = []
    for block in _blocks():
        ran = []
        for argv in shell_commands(block.text):
            command = shrunken(argv, small_spm)
            if "bertjax.data.prepare" in command:
                command = [*command, f"--config.data.tokenizer_model={small_spm}"]
            result = subprocess.run(command, cwd=root, env=_env(), capture_output=True,
                                    text=True, timeout=600)  # fmt: skip
            ran.append((command, result))
            if result.returncode:
                break
        out.append((block, ran))
    return root, out


def test_every_command_of_docs_hub_runs_as_written(results):
    _, ran = results
    assert len(ran) == 5
    for block, commands in ran:
        for command, result in commands:
            assert result.returncode == 0, (block.name, command, result.stderr[-3000:])


def test_the_hub_runs_read_what_the_doc_says(results, hub):
    root, _ = results
    work = os.path.join(root, "workdir")
    fineweb = json.load(open(os.path.join(work, "fineweb", "corpus.json")))
    sha = hub.repos.resolve(hub.repos.folder("dataset", "HuggingFaceFW/fineweb-edu"), "main")
    assert fineweb["pinned"] == (
        f"hf://datasets/HuggingFaceFW/fineweb-edu@{sha}/sample/10BT/*.parquet"
    )
    wikipedia = json.load(open(os.path.join(work, "wikipedia", "corpus.json")))
    assert wikipedia["pinned"].endswith("/20231101.en/train-*")
    manifest = json.load(open(os.path.join(work, "fineweb-store", "manifest.json")))
    assert sha in manifest["corpus"]
    for name in ("own-text", "fineweb", "wikipedia", "stream", "from-store"):
        metrics = [json.loads(line) for line in open(os.path.join(work, name, "metrics.jsonl"))]
        assert any("eval/mlm_accuracy" in row for row in metrics), name
