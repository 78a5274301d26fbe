"""A GLUE directory in the exact formats of the standard download script, a few rows per task,
with a learnable toy signal (label words in the first sentence) — for tests/glue_test.py."""

from __future__ import annotations

import os

import numpy as np

# Words that carry the label (class c of a task uses SIGNAL[c]) and filler around them.
SIGNAL = (
    "good great fine nice happy".split(),
    "bad poor awful sad wrong".split(),
    "maybe perhaps some other thing".split(),
)
FILLER = "the film was a story about people and their day in the town with friends".split()
SIZES = {"train": 64, "dev": 48}


def _sentence(rng, label: int) -> str:
    words = list(rng.choice(FILLER, 5)) + list(rng.choice(SIGNAL[label], 2))
    rng.shuffle(words)
    return " ".join(words)


def _write(path: str, header: list[str] | None, rows: list[list[str]], extra: str = "") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        if header:
            f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(row) + "\n")
        f.write(extra)


MNLI_TRAIN = (
    "index promptID pairID genre sentence1_binary_parse sentence2_binary_parse "
    "sentence1_parse sentence2_parse sentence1 sentence2 label1 gold_label"
).split()
MNLI_DEV = MNLI_TRAIN[:-1] + "label2 label3 label4 label5 gold_label".split()
MNLI_LABELS = ("entailment", "neutral", "contradiction")
STSB = "index genre filename year old_index source1 source2 sentence1 sentence2 score".split()


def _rows(task: str, split: str, rng, n: int) -> tuple[list[str] | None, list[list[str]]]:
    """One file's header and rows in the download script's layout for ``task``."""
    rows = []
    for i in range(n):
        label = int(rng.integers(3 if task == "mnli" else 2))
        a, b = _sentence(rng, label), _sentence(rng, int(rng.integers(2)))
        if task == "cola":  # no header: source, label, original mark, sentence
            rows.append(["gj04", str(1 - label), "*" if label else "", a])
        elif task == "sst2":
            rows.append([a, str(1 - label)])
        elif task == "mrpc":
            rows.append([str(1 - label), str(100 + i), str(200 + i), a, b])
        elif task == "stsb":
            score = f"{(5.0 if label == 0 else 1.0) - rng.random():.3f}"
            rows.append([str(i), "main-news", "2012", "0001", str(i), "none", "none", a, b, score])
        elif task == "qqp":
            rows.append([str(i), str(2 * i), str(2 * i + 1), a, b, str(1 - label)])
        elif task == "mnli":
            gold = MNLI_LABELS[label]
            votes = [gold] * (5 if split != "train" else 1)
            parses = ["( x )", "( y )", "(S x)", "(S y)"]
            rows.append([str(i), str(i), f"{i}e", "fiction", *parses, a, b, *votes, gold])
        elif task in ("qnli", "rte"):
            rows.append([str(i), a, b, ("entailment", "not_entailment")[label]])
        elif task == "wnli":
            rows.append([str(i), a, b, str(1 - label)])
    headers = {
        "cola": None,
        "sst2": ["sentence", "label"],
        "mrpc": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        "stsb": STSB,
        "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        "mnli": MNLI_TRAIN if split == "train" else MNLI_DEV,
        "qnli": ["index", "question", "sentence", "label"],
        "rte": ["index", "sentence1", "sentence2", "label"],
        "wnli": ["index", "sentence1", "sentence2", "label"],
    }
    return headers[task], rows


DIRECTORIES = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "stsb": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}


def write_glue_dir(root: str, seed: int = 0) -> str:
    """Writes every task's train and dev files under ``root``; returns ``root``. Quirks of the
    real files are kept: an SST-2 sentence opens a quote it never closes, and QQP's train file
    has a malformed row (too few fields) that readers must skip."""
    rng = np.random.default_rng(seed)
    for task, directory in DIRECTORIES.items():
        for split in ("train", "dev"):
            files = ["dev_matched.tsv", "dev_mismatched.tsv"] if task == "mnli" else ["dev.tsv"]
            for file in ["train.tsv"] if split == "train" else files:
                header, rows = _rows(task, split, rng, SIZES[split])
                extra = ""
                if task == "sst2" and split == "train":
                    rows[0][0] = '" ' + rows[0][0]  # an unbalanced quote, as in GLUE's text
                if task == "qqp" and split == "train":
                    extra = "999\t1\t2\tonly one question\n"  # a malformed row
                _write(os.path.join(root, directory, file), header, rows, extra)
    return root
