"""ELECTRA and Hugging Face both ways: a discriminator (ElectraForPreTraining) and a generator
(ElectraForMaskedLM) read by `convert.from_hf` give transformers' logits (1e-5, fp32, every
parameter random, padded rows; compared at real positions), and a pretraining state written by
`convert.to_hf` loads into transformers as both models with no missing or unexpected keys and
the same logits."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close as _assert_close
from helpers import hf_batch as _batch
from helpers import hf_dir as _hf_dir
from helpers import randomize as _randomize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import linen as nn  # noqa: E402

import bertjax  # noqa: E402
from bertjax import convert  # noqa: E402
from bertjax.modeling.electra import ElectraForPreTraining, generator_config  # noqa: E402

COMMON = dict(
    vocab_size=97,
    embedding_size=24,  # != hidden size: both models project the embeddings
    num_hidden_layers=2,
    max_position_embeddings=40,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
DISCRIMINATOR = dict(COMMON, hidden_size=32, num_attention_heads=4, intermediate_size=48)
GENERATOR = dict(COMMON, hidden_size=16, num_attention_heads=2, intermediate_size=24)


def _hf_logits(model, ids, types, mask):
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(types),
            attention_mask=torch.tensor(mask),
        ).logits.numpy()


def _ours(module_cls, cfg, params, ids, types, mask):
    out = module_cls(cfg).apply(
        {"params": params},
        jnp.asarray(ids),
        token_type_ids=jnp.asarray(types),
        attention_mask=jnp.asarray(mask),
        deterministic=True,
    )
    return out["rtd_logits" if module_cls is bertjax.ElectraDiscriminator else "mlm_logits"]


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """Random HF discriminator and generator (every parameter, LayerNorms included) and dirs."""
    models = {
        "discriminator": transformers.ElectraForPreTraining(
            transformers.ElectraConfig(**DISCRIMINATOR)
        ),
        "generator": transformers.ElectraForMaskedLM(transformers.ElectraConfig(**GENERATOR)),
    }
    out = {}
    for seed, (kind, model) in enumerate(models.items()):
        model = _randomize(model, seed=seed + 11)
        out[kind] = (model, _hf_dir(tmp_path_factory, kind, model))
    return out


@pytest.mark.parametrize(
    "kind, module_cls",
    [("discriminator", bertjax.ElectraDiscriminator), ("generator", bertjax.ElectraGenerator)],
)
def test_from_hf_parity(hf_models, kind, module_cls):
    hf_model, path = hf_models[kind]
    cfg, params = convert.from_hf(path)
    assert cfg.model_type == "electra" and cfg.embedding_dim == 24
    assert (
        cfg.hidden_size == (DISCRIMINATOR if kind == "discriminator" else GENERATOR)["hidden_size"]
    )
    ids, types, mask = _batch(0, cfg.vocab_size)
    expected = _hf_logits(hf_model, ids, types, mask)
    _assert_close(_ours(module_cls, cfg, params, ids, types, mask), expected, mask, kind)


def test_pretraining_state_exports_both_models(tmp_path):
    """A pretraining state born in bertjax (scanned layers, shared embeddings, every parameter
    random) -> to_hf -> transformers loads both with no missing/unexpected keys and our logits;
    from_hf reads the written dirs back to the same arrays."""
    cfg = bertjax.BertConfig(
        **{k: v for k, v in DISCRIMINATOR.items() if k != "embedding_size"},
        embedding_size=24,
        model_type="electra",
        scan_layers=True,
    )
    gen_cfg = generator_config(cfg, 0.5)
    model = ElectraForPreTraining(cfg, gen_cfg)
    ids, types, mask = _batch(0, cfg.vocab_size, seed=3)
    one = jnp.ones((1, 1), jnp.int32)
    shapes = jax.eval_shape(
        model.init,
        {"params": jax.random.key(0), "sample": jax.random.key(1)},
        jnp.asarray(ids[:1]),
        masked_positions=one,
        masked_ids=one,
        masked_weights=one.astype(jnp.float32),
    )
    rng = np.random.default_rng(2)

    def random(path, leaf):  # every parameter random; LayerNorm scales around 1
        base = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
        return (base + 0.1 * rng.standard_normal(leaf.shape)).astype(np.float32)

    params = jax.tree_util.tree_map_with_path(random, nn.unbox(shapes["params"]))
    convert.to_hf(cfg, params, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["discriminator", "generator"]

    for kind, hf_cls, module_cls in (
        ("discriminator", transformers.ElectraForPreTraining, bertjax.ElectraDiscriminator),
        ("generator", transformers.ElectraForMaskedLM, bertjax.ElectraGenerator),
    ):
        path = str(tmp_path / kind)
        hf_model, info = hf_cls.from_pretrained(path, output_loading_info=True)
        assert not any(info.values()), (kind, info)
        expected = _hf_logits(hf_model.eval(), ids, types, mask)
        cfg_back, params_back = convert.from_hf(path, scan_layers=True)
        if kind == "discriminator":  # the state's own tree, as the pretraining model holds it
            ours = _ours(module_cls, cfg, params, ids, types, mask)
            jax.tree.map(
                np.testing.assert_array_equal,
                {"bert": params["bert"], "rtd_head": params["rtd_head"]},
                params_back,
            )
        else:
            assert (cfg_back.hidden_size, cfg_back.num_attention_heads) == (16, 2)
            assert cfg_back.intermediate_size == gen_cfg.intermediate_size
            np.testing.assert_array_equal(  # the shared word table
                params_back["bert"]["embeddings"]["word_embeddings"],
                params["bert"]["embeddings"]["word_embeddings"],
            )
            np.testing.assert_array_equal(
                params_back["bert"]["embeddings"]["projection"]["kernel"],
                params["generator"]["embeddings_project"]["kernel"],
            )
            ours = _ours(module_cls, cfg_back, params_back, ids, types, mask)
        _assert_close(ours, expected, mask, f"exported {kind}")


def test_bad_electra_input_is_named(hf_models, tmp_path):
    cfg, params = convert.from_hf(hf_models["generator"][1])
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        convert.to_hf(cfg.replace(hidden_act="relu"), params, str(tmp_path / "relu"))
    del params["mlm_head"]
    with pytest.raises(ValueError, match="rtd_head"):
        convert.to_hf(cfg, params, str(tmp_path / "headless"))
    with pytest.raises(ValueError, match="classifier_pooling='first' has no Hugging Face"):
        convert.to_hf(cfg, {**params, "classifier": {}}, str(tmp_path / "classifier"))
    with pytest.raises(ValueError, match="shared layers"):
        convert.to_hf(cfg.replace(num_hidden_groups=1), params, str(tmp_path / "shared"))
    # An ElectraModel save (no head) is refused with the kinds it could be.
    bare = transformers.ElectraModel(transformers.ElectraConfig(**GENERATOR))
    path = _hf_dir_plain(bare, tmp_path / "bare")
    with pytest.raises(ValueError, match="none of those heads"):
        convert.from_hf(path)


def _hf_dir_plain(model, path):
    model.save_pretrained(str(path))
    return str(path)


def _electra_classification_head(features, dense_w, dense_b, out_w, out_b):
    """Port of HF ElectraClassificationHead.forward in float64 (eval: dropout off): the first
    token, dense, exact GELU, out_proj."""
    from math import erf

    x = features[:, 0, :] @ dense_w.T + dense_b
    x = x * 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))
    return x @ out_w.T + out_b


def test_sequence_classifier_converts_both_ways(tmp_path_factory):
    """An HF ElectraForSequenceClassification reads as classifier_pooling "electra_hf" with
    transformers' logits (1e-5; the head also against a float64 port of ElectraClassificationHead
    on HF's own encoder output), and writes back loading with no missing or unexpected keys."""
    config = transformers.ElectraConfig(**DISCRIMINATOR, num_labels=3)
    hf_model = _randomize(transformers.ElectraForSequenceClassification(config), seed=21)
    path = _hf_dir(tmp_path_factory, "classifier", hf_model)
    cfg, params = convert.from_hf(path)
    assert cfg.classifier_pooling == "electra_hf" and set(params) == {
        "bert",
        "electra_head",
        "classifier",
    }
    ids, types, mask = _batch(0, 97)
    want = _hf_logits(hf_model, ids, types, mask)
    model = bertjax.BertForSequenceClassification(cfg, num_labels=3)
    apply = lambda p: model.apply(  # noqa: E731
        {"params": p}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)
    )
    _assert_close(apply(params), want, what="classifier logits")
    with torch.no_grad():
        features = hf_model.electra(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(types),
            attention_mask=torch.tensor(mask),
        ).last_hidden_state.double()
    head = {k: v.double().numpy() for k, v in hf_model.classifier.state_dict().items()}
    ported = _electra_classification_head(
        features.numpy(),
        head["dense.weight"],
        head["dense.bias"],
        head["out_proj.weight"],
        head["out_proj.bias"],
    )
    _assert_close(want, ported, what="HF head vs its port")
    out = str(tmp_path_factory.mktemp("classifier_out"))
    convert.to_hf(cfg, params, out)
    back, info = transformers.ElectraForSequenceClassification.from_pretrained(
        out, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _assert_close(_hf_logits(back.eval(), ids, types, mask), want, what="exported logits")
    first = cfg.replace(classifier_pooling="first")  # ELECTRA's own head: no HF equivalent
    with pytest.raises(ValueError, match="classifier_pooling='first'.*electra_hf"):
        convert.to_hf(first, {"bert": params["bert"], "classifier": params["classifier"]}, out)


def test_a_pretrained_discriminator_fine_tunes_with_electra_s_head(hf_models):
    """ELECTRA's fine-tuning head (google-research/electra classification_tasks.py: the first
    token's output, dropout, one dense to the labels): no pooler or extra layer that the
    pretrained discriminator lacks; the logits are that dense of the encoder's first token."""
    _, path = hf_models["discriminator"]
    cfg, params = convert.from_hf(path)
    assert cfg.classifier_pooling == "first"
    model = bertjax.BertForSequenceClassification(cfg, num_labels=2)
    ids, types, mask = _batch(0, 97)
    fresh = model.init(jax.random.key(0), jnp.asarray(ids))["params"]
    assert set(fresh) == {"bert", "classifier"} and "pooler" not in fresh["bert"]
    logits = model.apply(
        {"params": {**fresh, "bert": params["bert"]}},
        jnp.asarray(ids),
        jnp.asarray(types),
        jnp.asarray(mask),
    )
    sequence, _ = bertjax.BertModel(cfg, add_pooler=False).apply(
        {"params": params["bert"]}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)
    )
    kernel = np.asarray(nn.unbox(fresh["classifier"]["kernel"]), np.float64)
    want = np.asarray(sequence, np.float64)[:, 0] @ kernel
    _assert_close(logits, want + np.asarray(nn.unbox(fresh["classifier"]["bias"])))
