"""A pretrained model a run starts from: a Hugging Face directory or a bertjax checkpoint.

Fine-tuning's ``config.init_from`` and a distillation teacher (``config.loss.teacher``) name one;
`PretrainedSource` gives its model config, tokenizer and params the same way for either kind.
"""

from __future__ import annotations

import os

from bertjax import convert, paths
from bertjax.interop import hf_files
from bertjax.interop.checkpoints import CheckpointReader, require_dir
from bertjax.modeling.bert_config import BertConfig


class PretrainedSource:
    """The model under ``path``; ``key`` names the setting the path came from in errors."""

    def __init__(self, path: str, key: str):
        require_dir(path, key)
        self.path, self.key = path, key
        self.is_hf = hf_files.is_hf_dir(path)
        self._reader = None if self.is_hf else CheckpointReader(path, key)

    def model_config(self, **overrides) -> BertConfig:
        """The model's BertConfig (``overrides`` replace fields, e.g. dtype)."""
        if self.is_hf:
            return hf_files.read_config(self.path, **overrides)
        return self._reader.model_config(**overrides)

    def tokenizer_file(self, cache: str | None = None) -> str:
        """The model's tokenizer as a local file: an HF directory's own (copied into the local
        cache when it is a URL), or a bertjax checkpoint's, written into the local cache
        (``cache``, default `bertjax.paths.cache_dir()`) under its fingerprint."""
        if self.is_hf:
            return hf_files.tokenizer_file(self.path, self.key)
        fingerprint = self._reader.meta.get("tokenizer_fingerprint", "unknown")
        directory = os.path.join(cache or paths.cache_dir(), "tokenizers", fingerprint)
        return self._reader.write_tokenizer(directory)

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The fingerprint a bertjax checkpoint recorded for its tokenizer (None for HF)."""
        return None if self.is_hf else self._reader.meta.get("tokenizer_fingerprint")

    def params(self, **overrides) -> dict:
        """The whole parameter tree as host arrays (``overrides``: from_hf's, e.g. scan_layers)."""
        if self.is_hf:
            return convert.from_hf(self.path, **overrides)[1]
        return self._reader.params()
