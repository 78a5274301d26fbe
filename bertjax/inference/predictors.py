"""The predictors `python -m bertjax.predict` runs: a trained model turned into rows of labels,
probabilities, regression values, word-level tags, embeddings or fill-mask tokens.

`make(model, task)` gives the predictor of a loaded model (`bertjax.inference.loading`: a bertjax
workdir, its ``best/``, a Hugging Face or a sentence-transformers directory) for the task it was
trained for (an HF ``...ForSequenceClassification``: classify, ``...ForTokenClassification``:
tag, ``...ForMaskedLM`` / ``...ForPreTraining``: fill_mask, a base model: embed) or the one
forced. Every predictor batches by length (sorted_apply.py) and keeps input order; `check` names
the column a record lacks before anything runs.
"""

from __future__ import annotations

import abc
import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.inference import embedder, loading, precision, sorted_apply
from bertjax.inference.labels import label_names
from bertjax.inference.loading import TASKS, TrainedModel
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.heads import (
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertjax.tasks import tasks

__all__ = ["TASKS", "Classifier", "Embeddings", "FillMask", "Predictor", "Tagger", "load", "make"]


class Predictor(abc.ABC):
    """A model and its tokenizer; `predict(records)` -> one output dict a record, in order."""

    task = ""

    def __init__(
        self,
        cfg: BertConfig,
        params: dict,
        tokenizer: Tokenizer,
        length: int,
        matmul_dtype: str | None = "auto",
    ):
        """``matmul_dtype``: the products' dtype ("auto": bertjax/inference/precision.py; None:
        ``cfg``'s, already chosen)."""
        products = cfg.matmul_dtype
        if matmul_dtype is not None:
            products = precision.matmul_dtype(matmul_dtype, self.task)
        self.cfg = cfg.replace(dtype="float32", matmul_dtype=products)
        self.params = jax.device_put(params)  # once, not copied in at every call
        self.tokenizer = tokenizer
        self.length = min(int(length), cfg.max_position_embeddings - cfg.position_offset)
        self.text_column, self.text_pair_column, self.tokens_column = "text", "", "tokens"

    def check(self, record: dict) -> None:
        """Raises ValueError naming the column ``record`` lacks and the flag that names it."""
        _require(record, {self.text_column: "--text_column"})

    def text(self, record: dict, column: str = "") -> str:
        """The record's text: ``column`` (default the text column); BEIR rows: title + text."""
        column = column or self.text_column
        _require(record, {column: "--text_column"})
        if column == "text" and "title" in record and "_id" in record:
            return " ".join(str(record.get(k) or "") for k in ("title", "text")).strip()
        return str(record[column])

    @abc.abstractmethod
    def predict(self, records: list[dict]) -> list[dict]:
        """One output dict a record, in the records' order."""


def _require(record: dict, columns: dict[str, str]) -> None:
    """Raises naming the first of ``columns`` (column -> its flag) that ``record`` lacks."""
    for column, flag in columns.items():
        if column and column not in record:
            raise ValueError(
                f"no column {column!r} (the row has {sorted(record)}): name the column with {flag}"
            )


class Classifier(Predictor):
    """Sequence classification (label and probabilities) or regression (``value``)."""

    task = "classify"

    def __init__(self, cfg, params, tokenizer, length, labels: list[str], matmul_dtype="auto"):
        super().__init__(cfg, params, tokenizer, length, matmul_dtype)
        self.labels = labels
        model = BertForSequenceClassification(self.cfg, num_labels=max(1, len(labels)))

        def apply(params, ids, types, mask):
            logits = model.apply({"params": params}, ids, types, mask)
            return logits[:, 0] if not labels else jax.nn.softmax(logits, axis=-1)

        self._apply = jax.jit(apply)

    def check(self, record):
        _require(record, {self.text_column: "--text_column"})
        _require(record, {self.text_pair_column: "--text_pair_column"})

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

    def __init__(self, cfg, params, tokenizer, length, labels: list[str], matmul_dtype="auto"):
        super().__init__(cfg, params, tokenizer, length, matmul_dtype)
        self.labels = labels
        model = BertForTokenClassification(self.cfg, num_labels=len(labels))
        self._apply = jax.jit(
            lambda params, ids, types, mask: jnp.argmax(
                model.apply({"params": params}, ids, types, mask), axis=-1
            )
        )

    def check(self, record):
        if self.tokens_column not in record:
            _require(record, {self.text_column: "--tokens_column (words) or --text_column"})

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

    def __init__(self, model: embedder.Embedder):
        length = model.max_seq_length  # its products' dtype: the embedder's own choice
        super().__init__(model.cfg, model.params, model.tokenizer, length, matmul_dtype=None)
        self.embedder = model

    def predict(self, records):
        vectors = self.embedder.encode([self.text(r) for r in records])
        return [{"embedding": v.tolist()} for v in vectors]


class FillMask(Predictor):
    """The ``top_k`` likeliest tokens at each mask token of a text (softmax over the vocabulary,
    as transformers' fill-mask pipeline scores them)."""

    task = "fill_mask"

    def __init__(self, cfg, params, tokenizer, length, top_k: int = 5, matmul_dtype="auto"):
        super().__init__(cfg, params, tokenizer, length, matmul_dtype)
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


def make(
    model: TrainedModel,
    task: str = "",
    labels: list[str] | None = None,
    top_k: int = 5,
    matmul_dtype: str = "auto",
) -> Predictor:
    """The predictor of ``model`` (`bertjax.inference.loading`) for ``task``, by default the one
    it was trained for; ``labels`` names the classes when the model's own names are gone;
    ``matmul_dtype``: its products' dtype ("auto": bertjax/inference/precision.py)."""
    if task and task not in TASKS:
        raise ValueError(f"--task={task!r}: one of {TASKS}")
    task = task or model.task
    if task == "embed":
        predictor = Embeddings(embedder.from_model(model, matmul_dtype=matmul_dtype))
    elif task in ("classify", "tag"):
        if model.task != task:  # its head, if any, is another task's
            raise ValueError(
                f"--task={task}: {model.path} was trained for {model.task} (the tasks it "
                f"gives: {model.task}, embed)"
            )
        labels = labels or label_names(model, task)
        cls = Classifier if task == "classify" else Tagger
        length = model.max_seq_length
        predictor = cls(model.cfg, model.params, model.tokenizer, length, labels, matmul_dtype)
    elif "mlm_head" not in model.params:
        raise ValueError("--task=fill_mask needs a model with its MLM head (a pretraining save)")
    else:
        length = model.max_seq_length
        predictor = FillMask(model.cfg, model.params, model.tokenizer, length, top_k, matmul_dtype)
    for column, value in model.columns.items():
        setattr(predictor, column, value)
    return predictor


def load(
    path: str,
    task: str = "",
    labels: list[str] | None = None,
    top_k: int = 5,
    matmul_dtype: str = "auto",
) -> Predictor:
    """`make` of the model under ``path`` (a workdir, ``best/``, HF or sentence-transformers
    directory: `bertjax.inference.loading.load`)."""
    if task and task not in TASKS:
        raise ValueError(f"--task={task!r}: one of {TASKS}")
    if matmul_dtype not in precision.CHOICES:  # before the model is read
        raise ValueError(f"--matmul_dtype={matmul_dtype!r}: one of {precision.CHOICES}")
    return make(loading.load(path), task, labels, top_k, matmul_dtype)
