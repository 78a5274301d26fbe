"""Hugging Face weights both ways: the public face of `bertjax.interop.hf` (BERT, RoBERTa,
ALBERT), `bertjax.interop.electra` (ELECTRA discriminators and generators) and
`bertjax.interop.modernbert` (ModernBERT, Ettin), chosen by the
model type (config.json's on the way in, the BertConfig's on the way out).

cfg, params = bertjax.convert.from_hf("path/to/bert-base-uncased")
bertjax.convert.to_hf(cfg, params, "exported/")
"""

from __future__ import annotations

from typing import Any

from bertjax.interop import electra, hf, modernbert
from bertjax.interop.hf import stack_layers, unstack_layers
from bertjax.interop.hf_files import read_config
from bertjax.modeling.bert_config import BertConfig

__all__ = ["from_hf", "stack_layers", "to_hf", "unstack_layers"]


def from_hf(path: str, **overrides: Any) -> tuple[BertConfig, dict]:
    """(BertConfig, params) of an HF directory (see `bertjax.interop.hf.from_hf`; an ELECTRA
    directory: `bertjax.interop.electra.from_hf`).

    Args:
      path: a Hugging Face model directory (config.json + model.safetensors or
        pytorch_model.bin, read with ``weights_only``): BERT, RoBERTa, ALBERT, ELECTRA or
        ModernBERT, a base model or a task-head save.
      **overrides: BertConfig fields to set on the read config (e.g. ``dtype="bfloat16"``).

    Returns:
      ``(cfg, params)``: the BertConfig and the Linen params of the matching bertjax model
      (`BertForPreTraining`, a classifier, or `ElectraDiscriminator`/`ElectraGenerator`).
    """
    family = read_config(path).model_type
    if family == "electra":
        return electra.from_hf(path, **overrides)
    if family == "modernbert":
        return modernbert.from_hf(path, **overrides)
    return hf.from_hf(path, **overrides)


def to_hf(cfg: BertConfig, params: dict, path: str, **kwargs: Any) -> None:
    """Writes an HF directory (see `bertjax.interop.hf.to_hf`); with ``cfg.model_type ==
    "electra"`` the discriminator and/or generator (`bertjax.interop.electra.to_hf`).

    Args:
      cfg: the model's BertConfig; ``model_type`` picks the Hugging Face family written.
      params: the model's Linen params (a bertjax model's, or a train state's ``params``).
      path: the directory to write (config.json + model.safetensors).
      **kwargs: family options of the interop writer it dispatches to.

    Returns:
      None; ``transformers``' ``from_pretrained(path)`` loads the directory.
    """
    if cfg.model_type == "electra":
        return electra.to_hf(cfg, params, path, **kwargs)
    if cfg.model_type == "modernbert":
        return modernbert.to_hf(cfg, params, path, **kwargs)
    return hf.to_hf(cfg, params, path, **kwargs)
