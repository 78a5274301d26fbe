"""Optimizer tests: schedules, batch-size scaling, weight-decay mask, layer-wise LR decay."""

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import apply_steps

import bertjax
from bertjax import trainer
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


def _reference_lamb(params, grads_per_step, *, lr, weight_decay, b1, b2, eps, clip):
    """Numpy float64 port of ALBERT's LAMBOptimizer.apply_gradients (google-research/albert
    lamb_optimizer.py) as optimization.py builds it: global-norm clipping first, then per
    variable m, v, the Adam direction + weight decay, and the trust ratio ||w|| / ||u|| (1 where
    a norm is 0), neither for LayerNorm parameters nor biases. Moments are bias-corrected (the
    LAMB paper's Algorithm 2 and apex; ALBERT's TF code omits the correction). ``params``: one
    entry per variable (one layer's / one expert's matrix), named like bertjax's paths."""
    params = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}

    def excluded(name):  # ALBERT: "LayerNorm", "layer_norm", "bias"; bertjax's norms are "*_norm"
        name = name.split("[")[0]  # a slice of a stacked leaf: "path[layer, expert]"
        return name.endswith("bias") or "norm/" in name

    for t, grads in enumerate(grads_per_step, start=1):
        norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads.values()))
        scale = clip / max(norm, clip)  # tf.clip_by_global_norm
        for name, w in params.items():
            g = grads[name] * scale
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g * g
            m_hat, v_hat = m[name] / (1 - b1**t), v[name] / (1 - b2**t)
            update = m_hat / (np.sqrt(v_hat) + eps)
            if not excluded(name):
                update = update + weight_decay * w
            ratio = 1.0
            if not excluded(name):
                w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[name] = w - ratio * lr * update
    return params


def _split_variables(tree, blocks):
    """{path[i,j]: slice}: each stacked leaf cut into the variables the reference would hold."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        name, leaf = _path(path), np.asarray(leaf, np.float64)
        count = blocks[name]
        for index in np.ndindex(*leaf.shape[:count]):
            out[f"{name}{list(index) if count else ''}"] = leaf[index]
    return out


@pytest.mark.parametrize(
    "overrides",
    [{}, {"scan_layers": True, "num_experts": 2}, {"num_experts": 2, "experts_per_token": 2}],
    ids=["loop", "scan_moe", "loop_moe"],
)
def test_lamb_matches_albert_reference_per_layer_and_expert(overrides):
    """Three LAMB steps with clipping and weight decay equal the float64 reference, run per layer
    of a scanned stack and per expert slice, with biases and LayerNorm parameters unadapted."""
    lr, decay = 2.0**-7, 0.01  # an LR exact in float32 (the schedule's dtype)
    model_cfg, shapes = _param_shapes(**overrides)
    with jax.enable_x64(True):
        leaves, treedef = jax.tree.flatten(shapes)
        rs = np.random.RandomState(0)
        params = treedef.unflatten([rs.randn(*s.shape) * 0.1 for s in leaves])
        grads = [treedef.unflatten([rs.randn(*s.shape) for s in leaves]) for _ in range(3)]
        blocks = {
            _path(p): optim.stacked_axes(p, leaf, model_cfg)
            for p, leaf in jax.tree_util.tree_leaves_with_path(params)
        }
        if overrides.get("scan_layers"):
            assert blocks["bert/encoder/layers/mlp/intermediate_kernel"] == 2
            assert blocks["bert/encoder/layers/attention/query_kernel"] == 1
        if overrides.get("num_experts") and not overrides.get("scan_layers"):
            assert blocks["bert/encoder/layer_1/mlp/output_kernel"] == 1
        config = _config(
            name="lamb",
            schedule="constant",
            warmup_fraction=0.0,
            learning_rate=lr,
            weight_decay=decay,
            clip_norm=1.0,
        )
        tx = optim.make_optimizer(config, model_cfg, 256).tx
        current = apply_steps(tx, params, grads)
        got = _split_variables(current, blocks)
        want = _reference_lamb(
            _split_variables(params, blocks),
            [_split_variables(g, blocks) for g in grads],
            lr=lr,
            weight_decay=decay,
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            clip=1.0,
        )
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-10, atol=1e-13, err_msg=name)


def test_lamb_ratio_is_one_for_biases_and_layer_norms_and_per_slice_for_stacks():
    """One step from zero moments: each adapted slice's update has norm lr * ||w|| (the ratio
    rescales it to its weight's norm); biases and LayerNorm take the plain Adam step."""
    lr = 2.0**-7
    model_cfg, shapes = _param_shapes(scan_layers=True, num_experts=2)
    params, grads = _random_like(shapes, 0), _random_like(shapes, 1)
    config = _config(
        name="lamb", schedule="constant", warmup_fraction=0.0, learning_rate=lr, clip_norm=0.0
    )
    tx = optim.make_optimizer(config, model_cfg, 256).tx
    updates = jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)
    for (path, update), param, grad in zip(
        jax.tree_util.tree_leaves_with_path(updates),
        jax.tree.leaves(params),
        jax.tree.leaves(grads),
    ):
        name, axes = _path(path), optim.stacked_axes(path, param, model_cfg)
        if optim.decays_weight(path):
            over = tuple(range(axes, np.ndim(param)))  # one norm per layer / expert slice
            got = np.sqrt(np.sum(np.square(np.asarray(update, np.float64)), over))
            want = lr * np.sqrt(np.sum(np.square(np.asarray(param, np.float64)), over))
            assert got.size == int(np.prod(np.shape(param)[:axes]))
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
        else:  # Adam's first step: -lr * g / (|g| + eps)
            g = np.asarray(grad, np.float64)
            want = -lr * g / (np.abs(g) + 1e-6)
            np.testing.assert_allclose(update, want, rtol=1e-5, err_msg=f"{name} took a ratio")


def test_electra_convention_puts_the_heads_at_l_plus_2():
    """ELECTRA's _get_layer_lrs: embeddings decay^(L+2), layer i decay^(L+1-i), the rest 1."""
    decay = 0.8
    model_cfg, shapes = _param_shapes()
    factors = optim.layerwise_lr_factors(shapes, model_cfg, decay, "electra")
    got = {_path(p): float(f) for p, f in jax.tree_util.tree_leaves_with_path(factors)}

    def electra(name):  # a port of the reference's key_to_depths lookup
        depths = {"/embeddings/": 0, **{f"encoder/layer_{i}/": i + 1 for i in range(LAYERS)}}
        depth = next((d for key, d in depths.items() if key in f"/{name}"), LAYERS + 2)
        return decay ** (LAYERS + 2 - depth)

    for name, factor in got.items():
        np.testing.assert_allclose(factor, electra(name), rtol=1e-6, err_msg=name)
    assert got["bert/encoder/layer_3/mlp/output/kernel"] == pytest.approx(decay**2)
    beit = optim.layerwise_lr_factors(shapes, model_cfg, decay)
    assert float(beit["bert"]["encoder"]["layer_3"]["mlp"]["output"]["kernel"]) == pytest.approx(
        decay
    )
    # Through the optimizer: the config key selects the convention.
    params, grads = _random_like(shapes, 0), _random_like(shapes, 1)
    config = _config(
        schedule="constant",
        warmup_fraction=0.0,
        layerwise_lr_decay=decay,
        layerwise_lr_convention="electra",
    )
    with_decay = optim.make_optimizer(config, model_cfg, 256).tx
    config.layerwise_lr_decay = 1.0
    without = optim.make_optimizer(config, model_cfg, 256).tx
    a, b = jax.jit(lambda g, p: [tx.update(g, tx.init(p), p)[0] for tx in (with_decay, without)])(
        grads, params
    )
    for path, value in jax.tree_util.tree_leaves_with_path(a):
        other = b
        for k in path:
            other = other[k.key]
        np.testing.assert_allclose(value, other * electra(_path(path)), rtol=1e-6)
    with pytest.raises(ValueError, match="config.optim.layerwise_lr_convention"):
        optim.validate_optim_config(_config(layerwise_lr_convention="bert"))


def test_sqrt_adam_rule_moves_betas_and_epsilon():
    """Malladi et al. 2022's square-root rule: at batch k*B, lr*sqrt(k), 1-k(1-b), eps/sqrt(k);
    "sqrt" moves the LR alone."""
    config = _config(
        lr_scaling="sqrt_adam", base_batch_size=256, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0
    )
    b1, b2, eps = optim.adam_hyperparameters(config, 1024)
    np.testing.assert_allclose([b1, b2, eps], [1 - 4 * 0.1, 1 - 4 * 0.001, 1e-6 / 2], rtol=1e-12)
    np.testing.assert_allclose(optim.learning_rate_scale(config, 1024), 2.0, rtol=1e-12)
    b1, b2, eps = optim.adam_hyperparameters(config, 64)  # smaller batches: b closer to 1
    np.testing.assert_allclose([b1, b2, eps], [1 - 0.025, 1 - 0.00025, 2e-6], rtol=1e-12)
    assert optim.adam_hyperparameters(_config(lr_scaling="sqrt"), 1024) == (0.9, 0.999, 1e-6)
    with pytest.raises(ValueError, match="config.optim.lr_scaling.*b1"):
        optim.adam_hyperparameters(config, 256 * 16)  # 1 - 16 * 0.1 < 0
    # The optimizer uses the moved values: two Adam steps against a numpy Adam at (b1', b2', eps').
    model_cfg, _ = _param_shapes()
    config.update(schedule="constant", warmup_fraction=0.0, clip_norm=0.0)
    tx = optim.make_optimizer(config, model_cfg, 1024).tx
    params = {"w": {"kernel": jnp.asarray([[0.5, -1.0], [2.0, 0.25]])}}
    grads = [np.array([[0.1, -0.2], [0.3, 0.05]]), np.array([[-0.3, 0.1], [0.2, 0.4]])]
    state, m, v = tx.init(params), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        update, state = tx.update({"w": {"kernel": jnp.asarray(g, jnp.float32)}}, state, params)
        m, v = 0.6 * m + 0.4 * g, 0.996 * v + 0.004 * g * g
        want = -2e-4 * (m / (1 - 0.6**t)) / (np.sqrt(v / (1 - 0.996**t)) + 5e-7)
        np.testing.assert_allclose(update["w"]["kernel"], want, rtol=1e-5)


def test_stacked_axes_checks_the_leaf_shape():
    model_cfg, shapes = _param_shapes(scan_layers=True)
    path = next(
        p for p, _ in jax.tree_util.tree_leaves_with_path(shapes) if "query_kernel" in _path(p)
    )
    with pytest.raises(ValueError, match="layers axis of size 4"):
        optim.stacked_axes(path, np.zeros((3, 32, 2, 16)), model_cfg)


def test_roberta_base_recipe_is_the_paper_s_table_9():
    """RoBERTa-base (Liu et al. 2019, Table 9): peak LR 6e-4 at batch 8k after 24k warmup steps,
    linear decay over 500k, b2 0.98, eps 1e-6, weight decay 0.01, no gradient clipping."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    config = trainer.load_config_file(os.path.join(root, "roberta_base.py"))
    c = config.optim
    schedule = optim.make_schedule(c, config.batch_size)
    assert config.batch_size == 8192 and config.num_train_steps == c.total_steps == 500_000
    np.testing.assert_allclose(float(schedule(24_000)), 6e-4, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(12_000)), 3e-4, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(262_000)), 3e-4, rtol=1e-5)
    assert (c.b1, c.b2, c.eps, c.weight_decay, c.clip_norm) == (0.9, 0.98, 1e-6, 0.01, 0.0)
