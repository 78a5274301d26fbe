"""Hugging Face ELECTRA directories both ways (``model_type: electra``).

``from_hf(path)`` reads an ``ElectraForPreTraining`` directory (the discriminator) into the
params of `bertjax.ElectraDiscriminator` (``bert`` + ``rtd_head``), an ``ElectraForMaskedLM``
directory (the generator) into those of `bertjax.ElectraGenerator` (``bert`` + ``mlm_head``), or
an ``ElectraForSequenceClassification`` directory into those of
`bertjax.BertForSequenceClassification` with classifier_pooling "electra_hf" (``bert`` +
``electra_head`` + ``classifier``: HF's ElectraClassificationHead), each with its own BertConfig
(``embedding_size`` set when the embeddings are projected).
``to_hf(cfg, params, path)`` writes one of those, or, for the params of a pretraining state
(`bertjax.modeling.electra.ElectraForPreTraining`: discriminator, generator and their shared
embeddings), both: ``path/discriminator`` and ``path/generator``, the generator's config read
off its parameter shapes. `bertjax.convert` dispatches here on the model type.

The encoder keys are BERT's under ``electra.``; ``electra.embeddings_project`` is the W -> D
projection (bertjax: ``bert/embeddings/projection``). Hugging Face's generator head applies GELU
whatever ``hidden_act`` says, so a generator converts only with ``hidden_act="gelu"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertjax import paths
from bertjax.interop import hf, hf_files, hf_keys
from bertjax.interop.hf_files import read_config, read_weights
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.electra import generator_config

KINDS = {
    "discriminator": "ElectraForPreTraining",
    "generator": "ElectraForMaskedLM",
    "classifier": "ElectraForSequenceClassification",
}
_HEAD_KEYS = {
    "discriminator": "discriminator_predictions.dense.weight",
    "generator": "generator_predictions.dense.weight",
    "classifier": "classifier.out_proj.weight",
}
# Buffers and the generator's decoder weight (tied to the word embeddings): not parameters here.
_IGNORED = ("position_ids", "token_type_ids", "generator_lm_head.weight")


def _linear(prefix: str, path: tuple) -> dict:
    return {
        f"{prefix}.weight": (path + ("kernel",), np.transpose, np.transpose),
        f"{prefix}.bias": (path + ("bias",), np.asarray, np.asarray),
    }


def _mapping(cfg: BertConfig, kind: str) -> dict:
    """Every HF key of an ELECTRA ``kind`` model, with its place in our params (hf_keys.Rule)."""
    bert_rules = hf_keys.key_map(cfg.replace(model_type="bert", embedding_size=None), set())
    rules = {"electra." + key[len("bert.") :]: rule for key, rule in bert_rules.items()}
    if cfg.embedding_dim != cfg.hidden_size:
        rules.update(_linear("electra.embeddings_project", ("bert", "embeddings", "projection")))
    if kind == "classifier":  # HF's ElectraClassificationHead: dense, GELU, out_proj
        rules.update(_linear("classifier.dense", ("electra_head",)))
        rules.update(_linear("classifier.out_proj", ("classifier",)))
    elif kind == "discriminator":
        rules.update(_linear("discriminator_predictions.dense", ("rtd_head", "dense")))
        rules.update(
            _linear("discriminator_predictions.dense_prediction", ("rtd_head", "prediction"))
        )
    else:
        rules.update(_linear("generator_predictions.dense", ("mlm_head", "transform")))
        rules["generator_predictions.LayerNorm.weight"] = (
            ("mlm_head", "layer_norm", "scale"),
            np.asarray,
            np.asarray,
        )
        rules["generator_predictions.LayerNorm.bias"] = (
            ("mlm_head", "layer_norm", "bias"),
            np.asarray,
            np.asarray,
        )
        rules["generator_lm_head.bias"] = (("mlm_head", "bias"), np.asarray, np.asarray)
    return rules


def _check_generator_activation(cfg: BertConfig, where: str) -> None:
    if cfg.hidden_act != "gelu":
        raise ValueError(
            f"{where}: an ELECTRA generator with hidden_act={cfg.hidden_act!r}: Hugging Face's "
            "generator head applies GELU whatever hidden_act says, bertjax's applies hidden_act; "
            "only hidden_act='gelu' converts exactly"
        )


def from_hf(path: str, **overrides: Any) -> tuple[BertConfig, dict]:
    """(BertConfig, params) of an HF ElectraForPreTraining or ElectraForMaskedLM directory."""
    scan = overrides.pop("scan_layers", False)
    cfg = read_config(path, **overrides)
    weights = read_weights(path)
    keys = set(weights)
    kinds = [kind for kind, key in _HEAD_KEYS.items() if key in keys]
    if len(kinds) != 1:
        raise ValueError(
            f"{path}: bertjax reads ELECTRA discriminators (ElectraForPreTraining, with "
            "discriminator_predictions.*), generators (ElectraForMaskedLM, with "
            "generator_predictions.*) and sequence classifiers (ElectraForSequenceClassification, "
            "with classifier.out_proj.*); this directory has none of those heads"
        )
    kind = kinds[0]
    if kind == "generator":
        _check_generator_activation(cfg, path)
    rules = _mapping(cfg, kind)
    model = f"ELECTRA {kind}, {cfg.num_hidden_layers} layers"
    hf_keys.check_keys(path, model, rules, keys, _IGNORED)
    params: dict = {}
    for key, (target, forward, _) in rules.items():
        hf_keys.set_path(params, target, np.asarray(forward(weights[key]), np.float32))
    table = params["bert"]["embeddings"]["word_embeddings"]
    if table.shape != (cfg.vocab_size, cfg.embedding_dim):
        raise ValueError(
            f"{path}: word embeddings of shape {table.shape}, config.json implies "
            f"{(cfg.vocab_size, cfg.embedding_dim)}"
        )
    if scan:
        cfg = cfg.replace(scan_layers=True)
        params = hf.stack_layers(cfg, params)
    return cfg, params


def split_pretraining_params(cfg: BertConfig, params: dict) -> dict:
    """{"discriminator": (cfg, params), "generator": (cfg, params)} of a pretraining state's
    params: the shared embeddings go to both; the generator's sizes come from its weights."""
    generator = params["generator"]
    encoder = generator["encoder"]
    if "layers" in encoder:  # scanned: the leading axis counts the layers
        layer = encoder["layers"]
        query = np.asarray(layer["attention"]["query_kernel"])[0]
        inner = np.asarray(layer["mlp"]["intermediate"]["kernel"])[0]
        layers = np.shape(layer["attention"]["query_kernel"])[0]
    else:
        layers = sum(name.startswith("layer_") for name in encoder)
        query = np.asarray(encoder["layer_0"]["attention"]["query_kernel"])
        inner = np.asarray(encoder["layer_0"]["mlp"]["intermediate"]["kernel"])
    width, heads, _ = query.shape
    generator_cfg = generator_config(cfg, 1.0, 1.0).replace(
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=inner.shape[1],
        num_hidden_layers=layers,
    )
    embeddings = {k: v for k, v in params["bert"]["embeddings"].items() if k != "projection"}
    if "embeddings_project" in generator:
        embeddings["projection"] = generator["embeddings_project"]
    return {
        "discriminator": (cfg, {"bert": params["bert"], "rtd_head": params["rtd_head"]}),
        "generator": (
            generator_cfg,
            {
                "bert": {"embeddings": embeddings, "encoder": encoder},
                "mlm_head": params["mlm_head"],
            },
        ),
    }


def to_hf(cfg: BertConfig, params: dict, path: str) -> None:
    """Writes an ELECTRA discriminator or generator directory at ``path``, or both
    (``path/discriminator``, ``path/generator``) for a pretraining state's params."""
    from flax import linen as nn

    problems = hf.encoder_problems(cfg)
    if cfg.num_hidden_groups is not None:
        problems.append(f"num_hidden_groups={cfg.num_hidden_groups} (shared layers)")
    if cfg.position_offset:
        problems.append(f"position_offset={cfg.position_offset}")
    hf.check_exportable(cfg, "ELECTRA", problems)
    params = nn.unbox(params)
    params = params.get("params", params)
    if "generator" in params:
        parts = split_pretraining_params(cfg, params)
        for kind, (part_cfg, part_params) in parts.items():
            _write(part_cfg, part_params, paths.join(path, kind), kind)
    elif "rtd_head" in params:
        _write(cfg, params, path, "discriminator")
    elif "mlm_head" in params:
        _write(cfg, params, path, "generator")
    elif "classifier" in params and "electra_head" in params:
        _write(cfg, params, path, "classifier")
    elif "classifier" in params:
        raise ValueError(
            f"to_hf: an ELECTRA classifier with classifier_pooling={cfg.classifier_pooling!r} has "
            "no Hugging Face equivalent (ElectraForSequenceClassification is HF's "
            "ElectraClassificationHead: first token, dense, GELU, out_proj); fine-tune with "
            "config.task.classifier_pooling='electra_hf' to export one"
        )
    else:
        raise ValueError(
            "to_hf: ELECTRA params need a discriminator head (rtd_head), a generator head "
            f"(mlm_head) or both models of a pretraining state; got {sorted(params)}"
        )


def _write(cfg: BertConfig, params: dict, path: str, kind: str) -> None:
    if kind == "generator":
        _check_generator_activation(cfg, f"to_hf({path!r})")
    if "layers" in params["bert"]["encoder"]:
        params = hf.unstack_layers(cfg, params)
    tensors = {
        key: backward(np.asarray(hf_keys.get_path(params, source)))
        for key, (source, _, backward) in _mapping(cfg, kind).items()
    }
    config = dict(
        hf_files.bert_keys(cfg),
        architectures=[KINDS[kind]],
        model_type="electra",
        embedding_size=cfg.embedding_dim,
        classifier_dropout=cfg.classifier_dropout,
        position_embedding_type="absolute",
    )
    num_labels = 0
    if kind == "classifier":
        num_labels = int(np.asarray(params["classifier"]["bias"]).shape[0])
    hf_files.write_model_dir(path, tensors, config, num_labels)
