"""Mixture-of-experts: dense equivalence, capacity, balancing loss, expert-parallel parity."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_process_worker as setup

from bertjax import BertConfig, BertModel, convert, step
from bertjax.modeling import moe
from bertjax.training import sharding

BATCH, LENGTH, PREDICTIONS, VOCAB = 8, 16, 3, 128


def _cfg(**overrides):
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=LENGTH,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertConfig(**{**fields, **overrides})


def _batch(seed=0):
    rs = np.random.RandomState(seed)
    mask = np.ones((BATCH, LENGTH), np.int32)
    mask[::3, LENGTH - 4 :] = 0
    return dict(
        input_ids=rs.randint(5, VOCAB, (BATCH, LENGTH)).astype(np.int32),
        token_type_ids=np.zeros((BATCH, LENGTH), np.int32),
        attention_mask=mask,
        masked_positions=rs.randint(1, LENGTH - 4, (BATCH, PREDICTIONS)).astype(np.int32),
        masked_ids=rs.randint(5, VOCAB, (BATCH, PREDICTIONS)).astype(np.int32),
        masked_weights=np.ones((BATCH, PREDICTIONS), np.float32),
        next_sentence_label=rs.randint(0, 2, (BATCH,)).astype(np.int32),
    )


def test_config_validates_moe_fields():
    for fields, name in [
        (dict(num_experts=-1), "num_experts"),
        (dict(num_experts=2, experts_per_token=3), "experts_per_token"),
        (dict(num_experts=2, expert_capacity_factor=0.0), "expert_capacity_factor"),
        (dict(router_z_loss_weight=-1.0), "router_z_loss_weight"),
        (dict(num_experts=2, moe_layer_interval=2, scan_layers=True), "moe_layer_interval"),
        (dict(num_experts=2, moe_layer_interval=3), "moe_layer_interval"),
    ]:
        with pytest.raises(ValueError, match=f"BertConfig.{name}"):
            _cfg(**fields)
    cfg = _cfg(num_hidden_layers=4, num_experts=2, moe_layer_interval=2)
    assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert not _cfg().is_moe_layer(0)


def test_one_expert_top1_equals_dense_feed_forward():
    dense_cfg = _cfg()
    moe_cfg = dense_cfg.replace(num_experts=1, experts_per_token=1, expert_capacity_factor=1.0)
    ids = jnp.asarray(_batch()["input_ids"])
    dense_params = nn.unbox(BertModel(dense_cfg).init(jax.random.key(0), ids)["params"])
    moe_params = nn.unbox(BertModel(moe_cfg).init(jax.random.key(1), ids)["params"])
    params = jax.tree.map(lambda x: x, dense_params)
    for g in range(2):
        mlp = dense_params["encoder"][f"layer_{g}"]["mlp"]
        params["encoder"][f"layer_{g}"]["mlp"] = {
            "router_kernel": moe_params["encoder"][f"layer_{g}"]["mlp"]["router_kernel"],
            "intermediate_kernel": mlp["intermediate"]["kernel"][None],
            "intermediate_bias": mlp["intermediate"]["bias"][None],
            "output_kernel": mlp["output"]["kernel"][None],
            "output_bias": mlp["output"]["bias"][None],
        }
    want, _ = BertModel(dense_cfg).apply({"params": dense_params}, ids)
    (got, _), state = BertModel(moe_cfg).apply({"params": params}, ids, mutable=["intermediates"])
    assert float(moe.collect_stats(state)["dropped_fraction"]) == 0.0
    # One expert: router prob 1, capacity = S, one-hot einsums add exact zeros -> equal to fp32.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_route_respects_capacity_and_drops_overflow():
    logits = jax.random.normal(jax.random.key(0), (3, 16, 4)) * 3.0
    capacity = 3
    dispatch, combine, stats = moe.route(logits, 2, capacity)
    dispatch, combine = np.asarray(dispatch), np.asarray(combine)
    assert set(np.unique(dispatch)) <= {0.0, 1.0}
    assert dispatch.sum(axis=1).max() <= 1  # each expert slot holds at most one token
    assert dispatch.sum(axis=(1, 3)).max() <= capacity  # no expert gets more than C tokens
    assert dispatch.sum(axis=(2, 3)).max() <= 2  # a token fills at most k slots
    dropped = 1.0 - dispatch.sum() / (3 * 16 * 2)
    assert dropped > 0.2  # 2 * 16 / 4 = 8 choices per expert on average vs C = 3
    np.testing.assert_allclose(stats["dropped_fraction"], dropped, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(stats["expert_load"]).sum(), 1.0, rtol=1e-6)
    # Kept tokens' gates are their renormalized top-2 probabilities.
    kept = combine.sum(axis=(2, 3))
    assert np.all((kept >= 0) & (kept <= 1 + 1e-6))
    # Padding tokens are not routed: no slots, no share of the load statistics.
    valid = np.ones((3, 16), np.float32)
    valid[:, 10:] = 0.0
    dispatch, _, stats = moe.route(logits, 2, capacity, jnp.asarray(valid))
    assert np.asarray(dispatch)[:, 10:].sum() == 0
    np.testing.assert_allclose(np.asarray(stats["expert_load"]).sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        stats["dropped_fraction"], 1.0 - np.asarray(dispatch).sum() / (3 * 10 * 2), rtol=1e-6
    )


def test_expert_choice_experts_take_their_top_tokens_and_never_padding():
    logits = jax.random.normal(jax.random.key(4), (3, 16, 4)) * 2.0
    valid = np.ones((3, 16), np.float32)
    valid[1, 10:] = 0.0
    valid[2, 3:] = 0.0  # 3 real tokens, fewer than the capacity
    capacity = 5
    dispatch, combine, stats = moe.route_expert_choice(logits, capacity, jnp.asarray(valid))
    dispatch, combine = np.asarray(dispatch), np.asarray(combine)
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    assert set(np.unique(dispatch)) <= {0.0, 1.0}
    for g in range(3):
        real = np.flatnonzero(valid[g])
        for e in range(4):
            taken = np.flatnonzero(dispatch[g, :, e, :].sum(-1))
            # The expert's C most probable real tokens (all of them when fewer), each in one slot.
            want = real[np.argsort(-probs[g, real, e], kind="stable")[:capacity]]
            assert sorted(taken) == sorted(want), (g, e)
            np.testing.assert_allclose(
                combine[g, taken, e, :].sum(-1), probs[g, taken, e], rtol=1e-6
            )
    assert dispatch[1, 10:].sum() == 0 and dispatch[2, 3:].sum() == 0
    np.testing.assert_allclose(np.asarray(stats["expert_load"]), 0.25, rtol=1e-6)  # balanced
    assert float(stats["balance_loss"]) == 0.0  # none needed (flaxformer: 0)
    untaken = ((dispatch.sum(axis=(2, 3)) == 0) * valid).sum() / valid.sum()
    np.testing.assert_allclose(stats["dropped_fraction"], untaken, rtol=1e-6)
    # In the layer: a token's output is the probability-weighted sum of the experts that took it.
    cfg = _cfg(num_experts=4, moe_routing="expert_choice", expert_capacity_factor=1.0)
    layer = moe.MoeFeedForward(cfg)
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, 32))
    params = nn.unbox(layer.init(jax.random.key(1), x))["params"]
    y = np.asarray(layer.apply({"params": params}, x))
    route_logits = jnp.einsum("gsm,me->gse", x, params["router_kernel"])
    dispatch, _, _ = moe.route_expert_choice(route_logits, moe.expert_capacity(cfg, LENGTH))
    p = np.asarray(jax.nn.softmax(route_logits, -1))

    def gelu(h):
        return np.asarray(jax.nn.gelu(h, approximate=False))

    for g, s in [(0, 0), (1, 7), (1, 15)]:
        want = np.zeros(32)
        for e in np.flatnonzero(np.asarray(dispatch)[g, s].sum(-1)):
            h = gelu(
                np.asarray(x[g, s]) @ params["intermediate_kernel"][e]
                + params["intermediate_bias"][e]
            )
            want += p[g, s, e] * (h @ params["output_kernel"][e] + params["output_bias"][e])
        np.testing.assert_allclose(y[g, s], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="moe_routing"):
        _cfg(num_experts=4, moe_routing="random")


def test_dropped_tokens_get_zero_output():
    cfg = _cfg(num_experts=4, experts_per_token=1, expert_capacity_factor=0.25)
    layer = moe.MoeFeedForward(cfg)
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, 32))
    variables = nn.unbox(layer.init(jax.random.key(1), x))
    y, state = layer.apply({"params": variables["params"]}, x, mutable=["intermediates"])
    capacity = moe.expert_capacity(cfg, LENGTH)
    assert capacity == 1  # ceil(0.25 * 16 / 4)
    logits = jnp.einsum("gsm,me->gse", x, variables["params"]["router_kernel"])
    dispatch, combine, _ = moe.route(logits, 1, capacity)
    kept = np.asarray(dispatch.sum(axis=(2, 3))) > 0
    assert kept.sum(axis=1).max() <= 4  # at most E * C tokens per sequence survive
    rows = np.abs(np.asarray(y)).sum(-1)
    assert np.all(rows[~kept] == 0.0) and np.all(rows[kept] > 0)
    stats = state["intermediates"]["moe"][0]
    np.testing.assert_allclose(stats["dropped_fraction"], 1.0 - kept.mean(), rtol=1e-6)


def _flaxformer_balance_loss(probs_GTE, top_k_GTK):
    """Numpy float64 port of flaxformer's ``_load_balancing_loss`` (architectures/moe/routing.py):
    the per-group share of tokens routed to each expert (any of its k choices) times the
    per-group mean probability, averaged over groups and experts, times E^2."""
    groups, tokens, experts = probs_GTE.shape
    routed_GTE = np.zeros((groups, tokens, experts))
    for g, t, j in np.ndindex(*top_k_GTK.shape):
        routed_GTE[g, t, top_k_GTK[g, t, j]] = 1.0
    share_GE, mean_probs_GE = routed_GTE.mean(axis=1), probs_GTE.mean(axis=1)
    return np.mean(share_GE * mean_probs_GE) * experts**2


@pytest.mark.parametrize("k", [1, 2, 3])
def test_balance_loss_matches_flaxformer(k):
    """Uniform routing gives k (flaxformer's minimum); random routing equals a float64 port of
    flaxformer's loss, and with padding the port on each group's real tokens (bertjax's stated
    deviation: padding is left out of the averages)."""
    uniform = jnp.zeros((2, 16, 4))
    _, _, stats = moe.route(uniform, k, 16)
    np.testing.assert_allclose(stats["balance_loss"], float(k), rtol=1e-6)
    np.testing.assert_allclose(stats["z_loss"], np.log(4.0) ** 2, rtol=1e-6)
    skewed = jnp.zeros((2, 16, 4)).at[..., 0].set(10.0)
    _, _, stats = moe.route(skewed, 1, 16)
    assert stats["balance_loss"] > 3.9  # everything on one expert: close to E = 4
    rs = np.random.RandomState(k)
    logits = rs.randn(3, 16, 4) * 2.0
    valid = np.ones((3, 16))
    valid[1, 11:], valid[2, 5:] = 0.0, 0.0
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top_k = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    with jax.enable_x64(True):
        _, _, stats = moe.route(jnp.asarray(logits), k, 4)  # capacity 4: drops do not matter
        np.testing.assert_allclose(
            stats["balance_loss"], _flaxformer_balance_loss(probs, top_k), rtol=1e-12
        )
        _, _, stats = moe.route(jnp.asarray(logits), k, 4, jnp.asarray(valid))
    per_group = [
        _flaxformer_balance_loss(probs[g : g + 1, valid[g] > 0], top_k[g : g + 1, valid[g] > 0])
        for g in range(3)
    ]
    np.testing.assert_allclose(stats["balance_loss"], np.mean(per_group), rtol=1e-12)


def test_to_hf_rejects_moe(tmp_path):
    cfg = _cfg(num_experts=2)
    with pytest.raises(ValueError, match="num_experts"):
        convert.to_hf(cfg, {"bert": {"encoder": {}}}, str(tmp_path))


def _train_one_step(mesh_axes, devices, model_cfg):
    config = setup.step_config(**mesh_axes)
    config.batch_size = BATCH
    mesh = sharding.make_mesh(config.mesh, devices)
    state = step.init_train_state(config, model_cfg, mesh, jax.random.key(0))
    steps = step.jit_steps(state, mesh, step.FAST_COMPILE)
    batch = sharding.global_batch(_batch(), mesh, BATCH)
    state, metrics = steps.train(state, batch, jax.random.key(1))
    return state, jax.device_get(metrics)


@pytest.mark.parametrize("routing", ["token_choice", "expert_choice"])
def test_expert_parallel_step_equals_one_device(routing):
    cfg = _cfg(num_experts=4, experts_per_token=2, expert_capacity_factor=1.0, moe_routing=routing)
    ref_state, ref = _train_one_step({}, jax.devices()[:1], cfg)
    state, got = _train_one_step(dict(data=2, expert=4), jax.devices()[:8], cfg)
    # Auxiliary losses reach the total: loss = MLM + NSP + weighted router losses.
    aux = ref["moe_aux_loss"]
    np.testing.assert_allclose(ref["loss"], ref["mlm_loss"] + ref["nsp_loss"] + aux, rtol=1e-6)
    assert aux > 0 and 0 <= ref["moe_dropped_fraction"] < 1
    np.testing.assert_allclose(sum(ref[f"moe_load_{i}"] for i in range(4)), 1.0, rtol=1e-5)
    # Same tolerances as tests/sharding_test.py: only cross-device reduction order differs.
    for key in ("loss", "grad_norm", "moe_aux_loss", "moe_dropped_fraction"):
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, err_msg=key)
    for (path, leaf), want in zip(
        jax.tree_util.tree_leaves_with_path(state.params), jax.tree.leaves(ref_state.params)
    ):
        np.testing.assert_allclose(
            leaf, want, rtol=1e-5, atol=5e-6, err_msg=jax.tree_util.keystr(path)
        )
    kernel = state.params["bert"]["encoder"]["layer_0"]["mlp"]["intermediate_kernel"]
    assert kernel.sharding.shard_shape(kernel.shape) == (1, 32, 64)  # one expert per device


def _objective_batch(name):
    """An objective and a batch of the keys it reads."""
    from bertjax.objectives.diffusion import MaskedDiffusion
    from bertjax.objectives.finetune import Classification, TokenClassification
    from bertjax.objectives.pretraining import Pretraining

    rs = np.random.RandomState(1)
    batch = _batch()
    if name in ("pretraining", "diffusion"):
        batch.update(
            masked_positions=np.tile(np.arange(LENGTH, dtype=np.int32), (BATCH, 1)),
            masked_ids=batch["input_ids"],
            masked_weights=(rs.rand(BATCH, LENGTH) < 0.5).astype(np.float32),
            mask_ratio=np.full((BATCH,), 0.5, np.float32),
        )
        return (Pretraining() if name == "pretraining" else MaskedDiffusion()), batch
    shape = (BATCH, LENGTH) if name == "tokens" else (BATCH,)
    batch = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    batch.update(
        labels=rs.randint(0, 3, shape).astype(np.int32),
        label_weights=(rs.rand(*shape) < 0.7).astype(np.float32),
    )
    return (TokenClassification if name == "tokens" else Classification)(num_labels=3), batch


@pytest.mark.parametrize("name", ["pretraining", "diffusion", "classification", "tokens"])
def test_every_objective_adds_the_router_losses_in_one_place(name):
    """Objective.sums/loss/report add the weighted router losses whatever the objective; a dense
    model's loss has no router term."""
    objective, batch = _objective_batch(name)
    cfg = _cfg(num_experts=4, experts_per_token=1)
    model = objective.model(cfg)
    variables = objective.init(model, {"params": jax.random.key(0)}, batch)
    outputs = objective.apply(model, variables, batch, None, True)
    sums, norms = objective.sums(outputs, batch), objective.norms(batch)
    report = objective.report(sums, norms)
    aux = float(moe.aux_loss(cfg, outputs["moe"]))
    assert aux > 0 and float(report["moe_aux_loss"]) == pytest.approx(aux, rel=1e-5)
    own = float(objective.total_loss(sums, norms))
    assert float(objective.loss(sums, norms)) == pytest.approx(own + aux, rel=1e-5)
    assert float(report["loss"]) == pytest.approx(own + aux, rel=1e-5)
    if name in ("classification", "tokens"):
        shape = batch["labels"].shape
        assert objective.predictions(outputs).shape == shape
    dense_model = objective.model(_cfg())
    dense_vars = objective.init(dense_model, {"params": jax.random.key(0)}, batch)
    dense = objective.apply(dense_model, dense_vars, batch, None, True)
    dense_sums = objective.sums(dense, batch)
    assert "moe" not in dense and "moe_aux_loss" not in dense_sums
    dense_norms = objective.norms(batch)
    assert float(objective.loss(dense_sums, dense_norms)) == pytest.approx(
        float(objective.total_loss(dense_sums, dense_norms))
    )


def test_expert_axis_must_divide_the_experts():
    cfg = _cfg(num_experts=6)
    config = setup.step_config(data=2, expert=4)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:8])
    with pytest.raises(ValueError, match="config.mesh.expert=4 must divide model.num_experts=6"):
        step.abstract_train_state(config, cfg, mesh)
