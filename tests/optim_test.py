"""Optimizer tests: schedules, batch-size scaling, weight-decay mask, layer-wise LR decay."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import bertjax
from bertjax.training import optim

LAYERS = 4


def _config(**changes):
    config = optim.default_optim_config()
    config.update(changes)
    return config


def _param_shapes(**overrides):
    """Abstract parameters of a tiny 4-layer pretraining model (no compilation)."""
    cfg = bertjax.BertConfig.preset(
        "tiny",
        vocab_size=64,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_hidden_layers=LAYERS,
        **overrides,
    )
    model = bertjax.BertForPreTraining(cfg)
    ids = jnp.zeros((1, 8), jnp.int32)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), ids, masked_positions=ids[:, :2])
    )
    return cfg, nn.unbox(variables["params"])


def _random_like(shapes, seed=0):
    leaves, treedef = jax.tree.flatten(shapes)
    rs = np.random.RandomState(seed)
    return treedef.unflatten([jnp.asarray(rs.randn(*s.shape), jnp.float32) for s in leaves])


def _path(path):
    return "/".join(k.key for k in path)


@pytest.mark.parametrize("name", ["linear", "cosine", "constant", "wsd"])
def test_schedule_matches_closed_form(name):
    peak, total, warmup, end = 2e-3, 1000, 100, 0.1
    config = _config(
        schedule=name,
        learning_rate=peak,
        total_steps=total,
        warmup_steps=warmup,
        end_lr_fraction=end,
        decay_fraction=0.2,
    )
    schedule = optim.make_schedule(config, global_batch_size=256)

    def expected(s):
        if s < warmup:
            return peak * s / warmup
        if name == "constant":
            return peak
        if name == "linear":
            return peak * (1 + (end - 1) * (s - warmup) / (total - warmup))
        if name == "cosine":
            p = (s - warmup) / (total - warmup)
            return peak * (end + (1 - end) * 0.5 * (1 + math.cos(math.pi * p)))
        decay_start = total - 200  # wsd: stable, then linear over the last 20%
        return peak * (1 + (end - 1) * max(0, s - decay_start) / 200)

    for s in [0, 1, 50, 99, 100, 101, 400, 799, 800, 900, 999, 1000, 1200]:
        np.testing.assert_allclose(
            float(schedule(s)),
            expected(min(s, total)),
            rtol=1e-5,
            atol=1e-12,
            err_msg=f"{name} at step {s}",
        )


def test_warmup_fraction_sets_warmup_steps():
    config = _config(schedule="constant", warmup_fraction=0.1, total_steps=500)
    assert optim.warmup_steps(config) == 50
    schedule = optim.make_schedule(config, 256)
    np.testing.assert_allclose(float(schedule(25)), 0.5e-4, rtol=1e-6)
    config.warmup_steps = 10  # explicit steps win over the fraction
    np.testing.assert_allclose(float(optim.make_schedule(config, 256)(5)), 0.5e-4, rtol=1e-6)


@pytest.mark.parametrize("rule,power", [("none", 0.0), ("linear", 1.0), ("sqrt", 0.5)])
def test_batch_size_scaling_rule(rule, power):
    config = _config(
        schedule="constant",
        warmup_fraction=0.0,
        lr_scaling=rule,
        base_batch_size=256,
        learning_rate=1e-4,
    )
    for batch in (64, 256, 1024):
        lr = float(optim.make_schedule(config, batch)(10))
        np.testing.assert_allclose(lr, 1e-4 * (batch / 256) ** power, rtol=1e-6)


@pytest.mark.parametrize(
    "key,value",
    [
        ("name", "sgd"),
        ("schedule", "step"),
        ("lr_scaling", "cube"),
        ("learning_rate", 0.0),
        ("warmup_fraction", 1.5),
        ("weight_decay", -1.0),
        ("b2", 1.0),
        ("clip_norm", -1.0),
        ("layerwise_lr_decay", 1.5),
        ("grad_accum_steps", 0),
        ("warmup_steps", 20_000),
        ("decay_fraction", 0.0),
    ],
)
def test_invalid_values_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"config.optim.{key}"):
        optim.validate_optim_config(_config(**{key: value}))


def test_unknown_key_is_rejected():
    config = _config()
    config.lr = 1.0
    with pytest.raises(ValueError, match="'lr'"):
        optim.validate_optim_config(config)


def test_weight_decay_skips_biases_and_layer_norms():
    _, shapes = _param_shapes()
    mask = {
        _path(p): m for p, m in jax.tree_util.tree_leaves_with_path(optim.weight_decay_mask(shapes))
    }
    assert mask["bert/embeddings/word_embeddings"]
    assert mask["bert/encoder/layer_0/attention/query_kernel"]
    assert mask["bert/encoder/layer_3/mlp/output/kernel"]
    for name in [
        "bert/embeddings/layer_norm/scale",
        "bert/embeddings/layer_norm/bias",
        "bert/encoder/layer_1/attention/query_bias",
        "bert/encoder/layer_1/attention_norm/scale",
        "bert/encoder/layer_1/output_norm/bias",
        "mlm_head/bias",
        "mlm_head/layer_norm/scale",
        "nsp_head/bias",
    ]:
        assert not mask[name], name
    # Behaviour: with zero gradients only decayed leaves move, by exactly -lr * wd * w.
    config = _config(schedule="constant", warmup_fraction=0.0, weight_decay=0.1, clip_norm=0.0)
    model_cfg, shapes = _param_shapes()
    params = _random_like(shapes)
    tx = optim.make_optimizer(config, model_cfg, 256).tx
    updates = jax.jit(lambda p: tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p)[0])(
        params
    )
    for path, update in jax.tree_util.tree_leaves_with_path(updates):
        param = params
        for k in path:
            param = param[k.key]
        want = -1e-4 * 0.1 * param if mask[_path(path)] else jnp.zeros_like(param)
        np.testing.assert_allclose(update, want, rtol=1e-5, atol=1e-12, err_msg=_path(path))


def _expected_factor(path_str, decay, groups):
    """Closed-form LLRD factor: decay^(L+1-depth), ALBERT groups at their deepest layer."""
    repeats = LAYERS // groups
    if "embeddings" in path_str:
        return decay ** (LAYERS + 1)
    if "/layers/" in path_str:
        depths = (np.arange(groups) + 1) * repeats
        return decay ** (LAYERS + 1 - depths)
    if "/encoder/layer_" in path_str:
        group = int(path_str.split("/encoder/layer_")[1].split("/")[0])
        return decay ** (LAYERS + 1 - (group + 1) * repeats)
    return 1.0


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("adamw", {}),
        ("adamw", {"scan_layers": True}),
        ("adamw", {"num_hidden_groups": 2}),
        ("lamb", {"num_hidden_groups": 2, "scan_layers": True}),
    ],
    ids=["loop", "scan", "albert", "albert_scan_lamb"],
)
def test_layerwise_lr_decay_scales_each_layer(name, overrides):
    decay = 0.5
    model_cfg, shapes = _param_shapes(**overrides)
    params, grads = _random_like(shapes, 0), _random_like(shapes, 1)
    base = _config(name=name, schedule="constant", warmup_fraction=0.0, weight_decay=0.01)
    updates = {}
    for llrd in (1.0, decay):
        base.layerwise_lr_decay = llrd
        tx = optim.make_optimizer(base, model_cfg, 256).tx
        updates[llrd] = jax.jit(lambda g, p, tx=tx: tx.update(g, tx.init(p), p)[0])(grads, params)
    groups = model_cfg.num_groups
    for (path, with_decay), without in zip(
        jax.tree_util.tree_leaves_with_path(updates[decay]), jax.tree.leaves(updates[1.0])
    ):
        factor = np.asarray(_expected_factor(_path(path), decay, groups), np.float32)
        if factor.ndim:  # stacked layers: one factor per slice of the leading axis
            factor = factor.reshape((-1,) + (1,) * (without.ndim - 1))
        np.testing.assert_allclose(
            with_decay, without * factor, rtol=1e-6, atol=1e-12, err_msg=_path(path)
        )


def test_layer_depths_cover_the_model():
    model_cfg, shapes = _param_shapes(num_hidden_groups=2, scan_layers=True, pre_layer_norm=True)
    depths = {
        _path(p): optim.layer_depth(p, model_cfg)
        for p, _ in jax.tree_util.tree_leaves_with_path(shapes)
    }
    assert depths["bert/embeddings/word_embeddings"] == 0
    np.testing.assert_array_equal(depths["bert/encoder/layers/mlp/intermediate/kernel"], [2, 4])
    assert depths["bert/encoder/final_norm/scale"] == LAYERS + 1
    assert depths["bert/pooler/kernel"] == depths["nsp_head/kernel"] == LAYERS + 1


@pytest.mark.parametrize("name", ["adamw", "lamb", "adafactor"])
def test_every_optimizer_reduces_a_quadratic(name):
    config = _config(
        name=name, schedule="constant", warmup_fraction=0.0, learning_rate=0.05, weight_decay=0.0
    )
    model_cfg, _ = _param_shapes()
    tx = optim.make_optimizer(config, model_cfg, 256).tx
    params = {"w": {"kernel": jnp.full((4, 4), 2.0)}}
    state = tx.init(params)
    loss = lambda p: jnp.sum(p["w"]["kernel"] ** 2)  # noqa: E731
    start = loss(params)
    for _ in range(5):
        updates, state = tx.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
    assert loss(params) < start
