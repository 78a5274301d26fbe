"""Modern-recipe optimizer tests: StableAdamW, Kahan summation, 1-sqrt and WSD schedules against
ModernBERT's schedulers, lengths in tokens, per-step batch-size LR scaling."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import apply_steps

import bertjax
from bertjax import step
from bertjax.training import optim, sharding, stable_adamw


def _config(**changes):
    config = optim.default_optim_config()
    config.update(changes)
    return config


def _param_shapes(**overrides):
    """Abstract parameters of a tiny 2-layer pretraining model (no compilation)."""
    cfg = bertjax.BertConfig.preset(
        "tiny",
        vocab_size=64,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        **overrides,
    )
    model = bertjax.BertForPreTraining(cfg)
    ids = jnp.zeros((1, 8), jnp.int32)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), ids, masked_positions=ids[:, :2])
    )
    return cfg, nn.unbox(variables["params"])


def _path(path):
    return "/".join(k.key for k in path)


def _split_variables(tree, blocks):
    """{path[i,j]: slice}: each stacked leaf cut into the tensors the reference would hold."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        name, leaf = _path(path), np.asarray(leaf, np.float64)
        for index in np.ndindex(*leaf.shape[: blocks[name]]):
            out[f"{name}{list(index) if blocks[name] else ''}"] = leaf[index]
    return out


def _reference_stableadamw(params, grads_per_step, lrs, *, max_lr, weight_decay, b1, b2, eps):
    """Numpy float64 port of Wortsman et al.'s StableAdamWUnfused (reference gist: debiased
    betas, so m and v come out bias-corrected; per-tensor RMS of g^2 / max(v, eps^2) with the
    current g and updated v; eta = lr / max(1, RMS)) with ModernBERT's fully decoupled decay
    (optimi decouple_lr=True: p *= 1 - (eta / max_lr) * wd) on ModernBERT's parameter groups
    (main.py param_groups_weight_decay: no decay for ndim <= 1 or names ending in bias).
    Returns the parameters and the (step, tensor) pairs whose LR was clipped."""
    params = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    clipped = set()
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        b1_hat = b1 * (1 - b1 ** (t - 1)) / (1 - b1**t)
        b2_hat = b2 * (1 - b2 ** (t - 1)) / (1 - b2**t)
        for name, w in params.items():
            g = grads[name]
            m[name] = b1_hat * m[name] + (1 - b1_hat) * g
            v[name] = b2_hat * v[name] + (1 - b2_hat) * g * g
            rms = np.sqrt(np.mean(g * g / np.maximum(v[name], eps**2)))
            eta = lr / max(1.0, rms)
            if rms > 1 + 1e-9:  # step 1 has RMS 1 up to rounding
                clipped.add((t, name))
            if not (w.ndim <= 1 or name.split("[")[0].endswith("bias")):
                w = w * (1 - eta / max_lr * weight_decay)
            params[name] = w - eta * m[name] / (np.sqrt(v[name]) + eps)
    return params, clipped


@pytest.mark.parametrize(
    "overrides", [{}, {"scan_layers": True, "num_experts": 2}], ids=["loop", "scan_moe"]
)
def test_stableadamw_matches_float64_reference_per_tensor_and_slice(overrides):
    """Five steps with weight decay and a decaying LR equal the float64 reference. Gradients
    shrink for four steps (no clipping), then jump 100x in one tensor and, of each stacked leaf,
    only in layer 1: those LRs are clipped, one RMS per layer / expert slice, the rest not."""
    peak = 2.0**-7
    model_cfg, shapes = _param_shapes(**overrides)
    with jax.enable_x64(True):
        leaves, treedef = jax.tree.flatten(shapes)
        rs = np.random.RandomState(0)
        params = treedef.unflatten([rs.randn(*s.shape) * 0.1 for s in leaves])
        base = treedef.unflatten([rs.randn(*s.shape) for s in leaves])
        blocks = {
            _path(p): optim.stacked_axes(p, leaf, model_cfg)
            for p, leaf in jax.tree_util.tree_leaves_with_path(params)
        }

        def spike(path, g):
            name, g = _path(path), g.copy()
            if blocks[name]:
                g[1] *= 100.0
            elif name == "bert/embeddings/word_embeddings":
                g *= 100.0
            return g

        grads = [jax.tree.map(lambda g, t=t: g * 0.5**t, base) for t in range(4)]
        grads.append(jax.tree_util.tree_map_with_path(spike, grads[-1]))
        config = _config(
            name="stableadamw",
            learning_rate=peak,
            schedule="linear",
            warmup_fraction=0.0,
            total_steps=8,
            end_lr_fraction=0.1,
            weight_decay=0.05,
            b1=0.9,
            b2=0.98,
            clip_norm=0.0,
        )
        optimizer = optim.make_optimizer(config, model_cfg, 256)
        current = apply_steps(optimizer.tx, params, grads)
        lrs = [float(optimizer.learning_rate_fn(t)) for t in range(len(grads))]
        assert lrs[0] == peak and lrs[-1] < peak
        want, clipped = _reference_stableadamw(
            _split_variables(params, blocks),
            [_split_variables(g, blocks) for g in grads],
            lrs,
            max_lr=peak,
            weight_decay=0.05,
            b1=0.9,
            b2=0.98,
            eps=1e-6,
        )
    got = _split_variables(current, blocks)
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-10, atol=1e-14, err_msg=name)
    assert all(t == 5 for t, _ in clipped)
    assert (5, "bert/embeddings/word_embeddings") in clipped
    assert (5, "bert/embeddings/position_embeddings") not in clipped
    if overrides:
        kernel = "bert/encoder/layers/mlp/intermediate_kernel"  # layers x experts
        assert {(5, f"{kernel}[1, 0]"), (5, f"{kernel}[1, 1]")} <= clipped
        assert not {(5, f"{kernel}[0, 0]"), (5, f"{kernel}[0, 1]")} & clipped


def test_stableadamw_weight_decay_is_per_step_at_the_peak_lr():
    """Zero gradients: decayed leaves move by -wd * (lr_t / peak) * p, not AdamW's -lr_t * wd * p;
    biases and LayerNorm parameters stay put."""
    model_cfg, _ = _param_shapes()
    params = {"dense": {"kernel": jnp.full((3, 4), 2.0), "bias": jnp.ones(4)}}
    params["layer_norm"] = {"scale": jnp.ones(4)}
    config = _config(
        name="stableadamw",
        learning_rate=1e-3,
        weight_decay=1e-5,
        schedule="linear",
        warmup_fraction=0.0,
        total_steps=10,
    )
    tx = optim.make_optimizer(config, model_cfg, 256).tx
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for fraction in (1.0, 0.9, 0.8):  # lr_t / peak of the linear decay at steps 0, 1, 2
        updates, state = tx.update(zeros, state, params)
        np.testing.assert_allclose(updates["dense"]["kernel"], -1e-5 * fraction * 2.0, rtol=1e-5)
        assert not np.any(updates["dense"]["bias"]) and not np.any(updates["layer_norm"]["scale"])
    config.name = "adamw"  # AdamW's decay is multiplied by the LR
    tx = optim.make_optimizer(config, model_cfg, 256).tx
    updates = tx.update(zeros, tx.init(params), params)[0]
    np.testing.assert_allclose(updates["dense"]["kernel"], -1e-3 * 1e-5 * 2.0, rtol=1e-5)


def test_kahan_update_lands_exactly_on_the_rounded_sum():
    """p + update (optax.apply_updates: bfloat16 + float32 in float32, cast back) equals
    round_bf16(p + (u + c)) bit for bit, including cancellation (u ~ -p), updates far larger
    than p and p = 0; the buffer keeps (u + c) - (round(...) - p)."""
    rs = np.random.RandomState(0)
    n = 200_000
    p = jnp.asarray(rs.randn(n) * 10.0 ** rs.uniform(-6, 3, n), jnp.bfloat16)
    p = p.at[:1000].set(0)
    wide = np.asarray(p, np.float32)
    c = jnp.asarray(rs.randn(n) * 1e-3 * np.abs(wide), jnp.bfloat16)
    u = (rs.randn(n) * 10.0 ** rs.uniform(-9, 3, n)).astype(np.float32)
    cancel = slice(1000, n // 2)  # u + c ~ -p: new values far below p, or exactly 0
    near = 1 + rs.randn(n // 2 - 1000) * 10.0 ** rs.uniform(-12, -1, n // 2 - 1000)
    u[cancel] = -(wide + np.asarray(c, np.float32))[cancel] * near
    tx = stable_adamw.kahan_summation()

    @jax.jit
    def apply(p, u, c):
        update, state = tx.update(u, stable_adamw.KahanState(c), p)
        return optax.apply_updates(p, update), state.compensation

    new, compensation = apply(p, jnp.asarray(u), c)
    total = u + np.asarray(c, np.float32)
    want = np.asarray(jnp.asarray(wide + total, jnp.bfloat16), np.float32)
    np.testing.assert_array_equal(np.asarray(new, np.float32), want)
    assert np.mean(np.abs(want) < 2.0**-16 * np.abs(wide)) > 0.1  # cancellation was exercised
    assert np.mean(np.abs(want) > 2.0**16 * np.abs(wide)) > 0.01  # so were huge updates
    kept = np.asarray(jnp.asarray(total - (want - wide), jnp.bfloat16), np.float32)
    np.testing.assert_array_equal(np.asarray(compensation, np.float32), kept)


def test_kahan_summation_keeps_bfloat16_training_on_the_float32_path():
    """300 StableAdamW steps of 1e-4 on bfloat16 weights at 1 (the next bfloat16 below is
    1 - 2^-8): plain bfloat16 never moves; with Kahan summation it stays within half an ulp of
    float32 training. b1 = b2 = 0 keep the moments (stored in the parameter dtype) exact, so only
    the summation differs. On float32 parameters Kahan summation changes nothing."""
    model_cfg, _ = _param_shapes()
    config = _config(
        name="stableadamw", schedule="constant", warmup_fraction=0.0, learning_rate=1e-4
    )
    config.update(weight_decay=0.0, clip_norm=0.0, b1=0.0, b2=0.0)
    results = {}
    for dtype, kahan in [(jnp.float32, False), (jnp.bfloat16, False), (jnp.bfloat16, True)]:
        config.kahan_summation = kahan
        tx = optim.make_optimizer(config, model_cfg, 256).tx
        params = {"w": {"kernel": jnp.ones((4, 4), dtype)}}
        grads = {"w": {"kernel": jnp.ones((4, 4), dtype)}}
        state = tx.init(params)

        @jax.jit
        def step(params, state, tx=tx, grads=grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        for _ in range(300):
            params, state = step(params, state)
        assert params["w"]["kernel"].dtype == dtype
        results[dtype, kahan] = np.asarray(params["w"]["kernel"], np.float32)
    reference = results[jnp.float32, False]
    np.testing.assert_allclose(reference, 1 - 300e-4, rtol=1e-4)
    np.testing.assert_array_equal(results[jnp.bfloat16, False], 1.0)
    np.testing.assert_allclose(results[jnp.bfloat16, True], reference, atol=2.0**-9 + 1e-5)
    config.kahan_summation = True
    with_kahan = optim.make_optimizer(config, model_cfg, 256).tx
    params = {"w": {"kernel": jnp.linspace(-1, 1, 16).reshape(4, 4)}}
    grads = jax.tree.map(lambda p: p * 0.3, params)
    config.kahan_summation = False
    without = optim.make_optimizer(config, model_cfg, 256).tx
    a = with_kahan.update(grads, with_kahan.init(params), params)[0]
    b = without.update(grads, without.init(params), params)[0]
    np.testing.assert_array_equal(a["w"]["kernel"], b["w"]["kernel"])


def test_stableadamw_with_kahan_trains_bfloat16_params_through_the_train_step():
    """The chain plugs into step.train_step unchanged: sharded state (moments and compensation
    shaped like the bfloat16 parameters), donation, three steps that move every parameter."""
    import two_process_worker as setup

    config = setup.step_config()
    config.optim.update(name="stableadamw", kahan_summation=True, clip_norm=0.0, schedule="1-sqrt")
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    model_cfg = setup.tiny_model_config(param_dtype="bfloat16")
    state = step.init_train_state(config, model_cfg, mesh, jax.random.key(0))
    train = step.jit_steps(state, mesh, step.FAST_COMPILE)[0]
    before = [np.asarray(p) for p in jax.tree.leaves(state.params)]
    for seed in range(3):
        batch = sharding.global_batch(setup.synthetic_batch(seed), mesh, setup.BATCH)
        state, metrics = train(state, batch, jax.random.key(1))
    assert np.isfinite(float(metrics["loss"])) and not float(metrics["nonfinite"])
    is_kahan = lambda x: isinstance(x, stable_adamw.KahanState)  # noqa: E731
    (kahan,) = [s for s in jax.tree.leaves(state.opt_state, is_leaf=is_kahan) if is_kahan(s)]
    for param, compensation, old in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(kahan.compensation), before
    ):
        assert param.dtype == compensation.dtype == jnp.bfloat16
        assert compensation.shape == param.shape and np.any(np.asarray(param) != old)
    assert any(np.any(np.asarray(c)) for c in jax.tree.leaves(kahan.compensation))


def _modernbert_one_minus_sqrt(n, t_decay, t_max, alpha_f):
    """ModernBERT src/scheduler.py OneMinusSqrtScheduler.__call__ (no warmup)."""
    if n <= t_max - t_decay:
        return 1.0
    relative = (n - (t_max - t_decay)) / t_decay
    return max(alpha_f, alpha_f + (1 - alpha_f) * (1 - math.sqrt(relative)))


def _modernbert_wsd(n, t_warmup, t_decay, t_max, alpha_f):
    """ModernBERT WarmupStableDecayScheduler: composer LinearScheduler(alpha_i=1e-10) warmup,
    then 1, then a linear decay to alpha_f over the last t_decay."""
    if n < t_warmup:
        return 1e-10 + (1 - 1e-10) * n / t_warmup
    if n < t_max - t_decay:
        return 1.0
    return max(0.0, 1 - (n - (t_max - t_decay)) / t_decay * (1 - alpha_f))


@pytest.mark.parametrize(
    "schedule,decay_shape,warmup",
    [("1-sqrt", "linear", 0), ("1-sqrt", "linear", 100), ("wsd", "1-sqrt", 50)]
    + [("wsd", "linear", 50)],
)
def test_schedules_match_modernbert_schedulers(schedule, decay_shape, warmup):
    """1-sqrt (ModernBERT's phase 3: alpha_f 0.001, decay over the whole phase) and both WSD
    tails (Hägele et al. 2024) against ports of ModernBERT's schedulers, after a linear warmup."""
    peak, total, decay, end = 3e-4, 1000, 200, 0.001
    config = _config(
        schedule=schedule,
        decay_shape=decay_shape,
        learning_rate=peak,
        total_steps=total,
        warmup_steps=warmup,
        warmup_fraction=0.0,
        decay_fraction=decay / total,
        end_lr_fraction=end,
    )
    lr = jax.jit(optim.make_schedule(config, 256))

    def expected(n):
        if schedule == "1-sqrt":  # the decay spans everything after warmup
            if n < warmup:
                return n / warmup
            return _modernbert_one_minus_sqrt(n - warmup, total - warmup, total - warmup, end)
        if decay_shape == "linear":
            return _modernbert_wsd(n, warmup, decay, total, end)
        return n / warmup if n < warmup else _modernbert_one_minus_sqrt(n, decay, total, end)

    for n in [0, 1, 25, 49, 50, 51, 99, 100, 101, 400, 799, 800, 801, 900, 999, 1000, 1100]:
        np.testing.assert_allclose(
            float(lr(n)), peak * expected(min(n, total)), rtol=1e-5, atol=peak * 1e-6, err_msg=n
        )


def test_tokens_set_warmup_and_decay_with_a_fixed_batch():
    """tokens_before(s) = s x B x T: warmup ends at the first step that has seen warmup_tokens,
    the decay starts where decay_tokens remain; they override warmup_steps and decay_fraction."""
    per_step = 32 * 128
    tokens_before = lambda step: step * per_step  # noqa: E731
    config = _config(
        schedule="wsd",
        total_steps=100,
        warmup_steps=3,
        decay_fraction=0.5,
        warmup_tokens=10 * per_step + 1,
        decay_tokens=20 * per_step,
        end_lr_fraction=0.0,
    )
    assert optim.schedule_phases(config, tokens_before) == (11, 80)
    lr = optim.make_schedule(config, 256, tokens_before=tokens_before)
    peak = config.learning_rate
    for n, want in [(5, 5 / 11), (11, 1.0), (80, 1.0), (90, 0.5), (100, 0.0)]:
        np.testing.assert_allclose(float(lr(n)), peak * want, rtol=1e-6, err_msg=n)


def test_tokens_follow_a_growing_batch():
    """A batch that grows 8, 16, ... 64 rows every 5 steps: the steps equal a linear search."""
    length = 16
    batch = lambda step: min(64, 8 * (1 + step // 5))  # noqa: E731
    tokens_before = lambda step: length * sum(batch(k) for k in range(step))  # noqa: E731
    first = lambda tokens: next(s for s in range(10**6) if tokens_before(s) >= tokens)  # noqa: E731
    for tokens in [1, 128, 129, 5000, 12_345, 40_000]:
        assert optim.steps_for_tokens(tokens, tokens_before, 200) == first(tokens)
    assert optim.steps_for_tokens(tokens_before(200) + 1, tokens_before, 200) is None
    config = _config(schedule="wsd", total_steps=200, warmup_tokens=12_345, decay_tokens=40_000)
    run = tokens_before(200)
    assert optim.schedule_phases(config, tokens_before) == (first(12_345), first(run - 40_000))


@pytest.mark.parametrize(
    "changes,key,tokens_before",
    [
        ({"warmup_tokens": 100}, "warmup_tokens", None),  # no tokens_before
        ({"warmup_tokens": 10**9}, "warmup_tokens", lambda s: 64 * s),  # beyond the run
        ({"schedule": "wsd", "decay_tokens": 64 * 10_001}, "decay_tokens", lambda s: 64 * s),
        ({"decay_tokens": 100}, "decay_tokens", lambda s: 64 * s),  # not wsd
        ({"warmup_tokens": -1}, "warmup_tokens", lambda s: 64 * s),
        ({"decay_shape": "cubic"}, "decay_shape", None),
        ({"decay_shape": "1-sqrt"}, "decay_shape", None),  # shapes wsd only
    ],
)
def test_invalid_lengths_and_shapes_name_the_key(changes, key, tokens_before):
    model_cfg, _ = _param_shapes()
    with pytest.raises(ValueError, match=f"config.optim.{key}"):
        optim.make_optimizer(_config(**changes), model_cfg, 256, tokens_before=tokens_before)


@pytest.mark.parametrize("rule,power", [("none", 0.0), ("linear", 1.0), ("sqrt", 0.5)])
def test_batch_at_scales_each_step_s_learning_rate(rule, power):
    """Under batch-size warmup the LR of step n is peak x (batch_at(n) / base)^p x shape(n),
    traced (jit, vmap); a constant batch_at gives the fixed-batch schedule."""
    config = _config(lr_scaling=rule, base_batch_size=256, warmup_steps=10, total_steps=100)
    batch_at = lambda n: jnp.minimum(64 * (1 + jnp.asarray(n) // 10), 512)  # noqa: E731
    growing = optim.make_schedule(config, 512, batch_at=batch_at)
    fixed = optim.make_schedule(config, 512)
    steps = jnp.arange(0, 101)
    got = np.asarray(jax.jit(jax.vmap(growing))(steps))
    shape = np.asarray(jax.vmap(optim.make_schedule(config, 256))(steps))  # batch = base
    want = shape * (np.minimum(64 * (1 + np.arange(101) // 10), 512) / 256) ** power
    np.testing.assert_allclose(got, want, rtol=1e-6)
    constant = optim.make_schedule(config, 512, batch_at=lambda n: jnp.int32(512))
    np.testing.assert_allclose(jax.vmap(constant)(steps), jax.vmap(fixed)(steps), rtol=1e-6)
    # make_optimizer passes it on: Adam's first step is -lr_0 * g / (|g| + eps).
    config.update(warmup_steps=0, warmup_fraction=0.0, clip_norm=0.0, weight_decay=0.0)
    model_cfg, _ = _param_shapes()
    tx = optim.make_optimizer(config, model_cfg, 512, batch_at=batch_at).tx
    params = {"w": {"kernel": jnp.ones((2, 2))}}
    update = tx.update(params, tx.init(params), params)[0]["w"]["kernel"]
    np.testing.assert_allclose(update, -1e-4 * (64 / 256) ** power / (1 + 1e-6), rtol=1e-5)


def test_sqrt_adam_cannot_follow_a_varying_batch():
    config = _config(lr_scaling="sqrt_adam")
    with pytest.raises(ValueError, match="config.optim.lr_scaling='sqrt_adam'.*b1, b2 and eps"):
        optim.make_schedule(config, 1024, batch_at=lambda n: jnp.int32(1024))
    optim.make_schedule(config, 1024)  # a fixed batch keeps Malladi et al.'s rule


def _cramming_budget_triangle(fake_step, num_training_steps, base=0.25, falloff=0.25):
    """Port of JonasGeiping/cramming schedulers.py get_budget_triangle's lr_lambda
    ("budget-triangle2": base_percentage 0.25, falloff 0.25); fake_step is the elapsed budget
    fraction times num_training_steps (`_get_fake_step`)."""
    return min(
        base + fake_step * (1 - base) / (1 - falloff) / num_training_steps,
        1 / falloff - fake_step / (num_training_steps * falloff),
    )


def test_cramming_triangle_runs_on_the_budget_clock_of_the_batch_ramp():
    """cramming's triangle and its batch ramp share one clock, the elapsed budget; with
    schedule_clock "tokens" the LR of every step is the port's at the tokens consumed, so it peaks
    at 75% of the tokens although the small early batches are most of the steps."""
    from bertjax.data.plans.batch_plan import BatchPlan, default_batch_warmup_config

    length, total_rows = 16, 64 * 120
    run = optim.default_optim_config()
    run.update(schedule="triangle", schedule_clock="tokens", warmup_fraction=0.0)
    config = type(run)(dict(batch_size=64, batch_warmup=default_batch_warmup_config()))
    config.batch_warmup.update(
        quantum=8, shape="equal_tokens", tokens=int(0.6 * total_rows * length)
    )
    plan = BatchPlan.from_config(config, length)
    steps = plan.steps_for_samples(total_rows)
    run.total_steps = steps
    lr = optim.make_schedule(
        run,
        64,
        tokens_before=lambda s: plan.samples_before(s) * length,
        tokens_at=lambda s: plan.samples_at(s) * length,
    )
    got = np.asarray(jax.jit(jax.vmap(lr))(jnp.arange(steps)), np.float64)
    tokens = np.asarray([plan.samples_before(s) * length for s in range(steps)], np.float64)
    fraction = tokens / (plan.samples_before(steps) * length)
    nominal = 10**9  # cramming's cfg_train.steps; large, so int() in fake_step is negligible
    want = [1e-4 * _cramming_budget_triangle(int(f * nominal), nominal) for f in fraction]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-10)
    assert plan.warmup_steps > 0.5 * steps  # the ramp's small batches are most of the steps
    assert 0.73 < fraction[int(np.argmax(got))] < 0.77
    run.schedule_clock = "steps"  # the step clock peaks far earlier in the tokens
    by_steps = np.asarray(jax.vmap(optim.make_schedule(run, 64))(jnp.arange(steps)))
    assert fraction[int(np.argmax(by_steps))] < 0.6
    with pytest.raises(ValueError, match="schedule_clock.*tokens_at"):
        optim.make_schedule(_config(schedule_clock="tokens"), 64)
