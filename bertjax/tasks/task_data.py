"""Fine-tuning data: the task's train/dev examples encoded once into fixed-shape rows, served as
a `DataSource` (batches keyed by the step, the dev split for evaluation, task metrics)."""

from __future__ import annotations

import logging

import numpy as np

from bertjax import paths
from bertjax.data import keys
from bertjax.tasks import glue_tasks, task_metrics, tasks
from bertjax.tasks.encoded_rows import EncodedRows


class TaskData(EncodedRows):
    """Encoded train/dev rows of ``config.task``; `batch(step)` is a pure function of the step.

    ``objective`` says what rows to make (``tokens``: token tags; ``num_labels``: 1 is
    regression). With ``config.init_from`` the pretrained model's tokenizer is used and
    `pretrained` holds that model (its weights are read by the objective's `prepare_state`).
    """

    order_stream = "finetune/order"
    weight_key = "label_weights"
    private_keys = ("word_positions",)  # where each word starts: for scoring token tags

    def __init__(self, config, workdir: str, objective):
        self.config, self.workdir, self.objective = config, workdir, objective
        task, tokens = config.task, objective.tokens
        self.pretrained, self._model_cfg = None, None
        if config.init_from:
            pooling = task.get("classifier_pooling")
            self._load_pretrained(
                config.init_from, **({"classifier_pooling": pooling} if pooling else {})
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
            self.tokenizer = self._own_tokenizer(self._texts(train))
        self.labels = tasks.label_index(train, task.labels, objective.num_labels, tokens)
        self.glue_task = glue_tasks.task_of_source(task.source)
        self.dev_metric = task.metric or self._main_metric()
        length = self._fitting(int(config.data.max_seq_length))
        self.dev_examples = dev
        # Dev files scored apart (MNLI matched / mismatched): (metric suffix, example indices).
        parts = [e.get("dev_part", "") for e in dev]
        self._dev_parts = [
            (part, np.flatnonzero(np.asarray(parts) == part)) for part in dict.fromkeys(parts)
        ]
        self._serve(self._encode(train, length), self._encode(dev, length))
        self.num_train, self.num_dev = len(train), len(dev)
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

    def _texts(self, train) -> list[str]:
        """The task's training text (what its own tokenizer is trained on)."""
        if self.objective.tokens:
            return [" ".join(e["tokens"]) for e in train]
        return [e["text"] for e in train] + [e["text_pair"] for e in train if e["text_pair"]]

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
