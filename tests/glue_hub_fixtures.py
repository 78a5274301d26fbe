"""``nyu-mll/glue`` as the Hub holds it, made from a GLUE directory (tests/glue_fixtures.py), for
the local Hub (tests/hub_server.py): every config's folder (cola, sst2, mrpc, qqp, stsb, mnli,
mnli_matched, mnli_mismatched, qnli, rte, wnli, ax) with ``SPLIT-00000-of-00001.parquet`` files,
at the pinned commit SHA bertjax reads (`bertjax.tasks.glue_hub.REVISION`), main pointing at it.

The rows are what the old ``glue`` loading script (huggingface/datasets, datasets/glue/glue.py,
whose output the parquet conversion stored) made of the download script's TSV files, ported
here: its text features (``premise`` from MNLI's ``sentence1``, ...), a TSV label that is not
one of the ClassLabel's names cast to int (CoLA "1", WNLI "1"), otherwise the name's index,
STS-B's score as float32, ``idx`` the row number, rows with a missing field dropped; test
splits with every label -1. The schema is the conversion's: strings, ``label`` int64 (float32
for STS-B), ``idx`` int32, and the features, ClassLabel names included, in the ``huggingface``
schema metadata."""

import csv
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bertjax.tasks import glue_hub

# Each config: (TSV folder, {feature: TSV column}, label column, ClassLabel names or None).
SCRIPT = {
    "cola": ("CoLA", {"sentence": "sentence"}, "is_acceptable", ("unacceptable", "acceptable")),
    "sst2": ("SST-2", {"sentence": "sentence"}, "label", ("negative", "positive")),
    "mrpc": (
        "MRPC",
        {"sentence1": "#1 String", "sentence2": "#2 String"},
        "Quality",
        ("not_equivalent", "equivalent"),
    ),
    "qqp": (
        "QQP",
        {"question1": "question1", "question2": "question2"},
        "is_duplicate",
        ("not_duplicate", "duplicate"),
    ),
    "stsb": ("STS-B", {"sentence1": "sentence1", "sentence2": "sentence2"}, "score", None),
    "mnli": (
        "MNLI",
        {"premise": "sentence1", "hypothesis": "sentence2"},
        "gold_label",
        ("entailment", "neutral", "contradiction"),
    ),
    "qnli": (
        "QNLI",
        {"question": "question", "sentence": "sentence"},
        "label",
        ("entailment", "not_entailment"),
    ),
    "rte": (
        "RTE",
        {"sentence1": "sentence1", "sentence2": "sentence2"},
        "label",
        ("entailment", "not_entailment"),
    ),
    "wnli": (
        "WNLI",
        {"sentence1": "sentence1", "sentence2": "sentence2"},
        "label",
        ("not_entailment", "entailment"),
    ),
}
# Hub split -> the TSV file it was made from (MNLI's and its matched/mismatched configs').
MNLI_FILES = {"validation_matched": "dev_matched", "validation_mismatched": "dev_mismatched"}


def script_rows(tsv_path: str, config: str) -> list[dict]:
    """Port of the loading script's _generate_examples for one TSV file (module docstring)."""
    _, features, label_column, names = SCRIPT[config]
    with open(tsv_path, encoding="utf8") as f:
        if config == "cola":  # train/dev without a header: (source, label, mark, sentence)
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            rows = [{"sentence": r[3], "is_acceptable": r[1]} for r in reader]
        else:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    out = []
    for n, row in enumerate(rows):
        example = {feature: row.get(column) for feature, column in features.items()}
        label = row.get(label_column)
        if names and label is not None and label not in names:
            label = int(label) if label else None
        elif names and label is not None:
            label = names.index(label)  # ClassLabel encodes a name as its index
        elif label is not None:
            label = float(np.float32(label))
        example["label"], example["idx"] = label, n
        if all(value is not None for value in example.values()):
            out.append(example)
    return out


def _features(config: str) -> dict:
    _, features, _, names = SCRIPT[config]
    out = {name: {"dtype": "string", "_type": "Value"} for name in features}
    out["label"] = (
        {"names": list(names), "_type": "ClassLabel"}
        if names
        else {"dtype": "float32", "_type": "Value"}
    )
    out["idx"] = {"dtype": "int32", "_type": "Value"}
    return out


def write_parquet(path: str, config: str, rows: list[dict], features: dict | None = None) -> None:
    """One split's parquet file with the conversion's schema and metadata (``features``: other
    metadata, to make a file of another layout)."""
    _, text_features, _, names = SCRIPT[config]
    fields = [(name, pa.string()) for name in text_features]
    fields += [("label", pa.int64() if names else pa.float32()), ("idx", pa.int32())]
    metadata = {"huggingface": json.dumps({"info": {"features": features or _features(config)}})}
    schema = pa.schema(fields, metadata=metadata)
    table = pa.table({name: [r[name] for r in rows] for name, _ in fields}, schema=schema)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)


def _readme(splits: dict[str, list[str]]) -> str:
    lines = ["---", "configs:"]
    for config, names in splits.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        lines += [f"  - split: {s}\n    path: {config}/{s}-*" for s in names]
    return "\n".join(lines + ["---", "# GLUE (a test copy of nyu-mll/glue's layout)", ""])


def write_glue_repo(repos_root: str, glue_dir: str, sha: str = glue_hub.REVISION) -> str:
    """Writes ``nyu-mll/glue`` at commit ``sha`` (main) under the Hub server's ``repos_root``,
    its rows from the GLUE directory ``glue_dir``; returns the snapshot folder."""
    repo = os.path.join(repos_root, "datasets--nyu-mll--glue")
    snapshot = os.path.join(repo, "snapshots", sha)
    splits = {}

    def write(config, split, rows, layout=None):  # layout: the config whose columns it has
        layout = layout or config
        if split.startswith("test"):  # hidden labels
            rows = [dict(r, label=-1 if SCRIPT[layout][3] else -1.0) for r in rows]
        path = os.path.join(snapshot, config, f"{split}-00000-of-00001.parquet")
        write_parquet(path, layout, rows)
        splits.setdefault(config, []).append(split)

    for config, (folder, *_) in SCRIPT.items():
        tsv = os.path.join(glue_dir, folder, "{}.tsv").format
        write(config, "train", script_rows(tsv("train"), config))
        if config == "mnli":
            for split, file in MNLI_FILES.items():
                rows = script_rows(tsv(file), config)
                write("mnli", split, rows)
                write("mnli", split.replace("validation", "test"), rows)
                part = "mnli_matched" if split.endswith("_matched") else "mnli_mismatched"
                write(part, "validation", rows, "mnli")
                write(part, "test", rows, "mnli")
        else:
            rows = script_rows(tsv("dev"), config)
            write(config, "validation", rows)
            write(config, "test", rows)
    diagnostic = script_rows(os.path.join(glue_dir, "MNLI", "dev_matched.tsv"), "mnli")
    write("ax", "test", diagnostic, "mnli")
    with open(os.path.join(snapshot, "README.md"), "w") as f:
        f.write(_readme(splits))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(sha)
    return snapshot
