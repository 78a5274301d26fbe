"""Fine-tuning: sequence classification/regression and token classification objectives, their
task data, and the pretrained encoder a run starts from (``config.init_from``).

The trainer's one loop runs fine-tuning: `config.loss.objective` = "classification" (num_labels=1:
regression) or "token_classification"; the objective supplies the data object (`make_data`), which
also knows the init checkpoint's model config and tokenizer, loads its encoder weights, scores
dev predictions with GLUE/CoNLL metrics and keeps WORKDIR/best. FGM (`config.loss.fgm_epsilon`)
is applied in `step._gradients` (`step.with_fgm`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax import checkpoint as checkpoint_lib
from bertjax import evaluation, moe, tasks_data
from bertjax.config import BertConfig
from bertjax.data import keys
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece
from bertjax.heads import BertForSequenceClassification, BertForTokenClassification
from bertjax.objectives import Objective, cross_entropy


def default_task_config() -> ml_collections.ConfigDict:
    """``config.task``: where examples come from and which dev metric picks the best checkpoint."""
    c = ml_collections.ConfigDict()
    c.source = (
        "builtin:stdlib_families"  # "builtin:NAME" | "files" | "tfds:glue/NAME" (no download)
    )
    c.train_file = (
        ""  # source="files": .tsv/.csv/.jsonl (tokens: also .conll/.txt) training examples
    )
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
    return c


def add_finetune_config(config: ml_collections.ConfigDict, objective: str, num_labels: int):
    """Turns a `default_run_config()` into a fine-tuning one (call before the config is locked)."""
    config.init_from = (
        ""  # "" (random) | bertjax pretraining workdir/checkpoints dir | HF model dir
    )
    config.task = default_task_config()
    config.loss.objective = objective
    config.loss.num_labels = num_labels  # classes (1 = regression; token tasks: BIO tags)
    config.loss.fgm_epsilon = 0.0  # FGM adversarial step on the word embeddings (0 = off)
    config.loss.next_sentence = False
    config.eval_batches = 0  # 0 = the whole dev split at every eval
    config.optim.warmup_fraction = 0.1
    return config


def _logits(outputs):
    """A head's logits, whether or not MoE stats came with them."""
    return outputs["logits"] if isinstance(outputs, dict) else outputs


class _Finetuning(Objective):
    """Shared pieces of the fine-tuning objectives: inputs, weighted normalizer, data, FGM."""

    extra_config_keys = ("num_labels", "fgm_epsilon")
    tokens = False

    @classmethod
    def from_config(cls, loss_config):
        num_labels = int(loss_config.num_labels)
        if num_labels < 1 or (cls.tokens and num_labels < 2):
            raise ValueError(f"config.loss.num_labels={num_labels}: must be >= {1 + cls.tokens}")
        if float(loss_config.fgm_epsilon) < 0:
            raise ValueError(f"config.loss.fgm_epsilon={loss_config.fgm_epsilon}: must be >= 0")
        return cls(num_labels, float(loss_config.fgm_epsilon))

    def init_batch(self, cfg):
        ids = jnp.zeros((1, min(8, cfg.max_position_embeddings - cfg.position_offset)), jnp.int32)
        return {"input_ids": ids, "token_type_ids": ids, "attention_mask": ids + 1}

    def apply(self, model, variables, batch, rngs, deterministic, init=False):
        args = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if init:
            return model.init(rngs, *args, deterministic=deterministic)
        # MoE encoders: {"logits", "moe"} with the router stats (bertjax.moe).
        return moe.apply_model(model, variables, *args, deterministic=deterministic, rngs=rngs)

    def normalizers(self, batch):
        weight = jnp.sum(batch["label_weights"].astype(jnp.float32))
        return {"examples": jnp.where(weight > 0, weight, 1.0)}

    def total_loss(self, sums, norms):
        return sums["loss"] / norms["examples"] + moe.total_loss_term(sums, norms)

    def metrics(self, sums, norms):
        out = {"loss": sums["loss"] / norms["examples"]}
        if "correct" in sums:
            out["accuracy" if not self.tokens else "token_accuracy"] = (
                sums["correct"] / norms["examples"]
            )
        out.update(moe.metrics(sums, norms))
        return out

    @staticmethod
    def router_sums(outputs, batch) -> dict:
        """MoE router losses weighted like the task loss (by label weight)."""
        weight = jnp.sum(batch["label_weights"].astype(jnp.float32))
        return moe.loss_sums(outputs, batch, examples=weight)

    def make_data(self, config, workdir):
        return TaskData(config, workdir, self)


@dataclasses.dataclass(frozen=True)
class Classification(_Finetuning):
    """Pooled [CLS] classifier: cross-entropy over ``num_labels``; MSE when ``num_labels == 1``."""

    num_labels: int = 2
    fgm_epsilon: float = 0.0

    def model(self, cfg):
        return BertForSequenceClassification(cfg, num_labels=self.num_labels)

    def loss_sums(self, outputs, batch):
        router = self.router_sums(outputs, batch)
        outputs = _logits(outputs)
        weights = batch["label_weights"].astype(jnp.float32)
        if self.num_labels == 1:
            error = outputs[:, 0].astype(jnp.float32) - batch["labels"].astype(jnp.float32)
            return {"loss": jnp.sum(error * error * weights), **router}
        nll, correct = cross_entropy(outputs, batch["labels"])
        return {"loss": jnp.sum(nll * weights), "correct": jnp.sum(correct * weights), **router}

    def predictions(self, outputs):
        outputs = _logits(outputs)
        if self.num_labels == 1:
            return outputs[:, 0].astype(jnp.float32)
        return jnp.argmax(outputs, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TokenClassification(Classification):
    """Per-token classifier (NER): cross-entropy on each word's first piece."""

    tokens = True

    def model(self, cfg):
        return BertForTokenClassification(cfg, num_labels=self.num_labels)

    def predictions(self, outputs):
        return jnp.argmax(_logits(outputs), axis=-1).astype(jnp.int32)


def _bertjax_checkpoints(path: str) -> str:
    """The checkpoints directory of a bertjax workdir (or the directory itself)."""
    sub = os.path.join(path, "checkpoints")
    return sub if os.path.isdir(sub) else path


def read_init_source(path: str, config, workdir: str):
    """(model config or None, tokenizer, loader of the encoder params) of ``config.init_from``."""
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"config.init_from={path!r} is not a directory (a bertjax workdir, "
            "its checkpoints/ dir, or a Hugging Face model dir)"
        )
    if os.path.isfile(os.path.join(path, "config.json")):
        from bertjax import convert

        name = next(
            (n for n in ("tokenizer.json", "vocab.txt") if os.path.isfile(os.path.join(path, n))),
            None,
        )
        if name is None:
            raise FileNotFoundError(f"config.init_from={path!r} has no tokenizer.json or vocab.txt")
        tokenizer = Tokenizer(os.path.join(path, name), lowercase=config.data.lowercase)
        cfg, params = convert.from_hf(
            path, dtype=config.model.dtype, scan_layers=config.model.scan_layers
        )
        return cfg, tokenizer, lambda: params["bert"]
    import orbax.checkpoint as ocp

    directory = _bertjax_checkpoints(path)
    manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(read_only=True),
        item_names=("state", "meta"),
    )
    step = manager.latest_step()
    if step is None:
        raise FileNotFoundError(
            f"config.init_from={path!r}: no complete bertjax checkpoint in {directory}"
        )
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if "model_config" not in meta or "tokenizer_bytes" not in meta:
        raise ValueError(
            f"config.init_from={path!r}: checkpoint {directory}/{step} has no model "
            "config or tokenizer in its meta; is it a bertjax pretraining checkpoint?"
        )
    tokenizer = Tokenizer(
        checkpoint_lib.write_tokenizer(meta, os.path.join(workdir, "tokenizer")),
        lowercase=config.data.lowercase,
    )
    cfg = BertConfig.from_dict({**meta["model_config"], "dtype": config.model.dtype})

    def load():
        """Only the encoder is used; the whole saved state is read as host arrays."""
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        return jax.tree.map(np.asarray, restored["state"]["params"]["bert"])

    return cfg, tokenizer, load


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
    flat = {
        k: v for k, v in flat.items() if not k.startswith("['pooler']")
    }  # token heads: no pooler
    if flat:
        raise ValueError(
            f"config.init_from={source!r} has encoder weights the model lacks: {sorted(flat)[:10]}"
        )
    if kept:
        logging.info("init_from %s: kept fresh init for %s", source, kept)
    return {**params, "bert": bert}


class TaskFingerprint:
    """Stands in for the pretraining token store in checkpoint meta: a hash of the encoded rows."""

    def __init__(self, *splits: dict):
        digest = hashlib.sha256()
        for rows in splits:
            for key in sorted(rows):
                digest.update(key.encode() + np.ascontiguousarray(rows[key]).tobytes())
        self.fingerprint = digest.hexdigest()[:16]


class TaskData:
    """Encoded train/dev rows of ``config.task``; `batch(step)` is a pure function of the step."""

    def __init__(self, config, workdir: str, objective: _Finetuning):
        self.config, self.workdir, self.objective = config, workdir, objective
        task, tokens = config.task, objective.tokens
        self.model_cfg, self._load_encoder = None, None
        if config.init_from:
            self.model_cfg, self.tokenizer, self._load_encoder = read_init_source(
                config.init_from, config, workdir
            )
        train = tasks_data.load_examples(task, "train", tokens)
        dev = tasks_data.load_examples(task, "dev", tokens)
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
        self.labels = tasks_data.label_index(train, task.labels, objective.num_labels, tokens)
        self.metric = task.metric or (
            "entity_f1" if tokens else "pearson" if objective.num_labels == 1 else "accuracy"
        )
        length = int(config.data.max_seq_length)
        if self.model_cfg is not None:
            length = min(
                length, self.model_cfg.max_position_embeddings - self.model_cfg.position_offset
            )
        self.dev_examples = dev
        self.train, self.dev = self._encode(train, length), self._encode(dev, length)
        self.num_train, self.num_dev = len(train), len(dev)
        self.store = TaskFingerprint(self.train, self.dev)
        self.global_batch_size = int(config.batch_size)
        count, index = jax.process_count(), jax.process_index()
        if self.global_batch_size % count:
            raise ValueError(
                f"config.batch_size={config.batch_size} is not divisible by the "
                f"process count {count}"
            )
        per_host = self.global_batch_size // count
        self._rows = slice(index * per_host, (index + 1) * per_host)
        self._predictions = None
        self.best = evaluation.BestCheckpoint(workdir, self.metric)
        logging.info(
            "task %s: %d train, %d dev examples, labels %s, T=%d",
            task.source,
            self.num_train,
            self.num_dev,
            self.labels,
            length,
        )

    def _own_tokenizer(self, train):
        c = self.config.data
        if c.hf_vocab or c.tokenizer_model:
            return Tokenizer(c.hf_vocab or c.tokenizer_model, lowercase=c.lowercase)
        texts = (
            [" ".join(e["tokens"]) for e in train]
            if self.objective.tokens
            else [e["text"] for e in train] + [e["text_pair"] for e in train if e["text_pair"]]
        )
        path = train_sentencepiece(
            texts,
            os.path.join(self.workdir, "tokenizer"),
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
            return tasks_data.encode_words(
                self.tokenizer, [e["tokens"] for e in examples], tags, length
            )
        rows = tasks_data.encode_pairs(
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
        positions = (
            int(step) * self.global_batch_size + np.arange(self.global_batch_size)[self._rows]
        )
        epochs, offsets = np.divmod(positions, self.num_train)
        index = np.empty_like(positions)
        for epoch in np.unique(epochs):
            order = keys.generator(self.config.seed, int(epoch), "finetune/order").permutation(
                self.num_train
            )
            index[epochs == epoch] = order[offsets[epochs == epoch]]
        return self._take(self.train, index)

    def eval_batches(self, num_batches: int):
        """The dev split in order, padded with weight-0 rows (``num_batches`` > 0 caps it)."""
        total = -(-self.num_dev // self.global_batch_size)
        for b in range(min(total, num_batches) if num_batches > 0 else total):
            positions = b * self.global_batch_size + np.arange(self.global_batch_size)[self._rows]
            real = (positions < self.num_dev).astype(np.float32)
            yield self._take(self.dev, np.minimum(positions, self.num_dev - 1), real)

    def pretrained_params(self, params):
        """``params`` with the init_from encoder weights (unchanged when init_from is empty)."""
        if self._load_encoder is None:
            return params
        return merge_encoder(params, self._load_encoder(), self.config.init_from)

    def score(self, predictions: np.ndarray) -> dict:
        """Task metrics of the dev predictions (global rows in dev order; padding rows dropped)."""
        predictions = np.asarray(predictions)[: self.num_dev]
        self._predictions = predictions
        if not self.objective.tokens:
            return evaluation.sequence_metrics(
                predictions, self.dev["labels"][: len(predictions)], self.objective.num_labels
            )
        predicted, gold = self._word_tags(predictions)
        return evaluation.entity_f1(predicted, gold)

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
        if jax.process_index() != 0 or self._predictions is None:
            return
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            if self.objective.tokens:
                predicted, gold = self._word_tags(self._predictions)
                f.write("tokens\tpredicted\tgold\n")
                for e, p, g in zip(self.dev_examples, predicted, gold):
                    f.write(f"{' '.join(e['tokens'][: len(p)])}\t{' '.join(p)}\t{' '.join(g)}\n")
            else:
                f.write("text\ttext_pair\tpredicted\tgold\n")
                for e, p in zip(self.dev_examples, self._predictions):
                    name = self.labels[int(p)] if self.labels else f"{float(p):.6g}"
                    clean = lambda s: str(s).replace("\t", " ").replace("\n", " ")  # noqa: E731
                    f.write(
                        f"{clean(e['text'])}\t{clean(e['text_pair'])}\t{name}\t{clean(e['label'])}\n"
                    )
        os.replace(path + ".tmp", path)

    def after_eval(self, step: int, result: dict, state, meta: dict) -> bool:
        """Keeps WORKDIR/best when ``result`` improves the dev metric."""
        return self.best.update(step, result, state, meta, self.write_predictions)

    def close(self):
        self.best.close()
