"""What `python -m bertjax.predict` runs: a trained model turned into rows of labels,
probabilities, regression values, word-level tags, embeddings or fill-mask tokens.

`load(path, task)` reads a bertjax fine-tuning/pretraining/embedding workdir (its ``best/``
when there is one, else its latest checkpoint), a ``best/`` or checkpoints directory, a Hugging
Face directory (``...ForSequenceClassification``, ``...ForTokenClassification``,
``...ForMaskedLM``/``...ForPreTraining``, a base model: embeddings) or a sentence-transformers
directory. Every predictor batches by length (sorted_apply.py) and keeps input order.
"""

from __future__ import annotations

import functools
import json
import logging
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax import paths
from bertjax.data.tokenizer import Tokenizer
from bertjax.inference import embedder as embed
from bertjax.inference import sorted_apply
from bertjax.interop import hf_files
from bertjax.interop import sentence_transformers as st_files
from bertjax.interop.checkpoints import CheckpointReader
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.heads import (
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertjax.tasks import tasks

TASKS = ("classify", "tag", "embed", "fill_mask")


class Predictor:
    """A model and its tokenizer; `predict(records)` -> one output dict a record, in order."""

    task = ""

    def __init__(self, cfg: BertConfig, params: dict, tokenizer: Tokenizer, length: int):
        self.cfg, self.params, self.tokenizer = cfg.replace(dtype="float32"), params, tokenizer
        self.length = min(int(length), cfg.max_position_embeddings - cfg.position_offset)
        self.text_column, self.text_pair_column, self.tokens_column = "text", "", "tokens"

    def text(self, record: dict, column: str = "") -> str:
        """The record's text: ``column`` (default the text column); BEIR rows: title + text."""
        column = column or self.text_column
        if column not in record:
            raise ValueError(f"input row has no column {column!r} (columns: {sorted(record)})")
        if column == "text" and "title" in record and "_id" in record:
            return " ".join(str(record.get(k) or "") for k in ("title", "text")).strip()
        return str(record[column])

    def predict(self, records: list[dict]) -> list[dict]:
        raise NotImplementedError


class Classifier(Predictor):
    """Sequence classification (label and probabilities) or regression (``value``)."""

    task = "classify"

    def __init__(self, cfg, params, tokenizer, length, labels: list[str]):
        super().__init__(cfg, params, tokenizer, length)
        self.labels = labels
        model = BertForSequenceClassification(self.cfg, num_labels=max(1, len(labels)))

        def apply(params, ids, types, mask):
            logits = model.apply({"params": params}, ids, types, mask)
            return logits[:, 0] if not labels else jax.nn.softmax(logits, axis=-1)

        self._apply = jax.jit(apply)

    def predict(self, records):
        texts = [self.text(r) for r in records]
        pairs = (
            [self.text(r, self.text_pair_column) for r in records]
            if self.text_pair_column
            else None
        )
        ids, types = tasks.pair_ids(self.tokenizer, texts, pairs, self.length)
        fn = functools.partial(self._apply, self.params)
        outputs = sorted_apply.apply_sorted(fn, ids, types, self.cfg.pad_token_id, self.length)
        if not self.labels:
            return [{"value": float(v)} for v in outputs]
        return [
            {
                "label": self.labels[int(np.argmax(p))],
                "probabilities": {name: float(v) for name, v in zip(self.labels, p)},
            }
            for p in outputs
        ]


class Tagger(Predictor):
    """Token classification: one tag a word (the first piece's), as the training data came;
    words past the length limit get None."""

    task = "tag"

    def __init__(self, cfg, params, tokenizer, length, labels: list[str]):
        super().__init__(cfg, params, tokenizer, length)
        self.labels = labels
        model = BertForTokenClassification(self.cfg, num_labels=len(labels))
        self._apply = jax.jit(
            lambda params, ids, types, mask: jnp.argmax(
                model.apply({"params": params}, ids, types, mask), axis=-1
            )
        )

    def words(self, record: dict) -> list[str]:
        if self.tokens_column in record:
            return [str(w) for w in record[self.tokens_column]]
        return self.text(record).split()

    def predict(self, records):
        sentences = [self.words(r) for r in records]
        zeros = [[0] * len(s) for s in sentences]
        rows = tasks.encode_words(self.tokenizer, sentences, zeros, self.length)
        lengths = rows["attention_mask"].sum(axis=1)
        ids = [rows["input_ids"][i, :n] for i, n in enumerate(lengths)]
        types = [np.zeros(n, np.int32) for n in lengths]
        fn = functools.partial(self._apply, self.params)
        pad = self.cfg.pad_token_id
        predicted = sorted_apply.apply_sorted(fn, ids, types, pad, self.length, per_token=True)
        out = []
        for i, words in enumerate(sentences):
            positions = rows["word_positions"][i]
            tags = [self.labels[int(predicted[i][p])] if p >= 0 else None for p in positions]
            out.append(
                {"tokens": words, "tags": tags[: len(words)] + [None] * (len(words) - len(tags))}
            )
        return out


class Embeddings(Predictor):
    """Sentence embeddings (`bertjax.embed.Embedder`: its pooling and normalization)."""

    task = "embed"

    def __init__(self, embedder: embed.Embedder):
        super().__init__(embedder.cfg, embedder.params, embedder.tokenizer, embedder.max_seq_length)
        self.embedder = embedder

    def predict(self, records):
        vectors = self.embedder.encode([self.text(r) for r in records])
        return [{"embedding": v.tolist()} for v in vectors]


class FillMask(Predictor):
    """The ``top_k`` likeliest tokens at each mask token of a text (softmax over the vocabulary,
    as transformers' fill-mask pipeline scores them)."""

    task = "fill_mask"

    def __init__(self, cfg, params, tokenizer, length, top_k: int = 5):
        super().__init__(cfg, params, tokenizer, length)
        self.top_k = top_k
        model = BertForPreTraining(self.cfg, next_sentence="nsp_head" in params)
        mask_id = tokenizer.mask_id

        def apply(params, ids, types, mask, masks):
            order = jnp.argsort(ids != mask_id, axis=1, stable=True)  # mask positions first
            positions = order[:, :masks]
            logits = model.apply({"params": params}, ids, types, mask, masked_positions=positions)[
                "mlm_logits"
            ]
            scores, tokens = jax.lax.top_k(jax.nn.softmax(logits.astype(jnp.float32)), top_k)
            return scores, tokens

        self._apply = jax.jit(apply, static_argnums=4)

    def ids(self, text: str) -> np.ndarray:
        """[CLS] text [SEP] with the mask token's spelling encoded as its id, cut to length."""
        spelling = self.tokenizer.pieces[self.tokenizer.mask_id]
        parts = self.tokenizer.encode(text.split(spelling))
        pieces = [parts[0]]
        for part in parts[1:]:
            pieces += [np.asarray([self.tokenizer.mask_id], np.int32), part]
        body = np.concatenate(pieces)[: self.length - 2]
        cls, sep = self.tokenizer.cls_id, self.tokenizer.sep_id
        return np.concatenate([[cls], body, [sep]]).astype(np.int32)

    def predict(self, records):
        ids = [self.ids(self.text(r)) for r in records]
        counts = [int(np.sum(x == self.tokenizer.mask_id)) for x in ids]
        masks = 1 << max(0, max(counts, default=1) - 1).bit_length()  # a few compiled shapes
        types = [np.zeros(len(x), np.int32) for x in ids]
        fn = functools.partial(self._apply, self.params, masks=masks)
        outputs = sorted_apply.apply_sorted(fn, ids, types, self.cfg.pad_token_id, self.length)
        out = []
        for (scores, tokens), count in zip(outputs, counts):
            out.append(
                {
                    "masks": [
                        [
                            {
                                "token": self.tokenizer.pieces[int(t)],
                                "token_id": int(t),
                                "score": float(s),
                            }
                            for s, t in zip(scores[m], tokens[m])
                        ]
                        for m in range(count)
                    ]
                }
            )
        return out


def _hf_kind(path: str) -> str:
    config = json.loads(paths.read_text(paths.join(path, "config.json")))
    architecture = (config.get("architectures") or [""])[0]
    for suffix, kind in (
        ("ForSequenceClassification", "classify"),
        ("ForTokenClassification", "tag"),
        ("ForMaskedLM", "fill_mask"),
        ("ForPreTraining", "fill_mask"),
    ):
        if architecture.endswith(suffix):
            return kind
    return "embed"


def _hf_labels(path: str) -> list[str]:
    config = json.loads(paths.read_text(paths.join(path, "config.json")))
    id2label = config.get("id2label") or {}
    if config.get("problem_type") == "regression" or config.get("num_labels", len(id2label)) == 1:
        return []
    return [str(id2label[k]) for k in sorted(id2label, key=int)]


def _checkpoint_dir(path: str) -> str:
    best = paths.join(path, "best")
    if paths.isdir(best):
        logging.info("predicting with %s (the best dev checkpoint)", best)
        return best
    return path


def _workdir_labels(run: dict, tokens: bool, num_labels: int) -> list[str]:
    """The label names a fine-tuning run trained with: its config.task.labels, else the sorted
    labels of its training examples (read again with the task's own readers)."""
    task = ml_collections.ConfigDict(run["task"])
    if num_labels == 1 and not tokens:
        return []
    if task.labels:
        return [str(v) for v in task.labels]
    try:
        train = tasks.load_examples(task, "train", tokens)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"the run's label names come from its training data ({task.source}), which cannot be "
            f"read here ({e}): pass --labels=NAME,NAME,... in label id order"
        ) from None
    return tasks.label_index(train, task.labels, num_labels, tokens)


def load(path: str, task: str = "", labels: list[str] | None = None, top_k: int = 5) -> Predictor:
    """The predictor of the model under ``path`` (module docstring); ``task`` forces one of
    `TASKS` (e.g. "embed" of a classifier's encoder)."""
    if task and task not in TASKS:
        raise ValueError(f"--task={task!r}: one of {TASKS}")
    hf = hf_files.is_hf_dir(path)
    if st_files.is_sentence_transformers_dir(path) or (task == "embed" and not hf):
        return Embeddings(embed.load(path))
    if hf:
        from bertjax import convert

        kind = task or _hf_kind(path)
        if kind == "embed":
            return Embeddings(embed.load(path))
        cfg, params = convert.from_hf(path)
        tokenizer = Tokenizer(hf_files.tokenizer_file(path, "--model"))
        length = cfg.max_position_embeddings - cfg.position_offset
        return _make(kind, cfg, params, tokenizer, length, labels or _hf_labels(path), top_k)
    path = _checkpoint_dir(path)
    reader = CheckpointReader(path, "--model")
    run = reader.meta.get("config", {})
    objective = run.get("loss", {}).get("objective", "mlm")
    kind = task or {
        "classification": "classify",
        "token_classification": "tag",
        "embedding": "embed",
    }.get(objective, "fill_mask")
    if kind == "embed":
        reader.close()
        return Embeddings(embed.load(path))
    cache = os.path.join(paths.cache_dir(), "tokenizers", reader.meta["tokenizer_fingerprint"])
    tokenizer = Tokenizer(
        reader.write_tokenizer(cache), lowercase=run.get("data", {}).get("lowercase", True)
    )
    cfg, params = reader.model_config(), reader.params()
    reader.close()
    if cfg.scan_layers:
        from bertjax.convert import unstack_layers

        cfg = cfg.replace(scan_layers=False)
        params = unstack_layers(cfg, params)
    if kind in ("classify", "tag") and not labels:
        labels = _workdir_labels(run, kind == "tag", int(run["loss"]["num_labels"]))
    length = run.get("data", {}).get("max_seq_length", 512)
    predictor = _make(kind, cfg, params, tokenizer, length, labels or [], top_k)
    task_config = run.get("task", {})
    predictor.text_column = task_config.get("text_column", "text")
    predictor.text_pair_column = task_config.get("text_pair_column", "")
    predictor.tokens_column = task_config.get("tokens_column", "tokens")
    return predictor


def _make(kind, cfg, params, tokenizer, length, labels, top_k) -> Predictor:
    if kind == "classify":
        return Classifier(cfg, params, tokenizer, length, labels)
    if kind == "tag":
        return Tagger(cfg, params, tokenizer, length, labels)
    if "mlm_head" not in params:
        raise ValueError("--task=fill_mask needs a model with its MLM head (a pretraining save)")
    return FillMask(cfg, params, tokenizer, length, top_k)


ID_COLUMNS = ("_id", "id")


def output_rows(predictor, rows: list[dict], start: int) -> list[dict]:
    """``predictor``'s outputs of ``rows`` (input rows ``start``...), each with its ``row``
    number and the input's id."""
    out = []
    for number, (row, result) in enumerate(zip(rows, predictor.predict(rows)), start=start):
        named = [str(row[k]) for k in ID_COLUMNS if k in row][:1]
        out.append({"row": number, **({"id": named[0]} if named else {}), **result})
    return out
