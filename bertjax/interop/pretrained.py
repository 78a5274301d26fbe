"""A pretrained model a run starts from: a Hugging Face directory or a bertjax checkpoint.

Fine-tuning's ``config.init_from`` and a distillation teacher (``config.loss.teacher``) name one;
`PretrainedSource` gives its model config, tokenizer and params the same way for either kind.
"""

from __future__ import annotations

from bertjax import convert
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

    def tokenizer_file(self, directory: str) -> str:
        """The model's tokenizer file: an HF directory's own, or a checkpoint's written into
        ``directory``."""
        if self.is_hf:
            return hf_files.tokenizer_file(self.path, self.key)
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
