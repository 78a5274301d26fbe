"""Embedding training data: ``config.pairs`` encoded once into fixed-shape rows and served as a
`DataSource` (batches a pure function of the step; the held-out pairs scored as a retrieval set).

Batch keys: ``input_ids`` / ``attention_mask`` [B, Tq] (queries), ``doc_input_ids`` /
``doc_attention_mask`` [B, K, T] (each query's positive, then its K - 1 hard negatives) and
``weights`` [B] (0 for the padding rows of the last held-out batch). A pair with fewer hard
negatives than ``config.pairs.num_negatives`` gets other documents of its group (the built-in
pairs' module), then random documents, keyed by (seed, pair): the same on every host and run.
"""

from __future__ import annotations

import logging

import numpy as np

from bertjax import paths
from bertjax.data import keys
from bertjax.data.text import pairs
from bertjax.evaluation import retrieval
from bertjax.interop import sentence_transformers as st_files
from bertjax.tasks.encoded_rows import EncodedRows
from bertjax.tasks.tasks import encode_pairs


class PairData(EncodedRows):
    """Encoded train and held-out pairs of ``config.pairs`` (module docstring)."""

    dev_metric = "ndcg@10"  # WORKDIR/best keeps the checkpoint with the best held-out NDCG@10
    order_stream = "pairs/order"
    weight_key = "weights"

    def __init__(self, config, workdir: str, objective):
        self.config, self.workdir = config, workdir
        self.similarity = objective.similarity
        c = config.pairs
        self.pretrained, self._model_cfg, self.pretrained_path = None, None, config.init_from
        self._st_modules = None
        if config.init_from:
            path = config.init_from
            if st_files.is_sentence_transformers_dir(path):
                self._st_modules = st_files.read_modules(path)
                path = self._st_modules.transformer_path
            self._load_pretrained(path)
        train, dev = self._load(c)
        if not config.init_from:
            texts = [p.query for p in train] + [p.positive for p in train]
            self.tokenizer = self._own_tokenizer(texts)
        length = self._fitting(int(config.data.max_seq_length))
        query_length = self._fitting(int(c.max_query_length))
        self.num_negatives = int(c.num_negatives)
        self._serve(
            self._encode(train, query_length, length, self.num_negatives, "train"),
            self._encode(dev, query_length, length, 0, "dev"),
        )
        self.num_train, self.num_dev = len(train), len(dev)
        self.dev_positives = [p.positive for p in dev]
        logging.info(
            "pairs %s: %d train, %d held-out, %d hard negatives, T=%d/%d",
            c.source,
            self.num_train,
            self.num_dev,
            self.num_negatives,
            query_length,
            length,
        )

    def _load(self, c):
        fields = (c.query_field, c.positive_field, c.negatives_field)
        if c.source == "builtin":
            every = pairs.builtin_pairs()
        else:
            every = pairs.read_pairs(paths.resolve(c.source, "config.pairs.source"), *fields)
        if c.dev_file:
            train = every
            dev = pairs.read_pairs(paths.resolve(c.dev_file, "config.pairs.dev_file"), *fields)
        else:
            train, dev = pairs.split_pairs(every, float(c.dev_fraction))
        if not train or not dev:
            raise ValueError(
                f"config.pairs.source={c.source!r}: {len(train)} train and {len(dev)} held-out "
                "pairs; both must be non-empty (config.pairs.dev_fraction or dev_file)"
            )
        return train, dev

    def _negatives(self, items, count: int, purpose: str) -> list[list[str]]:
        """``count`` hard negatives per pair: its own, then its group's, then random others."""
        by_group: dict[str, list[int]] = {}
        for i, p in enumerate(items):
            if p.group:
                by_group.setdefault(p.group, []).append(i)
        out = []
        for i, p in enumerate(items):
            chosen = [n for n in p.negatives[:count] if n != p.positive]
            if len(chosen) < count:
                rng = keys.generator(self.config.seed, i, f"pairs/{purpose}/negatives")
                group = [j for j in by_group.get(p.group, []) if j != i]
                others = list(rng.permutation(group)) + list(rng.integers(0, len(items), count))
                for j in others:
                    if len(chosen) == count:
                        break
                    if int(j) != i and items[int(j)].positive != p.positive:
                        chosen.append(items[int(j)].positive)
            while len(chosen) < count:  # a tiny set: repeat what there is
                chosen.append(chosen[-1] if chosen else items[(i + 1) % len(items)].positive)
            out.append(chosen)
        return out

    def _encode(self, items, query_length: int, length: int, negatives: int, purpose: str):
        n = len(items)
        queries = encode_pairs(self.tokenizer, [p.query for p in items], [""] * n, query_length)
        docs = [[p.positive] for p in items]
        if negatives:
            for row, extra in zip(docs, self._negatives(items, negatives, purpose)):
                row.extend(extra)
        flat = [text for row in docs for text in row]
        encoded = encode_pairs(self.tokenizer, flat, [""] * len(flat), length)
        slots = 1 + negatives
        return {
            "input_ids": queries["input_ids"],
            "attention_mask": queries["attention_mask"],
            "doc_input_ids": encoded["input_ids"].reshape(n, slots, length),
            "doc_attention_mask": encoded["attention_mask"].reshape(n, slots, length),
            "weights": np.ones(n, np.float32),
        }

    def pretrained_encoder(self) -> dict:
        """The init_from model's encoder params (host arrays)."""
        scan = self._model_cfg.scan_layers if self.pretrained.is_hf else None
        params = self.pretrained.params(**({"scan_layers": scan} if scan else {}))
        return {k: v for k, v in params["bert"].items() if k != "pooler"}

    def score(self, predictions: np.ndarray) -> dict:
        """NDCG@10, MRR@10 and Recall@100 of the held-out queries searching the held-out
        positives (the scored rows' documents, duplicates merged)."""
        predictions = np.asarray(predictions, np.float32)[: self.num_dev]
        if self.similarity == "cos":
            predictions = predictions / np.maximum(
                np.linalg.norm(predictions, axis=-1, keepdims=True), 1e-12
            )
        texts = self.dev_positives[: len(predictions)]
        doc_of_text: dict[str, str] = {}
        rows = []
        for i, text in enumerate(texts):
            if text not in doc_of_text:
                doc_of_text[text] = str(len(rows))
                rows.append(i)
        qrels = {str(i): {doc_of_text[text]: 1} for i, text in enumerate(texts)}
        run = retrieval.dense_run(
            list(qrels), predictions[:, 0], [str(d) for d in range(len(rows))], predictions[rows, 1]
        )
        return retrieval.evaluate_run(run, qrels)
