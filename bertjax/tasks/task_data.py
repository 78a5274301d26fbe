"""Fine-tuning data: the task's train/dev examples encoded once into fixed-shape rows, served as
a `DataSource` (batches keyed by the step, the dev split for evaluation, task metrics)."""

from __future__ import annotations

import hashlib
import logging

import jax
import numpy as np

from bertjax import paths
from bertjax.data import keys
from bertjax.data.source import DataSource, host_rows, ordered_rows, shuffled_rows
from bertjax.data.tokenizer import Tokenizer
from bertjax.data.tokenizer.configured import workdir_tokenizer
from bertjax.interop.pretrained import PretrainedSource
from bertjax.tasks import glue_tasks, task_metrics, tasks


def _fingerprint(*splits: dict) -> str:
    """A stable hash of encoded rows (stands for the data in checkpoint meta)."""
    digest = hashlib.sha256()
    for rows in splits:
        for key in sorted(rows):
            digest.update(key.encode() + np.ascontiguousarray(rows[key]).tobytes())
    return digest.hexdigest()[:16]


class TaskData(DataSource):
    """Encoded train/dev rows of ``config.task``; `batch(step)` is a pure function of the step.

    ``objective`` says what rows to make (``tokens``: token tags; ``num_labels``: 1 is
    regression). With ``config.init_from`` the pretrained model's tokenizer is used and
    `pretrained` holds that model (its weights are read by the objective's `prepare_state`).
    """

    def __init__(self, config, workdir: str, objective):
        self.config, self.workdir, self.objective = config, workdir, objective
        task, tokens = config.task, objective.tokens
        self.pretrained, self._model_cfg = None, None
        if config.init_from:
            self.pretrained = PretrainedSource(config.init_from, "config.init_from")
            overrides = {"dtype": config.model.dtype}
            if task.get("classifier_pooling"):
                overrides["classifier_pooling"] = task.classifier_pooling
            if self.pretrained.is_hf:  # HF layers are stacked on load when the run scans them
                overrides["scan_layers"] = config.model.scan_layers
            self._model_cfg = self.pretrained.model_config(**overrides)
            self.tokenizer = Tokenizer(
                self.pretrained.tokenizer_file(paths.cache_dir(config.data.cache_dir)),
                lowercase=config.data.lowercase,
            )
        train = tasks.load_examples(task, "train", tokens)
        dev = tasks.load_examples(task, "dev", tokens)
        if not train or not dev:
            raise ValueError(
                f"config.task.source={task.source!r}: {len(train)} train and {len(dev)} "
                "dev examples; both must be non-empty"
            )
        if 0 < int(task.train_examples) < len(train):
            subset = keys.generator(config.seed, 0, "finetune/subset").permutation(len(train))
            train = [train[i] for i in np.sort(subset[: int(task.train_examples)])]
        if not config.init_from:
            self.tokenizer = self._own_tokenizer(train)
        self.labels = tasks.label_index(train, task.labels, objective.num_labels, tokens)
        self.glue_task = glue_tasks.task_of_source(task.source)
        self.dev_metric = task.metric or self._main_metric()
        length = int(config.data.max_seq_length)
        if self._model_cfg is not None:
            cfg = self._model_cfg
            length = min(length, cfg.max_position_embeddings - cfg.position_offset)
        self.dev_examples = dev
        # Dev files scored apart (MNLI matched / mismatched): (metric suffix, example indices).
        parts = [e.get("dev_part", "") for e in dev]
        self._dev_parts = [
            (part, np.flatnonzero(np.asarray(parts) == part)) for part in dict.fromkeys(parts)
        ]
        self.train, self.dev = self._encode(train, length), self._encode(dev, length)
        self.num_train, self.num_dev = len(train), len(dev)
        self._fingerprint = _fingerprint(self.train, self.dev)
        self.global_batch_size = int(config.batch_size)
        self._rows = host_rows(self.global_batch_size, jax.process_index(), jax.process_count())
        self._predictions = None
        logging.info(
            "task %s: %d train, %d dev examples, labels %s, T=%d",
            task.source,
            self.num_train,
            self.num_dev,
            self.labels,
            length,
        )

    def _main_metric(self) -> str:
        """The dev metric the best checkpoint is kept by when config.task.metric is empty."""
        if self.objective.tokens:
            return "entity_f1"
        if self.glue_task:
            return "score"
        return "pearson" if self.objective.num_labels == 1 else "accuracy"

    def _own_tokenizer(self, train):
        """The configured tokenizer, else a SentencePiece model of the task's training text
        (kept as WORKDIR/tokenizer/spm.model)."""
        c = self.config.data
        cache = paths.cache_dir(c.cache_dir)
        if c.hf_vocab or c.tokenizer_model:
            return Tokenizer(
                paths.local_copy(c.hf_vocab or c.tokenizer_model, cache), lowercase=c.lowercase
            )
        texts = (
            [" ".join(e["tokens"]) for e in train]
            if self.objective.tokens
            else [e["text"] for e in train] + [e["text_pair"] for e in train if e["text_pair"]]
        )
        path = workdir_tokenizer(
            texts,
            self.workdir,
            cache,
            jax.process_index(),
            jax.process_count(),
            vocab_size=int(c.vocab_size),
            model_type=c.tokenizer_type,
            seed=int(self.config.seed),
        )
        return Tokenizer(path)

    def _label_id(self, value):
        if not self.labels:
            return float(value)
        try:
            return self.labels.index(str(value))
        except ValueError:
            raise ValueError(
                f"label {value!r} of config.task.source={self.config.task.source!r} is "
                f"not in the label set {self.labels} (config.task.labels)"
            ) from None

    def _encode(self, examples, length):
        if self.objective.tokens:
            tags = [[self._label_id(t) for t in e["tags"]] for e in examples]
            return tasks.encode_words(self.tokenizer, [e["tokens"] for e in examples], tags, length)
        rows = tasks.encode_pairs(
            self.tokenizer,
            [e["text"] for e in examples],
            [e["text_pair"] for e in examples],
            length,
        )
        rows["labels"] = np.asarray(
            [self._label_id(e["label"]) for e in examples],
            np.float32 if not self.labels else np.int32,
        )
        rows["label_weights"] = np.ones(len(examples), np.float32)
        return rows

    @staticmethod
    def _take(rows, index, weights=None):
        out = {k: v[index] for k, v in rows.items() if k != "word_positions"}
        if weights is not None:
            out["label_weights"] = out["label_weights"] * weights.reshape(
                (-1,) + (1,) * (out["label_weights"].ndim - 1)
            )
        return out

    def batch(self, step: int) -> dict:
        """This host's rows of global batch ``step``: epoch-wise shuffles keyed by (seed, epoch)."""
        seed, size = self.config.seed, self.global_batch_size
        index = shuffled_rows(seed, step, size, self._rows, self.num_train, "finetune/order")
        return self._take(self.train, index)

    def eval_batches(self, num_batches: int):
        """The dev split in order, padded with weight-0 rows (``num_batches`` > 0 caps it)."""
        for index, real in ordered_rows(
            self.num_dev, self.global_batch_size, self._rows, num_batches
        ):
            yield self._take(self.dev, index, real)

    @property
    def fingerprint(self) -> str:
        """A hash of the encoded train and dev rows."""
        return self._fingerprint

    def model_config(self):
        """The init_from model's BertConfig (None: the run's config.model)."""
        return self._model_cfg

    def score(self, predictions: np.ndarray) -> dict:
        """Task metrics of the dev predictions (global rows in dev order; padding rows dropped);
        a second dev file's metrics carry its suffix (``accuracy_mm``); GLUE tasks add ``score``
        (the mean of the task's official metrics)."""
        predictions = np.asarray(predictions)[: self.num_dev]
        self._predictions = predictions
        if self.objective.tokens:
            predicted, gold = self._word_tags(predictions)
            return task_metrics.entity_f1(predicted, gold)
        labels = self.dev["labels"][: len(predictions)]
        result = {}
        for part, index in self._dev_parts:
            index = index[index < len(predictions)]
            metrics = task_metrics.sequence_metrics(
                predictions[index], labels[index], self.objective.num_labels
            )
            result.update({f"{k}_{part}" if part else k: v for k, v in metrics.items()})
        if self.glue_task:
            result["score"] = glue_tasks.task_score(self.glue_task, result)
        return result

    def _word_tags(self, predictions):
        predicted, gold = [], []
        for i, row in enumerate(predictions):
            positions = self.dev["word_positions"][i]
            n = int(np.sum(positions >= 0))
            predicted.append([self.labels[int(row[p])] for p in positions[:n]])
            gold.append(list(self.dev_examples[i]["tags"][:n]))
        return predicted, gold

    def write_predictions(self, path: str) -> None:
        """Dev predictions as TSV: the input and the predicted and gold labels."""
        if self._predictions is None:
            return

        def clean(value):
            return str(value).replace("\t", " ").replace("\n", " ")

        if self.objective.tokens:
            predicted, gold = self._word_tags(self._predictions)
            lines = ["tokens\tpredicted\tgold"] + [
                f"{' '.join(e['tokens'][: len(p)])}\t{' '.join(p)}\t{' '.join(g)}"
                for e, p, g in zip(self.dev_examples, predicted, gold)
            ]
        else:
            lines = ["text\ttext_pair\tpredicted\tgold"]
            for e, p in zip(self.dev_examples, self._predictions):
                name = self.labels[int(p)] if self.labels else f"{float(p):.6g}"
                row = (clean(e["text"]), clean(e["text_pair"]), name, clean(e["label"]))
                lines.append("\t".join(row))
        paths.write_text(path, "\n".join(lines) + "\n")
