"""The Colab notebooks execute top to bottom on CPU with tiny settings (QUICK mode), so they never
rot; and each, executed once, is rendered the way Jupyter renders it (nbconvert to HTML), where
a reader's view is checked: every markdown cell opens with a heading that renders as one, and
the plots are images in the output (matplotlib's inline backend, Colab's default)."""

import html.parser
import os
import re

import nbformat
import pytest
from helpers import xla_flags
from nbclient import NotebookClient
from nbconvert import HTMLExporter

pytestmark = pytest.mark.slow  # end-to-end runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADING = re.compile(r"(#{1,6}) +(.+)")


def _run(name, tmp_path, monkeypatch):
    """The notebook executed (a kernel with matplotlib's inline backend, as in Colab)."""
    monkeypatch.setenv("BERTJAX_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own: inline, PNG outputs
    notebook = nbformat.read(os.path.join(ROOT, "colab", name), as_version=4)
    NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    return notebook


def _printed(notebook) -> str:
    return "\n".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


class _Page(html.parser.HTMLParser):
    """The headings (level, text), paragraphs and inline images of a rendered page."""

    def __init__(self):
        super().__init__()
        self.headings, self.paragraphs, self.images = [], [], []
        self._open = None  # (tag, collected text) of the heading or paragraph being read

    def handle_starttag(self, tag, attrs):
        if re.fullmatch(r"h[1-6]|p", tag):
            self._open = (tag, [])
        elif tag == "img":
            self.images.append(dict(attrs).get("src", ""))

    def handle_data(self, data):
        if self._open is not None:
            self._open[1].append(data)

    def handle_endtag(self, tag):
        if self._open is None or tag != self._open[0]:
            return
        text = "".join(self._open[1]).replace("¶", "").strip()  # the heading's anchor link
        if tag == "p":
            self.paragraphs.append(text)
        else:
            self.headings.append((int(tag[1]), text))
        self._open = None


def _check_as_rendered(notebook) -> _Page:
    """Renders ``notebook`` with nbconvert's HTML exporter (Jupyter's "Download as HTML") and
    checks what a reader sees: each markdown cell opens with a heading that renders at its
    level, the first is the page's title (h1), and no paragraph reads like a broken heading.
    Returns the page."""
    written = []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            first = cell.source.splitlines()[0]
            match = HEADING.fullmatch(first)
            assert match, f"a markdown cell that does not open with a heading: {first!r}"
            written.append((len(match.group(1)), match.group(2).strip()))
    body, _ = HTMLExporter().from_notebook_node(notebook)
    page = _Page()
    page.feed(body)
    assert page.headings == written  # each one a heading, in order, nothing else one
    assert written[0][0] == 1, "the notebook's first heading is its title (#)"
    broken = [p for p in page.paragraphs if p.lstrip("!").startswith("#")]
    assert not broken, f"paragraphs that read as unrendered headings: {broken}"
    return page


def test_quickstart_runs(tmp_path, monkeypatch):
    notebook = _run("quickstart.ipynb", tmp_path, monkeypatch)
    text = _printed(notebook)
    assert "held-out MLM accuracy" in text and "most-frequent-token baseline" in text
    assert "eval/" in text  # the fine-tuned classifier's dev metrics
    difference = float(text.split("max |bertjax - transformers| =")[1].split()[0])
    assert difference < 1e-4
    assert "held-out NLL bound" in text and "|||" in text
    page = _check_as_rendered(notebook)
    assert [h for _, h in page.headings][:2] == [
        "bertjax quickstart",
        "1. Pretrain BERT-tiny with a live loss plot",
    ]
    # The loss plot: a PNG output of the training cell (the last chunk's), shown inline.
    plotted = [
        out
        for cell in notebook.cells
        if cell.cell_type == "code" and "plt.show()" in cell.source
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(plotted) == 1
    pngs = [src for src in page.images if src.startswith("data:image/png;base64,")]
    assert pngs == ["data:image/png;base64," + plotted[0]["data"]["image/png"].strip()]


def test_pretrain_tpu_runs(tmp_path, monkeypatch):
    notebook = _run("pretrain_tpu.ipynb", tmp_path, monkeypatch)
    text = _printed(notebook)
    assert (
        "effective peak LR" in text and "stopped at step 4" in text and "resumed to step 6" in text
    )
    page = _check_as_rendered(notebook)
    assert page.headings[0] == (1, "Pretraining on a Cloud TPU with bertjax")
