"""Fine-tuning task data: examples from built-in tasks, local TSV/CSV/JSONL/CoNLL files, GLUE
(the Hub's nyu-mll/glue parquet: bertjax/tasks/glue_hub.py; or a GLUE directory:
bertjax/tasks/glue_tasks.py) or TFDS `glue/*`, encoded once into fixed-shape numpy rows.

Sequence rows are `[CLS] a [SEP] (b [SEP])`, truncated longest-first. Token rows label the first
piece of each word and give the word's other pieces (and [CLS]/[SEP]/padding) weight 0.

Built-in tasks (offline, from CPython's own docstrings): bertjax/tasks/builtin_tasks.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertjax.data.text import records
from bertjax.tasks import glue_tasks
from bertjax.tasks.builtin_tasks import (  # noqa: F401 (re-exported)
    BUILTIN_TASKS,
    FAMILIES,
    WORD_ORDER_SPANS,
    WORD_ORDER_WORDS,
    builtin_examples,
    code_span_tags,
    family_of,
    reorder_span,
)


def _read_rows(path: str) -> list[dict]:
    if not path.endswith(records.READ_FORMATS):
        raise ValueError(
            f"task file {path!r}: expected .tsv, .csv, .jsonl, .parquet (or .conll/.txt for tokens)"
        )
    return list(records.iter_records(path, "task file"))


def _read_conll(path: str) -> list[dict]:
    """CoNLL-style token file: 'word ... tag' per line (last column: the tag), blank line after."""
    examples, words, tags = [], [], []
    with open(path, encoding="utf-8") as f:
        for line in list(f) + [""]:
            parts = line.split()
            if parts and not parts[0].startswith("-DOCSTART-"):
                words.append(parts[0])
                tags.append(parts[-1])
            elif words:
                examples.append({"tokens": words, "tags": tags})
                words, tags = [], []
    return examples


def file_examples(path: str, task, tokens: bool) -> list[dict]:
    """Examples of a local file with the configured column names."""
    if tokens:
        if path.endswith((".conll", ".txt")):
            return _read_conll(path)
        rows, keys = _read_rows(path), (task.tokens_column, task.tags_column)
        missing = [k for k in keys if rows and k not in rows[0]]
        if missing:
            raise ValueError(
                f"task file {path!r} has no column(s) {missing}: set config.task."
                "tokens_column / tags_column"
            )
        return [{"tokens": list(r[keys[0]]), "tags": list(r[keys[1]])} for r in rows]
    rows = _read_rows(path)
    keys = [task.text_column, task.label_column] + (
        [task.text_pair_column] if task.text_pair_column else []
    )
    missing = [k for k in keys if rows and k not in rows[0]]
    if missing:
        raise ValueError(
            f"task file {path!r} has no column(s) {missing} (columns: "
            f"{sorted(rows[0]) if rows else []}): set config.task.text_column / "
            "text_pair_column / label_column"
        )
    return [
        {
            "text": str(r[task.text_column]),
            "label": r[task.label_column],
            "text_pair": str(r[task.text_pair_column]) if task.text_pair_column else "",
        }
        for r in rows
    ]


def tfds_examples(name: str, split: str, data_dir: str) -> list[dict]:
    """GLUE examples through tfds.data_source (ArrayRecord, no TensorFlow, no download)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError(
            f"config.task.source='tfds:{name}' needs tensorflow-datasets: "
            "pip install 'bertjax[tfds]'"
        ) from None
    task = name.split("/")[-1]
    if not name.startswith("glue/") or task not in glue_tasks.TASKS:
        raise ValueError(
            f"config.task.source='tfds:{name}': supported are "
            f"{['glue/' + t for t in glue_tasks.TASKS]}"
        )
    splits = [split]
    if split == "dev":  # MNLI: matched, then mismatched (TaskData scores them apart)
        splits = (
            ["validation_matched", "validation_mismatched"] if task == "mnli" else ["validation"]
        )
    text, pair = glue_tasks.TFDS_FEATURES[task]
    decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)  # noqa: E731
    examples = []
    for number, name_of_split in enumerate(splits):
        try:
            source = tfds.data_source(
                name, split=name_of_split, data_dir=data_dir or None, download=False
            )
        except Exception as e:  # tfds raises several types for a dataset that is not prepared
            raise FileNotFoundError(
                f"config.task.source='tfds:{name}': cannot open split {name_of_split!r} "
                f"(data_dir={data_dir or 'tfds default'}): {e}"
            ) from e
        extra = {"dev_part": "mm"} if number else {}
        examples.extend(
            {
                "text": decode(r[text]),
                "text_pair": decode(r[pair]) if pair else "",
                "label": r["label"],
                **extra,
            }
            for r in (source[i] for i in range(len(source)))
        )
    return examples


# ELECTRA's double_unordered (configure_finetuning.py; classification_tasks.py MRPC and STS):
# the symmetric pair tasks whose training split it doubles with each pair in both orders.
UNORDERED_TASKS = ("mrpc", "stsb")


def load_examples(task, split: str, tokens: bool) -> list[dict]:
    """Examples of ``config.task`` for split 'train' or 'dev'; with ``task.double_unordered``
    the MRPC/STS-B training split is followed by each pair in the other order (ELECTRA's
    double_unordered: twice the examples, so twice the steps an epoch)."""
    examples = _load_examples(task, split, tokens)
    if split == "train" and task.get("double_unordered"):
        if glue_tasks.task_of_source(task.source) in UNORDERED_TASKS:
            examples += [dict(e, text=e["text_pair"], text_pair=e["text"]) for e in examples]
    return examples


def _load_examples(task, split: str, tokens: bool) -> list[dict]:
    source = task.source
    if source.startswith("glue:"):  # a GLUE directory when given, else the Hub's parquet
        name = source[len("glue:") :]
        if task.glue_dir:
            return glue_tasks.glue_examples(task.glue_dir, name, split)
        from bertjax.tasks import glue_hub

        return glue_hub.glue_examples(name, split, task.glue_repo, task.glue_revision)
    if source.startswith("builtin:"):
        return builtin_examples(source[len("builtin:") :], split, float(task.dev_fraction))
    if source.startswith("tfds:"):
        return tfds_examples(source[len("tfds:") :], split, task.tfds_data_dir)
    if source == "files":
        path = task.train_file if split == "train" else task.dev_file
        if not path:
            raise ValueError(f"config.task.{split}_file is empty: set it (source='files')")
        return file_examples(path, task, tokens)
    raise ValueError(
        f"config.task.source={source!r}: expected 'builtin:NAME', 'files', 'glue:NAME' (the "
        "Hub's nyu-mll/glue, or config.task.glue_dir) or 'tfds:glue/NAME'"
    )


def pair_ids(
    tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, length: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each text's ``[CLS] a [SEP] (b [SEP])`` ids and token types, at most ``length`` long; the
    longer side is cut first. ``pairs`` None: single texts."""
    n = len(texts)
    pairs = [""] * n if pairs is None else list(pairs)
    firsts = tokenizer.encode(list(texts))
    seconds = tokenizer.encode(pairs) if any(pairs) else [np.zeros(0, np.int32)] * n
    ids_out, types_out = [], []
    cls, sep = np.int32(tokenizer.cls_id), np.int32(tokenizer.sep_id)
    for i, (a, b) in enumerate(zip(firsts, seconds)):
        budget = length - 2 - (1 if len(b) or pairs[i] else 0)
        keep_a, keep_b = len(a), len(b)
        while keep_a + keep_b > budget:  # longest first, one token at a time (ties: a)
            if keep_a >= keep_b:
                keep_a -= 1
            else:
                keep_b -= 1
        parts = [[cls], a[:keep_a], [sep]]
        if pairs[i]:
            parts += [b[:keep_b], [sep]]
        ids = np.concatenate(parts).astype(np.int32)
        types = np.zeros(len(ids), np.int32)
        types[keep_a + 2 :] = 1
        ids_out.append(ids)
        types_out.append(types)
    return ids_out, types_out


def encode_pairs(tokenizer, texts: Sequence[str], pairs: Sequence[str], length: int) -> dict:
    """[CLS] a [SEP] (b [SEP]) rows, padded to ``length``; the longer side is cut first."""
    n = len(texts)
    rows = {
        "input_ids": np.full((n, length), tokenizer.pad_id, np.int32),
        "token_type_ids": np.zeros((n, length), np.int32),
        "attention_mask": np.zeros((n, length), np.int32),
    }
    for i, (ids, types) in enumerate(zip(*pair_ids(tokenizer, texts, pairs, length))):
        rows["input_ids"][i, : len(ids)] = ids
        rows["token_type_ids"][i, : len(ids)] = types
        rows["attention_mask"][i, : len(ids)] = 1
    return rows


def encode_words(
    tokenizer, sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[int]], length: int
) -> dict:
    """First-piece labelling: each word's first piece carries its tag (weight 1), later pieces,
    [CLS], [SEP] and padding weight 0; words past ``length`` are cut (their tags are lost)."""
    n = len(sentences)
    rows = encode_pairs(tokenizer, [""] * n, [""] * n, length)
    rows["labels"] = np.zeros((n, length), np.int32)
    rows["label_weights"] = np.zeros((n, length), np.float32)
    rows["word_positions"] = np.full(
        (n, length), -1, np.int32
    )  # row position of word j's first piece
    flat = [w for words in sentences for w in words]
    pieces = tokenizer.encode(flat) if flat else []
    cursor = 0
    for i, (words, word_tags) in enumerate(zip(sentences, tags)):
        ids, position = [tokenizer.cls_id], 1
        for j, tag in enumerate(word_tags):
            word_ids = list(pieces[cursor + j]) or [tokenizer.unk_id]
            if len(ids) + len(word_ids) > length - 1:
                break
            rows["labels"][i, position] = tag
            rows["label_weights"][i, position] = 1.0
            rows["word_positions"][i, j] = position
            ids += word_ids
            position += len(word_ids)
        cursor += len(words)
        ids.append(tokenizer.sep_id)
        rows["input_ids"][i, : len(ids)] = ids
        rows["attention_mask"][i, : len(ids)] = 1
    return rows


def label_index(
    examples: list[dict], configured: Sequence[str], num_labels: int, tokens: bool
) -> list[str]:
    """Label names in id order: ``config.task.labels`` or the sorted train labels ('O' first)."""
    if configured:
        names = [str(v) for v in configured]
    elif num_labels == 1:
        return []
    elif tokens:
        names = sorted({t for e in examples for t in e["tags"]}, key=lambda t: (t != "O", t[2:], t))
    else:
        seen = {e["label"] for e in examples}
        ints = all(isinstance(v, (int, np.integer)) or str(v).lstrip("-").isdigit() for v in seen)
        names = [str(v) for v in sorted(seen, key=int if ints else str)]
    if len(names) != num_labels:
        raise ValueError(
            f"config.loss.num_labels={num_labels} but the task has {len(names)} "
            f"labels {names[:20]}: set config.loss.num_labels={len(names)} or "
            "config.task.labels"
        )
    return names
