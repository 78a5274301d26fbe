"""The built-in corpus: English prose shipped with CPython (pydoc topics and stdlib docstrings).

It needs no download and is identical on every run of the same Python: topics are walked in
sorted order, then a fixed, sorted list of standard-library modules, each member in sorted order.
One topic or one docstring is one document; paragraphs are joined and split into sentences.
"""
from __future__ import annotations

import importlib
import inspect
import re
import warnings
from typing import Iterator

from bertjax.data.corpus import cut_long, split_sentences

# Modules that import without side effects on every supported platform; sorted, never reordered.
STDLIB_MODULES = tuple(sorted((
    "abc", "argparse", "ast", "asyncio.events", "asyncio.locks", "asyncio.queues", "asyncio.streams",
    "asyncio.tasks", "base64", "bdb", "bisect", "bz2", "calendar", "cmd", "codecs", "collections",
    "concurrent.futures._base", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "dis", "doctest", "email.message", "email.utils", "enum", "filecmp",
    "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gettext", "glob", "gzip", "hashlib",
    "heapq", "hmac", "html.parser", "http.client", "http.cookiejar", "http.server", "imaplib",
    "inspect", "io", "ipaddress", "itertools", "json", "json.decoder", "json.encoder", "locale",
    "logging", "logging.handlers", "lzma", "mailbox", "math", "mimetypes", "multiprocessing.pool",
    "netrc", "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools",
    "platform", "plistlib", "poplib", "pprint", "profile", "pstats", "queue", "quopri", "random",
    "re", "reprlib", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "smtplib",
    "socket", "socketserver", "sqlite3", "ssl", "statistics", "string", "struct", "subprocess",
    "symtable", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace",
    "traceback", "types", "typing", "unittest.case", "unittest.mock", "urllib.parse",
    "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "zipfile", "zoneinfo",
)))

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


def _import(name: str):
  """Imports a stdlib module quietly; None if this Python lacks it."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      return importlib.import_module(name)
    except Exception:  # a module missing on this platform/build is simply not part of the corpus
      return None


def _member_docs(module) -> Iterator[tuple[str, str]]:
  """(qualified name, docstring) of a module's own classes, functions and methods, sorted."""
  for name, obj in sorted(vars(module).items()):
    if not (inspect.isclass(obj) or inspect.isfunction(obj)) or getattr(obj, "__module__", None) != module.__name__:
      continue
    if isinstance(obj.__doc__, str):
      yield f"{module.__name__}.{name}", obj.__doc__
    if inspect.isclass(obj):
      for attr, member in sorted(vars(obj).items()):
        member = getattr(member, "__func__", member)  # classmethod / staticmethod
        member = getattr(member, "fget", member)  # property
        if inspect.isfunction(member) and isinstance(member.__doc__, str):
          yield f"{module.__name__}.{name}.{attr}", member.__doc__


def documents() -> Iterator[tuple[str, list[str]]]:
  """(doc_id, sentences) of the built-in corpus, in a fixed order."""
  from pydoc_data.topics import topics
  for key in sorted(topics):
    doc = text_to_sentences(topics[key])
    if doc:
      yield f"topic:{key}", doc
  for module_name in STDLIB_MODULES:
    module = _import(module_name)
    if module is None:
      continue
    docs = [(module_name, module.__doc__)] if isinstance(module.__doc__, str) else []
    with warnings.catch_warnings():  # e.g. typing.io warns when its docstring is read
      warnings.simplefilter("ignore")
      docs += list(_member_docs(module))
    for doc_id, text in docs:
      doc = text_to_sentences(text)
      if doc:
        yield f"doc:{doc_id}", doc
