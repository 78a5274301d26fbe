"""What fine-tuning data (`task_data.TaskData`) and embedding pairs (`embedding_data.PairData`)
share: train and held-out rows encoded once into fixed-shape arrays, with the tokenizer of the
``config.init_from`` model or the run's own; batches shuffled per epoch, keyed by the step; the
held-out rows in order, the last batch padded with weight-0 rows."""

from __future__ import annotations

import hashlib
import json

import jax
import numpy as np

from bertjax import paths
from bertjax.data.source import DataSource, host_rows, ordered_rows, shuffled_rows
from bertjax.data.tokenizer import Tokenizer
from bertjax.data.tokenizer.configured import workdir_tokenizer
from bertjax.interop.pretrained import PretrainedSource


class EncodedRows(DataSource):
    """A `DataSource` over ``self.train`` and ``self.dev`` (dicts of arrays, one row per
    example) that a subclass encodes, then hands to `_serve`."""

    order_stream: str  # the key of the epoch shuffles (keys.generator's stream)
    weight_key: str  # the rows' weights, zeroed at the padding of the last held-out batch
    private_keys: tuple = ()  # row arrays kept for scoring, not batched

    def _load_pretrained(self, path: str, **overrides) -> None:
        """``self.pretrained`` (the model at ``path``, config.init_from), its BertConfig with
        the run's dtype and, for an HF directory, the run's scan_layers, and its tokenizer."""
        config = self.config
        self.pretrained = PretrainedSource(path, "config.init_from")
        overrides["dtype"] = config.model.dtype
        if self.pretrained.is_hf:  # HF layers are stacked on load when the run scans them
            overrides["scan_layers"] = bool(config.model.get("scan_layers"))
        self._model_cfg = self.pretrained.model_config(**overrides)
        self.tokenizer = Tokenizer(
            self.pretrained.tokenizer_file(paths.cache_dir(config.data.cache_dir)),
            lowercase=config.data.lowercase,
        )

    def _own_tokenizer(self, texts: list[str]) -> Tokenizer:
        """The configured tokenizer, else a SentencePiece model of ``texts`` (the training
        text), kept as WORKDIR/tokenizer/spm.model."""
        c = self.config.data
        cache = paths.cache_dir(c.cache_dir)
        if c.hf_vocab or c.tokenizer_model:
            return Tokenizer(
                paths.local_copy(c.hf_vocab or c.tokenizer_model, cache), lowercase=c.lowercase
            )
        path = workdir_tokenizer(
            texts,
            self.workdir,
            cache,
            jax.process_index(),
            jax.process_count(),
            key=lambda: {"task_texts": hashlib.sha256(json.dumps(texts).encode()).hexdigest()},
            vocab_size=int(c.vocab_size),
            model_type=c.tokenizer_type,
            seed=int(self.config.seed),
        )
        return Tokenizer(path)

    def _fitting(self, length: int) -> int:
        """``length`` cut to the positions of the init_from model (unchanged without one)."""
        cfg = self._model_cfg
        if cfg is None:
            return length
        return min(length, cfg.max_position_embeddings - cfg.position_offset)

    def _serve(self, train: dict, dev: dict) -> None:
        """Serves the encoded ``train`` and ``dev`` rows (their fingerprint, this host's rows
        of each global batch)."""
        self.train, self.dev = train, dev
        digest = hashlib.sha256()
        for rows in (train, dev):
            for key in sorted(rows):
                digest.update(key.encode() + np.ascontiguousarray(rows[key]).tobytes())
        self._fingerprint = digest.hexdigest()[:16]
        self.global_batch_size = int(self.config.batch_size)
        self._rows = host_rows(self.global_batch_size, jax.process_index(), jax.process_count())

    def _take(self, rows: dict, index: np.ndarray, weights: np.ndarray | None = None) -> dict:
        out = {k: v[index] for k, v in rows.items() if k not in self.private_keys}
        if weights is not None:
            row_weights = out[self.weight_key]
            shape = (-1,) + (1,) * (row_weights.ndim - 1)  # per row, or per token of a row
            out[self.weight_key] = row_weights * weights.reshape(shape)
        return out

    def batch(self, step: int) -> dict:
        """This host's rows of global batch ``step``: epoch-wise shuffles keyed by (seed, epoch)."""
        seed, size = self.config.seed, self.global_batch_size
        index = shuffled_rows(seed, step, size, self._rows, self.num_train, self.order_stream)
        return self._take(self.train, index)

    def eval_batches(self, num_batches: int):
        """The held-out rows in order, padded with weight-0 rows (``num_batches`` > 0 caps it)."""
        for index, real in ordered_rows(
            self.num_dev, self.global_batch_size, self._rows, num_batches
        ):
            yield self._take(self.dev, index, real)

    @property
    def fingerprint(self) -> str:
        """A hash of the encoded train and held-out rows."""
        return self._fingerprint

    def model_config(self):
        """The init_from model's BertConfig (None: the run's config.model)."""
        return self._model_cfg
