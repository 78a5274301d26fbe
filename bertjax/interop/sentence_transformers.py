"""sentence-transformers directories both ways, read and written without sentence-transformers.

A directory holds ``modules.json`` (the module chain), the transformer (``config.json`` and
weights, at the module's path, usually the root), ``1_Pooling/config.json`` (the pooling modes)
and optionally a ``Normalize`` module; ``sentence_bert_config.json`` gives the maximum length.
`read_modules` reads the chain (Transformer -> Pooling [-> Normalize]; other modules, such as
Dense, stop with a message), `load` gives the encoder's BertConfig and params, `save` writes a
directory ``SentenceTransformer(path)`` loads (module type names of the ``sentence_transformers.
models`` namespace, which every release since 2.x reads; pooling keys in the legacy
``pooling_mode_*`` form, which the current release converts).
"""

from __future__ import annotations

import dataclasses
import json
import logging

from bertjax import convert, paths
from bertjax.interop import hf_files
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.embedder import check_pooling

# Legacy Pooling config keys and the modes they switch on.
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclasses.dataclass(frozen=True)
class SentenceModules:
    """What a sentence-transformers directory's module chain computes."""

    transformer_path: str  # the Hugging Face model's directory (the root when path is "")
    pooling: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None


def is_sentence_transformers_dir(path: str) -> bool:
    return paths.isfile(paths.join(path, "modules.json"))


def _read_json(path: str, what: str) -> dict | list:
    if not paths.isfile(path):
        raise FileNotFoundError(f"{path} not found: {what}")
    try:
        return json.loads(paths.read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def _pooling_modes(config: dict, where: str) -> tuple[str, ...]:
    mode = config.get("pooling_mode")
    if mode is None:  # the legacy form: one boolean per mode
        mode = tuple(name for key, name in _LEGACY_POOLING.items() if config.get(key))
    if config.get("include_prompt") is False:
        raise ValueError(f"{where}: include_prompt=false (prompt tokens left out) is not supported")
    return check_pooling(mode, f"{where} pooling_mode")


def read_modules(path: str) -> SentenceModules:
    """The module chain of a sentence-transformers directory (see the module docstring)."""
    modules = _read_json(paths.join(path, "modules.json"), "not a sentence-transformers directory")
    kinds = [(m.get("type", "").rsplit(".", 1)[-1], m.get("path", "")) for m in modules]
    names = [kind for kind, _ in kinds]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(
            f"{path}/modules.json chains {names}; bertjax reads Transformer -> Pooling "
            "[-> Normalize] (no Dense or other modules)"
        )
    transformer = paths.join(path, kinds[0][1]) if kinds[0][1] else path
    pooling_file = paths.join(path, kinds[1][1], "config.json")
    pooling = _pooling_modes(_read_json(pooling_file, "the Pooling module's config"), pooling_file)
    length = None
    for directory in (transformer, path):
        config_file = paths.join(directory, "sentence_bert_config.json")
        if paths.isfile(config_file):
            length = _read_json(config_file, "").get("max_seq_length", length)
            break
    tokenizer_config = paths.join(transformer, "tokenizer_config.json")
    if length is None and paths.isfile(
        tokenizer_config
    ):  # sentence-transformers >= 6 keeps it here
        limit = _read_json(tokenizer_config, "").get("model_max_length")
        length = int(limit) if isinstance(limit, (int, float)) and limit < 1_000_000 else None
    return SentenceModules(transformer, pooling, "Normalize" in names, length)


def load(path: str, **overrides) -> tuple[BertConfig, dict, SentenceModules]:
    """(BertConfig, params {"bert": encoder}, modules) of a sentence-transformers directory;
    ``overrides`` go to `bertjax.convert.from_hf` (e.g. dtype)."""
    modules = read_modules(path)
    cfg, params = convert.from_hf(modules.transformer_path, **overrides)
    bert = {k: v for k, v in params["bert"].items() if k != "pooler"}
    return cfg, {"bert": bert}, modules


def tokenizer_file(path: str) -> str:
    """The transformer's tokenizer file (tokenizer.json or vocab.txt) as a local path."""
    return hf_files.tokenizer_file(read_modules(path).transformer_path, path)


def save(
    cfg: BertConfig,
    params: dict,
    path: str,
    *,
    pooling: tuple[str, ...] = ("mean",),
    normalize: bool = True,
    tokenizer_file: str = "",
    lowercase: bool = True,
    max_seq_length: int = 512,
) -> None:
    """Writes a sentence-transformers directory at ``path``: the encoder (``params["bert"]``) as a
    Hugging Face base model at the root, a Pooling module and, with ``normalize``, a Normalize
    module. ``tokenizer_file`` (tokenizer.json or vocab.txt) goes beside the weights with a
    tokenizer_config.json, so ``SentenceTransformer(path)`` tokenizes as bertjax does: a vocab.txt
    lowercases (and strips accents) when ``lowercase`` (the tokenizer's own setting) says so."""
    pooling = check_pooling(pooling)
    if not tokenizer_file:
        logging.warning("sentence-transformers save %s: no tokenizer file given", path)
    elif tokenizer_file.endswith(".model"):
        raise ValueError(
            f"{tokenizer_file}: a SentencePiece model has no Hugging Face fast-tokenizer form "
            "here; train with a tokenizer.json or vocab.txt (config.data.hf_vocab) to export"
        )
    convert.to_hf(cfg, {"bert": params["bert"]}, path)
    if tokenizer_file:
        name = "tokenizer.json" if tokenizer_file.endswith(".json") else "vocab.txt"
        paths.upload(tokenizer_file, paths.join(path, name))
        special = dict(
            cls_token=_piece(tokenizer_file, cfg.cls_token_id),
            sep_token=_piece(tokenizer_file, cfg.sep_token_id),
            pad_token=_piece(tokenizer_file, cfg.pad_token_id),
            unk_token=_piece(tokenizer_file, cfg.unk_token_id),
            mask_token=_piece(tokenizer_file, cfg.mask_token_id),
        )
        tokenizer_config = dict(
            tokenizer_class="BertTokenizer" if name == "vocab.txt" else "PreTrainedTokenizerFast",
            model_max_length=max_seq_length,
            **special,
        )
        if name == "vocab.txt":  # a tokenizer.json's normalizer says for itself
            tokenizer_config["do_lower_case"] = bool(lowercase)
        _write_json(paths.join(path, "tokenizer_config.json"), tokenizer_config)
    write_modules(cfg, path, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length)


def write_modules(
    cfg: BertConfig,
    path: str,
    *,
    pooling: tuple[str, ...] = ("mean",),
    normalize: bool = True,
    max_seq_length: int = 512,
) -> None:
    """The sentence-transformers files of a directory whose root holds the transformer:
    modules.json, the Pooling module, the Normalize module (with ``normalize``) and
    sentence_bert_config.json."""
    pooling = check_pooling(pooling)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
        paths.makedirs(paths.join(path, "2_Normalize"))
        _write_json(paths.join(path, "2_Normalize", "config.json"), {})
    _write_json(paths.join(path, "modules.json"), modules)
    width = cfg.hidden_size
    pooling_config = {"word_embedding_dimension": width, "include_prompt": True}
    pooling_config.update({key: name in pooling for key, name in _LEGACY_POOLING.items()})
    paths.makedirs(paths.join(path, "1_Pooling"))
    _write_json(paths.join(path, "1_Pooling", "config.json"), pooling_config)
    _write_json(
        paths.join(path, "sentence_bert_config.json"),
        {"max_seq_length": max_seq_length, "do_lower_case": False},
    )


def _piece(tokenizer_file: str, token_id: int) -> str:
    """The vocabulary entry of ``token_id`` in a tokenizer.json or vocab.txt."""
    if tokenizer_file.endswith(".json"):
        import tokenizers

        return tokenizers.Tokenizer.from_file(tokenizer_file).id_to_token(token_id)
    with open(tokenizer_file, encoding="utf-8") as f:
        return f.read().splitlines()[token_id]


def _write_json(path: str, value) -> None:
    paths.write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")
