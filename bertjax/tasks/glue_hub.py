"""GLUE as users get it today: the parquet files of ``nyu-mll/glue`` on the Hugging Face Hub, at
a pinned revision, downloaded once into the user's Hugging Face cache by huggingface_hub's own
``snapshot_download`` (a second read makes no request; an offline machine reads the cache).

The repository's layout (since its conversion to parquet, when datasets dropped loading
scripts): one folder a config, ``CONFIG/SPLIT-00000-of-00001.parquet``; configs cola, sst2,
mrpc, qqp, stsb, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli and ax; splits train,
validation and test, MNLI's validation_matched / validation_mismatched / test_matched /
test_mismatched; columns as the old loading script's features (`glue_tasks.TFDS_FEATURES`:
``sentence``; ``sentence1``/``sentence2``; ``question1``/``question2``; ``premise``/
``hypothesis``; ``question``/``sentence``), ``label`` (a ClassLabel, int64, its names in the
file's ``huggingface`` schema metadata; STS-B a float32 score) and ``idx`` (int32). Test labels
are -1 (hidden): only train and validation splits are read, and a -1 there stops the read.

A label id is the same class as the download script's (`glue_tasks.TASKS` labels, in the same
order, e.g. QNLI 0 entailment, WNLI 1 entailment), so examples carry those names: a run reads
the Hub, a GLUE directory or TFDS with the same ``config.task.labels``. Each file's ClassLabel
names are checked against the Hub's (`LABEL_NAMES`): another layout stops with one line.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time

from bertjax.tasks import glue_tasks

REPO = "nyu-mll/glue"
# main of nyu-mll/glue since 2024-01-30, its parquet layout (every file: tests/glue_hub_test.py)
REVISION = "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"
# Each task's ClassLabel names on the Hub, in id order (STS-B: a float score).
LABEL_NAMES = {
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "stsb": None,
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
    "wnli": ("not_entailment", "entailment"),
}
# The splits a bertjax split reads (MNLI's dev: matched, then mismatched, scored apart).
SPLITS = {"train": ("train",), "dev": ("validation",)}
MNLI_DEV = ("validation_matched", "validation_mismatched")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_splits(name: str, split: str) -> tuple[str, ...]:
    """The Hub splits of bertjax split ``split`` ("train" or "dev") of task ``name``."""
    return MNLI_DEV if (name, split) == ("mnli", "dev") else SPLITS[split]


def patterns(names, splits=("train", "dev")) -> list[str]:
    """The repository paths (globs) holding these tasks' splits."""
    return [f"{n}/{s}-*.parquet" for n in names for split in splits for s in hub_splits(n, split)]


def _where(repo: str, revision: str) -> str:
    return f"hf://datasets/{repo}@{revision}"


def download(names, repo: str = REPO, revision: str = REVISION) -> tuple[str, str]:
    """(local snapshot folder, commit SHA) holding the train and dev files of the GLUE tasks
    ``names``: huggingface_hub's ``snapshot_download`` into its cache (a commit SHA revision
    that is cached costs no request; offline, the cache answers). Every failure is one line."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ImportError(
            "GLUE from the Hub needs huggingface_hub and pyarrow: pip install 'bertjax[glue]' "
            "(or pass --glue_dir=DIR / --glue_source=tfds)"
        ) from None

    from bertjax import retry

    for name in names:
        if name not in glue_tasks.TASKS:
            raise ValueError(f"GLUE task {name!r}: GLUE tasks are {sorted(glue_tasks.TASKS)}")
    where, start = _where(repo, revision), time.monotonic()
    try:
        folder = snapshot_download(
            repo, repo_type="dataset", revision=revision, allow_patterns=patterns(names)
        )
    except RevisionNotFoundError:
        raise ValueError(
            f"config.task.glue_revision={revision!r}: {repo} has no such revision on the Hub "
            f"(a branch, a tag or a commit SHA; bertjax pins {REVISION})"
        ) from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"config.task.glue_repo={repo!r}: no such dataset repository on the Hub (or it is "
            "private: set HF_TOKEN)"
        ) from None
    except (LocalEntryNotFoundError, OSError) as error:  # nothing cached, Hub not reached
        if getattr(error, "errno", None) is not None:  # the local disk's (the cache's) error
            raise
        cause = retry.transient_cause(error)  # 429, 5xx, a connection that failed
        if cause is not None:
            raise retry.StorageUnavailable(where, cause, time.monotonic() - start, 1) from error
        offline = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "cannot reach the Hub"
        raise FileNotFoundError(
            f"GLUE from {where}: {offline} and its files are not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}): pass --glue_dir=DIR (the GLUE download script's "
            "folders) or --glue_source=tfds, or run once online"
        ) from None
    sha = os.path.basename(os.path.normpath(folder))
    if not _COMMIT.match(sha):  # not a cache snapshot folder: name the revision asked for
        sha = revision
    return folder, sha


def split_files(folder: str, name: str, hub_split: str, where: str) -> list[str]:
    """The parquet files of one split of ``name`` in a downloaded snapshot, in order."""
    pattern = f"{name}/{hub_split}-*.parquet"
    files = sorted(glob.glob(os.path.join(folder, *pattern.split("/"))))
    if not files:
        raise FileNotFoundError(
            f"{where} has no {pattern}: not the parquet layout of nyu-mll/glue (set "
            f"config.task.glue_revision to a commit that has it, e.g. {REVISION})"
        )
    return files


def _label_names(schema, path: str) -> tuple[str, ...] | None:
    """The ClassLabel names of a file's ``label`` column (its ``huggingface`` metadata)."""
    metadata = (schema.metadata or {}).get(b"huggingface")
    if not metadata:
        return None
    try:
        feature = json.loads(metadata)["info"]["features"]["label"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}: its huggingface schema metadata has no label feature") from None
    names = feature.get("names") if isinstance(feature, dict) else None
    return tuple(names) if names else None


def read_split(path: str, name: str) -> list[dict]:
    """The examples of one parquet file of GLUE task ``name`` (labels named as
    `glue_tasks.TASKS`; STS-B's float scores as they are)."""
    import pyarrow.parquet as pq

    text, pair = glue_tasks.TFDS_FEATURES[name]
    columns = [c for c in (text, pair, "label") if c]
    schema = pq.read_schema(path)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"{path} has no column(s) {missing} (its columns: {schema.names}): not nyu-mll/glue's "
            f"{name} layout"
        )
    expected = LABEL_NAMES[name]
    found = _label_names(schema, path)
    if expected and found is not None and found != expected:
        raise ValueError(
            f"{path}: label names {list(found)}, expected {list(expected)} (nyu-mll/glue's "
            f"{name}); another layout of the repository?"
        )
    table = pq.read_table(path, columns=columns).to_pydict()
    labels = table["label"]
    hidden = sum(1 for v in labels if v is None or (expected and v < 0))
    if hidden:
        raise ValueError(
            f"{path}: {hidden} rows with label -1 (unlabelled, as GLUE's test splits): only "
            "train and validation splits carry labels"
        )
    names = glue_tasks.TASKS[name].labels
    if expected and any(not 0 <= v < len(names) for v in labels):
        raise ValueError(f"{path}: a label id outside 0..{len(names) - 1}")
    return [
        {
            "text": table[text][i],
            "text_pair": table[pair][i] if pair else "",
            "label": names[labels[i]] if expected else float(labels[i]),
        }
        for i in range(len(labels))
    ]


def glue_examples(name: str, split: str, repo: str = REPO, revision: str = REVISION) -> list[dict]:
    """Examples of GLUE task ``name`` ("train" or "dev") from the Hub's parquet (module
    docstring); MNLI's dev holds matched, then mismatched examples marked ``dev_part="mm"``."""
    if name not in glue_tasks.TASKS:
        raise ValueError(
            f"config.task.source='glue:{name}': GLUE tasks are {sorted(glue_tasks.TASKS)}"
        )
    folder, sha = download([name], repo, revision)
    examples = []
    for number, hub_split in enumerate(hub_splits(name, split)):
        extra = {"dev_part": glue_tasks.SECOND_DEV_PART} if number else {}
        for path in split_files(folder, name, hub_split, _where(repo, sha)):
            examples.extend(dict(e, **extra) for e in read_split(path, name))
    return examples
