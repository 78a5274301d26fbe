"""Weights to and from Hugging Face BERT, RoBERTa and ALBERT directories.

``from_hf(path)`` reads ``config.json`` plus ``model.safetensors`` (sharded or not; no
torch needed) or ``pytorch_model.bin`` (``torch.load(weights_only=True)``), and returns
``(BertConfig, params)`` in the layout of `bertjax.modeling.heads` models: ``{"bert": ...}``
plus whichever heads the checkpoint has (``mlm_head``, ``nsp_head``, ``classifier``).
``to_hf(cfg, params, path)`` writes a directory ``transformers`` loads with
``from_pretrained``. Nothing is unpickled except through ``weights_only=True``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from bertjax.interop.hf_files import (
    FAMILY_NAMES,
    bert_keys,
    read_config,
    read_weights,
    write_model_dir,
)
from bertjax.interop.hf_keys import (
    check_keys,
    describe_heads,
    get_path,
    heads_in,
    key_map,
    set_path,
    with_prefix,
)
from bertjax.modeling.bert_config import BertConfig

# Keys HF keeps as buffers or tied copies of other weights: safe to ignore on load.
_IGNORED_SUFFIXES = ("position_ids", "decoder.weight", "decoder.bias")


def from_hf(path: str, **overrides: Any) -> tuple[BertConfig, dict]:
    """(BertConfig, params) from an HF BERT/RoBERTa/ALBERT directory (local or a URL), however the
    model was saved: a base model (``BertModel``: the encoder and pooler), a task model
    (``...ForSequenceClassification``, ``...ForTokenClassification``) or a pretraining model
    (``...ForPreTraining``, ``...ForMaskedLM``). ``params`` hold the encoder under ``bert`` and
    whichever heads the checkpoint has (``mlm_head``, ``nsp_head``, ``classifier``); the heads
    present and absent are logged (`describe_heads`).

    ``overrides`` change config fields (e.g. ``dropout``, ``dtype``, ``scan_layers=True``,
    which stacks the layers as `nn.scan` expects).

    Example::

        cfg, params = bertjax.convert.from_hf("path/to/bert-base-uncased")
        logits = bertjax.BertForPreTraining(cfg).apply({"params": params}, ids)["mlm_logits"]
    """
    scan = overrides.pop("scan_layers", False)
    cfg = read_config(path, **overrides)
    weights, base_model = with_prefix(read_weights(path), cfg.model_type)
    keys = set(weights)
    heads = heads_in(keys, cfg.model_type)
    logging.info(
        "from_hf(%r): %s%s", path, "a base-model save; " * base_model, describe_heads(heads)
    )
    rules = key_map(cfg, heads)
    model = f"{cfg.model_type}, {cfg.num_hidden_layers} layers"
    check_keys(path, model, rules, keys, _IGNORED_SUFFIXES)
    params: dict = {}
    for key, (target, forward, _) in rules.items():
        value = np.asarray(forward(weights[key]), np.float32)
        set_path(params, target, value)
    expected = {
        ("bert", "embeddings", "word_embeddings"): (cfg.vocab_size, cfg.embedding_dim),
        ("bert", "embeddings", "position_embeddings"): (
            cfg.max_position_embeddings,
            cfg.embedding_dim,
        ),
    }
    for target, shape in expected.items():
        if get_path(params, target).shape != shape:
            raise ValueError(
                f"{path}: {'/'.join(target)} has shape {get_path(params, target).shape}, "
                f"config.json implies {shape}"
            )
    if scan:
        cfg = cfg.replace(scan_layers=True)
        params = stack_layers(cfg, params)
    return cfg, params


def stack_layers(cfg: BertConfig, params: dict) -> dict:
    """Per-layer subtrees ``layer_i`` -> one ``layers`` subtree stacked on axis 0 (for scan)."""
    import jax

    encoder = dict(params["bert"]["encoder"])
    layers = [encoder.pop(f"layer_{g}") for g in range(cfg.num_groups)]
    encoder["layers"] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    return {**params, "bert": {**params["bert"], "encoder": encoder}}


def unstack_layers(cfg: BertConfig, params: dict) -> dict:
    """The inverse of `stack_layers`."""
    import jax

    encoder = dict(params["bert"]["encoder"])
    stacked = encoder.pop("layers")
    for g in range(cfg.num_groups):
        encoder[f"layer_{g}"] = jax.tree.map(lambda x, g=g: np.asarray(x[g]), stacked)
    return {**params, "bert": {**params["bert"], "encoder": encoder}}


_ARCHITECTURES = {
    ("bert", "mlm", True): "BertForPreTraining",
    ("bert", "mlm", False): "BertForMaskedLM",
    ("roberta", "mlm", False): "RobertaForMaskedLM",
    ("roberta", "mlm", True): "RobertaForMaskedLM",
    ("albert", "mlm", True): "AlbertForPreTraining",
    ("albert", "mlm", False): "AlbertForMaskedLM",
    ("bert", "classifier", False): "BertForSequenceClassification",
    ("roberta", "classifier", False): "RobertaForSequenceClassification",
    ("albert", "classifier", False): "AlbertForSequenceClassification",
}


def encoder_problems(cfg: BertConfig) -> list[str]:
    """The settings of ``cfg`` that Hugging Face's BERT encoder (BERT, RoBERTa, ALBERT, ELECTRA)
    cannot run, each with its value: learned absolute positions, post-LN, a plain MLP, biases
    everywhere, global bidirectional attention, a dense feed-forward."""
    problems = []
    if cfg.position_embedding_type != "absolute":
        problems.append(
            f"position_embedding_type={cfg.position_embedding_type!r} (its positions are a "
            "learned table; ModernBERT's shape exports with model_type='modernbert')"
        )
    if cfg.pre_layer_norm:
        problems.append("pre_layer_norm=True (it normalizes after each block)")
    if cfg.mlp_type != "mlp":
        problems.append(f"mlp_type={cfg.mlp_type!r}")
    for name in ("attention_bias", "mlp_bias", "norm_bias", "head_bias", "decoder_bias"):
        if not getattr(cfg, name):
            problems.append(f"{name}=False")
    if cfg.head_activation != cfg.hidden_act:
        problems.append(f"head_act={cfg.head_act!r} (its heads use hidden_act)")
    if cfg.local_attention_window:
        problems.append(f"local_attention_window={cfg.local_attention_window}")
    if cfg.causal:
        problems.append("causal=True")
    if cfg.num_experts:
        problems.append(f"num_experts={cfg.num_experts} (mixture of experts)")
    return problems


def check_exportable(cfg: BertConfig, family: str, problems: list[str]) -> None:
    """One error naming every setting of ``cfg`` (``problems``) that Hugging Face's ``family``
    cannot represent, before anything is written."""
    if problems:
        raise ValueError(
            f"to_hf: Hugging Face {family} has no {'; '.join(problems)}: this "
            f"{cfg.model_type} model cannot be exported as {family}"
        )


def check_classifier_pooling(cfg, token_classification: bool, family: str) -> None:
    """A classifier exports only with the pooling its Hugging Face class runs: BERT's family
    (bert, roberta, albert) its tanh pooler for sequences and no layer before a token
    classifier's linear one; ModernBERT its head (dense, activation, norm) on [CLS] or the mean,
    for sequences and tokens alike."""
    if family == "ModernBERT":
        allowed = ("cls", "mean")
    elif token_classification:
        allowed = ("pooler", "first", "electra_hf")
    else:
        allowed = ("pooler",)
    if cfg.classifier_pooling not in allowed:
        kind = "token" if token_classification else "sequence"
        raise ValueError(
            f"to_hf: a {family} {kind} classifier with classifier_pooling="
            f"{cfg.classifier_pooling!r} has no Hugging Face equivalent (the exported model "
            f"would run {allowed[0]!r} pooling, with weights this model never trained); "
            f"fine-tune with config.task.classifier_pooling in {allowed} to export one"
        )


def to_hf(
    cfg: BertConfig,
    params: dict,
    path: str,
    *,
    token_classification: bool = False,
    tokenizer_file: str = "",
) -> None:
    """Writes an HF directory (config.json + model.safetensors) that ``from_pretrained`` loads;
    ``tokenizer_file`` (a SentencePiece .model, tokenizer.json or vocab.txt) is copied beside
    them (a .model as spiece.model), so the directory fine-tunes with its own tokenizer."""
    from flax import linen as nn

    problems = encoder_problems(cfg)
    if cfg.model_type != "albert":
        if cfg.embedding_size is not None:
            problems.append(f"embedding_size={cfg.embedding_size} (ALBERT's factorization)")
        if cfg.num_hidden_groups is not None:
            problems.append(f"num_hidden_groups={cfg.num_hidden_groups} (ALBERT's sharing)")
    if cfg.model_type == "bert" and cfg.position_offset:
        problems.append(f"position_offset={cfg.position_offset} (RoBERTa's)")
    check_exportable(cfg, FAMILY_NAMES[cfg.model_type], problems)
    params = nn.unbox(params)
    params = params.get("params", params)
    if "layers" in params["bert"]["encoder"]:
        params = unstack_layers(cfg, params)
    fam = cfg.model_type
    heads = set()
    if "pooler" in params["bert"]:
        heads.add("pooler")
    if "mlm_head" in params:
        heads.add("mlm")
    if "nsp_head" in params:
        heads.add("nsp")
    if "classifier" in params:
        heads.add("classifier")
        check_classifier_pooling(cfg, token_classification, "BERT")
        if fam == "roberta":
            if "pooler" not in heads:
                raise ValueError("to_hf: a RoBERTa classifier needs the pooler (classifier.dense)")
            heads.add("roberta_classifier")
    if fam == "roberta" and cfg.position_offset != cfg.pad_token_id + 1:
        raise ValueError(
            f"to_hf: RoBERTa needs position_offset == pad_token_id + 1, got "
            f"{cfg.position_offset} and {cfg.pad_token_id}"
        )
    tensors = {
        key: backward(np.asarray(get_path(params, source)))
        for key, (source, _, backward) in key_map(cfg, heads).items()
    }
    kind = "classifier" if "classifier" in heads else "mlm"
    if token_classification:
        arch = {
            "bert": "BertForTokenClassification",
            "roberta": "RobertaForTokenClassification",
            "albert": "AlbertForTokenClassification",
        }[fam]
    else:
        arch = _ARCHITECTURES.get((fam, kind, "nsp" in heads))
    if arch is None:
        raise ValueError(
            f"to_hf: no Hugging Face architecture for {fam} with heads {sorted(heads)}"
        )
    hf = dict(bert_keys(cfg), architectures=[arch], model_type=fam)
    if fam in ("roberta", "albert"):
        hf.update(bos_token_id=cfg.cls_token_id, eos_token_id=cfg.sep_token_id)
    if fam == "albert":
        hf.update(
            embedding_size=cfg.embedding_dim,
            num_hidden_groups=cfg.num_groups,
            inner_group_num=1,
            classifier_dropout_prob=cfg.classifier_dropout,
        )
    else:
        hf.update(classifier_dropout=cfg.classifier_dropout)
    num_labels = 0
    if "classifier" in params:
        num_labels = int(np.asarray(params["classifier"]["bias"]).shape[0])
    write_model_dir(path, tensors, hf, num_labels, tokenizer_file)
