"""Hugging Face ModernBERT directories both ways (``model_type: modernbert``: ModernBERT and the
Ettin encoders, which share its architecture; ``modernbert-decoder``: the Ettin decoders, the same
stack with causal attention, read as a ``causal`` BertConfig).

``from_hf(path)`` reads a ``ModernBertForMaskedLM`` (encoder + ``mlm_head``), a
``ModernBertForSequenceClassification`` / ``...ForTokenClassification`` (encoder + ``head`` +
``classifier``) or a ``ModernBertModel`` save (the encoder alone) into bertjax params;
``to_hf(cfg, params, path)`` writes one of those (an MLM model, or a classifier) with a
config.json transformers loads without missing or unexpected keys.

Layout: HF's fused ``Wqkv`` ([3D, D]: query, key, value rows) becomes the three [D, N, H]
kernels; ``mlp.Wi`` ([2F, D]: input rows then gate rows) the [D, 2F] ``intermediate`` kernel
whose halves `FeedForward` splits in that order; layer 0 has no ``attn_norm``. The decoder
(``ModernBertDecoderForCausalLM``) has separate ``q_proj``/``k_proj``/``v_proj``, its head under
``lm_head`` and the decoder tied to the word embeddings; its sliding window counts keys
differently (`hf_files.decoder_window`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from bertjax.interop import hf, hf_keys
from bertjax.interop.hf_files import read_config, read_weights, write_model_dir
from bertjax.modeling.bert_config import BertConfig

# The tied decoder weight (a copy of the word embeddings) when a save keeps it.
_IGNORED = ("decoder.weight",)
_ENCODER_PARTS = ("embeddings.", "layers.", "final_norm.")


def _mapping(cfg: BertConfig, heads: set[str]) -> dict:
    """Every HF key this config and head set uses, with its place in our params (hf_keys.Rule)."""
    n, h, width = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    rules: dict = {}

    def same(x):
        return np.asarray(x)

    def add_linear(prefix, path, bias):
        rules[f"{prefix}.weight"] = (path + ("kernel",), np.transpose, np.transpose)
        if bias:
            rules[f"{prefix}.bias"] = (path + ("bias",), same, same)

    def add_norm(prefix, path):
        rules[f"{prefix}.weight"] = (path + ("scale",), same, same)
        if cfg.norm_bias:
            rules[f"{prefix}.bias"] = (path + ("bias",), same, same)

    emb = ("bert", "embeddings")
    rules["model.embeddings.tok_embeddings.weight"] = (emb + ("word_embeddings",), same, same)
    add_norm("model.embeddings.norm", emb + ("layer_norm",))
    for i in range(cfg.num_hidden_layers):
        p, layer = f"model.layers.{i}", ("bert", "encoder", f"layer_{i}")
        attention = layer + ("attention",)
        for part, name in enumerate(("query", "key", "value")):
            if cfg.causal:  # the decoder's separate projections
                rules[f"{p}.attn.{name[0]}_proj.weight"] = (
                    attention + (f"{name}_kernel",),
                    lambda w: w.T.reshape(width, n, h),
                    lambda k: k.reshape(width, n * h).T,
                )
                if cfg.attention_bias:
                    rules[f"{p}.attn.{name[0]}_proj.bias"] = (
                        attention + (f"{name}_bias",),
                        lambda b: b.reshape(n, h),
                        lambda b: b.reshape(n * h),
                    )
                continue
            rows = slice(part * width, (part + 1) * width)
            rules[f"{p}.attn.Wqkv.weight#{name}"] = (
                attention + (f"{name}_kernel",),
                lambda w, rows=rows: w[rows].T.reshape(width, n, h),
                lambda k: k.reshape(width, n * h).T,
            )
            if cfg.attention_bias:
                rules[f"{p}.attn.Wqkv.bias#{name}"] = (
                    attention + (f"{name}_bias",),
                    lambda b, rows=rows: b[rows].reshape(n, h),
                    lambda b: b.reshape(n * h),
                )
        rules[f"{p}.attn.Wo.weight"] = (
            attention + ("output_kernel",),
            lambda w: w.T.reshape(n, h, width),
            lambda k: k.reshape(n * h, width).T,
        )
        if cfg.attention_bias:
            rules[f"{p}.attn.Wo.bias"] = (attention + ("output_bias",), same, same)
        if i > 0 or cfg.first_attention_norm:
            add_norm(f"{p}.attn_norm", layer + ("attention_norm",))
        add_norm(f"{p}.mlp_norm", layer + ("output_norm",))
        add_linear(f"{p}.mlp.Wi", layer + ("mlp", "intermediate"), cfg.mlp_bias)
        add_linear(f"{p}.mlp.Wo", layer + ("mlp", "output"), cfg.mlp_bias)
    add_norm("model.final_norm", ("bert", "encoder", "final_norm"))
    if "mlm" in heads:
        head = "lm_head" if cfg.causal else "head"
        add_linear(f"{head}.dense", ("mlm_head", "transform"), cfg.head_bias)
        add_norm(f"{head}.norm", ("mlm_head", "layer_norm"))
        if cfg.decoder_bias:
            rules["decoder.bias"] = (("mlm_head", "bias"), same, same)
    if "classifier" in heads:
        add_linear("head.dense", ("head", "transform"), cfg.head_bias)
        add_norm("head.norm", ("head", "layer_norm"))
        add_linear("classifier", ("classifier",), True)
    return rules


def _fused(rules: dict) -> dict[str, list[str]]:
    """HF key -> the rule keys that read parts of it (Wqkv's three parts)."""
    keys: dict[str, list[str]] = {}
    for rule in rules:
        keys.setdefault(rule.split("#")[0], []).append(rule)
    return keys


def _heads_in(keys: set[str]) -> set[str]:
    if "classifier.weight" in keys:
        return {"classifier"}
    if "head.dense.weight" in keys or "lm_head.dense.weight" in keys:
        return {"mlm"}
    return set()


def from_hf(path: str, **overrides: Any) -> tuple[BertConfig, dict]:
    """(BertConfig, params) of an HF ModernBERT directory (module docstring)."""
    if overrides.pop("scan_layers", False):
        raise ValueError("from_hf: a ModernBERT stack alternates layer kinds; it cannot be scanned")
    cfg = read_config(path, **overrides)
    weights = read_weights(path)
    if not any(k.startswith("model.") for k in weights):  # a ModernBertModel save
        weights = {
            ("model." + k if k.startswith(_ENCODER_PARTS) else k): v for k, v in weights.items()
        }
    keys = set(weights)
    heads = _heads_in(keys)
    if cfg.causal and "classifier" in heads:
        raise ValueError(
            f"{path}: a ModernBERT-decoder classifier is not supported; convert the "
            "ModernBertDecoderForCausalLM or ModernBertDecoderModel save"
        )
    logging.info(
        "from_hf(%r): ModernBERT%s, %s",
        path,
        " decoder" if cfg.causal else "",
        {"mlm": "MLM head", "classifier": "classifier"}.get(
            next(iter(heads), ""), "no heads (a base-model save)"
        ),
    )
    rules = _mapping(cfg, heads)
    fused = _fused(rules)
    hf_keys.check_keys(path, f"modernbert, {cfg.num_hidden_layers} layers", fused, keys, _IGNORED)
    params: dict = {}
    for rule, (target, forward, _) in rules.items():
        value = np.asarray(forward(weights[rule.split("#")[0]]), np.float32)
        hf_keys.set_path(params, target, value)
    table = params["bert"]["embeddings"]["word_embeddings"]
    if table.shape != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(
            f"{path}: word embeddings of shape {table.shape}, config.json implies "
            f"{(cfg.vocab_size, cfg.hidden_size)}"
        )
    return cfg, params


def hf_config(cfg: BertConfig, architecture: str) -> dict:
    """The config.json of a ModernBERT model (transformers' ModernBertConfig fields)."""
    layer_types = [
        "sliding_attention" if cfg.attention_window(i) else "full_attention"
        for i in range(cfg.num_hidden_layers)
    ]
    local_theta = cfg.local_rope_theta if cfg.local_rope_theta is not None else cfg.rope_theta
    window = cfg.local_attention_window or cfg.max_position_embeddings
    if cfg.causal and cfg.local_attention_window:
        window = cfg.local_attention_window + 2  # the inverse of hf_files.decoder_window
    config = dict(
        architectures=[architecture],
        model_type="modernbert-decoder" if cfg.causal else "modernbert",
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        hidden_activation=cfg.hidden_act,
        max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.initializer_range,
        initializer_cutoff_factor=2.0,
        norm_eps=cfg.layer_norm_eps,
        norm_bias=cfg.norm_bias,
        pad_token_id=cfg.pad_token_id,
        bos_token_id=cfg.cls_token_id,
        eos_token_id=cfg.sep_token_id,
        cls_token_id=cfg.cls_token_id,
        sep_token_id=cfg.sep_token_id,
        attention_bias=cfg.attention_bias,
        attention_dropout=cfg.hidden_dropout_prob,
        layer_types=layer_types,
        global_attn_every_n_layers=cfg.global_attn_every_n_layers,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local_theta},
        },
        local_attention=window,
        embedding_dropout=cfg.embedding_dropout,
        mlp_bias=cfg.mlp_bias,
        mlp_dropout=cfg.mlp_dropout,
        decoder_bias=cfg.decoder_bias,
        classifier_pooling="mean" if cfg.classifier_pooling == "mean" else "cls",
        classifier_dropout=cfg.classifier_dropout or 0.0,
        classifier_bias=cfg.head_bias,
        classifier_activation=cfg.head_activation,
        tie_word_embeddings=True,
    )
    return config


def check_exportable(cfg: BertConfig) -> None:
    """One error naming what Hugging Face's ModernBERT cannot express."""
    problems = []
    if not cfg.pre_layer_norm or cfg.position_embedding_type != "rope" or cfg.mlp_type != "glu":
        problems.append("a non-ModernBERT shape (it needs pre_layer_norm, RoPE and a GLU)")
    if cfg.type_vocab_size or cfg.num_experts or cfg.num_hidden_groups or cfg.embedding_size:
        problems.append("token types, MoE, shared layers or factorized embeddings")
    hf.check_exportable(cfg, "ModernBERT", problems)


def check_decoder_heads(cfg: BertConfig, heads: set[str]) -> None:
    """A causal config exports as ModernBertDecoderForCausalLM / ...Model only."""
    if cfg.causal and "classifier" in heads:
        raise ValueError(
            "to_hf: a causal (ModernBERT-decoder) classifier is not supported; export the LM "
            "(BertForPreTraining params) or the encoder"
        )


def to_hf(
    cfg: BertConfig,
    params: dict,
    path: str,
    *,
    token_classification: bool = False,
    tokenizer_file: str = "",
) -> None:
    """Writes an HF ModernBERT directory (config.json + model.safetensors) at ``path``;
    ``tokenizer_file`` (tokenizer.json, or a SentencePiece .model as spiece.model) beside them."""
    from flax import linen as nn

    check_exportable(cfg)
    if cfg.attention_probs_dropout_prob != cfg.hidden_dropout_prob:
        logging.warning(
            "to_hf(%r): HF ModernBERT has one attention_dropout (probabilities and output); it "
            "gets hidden_dropout_prob=%s (the attention-output dropout), not "
            "attention_probs_dropout_prob=%s",
            path,
            cfg.hidden_dropout_prob,
            cfg.attention_probs_dropout_prob,
        )
    params = nn.unbox(params)
    params = params.get("params", params)
    heads = {"classifier"} if "classifier" in params else {"mlm"} if "mlm_head" in params else set()
    check_decoder_heads(cfg, heads)
    if "classifier" in heads:
        hf.check_classifier_pooling(cfg, token_classification, "ModernBERT")
    tensors: dict[str, np.ndarray] = {}
    for rule, (source, _, backward) in _mapping(cfg, heads).items():
        key, _, part = rule.partition("#")
        value = np.asarray(backward(np.asarray(hf_keys.get_path(params, source))), np.float32)
        tensors[key] = np.concatenate([tensors[key], value]) if part and key in tensors else value
    num_labels = 0
    if "classifier" in heads:
        num_labels = int(np.asarray(params["classifier"]["bias"]).shape[0])
        kind = "TokenClassification" if token_classification else "SequenceClassification"
        architecture = f"ModernBertFor{kind}"
    elif cfg.causal:
        architecture = "ModernBertDecoderForCausalLM" if heads else "ModernBertDecoderModel"
    else:
        architecture = "ModernBertForMaskedLM" if heads else "ModernBertModel"
    if architecture in ("ModernBertModel", "ModernBertDecoderModel"):
        tensors = {k[len("model.") :]: v for k, v in tensors.items()}
    config = hf_config(cfg, architecture)
    write_model_dir(path, tensors, config, num_labels, tokenizer_file)
