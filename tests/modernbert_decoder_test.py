"""Ettin / ModernBERT decoders against transformers' PyTorch ModernBertDecoderForCausalLM: a
random tiny decoder (every parameter randomised, a sliding window narrower than the row, padded
rows) converts with logits within 1e-5 of the largest; a causal model initialised here exports,
loads in transformers with no missing or unexpected keys and gives the same logits."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

import bertjax
from bertjax import convert

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=4,
    num_attention_heads=2,
    local_attention=8,  # HF: 4 keys back, itself included; rows of 24 cross it
    global_attn_every_n_layers=3,
    max_position_embeddings=64,
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


def _rows(seed, length=24):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, SMALL["vocab_size"], (2, length))
    mask = np.ones((2, length), np.int64)
    mask[1, 17:] = 0
    return np.where(mask > 0, ids, 0), mask


def _ours(cfg, params, ids, mask):
    model = bertjax.BertForPreTraining(cfg, next_sentence=False)
    with jax.default_matmul_precision("highest"):
        out = model.apply({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    return np.asarray(out["mlm_logits"], np.float64)


def _theirs(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    return out.logits.numpy().astype(np.float64)


def _relative(ours, theirs, mask):
    ours, theirs = ours[mask > 0], theirs[mask > 0]
    assert np.isfinite(ours).all()
    return np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs))


def test_a_transformers_decoder_converts_with_equal_logits(tmp_path):
    hf_cfg = transformers.ModernBertDecoderConfig(**SMALL)
    hf_model = transformers.ModernBertDecoderForCausalLM(hf_cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=gen))
    hf_model.eval().save_pretrained(str(tmp_path))
    cfg, params = convert.from_hf(str(tmp_path))
    assert cfg.causal and cfg.model_type == "modernbert"
    assert (cfg.rope_theta, cfg.local_rope_theta) == (80000.0, 5000.0)
    assert [cfg.attention_window(i) for i in range(4)] == [0, 3, 3, 0]
    ids, mask = _rows(1)
    assert _relative(_ours(cfg, params, ids, mask), _theirs(hf_model, ids, mask), mask) <= 1e-5


def test_a_bertjax_decoder_exports_and_loads_in_transformers(tmp_path):
    cfg = bertjax.BertConfig.preset(
        "modernbert-tiny",
        vocab_size=97,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=4,
        num_attention_heads=2,
        local_attention_window=6,
        global_attn_every_n_layers=3,
        max_position_embeddings=64,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        unk_token_id=1,
        mask_token_id=4,
        causal=True,
    )
    model = bertjax.BertForPreTraining(cfg, next_sentence=False)
    params = nn.unbox(model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"])
    rng = np.random.default_rng(5)  # every parameter away from its init (biases, norm scales)
    params = jax.tree.map(lambda p: p + 0.1 * rng.standard_normal(p.shape).astype(p.dtype), params)
    convert.to_hf(cfg, params, str(tmp_path))
    loaded, info = transformers.ModernBertDecoderForCausalLM.from_pretrained(
        str(tmp_path), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.sliding_window == 4
    ids, mask = _rows(2)
    ours = _ours(cfg, params, ids, mask)
    assert _relative(ours, _theirs(loaded.eval(), ids, mask), mask) <= 1e-5
    again_cfg, again = convert.from_hf(str(tmp_path))
    assert again_cfg.causal and again_cfg.local_attention_window == 6
    jax.tree.map(np.testing.assert_array_equal, again, params)
