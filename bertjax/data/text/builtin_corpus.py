"""The built-in corpus: English prose shipped with CPython (pydoc topics and stdlib docstrings).

It needs no download and is identical on every run of the same Python: topics are walked in
sorted order, then a fixed, sorted list of standard-library modules, each member in sorted order.
One topic or one docstring is one document; paragraphs are joined and split into sentences.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

from bertjax.data.text.sentences import cut_long, split_sentences
from bertjax.data.text.stdlib_docs import STDLIB_MODULES

_COLLECTOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdlib_docs.py")
_BLANK_LINES = re.compile(r"\n\s*\n")
_SPACES = re.compile(r"\s+")


def text_to_sentences(text: str) -> list[str]:
    """Dedents text, joins each paragraph's lines and splits it into sentences."""
    sentences = []
    for paragraph in _BLANK_LINES.split(inspect.cleandoc(text)):
        paragraph = _SPACES.sub(" ", paragraph).strip()
        for sentence in split_sentences(paragraph):
            sentences.extend(cut_long(sentence))
    return sentences


@functools.lru_cache(maxsize=1)
def _raw_documents() -> tuple:
    """Raw texts read by stdlib_docs.py in a clean interpreter (see there why)."""
    result = subprocess.run(
        [sys.executable, "-I", "-S", _COLLECTOR],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"reading the built-in corpus with {_COLLECTOR} failed: {result.stderr[-2000:]}"
        )
    return tuple((doc_id, text) for doc_id, text in json.loads(result.stdout))


# Docstrings are short (median 15 words): consecutive ones of a module are joined into one
# document of at least this many words, so NSP/SOP pairs can fill a 128-token row.
MIN_DOCUMENT_WORDS = 100


def _module_of(doc_id: str) -> str:
    """The standard-library module a docstring id belongs to (longest matching prefix)."""
    name = doc_id[len("doc:") :]
    return max(
        (m for m in STDLIB_MODULES if name == m or name.startswith(m + ".")), key=len, default=name
    )


def documents() -> Iterator[tuple[str, list[str]]]:
    """(doc_id, sentences) of the built-in corpus, in a fixed order: each pydoc topic is a
    document; a module's docstrings are joined in order into documents of >= MIN_DOCUMENT_WORDS."""
    pending_id, pending, words, module = None, [], 0, None
    for doc_id, text in _raw_documents():
        doc = text_to_sentences(text)
        if not doc:
            continue
        if doc_id.startswith("topic:"):
            yield doc_id, doc
            continue
        doc_module = _module_of(doc_id)
        if pending and (doc_module != module or words >= MIN_DOCUMENT_WORDS):
            yield pending_id, pending
            pending_id, pending, words = None, [], 0
        pending_id, module = pending_id or doc_id, doc_module
        pending = pending + doc
        words += sum(len(sentence.split()) for sentence in doc)
    if pending:
        yield pending_id, pending
