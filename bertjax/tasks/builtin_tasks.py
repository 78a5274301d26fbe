"""The built-in fine-tuning tasks, made offline from CPython's own docstrings.

The documents come from bertjax/data/text/builtin_corpus.py:
  stdlib_families    each docstring sentence labelled by the library family of its module
                     (text, files, network, concurrency); train/dev split by document.
  stdlib_code_spans  BIO tags over words: EXC (names ending in Error/Exception/Warning) and
                     CODE (runs of code-like words: dotted, snake_case, calls); split by document.
  stdlib_word_order  is a sentence (6-24 words, any document) as written or has a span of 3-4
                     inner words been permuted? Labels "as_written" / "reordered", about half
                     each, fixed per sentence by a hash; both classes have the same bag of
                     words, so unlike stdlib_families it needs word order (CoLA-like). Split by
                     document; dev leaves out sentences a train document repeats.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence

import numpy as np

from bertjax.data.text.sentences import is_heldout

# Library families of the built-in classification task (module -> family via these prefixes).
FAMILIES = {
    "text": (
        "difflib",
        "codecs",
        "re",
        "json",
        "textwrap",
        "base64",
        "csv",
        "configparser",
        "xml",
        "html",
        "locale",
        "tokenize",
        "pprint",
        "quopri",
        "shlex",
        "string",
        "gettext",
        "plistlib",
    ),
    "files": (
        "os",
        "shutil",
        "pathlib",
        "tarfile",
        "zipfile",
        "tempfile",
        "lzma",
        "bz2",
        "gzip",
        "fileinput",
        "io",
        "shelve",
        "filecmp",
        "fnmatch",
        "glob",
        "pickle",
        "sqlite3",
        "wave",
        "mailbox",
        "platform",
    ),
    "network": (
        "ssl",
        "smtplib",
        "imaplib",
        "http",
        "urllib",
        "socketserver",
        "ftplib",
        "socket",
        "mimetypes",
        "poplib",
    ),
    "concurrency": (
        "threading",
        "asyncio",
        "concurrent",
        "subprocess",
        "selectors",
        "queue",
        "sched",
        "multiprocessing",
    ),
}
BUILTIN_TASKS = ("stdlib_families", "stdlib_code_spans", "stdlib_word_order")
# stdlib_word_order: sentence lengths in words (whole sentences fit a 64-token row), span lengths.
WORD_ORDER_WORDS = (6, 24)
WORD_ORDER_SPANS = (3, 4)
_EXCEPTION = re.compile(r"^[A-Z]\w*(Error|Exception|Warning)$")
_CODE = re.compile(r"^\w+(\.\w+)+(\(\))?$|^\w*_\w*(\(\))?$|^\w+\(\)$")


def family_of(doc_id: str) -> str | None:
    """The family of a built-in document id such as 'doc:json.decoder.JSONDecoder.decode'."""
    if not doc_id.startswith("doc:"):
        return None
    top = doc_id[4:].split(".")[0]
    return next((family for family, modules in FAMILIES.items() if top in modules), None)


def code_span_tags(words: Sequence[str]) -> list[str]:
    """Rule-made BIO tags of the built-in token task: B-/I-CODE runs, B-EXC single words."""
    tags, previous = [], "O"
    for word in words:
        bare = word.strip(".,;:'\"`()")
        if _EXCEPTION.match(bare):
            tag = "B-EXC"
        elif _CODE.match(word.strip(",;:'\"`")) and not word.endswith("."):
            tag = "I-CODE" if previous.endswith("CODE") else "B-CODE"
        else:
            tag = "O"
        tags.append(tag)
        previous = tag
    return tags


def reorder_span(words: Sequence[str], key: str) -> tuple[list[str], bool] | None:
    """The word-order example of a sentence: (words, reordered) where, for about half the keys,
    a span of 3-4 distinct inner words (never the first or last word) is permuted into another
    order; None when the sentence is too short/long or the drawn span repeats a word. Depends
    only on ``key`` and the words."""
    low, high = WORD_ORDER_WORDS
    if not low <= len(words) <= high:
        return None
    seed = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    width = int(rng.integers(WORD_ORDER_SPANS[0], WORD_ORDER_SPANS[1] + 1))
    start = int(rng.integers(1, len(words) - width))  # inner words only: [1, len - 1)
    span = list(words[start : start + width])
    if len(set(span)) < width:  # a permuted span of equal words could read as written
        return None
    if rng.random() < 0.5:
        return list(words), False
    orders = list(itertools.permutations(range(width)))[1:]  # every order but the original
    order = orders[int(rng.integers(len(orders)))]
    return list(words[:start]) + [span[i] for i in order] + list(words[start + width :]), True


def _word_order_examples(documents, split: str, dev_fraction: float) -> list[dict]:
    """stdlib_word_order's examples; a dev sentence that a train document also holds (the
    stdlib repeats some docstrings) is left out, so dev is never memorised."""
    examples, train_sentences = [], set()
    for doc_id, sentences in documents:
        dev = is_heldout(doc_id, dev_fraction)
        train_sentences.update(() if dev else sentences)
        for index, sentence in enumerate(sentences if dev == (split == "dev") else ()):
            made = reorder_span(sentence.split(), f"{doc_id}#{index}")
            if made is not None:
                label = "reordered" if made[1] else "as_written"
                examples.append({"text": " ".join(made[0]), "label": label, "source": sentence})
    return [
        {"text": e["text"], "text_pair": "", "label": e["label"]}
        for e in examples
        if split != "dev" or e["source"] not in train_sentences
    ]


def builtin_examples(name: str, split: str, dev_fraction: float) -> list[dict]:
    """Examples of a built-in task; documents go to dev by a stable hash of their id."""
    from bertjax.data.text import builtin_corpus

    if name not in BUILTIN_TASKS:
        raise ValueError(f"config.task.source='builtin:{name}': built-in tasks are {BUILTIN_TASKS}")
    if name == "stdlib_word_order":
        return _word_order_examples(builtin_corpus.documents(), split, dev_fraction)
    examples = []
    for doc_id, sentences in builtin_corpus.documents():
        if (split == "dev") != is_heldout(doc_id, dev_fraction):
            continue
        family = family_of(doc_id)
        if family is None:
            continue
        for sentence in sentences:
            words = sentence.split()
            if len(words) < 4:  # "Return the value." carries no family signal
                continue
            if name == "stdlib_families":
                examples.append({"text": sentence, "text_pair": "", "label": family})
            else:
                examples.append({"tokens": words, "tags": code_span_tags(words)})
    return examples
