"""Weights to and from Hugging Face BERT, RoBERTa and ALBERT directories.

``from_hf(path)`` reads ``config.json`` plus ``model.safetensors`` (sharded or not; no
torch needed) or ``pytorch_model.bin`` (``torch.load(weights_only=True)``), and returns
``(BertConfig, params)`` in the layout of `bertjax.modeling.heads` models: ``{"bert": ...}``
plus whichever heads the checkpoint has (``mlm_head``, ``nsp_head``, ``classifier``).
``to_hf(cfg, params, path)`` writes a directory ``transformers`` loads with
``from_pretrained``. Nothing is unpickled except through ``weights_only=True``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from bertjax import paths
from bertjax.interop.hf_files import read_config, read_weights
from bertjax.modeling.bert_config import BertConfig

# Keys HF keeps as buffers or tied copies of other weights: safe to ignore on load.
_IGNORED_SUFFIXES = ("position_ids", "decoder.weight", "decoder.bias")


def _linear(w):  # torch Linear [out, in] -> Dense kernel [in, out]
    return w.T


def _linear_back(k):
    return k.T


# A rule: HF key -> (path in our params, forward transform, backward transform).
Rule = tuple[tuple[str, ...], Callable, Callable]


def _identity(x):
    return x


def _mapping(cfg: BertConfig, heads: set[str]) -> dict[str, Rule]:
    """Every HF key this config and head set uses, with its place in our params."""
    n, h, width = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    fam = cfg.model_type
    base = {"bert": "bert", "roberta": "roberta", "albert": "albert"}[fam]
    emb = ("bert", "embeddings")
    rules: dict[str, Rule] = {
        f"{base}.embeddings.word_embeddings.weight": (
            emb + ("word_embeddings",),
            _identity,
            _identity,
        ),
        f"{base}.embeddings.position_embeddings.weight": (
            emb + ("position_embeddings",),
            _identity,
            _identity,
        ),
        f"{base}.embeddings.token_type_embeddings.weight": (
            emb + ("token_type_embeddings",),
            _identity,
            _identity,
        ),
        f"{base}.embeddings.LayerNorm.weight": (
            emb + ("layer_norm", "scale"),
            _identity,
            _identity,
        ),
        f"{base}.embeddings.LayerNorm.bias": (emb + ("layer_norm", "bias"), _identity, _identity),
    }

    def qkv(w):
        return w.T.reshape(width, n, h)

    def qkv_back(k):
        return k.reshape(width, n * h).T

    def out(w):
        return w.T.reshape(n, h, width)

    def out_back(k):
        return k.reshape(n * h, width).T

    def head_bias(b):
        return b.reshape(n, h)

    def head_bias_back(b):
        return b.reshape(n * h)

    def add_linear(prefix, path):
        rules[f"{prefix}.weight"] = (path + ("kernel",), _linear, _linear_back)
        rules[f"{prefix}.bias"] = (path + ("bias",), _identity, _identity)

    def add_norm(prefix, path):
        rules[f"{prefix}.weight"] = (path + ("scale",), _identity, _identity)
        rules[f"{prefix}.bias"] = (path + ("bias",), _identity, _identity)

    def add_attention(prefix, path, names):
        for name in ("query", "key", "value"):
            rules[f"{prefix}.{names[name]}.weight"] = (path + (f"{name}_kernel",), qkv, qkv_back)
            rules[f"{prefix}.{names[name]}.bias"] = (
                path + (f"{name}_bias",),
                head_bias,
                head_bias_back,
            )
        rules[f"{prefix}.{names['output']}.weight"] = (path + ("output_kernel",), out, out_back)
        rules[f"{prefix}.{names['output']}.bias"] = (path + ("output_bias",), _identity, _identity)

    if fam == "albert":
        add_linear("albert.encoder.embedding_hidden_mapping_in", emb + ("projection",))
        for g in range(cfg.num_groups):
            p = f"albert.encoder.albert_layer_groups.{g}.albert_layers.0"
            layer = ("bert", "encoder", f"layer_{g}")
            add_attention(
                f"{p}.attention",
                layer + ("attention",),
                dict(query="query", key="key", value="value", output="dense"),
            )
            add_norm(f"{p}.attention.LayerNorm", layer + ("attention_norm",))
            add_linear(f"{p}.ffn", layer + ("mlp", "intermediate"))
            add_linear(f"{p}.ffn_output", layer + ("mlp", "output"))
            add_norm(f"{p}.full_layer_layer_norm", layer + ("output_norm",))
    else:
        for i in range(cfg.num_hidden_layers):
            p = f"{base}.encoder.layer.{i}"
            layer = ("bert", "encoder", f"layer_{i}")
            add_attention(
                p,
                layer + ("attention",),
                dict(
                    query="attention.self.query",
                    key="attention.self.key",
                    value="attention.self.value",
                    output="attention.output.dense",
                ),
            )
            add_norm(f"{p}.attention.output.LayerNorm", layer + ("attention_norm",))
            add_linear(f"{p}.intermediate.dense", layer + ("mlp", "intermediate"))
            add_linear(f"{p}.output.dense", layer + ("mlp", "output"))
            add_norm(f"{p}.output.LayerNorm", layer + ("output_norm",))

    if "pooler" in heads:
        pooler = {
            "bert": "bert.pooler.dense",
            "roberta": "roberta.pooler.dense",
            "albert": "albert.pooler",
        }[fam]
        if fam == "roberta" and "roberta_classifier" in heads:
            pooler = "classifier.dense"  # RoBERTa's classification head: dense + tanh on <s>
        add_linear(pooler, ("bert", "pooler"))
    if "mlm" in heads:
        mlm = {
            "bert": (
                "cls.predictions.transform.dense",
                "cls.predictions.transform.LayerNorm",
                "cls.predictions.bias",
            ),
            "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
            "albert": ("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
        }[fam]
        add_linear(mlm[0], ("mlm_head", "transform"))
        add_norm(mlm[1], ("mlm_head", "layer_norm"))
        rules[mlm[2]] = (("mlm_head", "bias"), _identity, _identity)
    if "nsp" in heads:
        add_linear(
            "sop_classifier.classifier" if fam == "albert" else "cls.seq_relationship",
            ("nsp_head",),
        )
    if "classifier" in heads:  # RoBERTa's sequence head: classifier.dense (pooler) + out_proj
        classifier = "classifier.out_proj" if "roberta_classifier" in heads else "classifier"
        add_linear(classifier, ("classifier",))
    return rules


def _heads_in(keys: set[str], fam: str) -> set[str]:
    heads = set()
    if {"bert.pooler.dense.weight", "roberta.pooler.dense.weight", "albert.pooler.weight"} & keys:
        heads.add("pooler")
    if {"cls.predictions.bias", "lm_head.bias", "predictions.bias"} & keys:
        heads.add("mlm")
    if {"cls.seq_relationship.weight", "sop_classifier.classifier.weight"} & keys:
        heads.add("nsp")
    if "classifier.weight" in keys or "classifier.out_proj.weight" in keys:
        heads.add("classifier")
    if fam == "roberta" and "classifier.dense.weight" in keys:
        heads |= {"pooler", "roberta_classifier"}
    return heads


_ENCODER_PARTS = ("embeddings.", "encoder.", "pooler.")  # the key prefixes of a base-model save


def _with_prefix(weights: dict, fam: str) -> tuple[dict, bool]:
    """Keys of a base-model save (``BertModel``/``RobertaModel``/``AlbertModel``: no
    ``bert.``-style prefix) renamed as the task models name them; whether they were renamed."""
    base = f"{fam}."
    if any(k.startswith(base) for k in weights):
        return weights, False
    renamed = {(base + k if k.startswith(_ENCODER_PARTS) else k): v for k, v in weights.items()}
    return renamed, True


def describe_heads(heads: set[str]) -> str:
    """A line naming the heads a converted checkpoint has and lacks."""
    names = {
        "pooler": "pooler",
        "mlm": "MLM head",
        "nsp": "NSP/SOP head",
        "classifier": "classifier",
    }
    have = [names[h] for h in names if h in heads]
    lack = [names[h] for h in names if h not in heads]
    return f"heads present: {', '.join(have) or 'none'}; absent: {', '.join(lack) or 'none'}"


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


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
    weights, base_model = _with_prefix(read_weights(path), cfg.model_type)
    keys = set(weights)
    heads = _heads_in(keys, cfg.model_type)
    logging.info(
        "from_hf(%r): %s%s", path, "a base-model save; " * base_model, describe_heads(heads)
    )
    rules = _mapping(cfg, heads)
    missing = sorted(set(rules) - keys)
    unknown = sorted(k for k in keys - set(rules) if not k.endswith(_IGNORED_SUFFIXES))
    if missing or unknown:
        raise ValueError(
            f"weights in {path} do not match its config.json ({cfg.model_type}, "
            f"{cfg.num_hidden_layers} layers): missing keys {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}; unexpected keys {unknown[:20]}"
            f"{' ...' if len(unknown) > 20 else ''}"
        )
    params: dict = {}
    for key, (target, forward, _) in rules.items():
        value = np.asarray(forward(weights[key]), np.float32)
        _set(params, target, value)
    expected = {
        ("bert", "embeddings", "word_embeddings"): (cfg.vocab_size, cfg.embedding_dim),
        ("bert", "embeddings", "position_embeddings"): (
            cfg.max_position_embeddings,
            cfg.embedding_dim,
        ),
    }
    for target, shape in expected.items():
        if _get(params, target).shape != shape:
            raise ValueError(
                f"{path}: {'/'.join(target)} has shape {_get(params, target).shape}, "
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
    from safetensors.numpy import save_file

    if cfg.pre_layer_norm:
        raise ValueError("to_hf: pre_layer_norm=True has no Hugging Face BERT equivalent")
    if cfg.num_experts:
        raise ValueError(
            f"to_hf: num_experts={cfg.num_experts} (mixture-of-experts) has no "
            "Hugging Face BERT equivalent; convert a dense model (num_experts=0)"
        )
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
        if fam == "roberta":
            if "pooler" not in heads:
                raise ValueError("to_hf: a RoBERTa classifier needs the pooler (classifier.dense)")
            heads.add("roberta_classifier")
    if fam == "roberta" and cfg.position_offset != cfg.pad_token_id + 1:
        raise ValueError(
            f"to_hf: RoBERTa needs position_offset == pad_token_id + 1, got "
            f"{cfg.position_offset} and {cfg.pad_token_id}"
        )
    tensors = {}
    for key, (source, _, backward) in _mapping(cfg, heads).items():
        tensors[key] = np.ascontiguousarray(
            np.asarray(backward(np.asarray(_get(params, source))), np.float32)
        )
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
    hf = dict(
        architectures=[arch],
        model_type=fam,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
        max_position_embeddings=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        initializer_range=cfg.initializer_range,
        layer_norm_eps=cfg.layer_norm_eps,
        pad_token_id=cfg.pad_token_id,
        tie_word_embeddings=True,
    )
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
    if "classifier" in params:
        num_labels = int(np.asarray(params["classifier"]["bias"]).shape[0])
        hf.update(
            id2label={str(i): f"LABEL_{i}" for i in range(num_labels)},
            label2id={f"LABEL_{i}": i for i in range(num_labels)},
        )
    paths.makedirs(path)
    with tempfile.TemporaryDirectory() as tmp:  # safetensors writes a local file; then copy it
        local = os.path.join(tmp, "model.safetensors")
        save_file(tensors, local, metadata={"format": "pt"})
        paths.upload(local, paths.join(path, "model.safetensors"))
    paths.write_text(paths.join(path, "config.json"), json.dumps(hf, indent=2, sort_keys=True))
    if tokenizer_file:
        copy_tokenizer(tokenizer_file, path)


def copy_tokenizer(tokenizer_file: str, path: str) -> None:
    """Copies a tokenizer file into an HF directory (a SentencePiece .model as spiece.model)."""
    name = "spiece.model" if tokenizer_file.endswith(".model") else os.path.basename(tokenizer_file)
    paths.upload(tokenizer_file, paths.join(path, name))
