"""What a Hugging Face model directory holds, read without transformers: config.json as a
BertConfig (special-token ids from its vocabulary), its tokenizer file, its weight tensors; and
writing one (`write_model_dir`). The config.json keys BERT's encoder shares with BertConfig
(`BERT_KEYS`) are read and written from one table."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from bertjax import paths
from bertjax.modeling.bert_config import BertConfig

# In the order they are preferred; spiece.model is a SentencePiece model (as ALBERT ships).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spiece.model")
# The config.json keys of BERT's encoder (BERT, RoBERTa, ALBERT, ELECTRA) that are BertConfig
# fields of the same name, with transformers' defaults (None: required).
BERT_KEYS = {
    "vocab_size": None,
    "hidden_size": None,
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "intermediate_size": None,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
}
FAMILY_NAMES = {"bert": "BERT", "roberta": "RoBERTa", "albert": "ALBERT", "electra": "ELECTRA"}


def is_hf_dir(path: str) -> bool:
    """Whether ``path`` (a directory or a URL) is a Hugging Face model dir: it has config.json."""
    return paths.isfile(paths.join(path, "config.json"))


def read_config(path: str, **overrides: Any) -> BertConfig:
    """The BertConfig of an HF directory's config.json (no weights are read)."""
    config_file = paths.join(path, "config.json")
    if not paths.isfile(config_file):
        raise FileNotFoundError(
            f"{config_file} not found: a Hugging Face model directory has config.json and "
            "model.safetensors"
        )
    return config_from_hf(json.loads(paths.read_text(config_file)), path, **overrides)


def tokenizer_file(path: str, key: str) -> str:
    """The directory's tokenizer.json or vocab.txt; ``key`` names the setting in the error."""
    for name in TOKENIZER_FILES:
        if paths.isfile(paths.join(path, name)):
            return paths.local_copy(paths.join(path, name))
    raise FileNotFoundError(f"{key}={path!r} has no {' or '.join(TOKENIZER_FILES)}")


def read_weights(path: str) -> dict[str, np.ndarray]:
    """All tensors of an HF directory (local or a URL) as float32 numpy arrays."""
    single = paths.join(path, "model.safetensors")
    index = paths.join(path, "model.safetensors.index.json")
    torch_bin = paths.join(path, "pytorch_model.bin")
    if paths.isfile(single) or paths.isfile(index):
        from safetensors import safe_open

        names = (
            ["model.safetensors"]
            if paths.isfile(single)
            else sorted(set(json.loads(paths.read_text(index))["weight_map"].values()))
        )
        weights = {}
        for name in names:
            file = paths.local_copy(paths.join(path, name))
            try:
                with safe_open(file, framework="np") as reader:
                    for key in reader.keys():
                        weights[key] = np.asarray(reader.get_tensor(key), np.float32)
            except Exception as error:  # corrupt header, truncated file, ...
                raise ValueError(f"cannot read safetensors file {file}: {error}") from error
        return weights
    if paths.isfile(torch_bin):
        try:
            import torch
        except ImportError as error:
            raise ValueError(
                f"{torch_bin} needs torch to read; install torch or save the "
                "model with safetensors (save_pretrained does by default)"
            ) from error
        state = torch.load(paths.local_copy(torch_bin), map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise FileNotFoundError(
        f"no weights in {path}: expected model.safetensors, model.safetensors.index.json "
        "or pytorch_model.bin"
    )


_SPECIAL_TOKENS = {  # field -> token strings used by each family's vocabularies
    "unk_token_id": ("[UNK]", "<unk>"),
    "cls_token_id": ("[CLS]", "<s>"),
    "sep_token_id": ("[SEP]", "</s>"),
    "mask_token_id": ("[MASK]", "<mask>"),
}
_FAMILY_DEFAULTS = {  # the ids of the reference vocabularies when no tokenizer file is present
    "bert": dict(unk_token_id=100, cls_token_id=101, sep_token_id=102, mask_token_id=103),
    "roberta": dict(cls_token_id=0, sep_token_id=2, unk_token_id=3, mask_token_id=50264),
    "albert": dict(unk_token_id=1, cls_token_id=2, sep_token_id=3, mask_token_id=4),
    "modernbert": dict(
        unk_token_id=50280, cls_token_id=50281, sep_token_id=50282, mask_token_id=50284
    ),
}


def _vocab_of(path: str) -> dict[str, int]:
    """token -> id from a directory's vocab.txt, tokenizer.json or spiece.model, if it has one."""
    vocab_txt = paths.join(path, "vocab.txt")
    if paths.isfile(vocab_txt):
        lines = paths.read_text(vocab_txt).split("\n")  # only "\n" ends a token's line
        if lines and lines[-1] == "":
            lines.pop()
        return {line: i for i, line in enumerate(lines)}
    tokenizer_json = paths.join(path, "tokenizer.json")
    if paths.isfile(tokenizer_json):
        data = json.loads(paths.read_text(tokenizer_json))
        vocab = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
        model_vocab = data.get("model", {}).get("vocab", {})
        if isinstance(model_vocab, dict):
            vocab = {**model_vocab, **vocab}
        elif isinstance(model_vocab, list):  # unigram: [[piece, score], ...]
            vocab = {**{piece: i for i, (piece, _) in enumerate(model_vocab)}, **vocab}
        return vocab
    spiece = paths.join(path, "spiece.model")
    if paths.isfile(spiece):
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_proto=paths.Path(spiece).read_bytes())
        return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    return {}


def special_token_ids(path: str, family: str, hf: dict) -> dict:
    """Special-token ids: the directory's vocabulary, then config.json, then family defaults."""
    vocab_size = hf["vocab_size"]
    ids = {"pad_token_id": hf.get("pad_token_id", 1 if family == "roberta" else 0)}
    vocab = _vocab_of(path)
    for field, names in _SPECIAL_TOKENS.items():
        found = [vocab[n] for n in names if n in vocab]
        if found:
            ids[field] = found[0]
        elif field == "cls_token_id" and hf.get("bos_token_id") is not None:
            ids[field] = hf["bos_token_id"]
        elif field == "sep_token_id" and hf.get("eos_token_id") is not None:
            ids[field] = hf["eos_token_id"]
        else:
            default = _FAMILY_DEFAULTS[family][field]
            ids[field] = default if default < vocab_size else None
    return ids


def config_from_hf(hf: dict, path: str, **overrides: Any) -> BertConfig:
    fam = hf.get("model_type")
    if fam == "electra":
        return _electra_config(hf, path, **overrides)
    if fam in ("modernbert", "modernbert-decoder"):
        return _modernbert_config(hf, path, **overrides)
    if fam not in ("bert", "roberta", "albert"):
        raise ValueError(
            f"{path}/config.json has model_type {fam!r}; bertjax converts "
            "'bert', 'roberta', 'albert', 'electra', 'modernbert' and 'modernbert-decoder'"
        )
    if fam == "albert" and hf.get("inner_group_num", 1) != 1:
        raise ValueError(
            f"{path}/config.json: ALBERT inner_group_num={hf['inner_group_num']} "
            "is not supported (only 1, as in every released ALBERT)"
        )
    pad = hf.get("pad_token_id", 1 if fam == "roberta" else 0)
    fields = dict(
        _bert_encoder(hf, path, fam),
        model_type=fam,
        position_offset=pad + 1 if fam == "roberta" else 0,
        classifier_dropout=hf.get(
            "classifier_dropout_prob" if fam == "albert" else "classifier_dropout"
        ),
        **special_token_ids(path, fam, hf),
    )
    if fam == "albert":
        fields.update(
            embedding_size=hf.get("embedding_size", 128),
            num_hidden_groups=hf.get("num_hidden_groups", 1),
        )
    return _valid(fields, path, overrides)


def _bert_encoder(hf: dict, path: str, family: str) -> dict:
    """The `BERT_KEYS` fields of a BERT-encoder config.json (learned absolute positions only)."""
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        name = FAMILY_NAMES[family]
        raise ValueError(
            f"{path}/config.json: {name} position_embedding_type={position_type!r} is not "
            f"supported (only 'absolute', as in every released {name})"
        )
    return {k: hf[k] if default is None else hf.get(k, default) for k, default in BERT_KEYS.items()}


def bert_keys(cfg: BertConfig) -> dict:
    """The config.json entries of ``cfg``'s BERT encoder: `BERT_KEYS`, the padding id, and the
    MLM decoder tied to the word embeddings."""
    keys = {k: getattr(cfg, k) for k in BERT_KEYS}
    return dict(keys, pad_token_id=cfg.pad_token_id, tie_word_embeddings=True)


def _valid(fields: dict, path: str, overrides: dict) -> BertConfig:
    """BertConfig(**fields, **overrides), or an error naming the config.json."""
    fields.update(overrides)
    try:
        return BertConfig.from_dict(fields)
    except ValueError as error:
        raise ValueError(f"{path}/config.json does not describe a valid model: {error}") from error


def write_model_dir(
    path: str, tensors: dict, config: dict, num_labels: int = 0, tokenizer_file: str = ""
) -> None:
    """An HF model directory at ``path`` (local or a URL): model.safetensors (float32),
    config.json (with LABEL_i names for a classifier of ``num_labels``), and ``tokenizer_file``
    copied beside them (a SentencePiece .model as spiece.model)."""
    from safetensors.numpy import save_file

    if num_labels:
        config = dict(
            config,
            id2label={str(i): f"LABEL_{i}" for i in range(num_labels)},
            label2id={f"LABEL_{i}": i for i in range(num_labels)},
        )
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    paths.makedirs(path)
    with tempfile.TemporaryDirectory() as tmp:  # safetensors writes a local file; then copy it
        local = os.path.join(tmp, "model.safetensors")
        save_file(tensors, local, metadata={"format": "pt"})
        paths.upload(local, paths.join(path, "model.safetensors"))
    paths.write_text(paths.join(path, "config.json"), json.dumps(config, indent=2, sort_keys=True))
    if tokenizer_file:
        name = os.path.basename(tokenizer_file)
        paths.upload(
            tokenizer_file, paths.join(path, "spiece.model" if name.endswith(".model") else name)
        )


def _electra_classifier(hf: dict) -> bool:
    """Whether an ELECTRA config.json is a sequence classifier (HF ElectraClassificationHead)."""
    return "ElectraForSequenceClassification" in (hf.get("architectures") or ())


def _electra_config(hf: dict, path: str, **overrides: Any) -> BertConfig:
    """An ELECTRA discriminator's or generator's config.json (BERT's vocabulary and encoder;
    embeddings of width ``embedding_size``, projected when it differs from the hidden size)."""
    embedding = hf.get("embedding_size", 128)
    fields = dict(
        _bert_encoder(hf, path, "electra"),
        model_type="electra",
        embedding_size=None if embedding == hf["hidden_size"] else embedding,
        classifier_dropout=hf.get("classifier_dropout"),
        # a fine-tuned ElectraForSequenceClassification has HF's head; a pretrained model
        # fine-tunes with ELECTRA's own (google-research/electra: first token -> classifier)
        classifier_pooling="electra_hf" if _electra_classifier(hf) else "first",
        **special_token_ids(path, "bert", hf),
    )
    return _valid(fields, path, overrides)


def _modernbert_layout(hf: dict, path: str) -> tuple[int, int]:
    """(local_attention_window, global_attn_every_n_layers) of a ModernBERT config.json, from
    its ``layer_types`` when saved (transformers 5) or ``global_attn_every_n_layers``."""
    layers, window = hf["num_hidden_layers"], hf.get("local_attention", 128)
    types = hf.get("layer_types")
    if types is None:
        return window, hf.get("global_attn_every_n_layers", 3)
    local = [t == "sliding_attention" for t in types]
    if not any(local):
        return 0, 1
    globals_ = [i for i, is_local in enumerate(local) if not is_local]
    every = globals_[1] - globals_[0] if len(globals_) > 1 else layers
    if local != [bool(i % every) for i in range(layers)]:
        raise ValueError(
            f"{path}/config.json: layer_types {types} is not 'every n-th layer global from "
            "layer 0'; bertjax builds that pattern only"
        )
    return window, every


def _rope_thetas(hf: dict, path: str) -> tuple[float, float]:
    """(global, local) RoPE bases from ``rope_parameters`` (transformers 5) or the older
    ``global_rope_theta`` / ``local_rope_theta`` keys."""
    params = hf.get("rope_parameters") or {}
    thetas = []
    for kind, old_key, default in (
        ("full_attention", "global_rope_theta", 160000.0),
        ("sliding_attention", "local_rope_theta", 10000.0),
    ):
        entry = params.get(kind) or {}
        if entry.get("rope_type", "default") != "default":
            raise ValueError(
                f"{path}/config.json: RoPE type {entry['rope_type']!r} for {kind} layers is not "
                "supported (only 'default')"
            )
        thetas.append(float(entry.get("rope_theta", hf.get(old_key, default))))
    return thetas[0], thetas[1]


def decoder_window(local_attention: int) -> int:
    """bertjax's local_attention_window for HF ModernBERT-decoder's ``local_attention``: HF's
    causal sliding window keeps keys q - k < local_attention // 2, bertjax's q - k <= window // 2
    (inverse: window + 2)."""
    return local_attention - 2


def _modernbert_config(hf: dict, path: str, **overrides: Any) -> BertConfig:
    """A ModernBERT (or Ettin) config.json: RoPE, GLU, pre-LN without biases, alternating
    local/global attention; ``modernbert-decoder`` (Ettin decoders) the same stack, causal. HF's
    three dropouts map to bertjax's places: attention_dropout to the attention probabilities and
    output, embedding_dropout and mlp_dropout to theirs."""
    window, every = _modernbert_layout(hf, path)
    decoder = hf.get("model_type") == "modernbert-decoder"
    if decoder and window:  # HF's decoder sees local_attention // 2 keys, itself included
        if window <= 2:
            raise ValueError(f"{path}/config.json: local_attention={window} must be > 2")
        window = decoder_window(window)
    global_theta, local_theta = _rope_thetas(hf, path)
    attention_dropout = float(hf.get("attention_dropout", 0.0))
    ids = special_token_ids(path, "modernbert", {"pad_token_id": 50283, **hf})
    fields = dict(
        model_type="modernbert",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_activation", "gelu"),
        hidden_dropout_prob=attention_dropout,
        attention_probs_dropout_prob=attention_dropout,
        embedding_dropout_prob=float(hf.get("embedding_dropout", 0.0)),
        mlp_dropout_prob=float(hf.get("mlp_dropout", 0.0)),
        max_position_embeddings=hf.get("max_position_embeddings", 8192),
        type_vocab_size=0,
        initializer_range=hf.get("initializer_range", 0.02),
        init_scheme="modernbert",
        layer_norm_eps=hf.get("norm_eps", 1e-5),
        pre_layer_norm=True,
        first_attention_norm=False,
        position_embedding_type="rope",
        rope_theta=global_theta,
        local_rope_theta=local_theta,
        local_attention_window=window,
        global_attn_every_n_layers=every,
        mlp_type="glu",
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        norm_bias=bool(hf.get("norm_bias", False)),
        head_bias=bool(hf.get("classifier_bias", False)),
        decoder_bias=bool(hf.get("decoder_bias", True)),
        head_act=hf.get("classifier_activation", "gelu"),
        classifier_pooling=hf.get("classifier_pooling", "cls"),
        classifier_dropout=float(hf.get("classifier_dropout", 0.0)),
        causal=decoder,
        **ids,
    )
    return _valid(fields, path, overrides)
