"""Parity with Hugging Face transformers' PyTorch BERT, RoBERTa and ALBERT, same weights.

Tolerance: 1e-5 max-abs in fp32 (jax matmul precision "highest", dropout off), on
batches with padding; only real (unpadded) positions are compared.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import linen as nn  # noqa: E402
from helpers import COMMON  # noqa: E402
from helpers import assert_close as _assert_close  # noqa: E402
from helpers import hf_batch as _batch  # noqa: E402
from helpers import hf_dir as _hf_dir  # noqa: E402
from helpers import randomize as _randomize  # noqa: E402

import bertjax  # noqa: E402
from bertjax import convert  # noqa: E402

FAMILIES = {
    "bert": (transformers.BertConfig, transformers.BertForPreTraining, {}, 0),
    "roberta": (
        transformers.RobertaConfig,
        transformers.RobertaForMaskedLM,
        dict(
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            max_position_embeddings=42,
            type_vocab_size=1,
        ),
        1,
    ),
    "albert": (
        transformers.AlbertConfig,
        transformers.AlbertForPreTraining,
        dict(embedding_size=16, num_hidden_groups=1, hidden_act="gelu_new"),
        0,
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pretraining_pair(request, tmp_path_factory):
    family = request.param
    config_cls, model_cls, extra, pad = FAMILIES[family]
    hf_model = _randomize(model_cls(config_cls(**{**COMMON, **extra})), seed=1)
    path = _hf_dir(tmp_path_factory, family, hf_model)
    cfg, params = convert.from_hf(path)
    return family, hf_model, cfg, params, pad, path


def _hf_pretraining_outputs(family, hf_model, ids, types, mask):
    with torch.no_grad():
        kwargs = dict(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            output_hidden_states=True,
        )
        if family != "roberta":
            kwargs["token_type_ids"] = torch.tensor(types)
        out = hf_model(**kwargs)
    logits = out.logits if family == "roberta" else out.prediction_logits
    nsp = {"bert": "seq_relationship_logits", "albert": "sop_logits"}.get(family)
    return (
        out.hidden_states[-1].numpy(),
        logits.numpy(),
        None if nsp is None else getattr(out, nsp).numpy(),
    )


def test_pretraining_parity(pretraining_pair):
    family, hf_model, cfg, params, pad, _ = pretraining_pair
    assert cfg.model_type == family
    ids, types, mask = _batch(pad, cfg.vocab_size)
    if family == "roberta":
        types = np.zeros_like(types)
    hidden, logits, nsp = _hf_pretraining_outputs(family, hf_model, ids, types, mask)
    model = bertjax.BertForPreTraining(cfg, next_sentence=nsp is not None)
    out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
    _assert_close(out["sequence_output"], hidden, mask, f"{family} last hidden state")
    _assert_close(out["mlm_logits"], logits, mask, f"{family} MLM logits")
    if nsp is not None:
        _assert_close(out["nsp_logits"], nsp, what=f"{family} NSP/SOP logits")
    # MLM at gathered positions equals the dense logits at those positions.
    positions = np.array([[0, 3, 1], [2, 5, 0], [4, 1, 2]], np.int32)
    sparse = model.apply(
        {"params": params},
        jnp.asarray(ids),
        jnp.asarray(types),
        jnp.asarray(mask),
        masked_positions=jnp.asarray(positions),
    )
    _assert_close(
        sparse["mlm_logits"],
        np.take_along_axis(logits, positions[..., None], 1),
        what=f"{family} MLM logits at masked positions",
    )


def test_round_trip_through_to_hf(pretraining_pair, tmp_path):
    family, hf_model, cfg, params, pad, _ = pretraining_pair
    convert.to_hf(cfg, params, str(tmp_path))
    reloaded, info = type(hf_model).from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    reloaded.eval()
    ids, types, mask = _batch(pad, cfg.vocab_size, seed=3)
    if family == "roberta":
        types = np.zeros_like(types)
    expected = _hf_pretraining_outputs(family, hf_model, ids, types, mask)
    got = _hf_pretraining_outputs(family, reloaded, ids, types, mask)
    for e, g in zip(expected, got):
        if e is not None:
            np.testing.assert_array_equal(e, g)


def test_bertjax_init_exports_to_hf(tmp_path):
    """Parameters born in bertjax (scanned layout) load into transformers with equal logits."""
    cfg = bertjax.BertConfig.preset(
        "tiny",
        vocab_size=64,
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=40,
        max_position_embeddings=24,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        scan_layers=True,
        unk_token_id=1,
    )
    model = bertjax.BertForPreTraining(cfg)
    ids, types, mask = _batch(0, cfg.vocab_size, seed=5, length=10)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.asarray(ids))["params"])
    convert.to_hf(cfg, params, str(tmp_path))
    hf_model = transformers.BertForPreTraining.from_pretrained(str(tmp_path)).eval()
    hidden, logits, nsp = _hf_pretraining_outputs("bert", hf_model, ids, types, mask)
    out = jax.jit(model.apply)(
        {"params": params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)
    )
    _assert_close(out["mlm_logits"], logits, mask, "exported MLM logits")
    _assert_close(out["nsp_logits"], nsp, what="exported NSP logits")
    # And back: from_hf(scan_layers=True) restores the same tree.
    cfg2, params2 = convert.from_hf(str(tmp_path), scan_layers=True)
    assert cfg2.scan_layers
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), params2)


CLASSIFIERS = {
    "bert": (transformers.BertConfig, transformers.BertForSequenceClassification, {}, 0),
    "roberta": (
        transformers.RobertaConfig,
        transformers.RobertaForSequenceClassification,
        FAMILIES["roberta"][2],
        1,
    ),
    "albert": (
        transformers.AlbertConfig,
        transformers.AlbertForSequenceClassification,
        FAMILIES["albert"][2],
        0,
    ),
}


@pytest.mark.parametrize("family", sorted(CLASSIFIERS))
def test_sequence_classification_parity(family, tmp_path_factory, tmp_path):
    config_cls, model_cls, extra, pad = CLASSIFIERS[family]
    hf_model = _randomize(model_cls(config_cls(**{**COMMON, **extra}, num_labels=3)), seed=2)
    cfg, params = convert.from_hf(_hf_dir(tmp_path_factory, f"{family}_cls", hf_model))
    ids, types, mask = _batch(pad, cfg.vocab_size, seed=1)
    if family == "roberta":
        types = np.zeros_like(types)
    with torch.no_grad():
        kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        if family != "roberta":
            kwargs["token_type_ids"] = torch.tensor(types)
        expected = hf_model(**kwargs).logits.numpy()
    model = bertjax.BertForSequenceClassification(cfg, num_labels=3)
    got = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
    _assert_close(got, expected, what=f"{family} classification logits")
    convert.to_hf(cfg, params, str(tmp_path))
    reloaded, info = model_cls.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        np.testing.assert_array_equal(reloaded.eval()(**kwargs).logits.numpy(), expected)


def test_token_classification_parity(tmp_path_factory):
    hf_model = _randomize(
        transformers.BertForTokenClassification(transformers.BertConfig(**COMMON, num_labels=5)),
        seed=4,
    )
    cfg, params = convert.from_hf(_hf_dir(tmp_path_factory, "bert_tok", hf_model))
    assert "pooler" not in params["bert"]
    ids, types, mask = _batch(0, cfg.vocab_size, seed=2)
    with torch.no_grad():
        expected = hf_model(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(types),
            attention_mask=torch.tensor(mask),
        ).logits.numpy()
    got = bertjax.BertForTokenClassification(cfg, num_labels=5).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)
    )
    _assert_close(got, expected, mask, "token classification logits")


@pytest.mark.parametrize(
    "preset, pooling, per_token",
    [("tiny", "first", False), ("tiny", "electra_hf", False), ("tiny", "mean", True),
     ("modernbert-tiny", "first", False), ("modernbert-tiny", "pooler", True)],
)  # fmt: skip
def test_a_classifier_pooled_unlike_its_hf_class_is_refused(preset, pooling, per_token, tmp_path):
    """BertForSequenceClassification runs BERT's pooler, ModernBERT's classes their head: a
    classifier fine-tuned with another pooling would export to a model with untrained weights
    in its path, so to_hf names the setting instead of writing it."""
    cfg = bertjax.BertConfig.preset(preset, classifier_pooling=pooling)
    model_cls = (
        bertjax.BertForTokenClassification if per_token else bertjax.BertForSequenceClassification
    )
    params = model_cls(cfg, num_labels=3).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    with pytest.raises(ValueError, match=f"classifier_pooling='{pooling}' has no Hugging Face"):
        convert.to_hf(cfg, params["params"], str(tmp_path), token_classification=per_token)
    assert not os.listdir(tmp_path)  # nothing half-written


@pytest.mark.parametrize(
    "fields, named",
    [
        (  # a RoPE BERT: HF BERT's positions are a learned table (was a bare KeyError)
            dict(position_embedding_type="rope"),
            ["Hugging Face BERT has no position_embedding_type='rope'", "model_type='modernbert'"],
        ),
        (  # every setting at once, not the first one found
            dict(mlp_type="glu", mlp_bias=False, local_attention_window=4, num_experts=2),
            ["mlp_type='glu'", "mlp_bias=False", "local_attention_window=4", "num_experts=2"],
        ),
        (dict(model_type="roberta", causal=True, position_offset=1), ["RoBERTa has no causal"]),
        (
            dict(model_type="electra", position_embedding_type="rope", pre_layer_norm=True),
            ["ELECTRA has no position_embedding_type='rope'", "pre_layer_norm=True"],
        ),
        (dict(embedding_size=64), ["BERT has no embedding_size=64 (ALBERT's factorization)"]),
    ],
    ids=["rope", "several", "causal-roberta", "electra", "factorized-bert"],
)
def test_a_model_hf_cannot_represent_is_refused_by_name(fields, named, tmp_path):
    """to_hf names every setting the Hugging Face family cannot run (the abstract params of the
    model: nothing is computed, nothing is written)."""
    cfg = bertjax.BertConfig.preset("tiny", **fields)
    model = bertjax.BertForPreTraining(cfg)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
    with pytest.raises(ValueError) as raised:
        convert.to_hf(cfg, params["params"], str(tmp_path / "out"))
    for text in named:
        assert text in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_special_tokens_come_from_the_vocabulary(pretraining_pair, tmp_path):
    family, _, cfg, params, _, path = pretraining_pair
    defaults = {"bert": (None, None), "roberta": (0, 2), "albert": (2, 3)}[family]
    assert (cfg.cls_token_id, cfg.sep_token_id) == defaults  # vocab 97 < BERT's 101/102
    words = [f"w{i}" for i in range(cfg.vocab_size)]
    words[7], words[8], words[9], words[10] = "[CLS]", "[SEP]", "[MASK]", "[UNK]"
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    try:
        cfg2, _ = convert.from_hf(path)
    finally:
        os.remove(os.path.join(path, "vocab.txt"))
    assert (cfg2.cls_token_id, cfg2.sep_token_id, cfg2.mask_token_id, cfg2.unk_token_id) == (
        7,
        8,
        9,
        10,
    )


def test_bad_checkpoint_directories(pretraining_pair, tmp_path):
    family, _, _, _, _, path = pretraining_pair
    with pytest.raises(FileNotFoundError, match="config.json"):
        convert.from_hf(str(tmp_path))
    # config.json whose layer count disagrees with the weights: missing keys are listed.
    bad = tmp_path / "bad"
    bad.mkdir()
    hf = json.load(open(os.path.join(path, "config.json")))
    json.dump(
        {**hf, "num_hidden_layers": hf["num_hidden_layers"] + 1}, open(bad / "config.json", "w")
    )
    os.symlink(os.path.join(path, "model.safetensors"), bad / "model.safetensors")
    if family == "albert":  # ALBERT shares one group, so add a group instead
        json.dump(
            {**hf, "num_hidden_groups": 3, "num_hidden_layers": 3}, open(bad / "config.json", "w")
        )
    with pytest.raises(ValueError, match="missing keys .*layer"):
        convert.from_hf(str(bad))
    # Weights file that is not safetensors.
    (bad / "model.safetensors").unlink()
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    json.dump(hf, open(bad / "config.json", "w"))
    with pytest.raises(ValueError, match="cannot read safetensors file .*model.safetensors"):
        convert.from_hf(str(bad))
    (bad / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights in"):
        convert.from_hf(str(bad))
    json.dump({**hf, "model_type": "gpt2"}, open(bad / "config.json", "w"))
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        convert.from_hf(str(bad))
    json.dump({**hf, "hidden_size": 30}, open(bad / "config.json", "w"))
    with pytest.raises(ValueError, match="hidden_size"):
        convert.from_hf(str(bad))
