"""GLUE tasks as the standard download script (download_glue_data.py) lays them out, each task's
official metrics, and its score.

``config.task.source="glue:NAME"`` reads ``config.task.glue_dir/<Dir>/train.tsv`` and the dev
file(s) with the script's exact columns: CoLA's train/dev have no header row (source, label,
original mark, sentence); SST-2 ``sentence``/``label``; MRPC ``#1 String``/``#2 String``/
``Quality``; STS-B ``sentence1``/``sentence2``/``score`` (a float); QQP ``question1``/
``question2``/``is_duplicate``; MNLI ``sentence1``/``sentence2``/``gold_label`` with
``dev_matched.tsv`` and ``dev_mismatched.tsv``; QNLI ``question``/``sentence``/``label`` and RTE,
WNLI ``sentence1``/``sentence2``/``label``. The files are read without quote handling (GLUE
sentences contain unbalanced quotes); rows with the wrong number of fields (a few in QQP) are
skipped and counted in the log.

Dev metrics (TaskData.score): MNLI's matched set keeps the plain names (``accuracy``), the
mismatched set gets ``_mm`` (``accuracy_mm``). A task's ``score`` is the mean of its official
metrics, as the GLUE leaderboard averages the tasks that report two numbers; the GLUE average
is the mean of the eight scores (WNLI is left out, as BERT and most papers leave it out).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os

import numpy as np


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """Where a task's examples are and what it reports. Columns are header names, or indices for
    a file without a header; ``metrics`` pairs each official name with its dev metric key."""

    directory: str
    text: str | int
    pair: str | int | None
    label: str | int
    labels: tuple[str, ...]  # label names in id order (() = regression)
    metrics: tuple[tuple[str, str], ...]
    dev_files: tuple[str, ...] = ("dev.tsv",)
    header: bool = True


_BINARY = ("0", "1")
_ENTAILMENT = ("entailment", "not_entailment")
# Label orders match TFDS glue/* ids (e.g. MNLI 0 entailment, 1 neutral, 2 contradiction).
TASKS = {
    "cola": GlueTask("CoLA", 3, None, 1, _BINARY, (("matthews", "matthews"),), header=False),
    "sst2": GlueTask("SST-2", "sentence", None, "label", _BINARY, (("accuracy", "accuracy"),)),
    "mrpc": GlueTask(
        "MRPC",
        "#1 String",
        "#2 String",
        "Quality",
        _BINARY,
        (("f1", "f1"), ("accuracy", "accuracy")),
    ),
    "stsb": GlueTask(
        "STS-B",
        "sentence1",
        "sentence2",
        "score",
        (),
        (("pearson", "pearson"), ("spearman", "spearman")),
    ),
    "qqp": GlueTask(
        "QQP",
        "question1",
        "question2",
        "is_duplicate",
        _BINARY,
        (("f1", "f1"), ("accuracy", "accuracy")),
    ),
    "mnli": GlueTask(
        "MNLI",
        "sentence1",
        "sentence2",
        "gold_label",
        ("entailment", "neutral", "contradiction"),
        (("accuracy_m", "accuracy"), ("accuracy_mm", "accuracy_mm")),
        dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
    ),
    "qnli": GlueTask(
        "QNLI", "question", "sentence", "label", _ENTAILMENT, (("accuracy", "accuracy"),)
    ),
    "rte": GlueTask(
        "RTE", "sentence1", "sentence2", "label", _ENTAILMENT, (("accuracy", "accuracy"),)
    ),
    "wnli": GlueTask(
        "WNLI", "sentence1", "sentence2", "label", _BINARY, (("accuracy", "accuracy"),)
    ),
}
# TFDS glue/* features: (text, pair or "").
TFDS_FEATURES = {
    "cola": ("sentence", ""),
    "sst2": ("sentence", ""),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
# The tasks of the GLUE average (WNLI runs when asked but is not averaged).
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
# Suffix of the metrics of a second dev file (MNLI mismatched).
SECOND_DEV_PART = "mm"


def task_of_source(source: str) -> str | None:
    """The GLUE task a ``config.task.source`` names ("glue:rte", "tfds:glue/rte"), else None."""
    for prefix in ("glue:", "tfds:glue/"):
        if source.startswith(prefix) and source[len(prefix) :] in TASKS:
            return source[len(prefix) :]
    return None


def _column(header: list[str] | None, column: str | int, path: str) -> int:
    if isinstance(column, int):
        return column
    if column not in header:
        raise ValueError(
            f"GLUE file {path!r} has no column {column!r} (its header: {header}); expected the "
            "layout of the GLUE download script (download_glue_data.py)"
        )
    return header.index(column)


def read_tsv(path: str, header: bool) -> tuple[list[str] | None, list[list[str]]]:
    """(header, rows) of a GLUE TSV file, read without quote handling."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"GLUE file {path!r} does not exist: --glue_dir (config.task.glue_dir) must hold "
            "the download script's task folders (CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, ...)"
        )
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    rows = [row for row in rows if row]
    if header:
        if not rows:
            raise ValueError(f"GLUE file {path!r} is empty (it needs a header row)")
        return [c.strip() for c in rows[0]], rows[1:]
    return None, rows


def glue_examples(glue_dir: str, name: str, split: str) -> list[dict]:
    """Examples of GLUE task ``name`` ("train" or "dev"; MNLI's dev holds matched, then
    mismatched examples marked ``dev_part="mm"``)."""
    if name not in TASKS:
        raise ValueError(f"config.task.source='glue:{name}': GLUE tasks are {sorted(TASKS)}")
    if not glue_dir:
        raise ValueError(
            f"config.task.source='glue:{name}' needs config.task.glue_dir (--glue_dir)"
        )
    task = TASKS[name]
    files = ("train.tsv",) if split == "train" else task.dev_files
    examples = []
    for number, file in enumerate(files):
        path = os.path.join(glue_dir, task.directory, file)
        header, rows = read_tsv(path, task.header)
        text, label = _column(header, task.text, path), _column(header, task.label, path)
        pair = None if task.pair is None else _column(header, task.pair, path)
        width = len(header) if header else max(text, label) + 1
        good = [row for row in rows if (len(row) == width if header else len(row) >= width)]
        if len(good) < len(rows):
            logging.warning("%s: skipped %d malformed rows", path, len(rows) - len(good))
        extra = {"dev_part": SECOND_DEV_PART} if number else {}
        examples.extend(
            {
                "text": row[text],
                "text_pair": "" if pair is None else row[pair],
                "label": row[label].strip(),
                **extra,
            }
            for row in good
        )
    return examples


def official_metrics(name: str, metrics: dict) -> dict:
    """The task's official metrics by their GLUE names, from TaskData's dev metrics (accepts
    keys with or without the trainer's ``eval/`` prefix)."""
    find = lambda key: metrics[key] if key in metrics else metrics[f"eval/{key}"]  # noqa: E731
    return {official: float(find(key)) for official, key in TASKS[name].metrics}


def task_score(name: str, metrics: dict) -> float:
    """The mean of the task's official metrics."""
    return float(np.mean(list(official_metrics(name, metrics).values())))
