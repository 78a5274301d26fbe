"""Fine-tuning: sequence classification/regression and token classification objectives, and the
pretrained encoder a run starts from (``config.init_from``).

The trainer's one loop runs fine-tuning: ``config.loss.objective`` = "classification"
(num_labels=1: regression) or "token_classification". The objective's data source is
`TaskData` (bertjax/tasks/task_data.py), which knows the init_from model's config and
tokenizer and scores dev predictions with GLUE/CoNLL metrics; the objective's `prepare_state`
loads the pretrained encoder; the trainer keeps WORKDIR/best by the task's dev metric. FGM
(``config.loss.fgm_epsilon``) is the objective's way of taking gradients (`Objective.gradients`).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.modeling.heads import BertForSequenceClassification, BertForTokenClassification
from bertjax.objectives.base import Objective, example_rows
from bertjax.objectives.fgm import with_fgm
from bertjax.ops.loss import cross_entropy
from bertjax.tasks import glue_hub
from bertjax.tasks.task_data import TaskData


def default_task_config() -> ml_collections.ConfigDict:
    """``config.task``: where examples come from and which dev metric picks the best checkpoint."""
    c = ml_collections.ConfigDict()
    # "builtin:NAME" | "files" | "glue:NAME" (the Hub's nyu-mll/glue parquet, or glue_dir) |
    # "tfds:glue/NAME" (prepared TFDS, no download)
    c.source = "builtin:stdlib_families"
    # source="files": .tsv/.csv/.jsonl (tokens: also .conll/.txt) training examples
    c.train_file = ""
    c.dev_file = ""  # source="files": dev examples, same format
    c.text_column = "text"  # column of the (first) text
    c.text_pair_column = ""  # column of the second text of a pair ("" = single sentence)
    c.label_column = "label"  # column of the label (class name/id, or a float for regression)
    c.tokens_column = "tokens"  # token tasks in JSONL: list of words
    c.tags_column = "tags"  # token tasks in JSONL: list of BIO tags
    c.labels = ()  # label names in id order (() = sorted train labels; BIO: "O" first)
    c.metric = ""  # dev metric for the best checkpoint ("" = the task's main metric)
    c.dev_fraction = 0.2  # built-in tasks: fraction of documents (by hash of id) in dev
    c.train_examples = 0  # > 0: train on a seeded random subset of this many (low-resource runs)
    c.tfds_data_dir = ""  # tfds: data_dir ("" = tfds default); nothing is downloaded
    c.glue_dir = ""  # source="glue:NAME": the GLUE download script's folder ("": the Hub's)
    c.glue_repo = glue_hub.REPO  # source="glue:NAME", no glue_dir: the Hub dataset repository
    # ... at this revision (a commit SHA: downloaded once, then read from the Hugging Face cache)
    c.glue_revision = glue_hub.REVISION
    # the classifier head over an init_from model ("": the model's own, e.g. ELECTRA "first"; or
    # "pooler" | "cls" | "mean" | "first" | "electra_hf": HF's ELECTRA head, which exports)
    c.classifier_pooling = ""
    # MRPC/STS-B training pairs also in the other order (ELECTRA's double_unordered; its recipe)
    c.double_unordered = False
    return c


def add_finetune_config(config: ml_collections.ConfigDict, objective: str, num_labels: int):
    """Turns a `default_run_config()` into a fine-tuning one (call before the config is locked)."""
    # "" (random) | bertjax pretraining workdir/checkpoints dir | HF model dir
    config.init_from = ""
    config.task = default_task_config()
    config.loss.objective = objective
    config.loss.num_labels = num_labels  # classes (1 = regression; token tasks: BIO tags)
    config.loss.fgm_epsilon = 0.0  # FGM adversarial step on the word embeddings (0 = off)
    config.eval_batches = 0  # 0 = the whole dev split at every eval
    config.optim.warmup_fraction = 0.1
    return config


class _Finetuning(Objective):
    """Shared pieces of the fine-tuning objectives: inputs, weighted normalizer, data, init,
    FGM."""

    loads_init_from = True  # the encoder of config.init_from, in prepare_state
    input_names = ("input_ids", "token_type_ids", "attention_mask")
    fgm_parameter = ("bert", "embeddings", "word_embeddings")  # what FGM perturbs
    tokens = False

    num_labels: int = 2  # classes (1 = regression; token tasks: BIO tags)
    fgm_epsilon: float = 0.0  # FGM adversarial step on the word embeddings (0 = off)

    def validate(self):
        if self.num_labels < 1 or (self.tokens and self.num_labels < 2):
            raise ValueError(
                f"config.loss.num_labels={self.num_labels}: must be >= {1 + self.tokens}"
            )
        if self.fgm_epsilon < 0:
            raise ValueError(f"config.loss.fgm_epsilon={self.fgm_epsilon}: must be >= 0")

    def gradients(self, grad_fn, model):
        """With ``fgm_epsilon`` > 0, clean plus FGM-adversarial gradients (`fgm.with_fgm`)."""
        if self.fgm_epsilon <= 0:
            return grad_fn
        return with_fgm(grad_fn, self.fgm_epsilon, self.fgm_parameter)

    def init_batch(self, cfg):
        ids = jnp.zeros((1, min(8, cfg.max_position_embeddings - cfg.position_offset)), jnp.int32)
        return {"input_ids": ids, "token_type_ids": ids, "attention_mask": ids + 1}

    def example_batch(self, cfg, rows, length, seed):
        """Labels per row (per token for token tasks), weight 0 on a few (padding tokens)."""
        batch = example_rows(cfg, rows, length, seed)
        rs = np.random.RandomState(seed + 1)
        shape = (rows, length) if self.tokens else (rows,)
        weights = np.ones(shape, np.float32)
        weights[::4] = 0.0
        if self.tokens:
            weights = (weights * batch["attention_mask"]).astype(np.float32)  # as task data
        if self.num_labels == 1:
            labels = rs.randn(*shape).astype(np.float32)
        else:
            labels = rs.randint(0, self.num_labels, shape).astype(np.int32)
        return dict(batch, labels=labels, label_weights=weights)

    def normalizers(self, batch):
        weight = jnp.sum(batch["label_weights"].astype(jnp.float32))
        return {"examples": jnp.where(weight > 0, weight, 1.0)}

    def total_loss(self, sums, norms):
        return sums["loss"] / norms["examples"]

    def metrics(self, sums, norms):
        if "correct" not in sums:
            return {}
        name = "token_accuracy" if self.tokens else "accuracy"
        return {name: sums["correct"] / norms["examples"]}

    def make_data(self, config, workdir):
        return TaskData(config, workdir, self)

    def prepare_state(self, state, data):
        """``state`` with the init_from encoder weights (unchanged when init_from is empty)."""
        if data.pretrained is None:
            return state
        pretrained = data.pretrained.params(scan_layers=data.model_config().scan_layers)
        params = merge_encoder(state.params, pretrained["bert"], data.pretrained.path)
        return state.replace(params=params)


class Classification(_Finetuning):
    """Pooled [CLS] classifier: cross-entropy over ``num_labels``; MSE when ``num_labels == 1``."""

    objective_name = "classification"

    headline_metrics = ("accuracy",)

    def model(self, cfg):
        return BertForSequenceClassification(cfg, num_labels=self.num_labels)

    def loss_sums(self, outputs, batch):
        logits = outputs["logits"]
        weights = batch["label_weights"].astype(jnp.float32)
        if self.num_labels == 1:
            error = logits[:, 0].astype(jnp.float32) - batch["labels"].astype(jnp.float32)
            return {"loss": jnp.sum(error * error * weights)}
        nll, correct = cross_entropy(logits, batch["labels"])
        return {"loss": jnp.sum(nll * weights), "correct": jnp.sum(correct * weights)}

    def predictions(self, outputs):
        logits = outputs["logits"]
        if self.num_labels == 1:
            return logits[:, 0].astype(jnp.float32)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


class TokenClassification(Classification):
    """Per-token classifier (NER): cross-entropy on each word's first piece."""

    objective_name = "token_classification"

    tokens = True
    headline_metrics = ("token_accuracy",)

    def model(self, cfg):
        return BertForTokenClassification(cfg, num_labels=self.num_labels)

    def predictions(self, outputs):
        return jnp.argmax(outputs["logits"], axis=-1).astype(jnp.int32)


def merge_encoder(params, pretrained: dict, source: str):
    """``params`` with its ``bert`` leaves replaced by the pretrained ones (same shapes); leaves the
    checkpoint lacks (e.g. a pooler never trained) keep their fresh init."""
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(pretrained)}
    kept = []

    def take(path, leaf):
        key = jax.tree_util.keystr(path)
        if key not in flat:
            kept.append(key)
            return leaf
        value = flat.pop(key)
        if value.shape != leaf.shape:
            raise ValueError(
                f"config.init_from={source!r}: bert{key} has shape {value.shape}, "
                f"the model expects {leaf.shape}"
            )
        return jax.device_put(np.asarray(value, leaf.dtype), leaf.sharding)

    bert = jax.tree_util.tree_map_with_path(take, params["bert"])
    flat = {k: v for k, v in flat.items() if not k.startswith("['pooler']")}  # token heads
    if flat:
        raise ValueError(
            f"config.init_from={source!r} has encoder weights the model lacks: {sorted(flat)[:10]}"
        )
    if kept:
        logging.info("init_from %s: kept fresh init for %s", source, kept)
    return {**params, "bert": bert}
