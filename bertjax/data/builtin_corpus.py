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
from typing import Iterator

from bertjax.data.corpus import cut_long, split_sentences

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
  result = subprocess.run([sys.executable, "-I", "-S", _COLLECTOR], capture_output=True, text=True,
                          check=False, timeout=300)
  if result.returncode != 0:
    raise RuntimeError(f"reading the built-in corpus with {_COLLECTOR} failed: {result.stderr[-2000:]}")
  return tuple((doc_id, text) for doc_id, text in json.loads(result.stdout))


def documents() -> Iterator[tuple[str, list[str]]]:
  """(doc_id, sentences) of the built-in corpus, in a fixed order."""
  for doc_id, text in _raw_documents():
    doc = text_to_sentences(text)
    if doc:
      yield doc_id, doc
