"""The key tables of Hugging Face BERT, RoBERTa and ALBERT checkpoints: every HF key a config and
head set uses (`key_map`), with its place in bertjax's params and the transforms each way; the
heads a save holds; base-model saves' unprefixed keys; nested-dict paths. `hf`, `electra` and
`modernbert` build on these.
"""

from __future__ import annotations

from collections.abc import Callable

from bertjax.modeling.bert_config import BertConfig


def _linear(w):  # torch Linear [out, in] -> Dense kernel [in, out]
    return w.T


def _linear_back(k):
    return k.T


# A rule: HF key -> (path in our params, forward transform, backward transform).
Rule = tuple[tuple[str, ...], Callable, Callable]


def _identity(x):
    return x


def key_map(cfg: BertConfig, heads: set[str]) -> dict[str, Rule]:
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


def heads_in(keys: set[str], fam: str) -> set[str]:
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


def with_prefix(weights: dict, fam: str) -> tuple[dict, bool]:
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


def check_keys(path: str, model: str, expected, found, ignored: tuple = ()) -> None:
    """Raises naming the keys of the weights in ``path`` that its config.json's ``model`` reads
    and they lack, and those they hold that nothing reads (but ``ignored`` suffixes: buffers,
    tied copies)."""
    missing = sorted(set(expected) - set(found))
    unknown = sorted(k for k in set(found) - set(expected) if not k.endswith(ignored))
    if missing or unknown:

        def few(keys):
            return f"{keys[:20]}{' ...' if len(keys) > 20 else ''}"

        raise ValueError(
            f"weights in {path} do not match its config.json ({model}): missing keys "
            f"{few(missing)}; unexpected keys {few(unknown)}"
        )


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def get_path(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree
