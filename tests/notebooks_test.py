"""The Colab notebooks execute top to bottom on CPU with tiny settings (QUICK mode), so they never
rot."""

import os

import nbformat
import pytest
from helpers import xla_flags
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # end-to-end runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(name, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTJAX_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(os.path.join(ROOT, "colab", name), as_version=4)
    NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    return "\n".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


def test_quickstart_runs(tmp_path, monkeypatch):
    text = _run("quickstart.ipynb", tmp_path, monkeypatch)
    assert "held-out MLM accuracy" in text and "most-frequent-token baseline" in text
    assert "eval/" in text  # the fine-tuned classifier's dev metrics
    difference = float(text.split("max |bertjax - transformers| =")[1].split()[0])
    assert difference < 1e-4
    assert "held-out NLL bound" in text and "|||" in text


def test_pretrain_tpu_runs(tmp_path, monkeypatch):
    text = _run("pretrain_tpu.ipynb", tmp_path, monkeypatch)
    assert (
        "effective peak LR" in text and "stopped at step 4" in text and "resumed to step 6" in text
    )
