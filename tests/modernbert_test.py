"""The ModernBERT shape against transformers' PyTorch ModernBERT (the reference): random models with
every parameter randomised, padded rows and a window narrower than the row convert and give the
same logits (<= 1e-5 of the largest at T <= 1024, <= 1e-4 at 8192); exports load in transformers
with no missing or unexpected keys; packed rows equal separate sequences; the sparse last layer
equals the full model; a ModernBERT directory fine-tunes with its own BPE tokenizer."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from helpers import jit_apply

import bertjax
from bertjax import convert, trainer
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer
from bertjax.modeling import attention as attention_lib
from bertjax.objectives.finetune import add_finetune_config
from bertjax.ops import blocked_attention

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4
SMALL = dict(  # every HF option that bertjax maps, set away from its default where it has one
    vocab_size=97,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=4,
    num_attention_heads=2,
    local_attention=16,
    global_attn_every_n_layers=3,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=3,
    cls_token_id=2,
    sep_token_id=3,
    norm_bias=True,
    attention_bias=True,
    mlp_bias=True,
    classifier_bias=True,
    classifier_activation="silu",
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 80000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
    },
)
CLASSES = {
    "mlm": transformers.ModernBertForMaskedLM,
    "base": transformers.ModernBertModel,
    "sequence": transformers.ModernBertForSequenceClassification,
    "token": transformers.ModernBertForTokenClassification,
}


def _randomize(model, seed):
    """Random values for every parameter (norm scales around 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def _save(kind, directory, seed=0, **changes):
    hf_cfg = transformers.ModernBertConfig(**{**SMALL, "num_labels": 3, **changes})
    model = _randomize(CLASSES[kind](hf_cfg), seed)
    model.save_pretrained(str(directory))
    return model


def _rows(length, seed=0, batch=2):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, SMALL["vocab_size"], (batch, length))
    mask = np.ones((batch, length), np.int64)
    mask[1, length * 2 // 3 :] = 0
    return np.where(mask > 0, ids, 0), mask


def _relative(ours, theirs, mask=None):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape
    if mask is not None:
        ours, theirs = ours[mask > 0], theirs[mask > 0]
    assert np.isfinite(ours).all()
    return np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs))


def _ours(kind, cfg, params, ids, mask):
    args = (jnp.asarray(ids),)
    kwargs = dict(attention_mask=jnp.asarray(mask), deterministic=True)
    with jax.default_matmul_precision("highest"):
        if kind == "mlm":
            model = bertjax.BertForPreTraining(cfg, next_sentence=False)
            return jit_apply(model, {"params": params}, *args, **kwargs)["mlm_logits"]
        if kind == "base":
            model = bertjax.BertModel(cfg, add_pooler=False)
            return jit_apply(model, {"params": params["bert"]}, *args, **kwargs)[0]
        model_cls = {
            "sequence": bertjax.BertForSequenceClassification,
            "token": bertjax.BertForTokenClassification,
        }[kind]
        return jit_apply(model_cls(cfg, num_labels=3), {"params": params}, *args, **kwargs)


def _theirs(model, kind, ids, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    return (out.last_hidden_state if kind == "base" else out.logits).numpy()


@pytest.mark.parametrize(
    "kind,pooling", [("mlm", "cls"), ("base", "cls"), ("sequence", "cls"), ("sequence", "mean"),
                     ("token", "cls")]
)  # fmt: skip
def test_every_save_converts_with_equal_outputs(kind, pooling, tmp_path):
    hf_model = _save(kind, tmp_path, seed=len(kind), classifier_pooling=pooling)
    cfg, params = convert.from_hf(str(tmp_path))
    assert cfg.model_type == "modernbert" and cfg.local_attention_window == 16
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.classifier_pooling) == (
        80000.0,
        5000.0,
        pooling,
    )
    ids, mask = _rows(40, seed=1)
    theirs = _theirs(hf_model, kind, ids, mask)
    rows = None if kind == "sequence" else mask
    assert _relative(_ours(kind, cfg, params, ids, mask), theirs, rows) <= 1e-5


@pytest.mark.parametrize("kind", ["mlm", "sequence"])
def test_an_export_loads_in_transformers_with_equal_outputs(kind, tmp_path):
    """from_hf -> to_hf -> transformers: no missing or unexpected keys, the same finite logits
    (ModernBERT users report all-NaN exports)."""
    hf_model = _save(kind, tmp_path / "hf", seed=3)
    cfg, params = convert.from_hf(str(tmp_path / "hf"))
    convert.to_hf(cfg, params, str(tmp_path / "out"))
    again, info = CLASSES[kind].from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask = _rows(40, seed=2)
    theirs, back = _theirs(hf_model, kind, ids, mask), _theirs(again.eval(), kind, ids, mask)
    assert np.isfinite(back).all()
    np.testing.assert_allclose(back, theirs, rtol=0, atol=1e-6 * np.abs(theirs).max())


def test_a_bertjax_model_exports_and_reads_back(tmp_path):
    """A model initialised here (the modernbert-tiny preset, MLM head) exports; transformers and
    from_hf read it; its config says what the preset says."""
    cfg = bertjax.BertConfig.preset(
        "modernbert-tiny", vocab_size=64, pad_token_id=0, unk_token_id=1, cls_token_id=2,
        sep_token_id=3, mask_token_id=4, num_hidden_layers=3, max_position_embeddings=64,
    )  # fmt: skip
    ids, mask = _rows(24, seed=3)
    ids = ids % 64
    model = bertjax.BertForPreTraining(cfg, next_sentence=False)
    params = jax.jit(model.init)(jax.random.key(0), jnp.asarray(ids))["params"]
    convert.to_hf(cfg, params, str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    hf_model, info = transformers.ModernBertForMaskedLM.from_pretrained(
        str(tmp_path), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    again, params_back = convert.from_hf(str(tmp_path))
    shape = ("num_hidden_layers", "hidden_size", "intermediate_size", "local_attention_window",
             "global_attn_every_n_layers", "rope_theta", "local_rope_theta", "mlp_type",
             "position_embedding_type", "first_attention_norm", "norm_bias", "attention_bias",
             "init_scheme", "hidden_dropout_prob", "classifier_pooling")  # fmt: skip
    assert {k: getattr(again, k) for k in shape} == {k: getattr(cfg, k) for k in shape}
    ours = _ours("mlm", again, params_back, ids, mask)
    assert _relative(ours, _theirs(hf_model.eval(), "mlm", ids, mask), mask) <= 1e-5


@pytest.mark.parametrize("length,bound", [(1024, 1e-5), (8192, 1e-4)])
def test_long_rows_match_transformers_through_the_blocked_paths(
    length, bound, tmp_path, monkeypatch
):
    """Two layers (global, local) at T = 1024 and 8192: the CPU takes banded local attention,
    and at 8192 blocked global attention too; the logits stay within the bound."""
    used = []
    for name in ("local_attention", "flash_attention"):
        original = getattr(blocked_attention, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            used.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(blocked_attention, name, spy)
    sizes = dict(num_hidden_layers=2, hidden_size=16, intermediate_size=16)
    hf_model = _save(
        "mlm", tmp_path, global_attn_every_n_layers=2, max_position_embeddings=length, **sizes
    )
    cfg, params = convert.from_hf(str(tmp_path))
    ids, mask = _rows(length, seed=4)
    ours = _ours("mlm", cfg, params, ids, mask)
    assert _relative(ours, _theirs(hf_model, "mlm", ids, mask), mask) <= bound
    assert "local_attention" in used
    assert ("flash_attention" in used) == (length >= attention_lib.FLASH_FROM)


@pytest.fixture(scope="module")
def tiny():
    cfg = bertjax.BertConfig.preset(
        "modernbert-tiny", vocab_size=64, pad_token_id=0, unk_token_id=1, cls_token_id=2,
        sep_token_id=3, mask_token_id=4, local_attention_window=8, global_attn_every_n_layers=2,
        num_hidden_layers=4, hidden_dropout_prob=0.0,
    )  # fmt: skip
    model = bertjax.BertForPreTraining(cfg, next_sentence=False)
    params = jax.jit(model.init)(jax.random.key(1), jnp.ones((1, 8), jnp.int32))["params"]
    return cfg, model, params


def test_packed_rows_equal_separate_sequences(tiny):
    """Two sequences packed in one row (segment ids; RoPE positions restart) give each one's
    logits alone."""
    cfg, model, params = tiny
    rng = np.random.default_rng(5)
    first, second = rng.integers(5, 64, 13), rng.integers(5, 64, 9)
    row = np.concatenate([first, second, np.zeros(2, int)])[None]
    segments = np.array([[1] * 13 + [2] * 9 + [0] * 2])
    packed = jit_apply(
        model, {"params": params}, jnp.asarray(row), segment_ids=jnp.asarray(segments)
    )
    for seq, where in ((first, slice(0, 13)), (second, slice(13, 22))):
        alone = jit_apply(model, {"params": params}, jnp.asarray(seq[None]))["mlm_logits"]
        np.testing.assert_allclose(packed["mlm_logits"][0, where], alone[0], atol=2e-5)


@pytest.mark.parametrize("layers", [4, 3])  # last layer local (index 3), global (index 2)
def test_sparse_last_layer_gives_the_full_models_logits(tiny, layers):
    """Rows gathered at the masked positions through a local (4 layers: layer 3) or a global
    (3 layers: layer 2) last layer: the logits of the full model there."""
    cfg, _, _ = tiny
    cfg = cfg.replace(num_hidden_layers=layers)
    assert bool(cfg.attention_window(layers - 1)) == (layers == 4)
    ids, mask = _rows(20, seed=6)
    ids = ids % 64
    where = jnp.asarray([[1, 5, 9, 17], [2, 3, 10, 12]])
    full = bertjax.BertForPreTraining(cfg, next_sentence=False)
    sparse = bertjax.BertForPreTraining(cfg, next_sentence=False, sparse_last_layer=True)
    params = jax.jit(full.init)(jax.random.key(2), jnp.asarray(ids))["params"]
    inputs = dict(attention_mask=jnp.asarray(mask), masked_positions=where)
    want = jit_apply(full, {"params": params}, jnp.asarray(ids), **inputs)["mlm_logits"]
    got = jit_apply(sparse, {"params": params}, jnp.asarray(ids), **inputs)["mlm_logits"]
    np.testing.assert_allclose(got, want, atol=2e-5 * float(jnp.abs(want).max()))


def test_impossible_shapes_are_named():
    with pytest.raises(ValueError, match="scan_layers=False"):
        bertjax.BertConfig.preset("modernbert-tiny", scan_layers=True)
    with pytest.raises(ValueError, match="no position table"):
        bertjax.BertConfig.preset("modernbert-tiny", position_embedding_init="fourier")
    with pytest.raises(ValueError, match="local_attention_window"):
        bertjax.BertConfig.preset("modernbert-tiny", local_attention_window=1)
    with pytest.raises(ValueError, match="pre_layer_norm"):
        bertjax.BertConfig.preset("tiny", first_attention_norm=False)


@pytest.fixture(scope="module")
def bpe_directory(tmp_path_factory):
    """A ModernBERT MLM directory with a byte-level BPE tokenizer.json of the built-in corpus
    (ModernBERT's special tokens), as save_pretrained writes both."""
    import tokenizers

    sentences = [s for _, d in corpus.iter_documents("builtin") for s in d][:3000]
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(sentences, vocab_size=300, special_tokens=SPECIALS)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok._tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    directory = tmp_path_factory.mktemp("modernbert_bpe")
    _save("mlm", directory, vocab_size=len(fast), num_hidden_layers=3)
    fast.save_pretrained(str(directory))
    return directory, fast


def test_a_modernbert_directory_fine_tunes_with_its_own_tokenizer(bpe_directory, tmp_path):
    directory, fast = bpe_directory
    cfg, _ = convert.from_hf(str(directory))
    assert (cfg.cls_token_id, cfg.sep_token_id, cfg.mask_token_id) == (2, 3, 4)
    config = add_finetune_config(trainer.default_run_config(), "classification", num_labels=4)
    config.init_from = str(directory)
    config.batch_size, config.num_train_steps, config.progress_bar = 8, 2, False
    config.data.max_seq_length = 24
    config.optim.warmup_steps, config.log_every, config.eval_every = 1, 1, 2
    config.eval_batches, config.checkpoint_every = 2, 0
    config.peak_flops_per_device = 1e12
    summary = trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert summary["step"] == 2 and 0.0 <= summary["eval/accuracy"] <= 1.0
    text = "Return the value of the socket."
    tokenizer = Tokenizer(str(directory / "tokenizer.json"))
    assert list(tokenizer.encode([text])[0]) == fast(text, add_special_tokens=False)["input_ids"]


def _full_megatron_std(module_type, init_std, num_layers):
    """Port of ModernBERT src/bert_layers/initialization.py init_weights, full_megatron branch:
    the std of an "in" module (FlexBertPredictionHead.dense, model.py:739) and of an "out" module
    (attention/MLP outputs, FlexBertPoolingHead.dense)."""
    return init_std if module_type == "in" else init_std / math.sqrt(2.0 * num_layers)


def test_prediction_head_init_is_the_training_code_s_and_hf_s_is_an_option():
    """init_scheme "modernbert": the MLM head's dense at std 0.02 (ModernBERT's training code),
    "modernbert_hf": at 0.02 / sqrt(2 L) (HF's _init_weights); the classifier head's transform
    and the residual outputs are "out" modules under both. Samples are truncated at +-2 std."""
    cut = 2.0  # init_cutoff_factor of the ModernBERT yamls
    pdf = math.exp(-cut * cut / 2) / math.sqrt(2 * math.pi)
    truncated = math.sqrt(1 - 2 * cut * pdf / math.erf(cut / math.sqrt(2)))  # std of N(0,1)|<2
    ids = jnp.ones((1, 8), jnp.int32)
    for scheme, head_type in (("modernbert", "in"), ("modernbert_hf", "out")):
        specials = dict(pad_token_id=0, unk_token_id=1, cls_token_id=2, sep_token_id=3)
        cfg = bertjax.BertConfig.preset(
            "modernbert-tiny", vocab_size=128, mask_token_id=4, init_scheme=scheme, **specials
        )
        layers = cfg.num_hidden_layers
        mlm_model = bertjax.BertForPreTraining(cfg, next_sentence=False)
        mlm = jax.jit(mlm_model.init)(jax.random.key(0), ids)
        classifier = bertjax.BertForSequenceClassification(cfg, num_labels=2)
        head = jax.jit(classifier.init)(jax.random.key(1), ids)
        kernels = {
            head_type: mlm["params"]["mlm_head"]["transform"]["kernel"],
            "out": head["params"]["head"]["transform"]["kernel"],
        }
        for module_type, kernel in kernels.items():
            values = np.asarray(jax.tree.leaves(kernel)[0], np.float64)
            want = _full_megatron_std(module_type, 0.02, layers)
            np.testing.assert_allclose(values.std(), want * truncated, rtol=0.04)
            assert np.abs(values).max() <= cut * want * (1 + 1e-6)
