"""Behaviour of the encoder itself: padding, packing, scan, sharing, gradients, configs."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from helpers import jit_apply

import bertjax
from bertjax import convert
from bertjax.modeling import attention_kernels
from bertjax.modeling.attention import exact_attention, make_attention_mask
from bertjax.objectives.pretraining import Pretraining
from bertjax.ops.dense import project, tied_decoder

SMALL = dict(
    vocab_size=61,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _cfg(**overrides):
    return bertjax.BertConfig.preset("tiny", **{**SMALL, **overrides})


def _init(model, length=12, seed=0):
    ids = jnp.ones((2, length), jnp.int32)
    return nn.unbox(model.init(jax.random.key(seed), ids)["params"])


def _ids(seed, shape, vocab=61):
    return jnp.asarray(np.random.default_rng(seed).integers(5, vocab, size=shape), jnp.int32)


@pytest.fixture(scope="module")
def bert():
    cfg = _cfg()
    model = bertjax.BertForPreTraining(cfg)
    return cfg, model, _init(model)


def test_padding_never_changes_real_positions(bert):
    cfg, model, params = bert
    apply = jax.jit(model.apply)
    ids = _ids(0, (2, 7))
    types = jnp.asarray([[0, 0, 0, 1, 1, 1, 1]] * 2, jnp.int32)
    short = apply({"params": params}, ids, types, jnp.ones((2, 7), jnp.int32))
    pad = jnp.zeros((2, 5), jnp.int32)
    padded = apply(
        {"params": params},
        jnp.concatenate([ids, pad + 9], 1),
        jnp.concatenate([types, pad], 1),
        jnp.concatenate([jnp.ones((2, 7), jnp.int32), pad], 1),
    )
    np.testing.assert_allclose(
        padded["sequence_output"][:, :7], short["sequence_output"], atol=1e-5
    )
    np.testing.assert_allclose(padded["mlm_logits"][:, :7], short["mlm_logits"], atol=1e-5)
    np.testing.assert_allclose(padded["nsp_logits"], short["nsp_logits"], atol=1e-5)


def test_packed_row_equals_separate_sequences(bert):
    cfg, model, params = bert
    a, b = _ids(1, (1, 5)), _ids(2, (1, 4))
    seg = jnp.asarray([[1] * 5 + [2] * 4 + [0] * 3], jnp.int32)
    packed_ids = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], 1)
    apply = jax.jit(model.apply)
    packed = apply({"params": params}, packed_ids, segment_ids=seg)["sequence_output"]
    alone_a = apply({"params": params}, a)["sequence_output"]
    alone_b = apply({"params": params}, b)["sequence_output"]
    np.testing.assert_allclose(packed[:, :5], alone_a, atol=1e-5)
    np.testing.assert_allclose(packed[:, 5:9], alone_b, atol=1e-5)
    # Without segment ids the two sequences do see each other: the test has teeth.
    leaky = apply({"params": params}, packed_ids[:, :9])["sequence_output"]
    assert np.max(np.abs(leaky[:, 5:9] - alone_b)) > 1e-3


@pytest.mark.parametrize(
    "overrides", [dict(), dict(embedding_size=16, num_hidden_groups=1, num_hidden_layers=4)]
)
def test_scan_and_remat_match_the_loop(overrides):
    cfg = _cfg(**overrides)
    ids = _ids(3, (2, 9))
    loop = bertjax.BertForPreTraining(cfg)
    params = _init(loop, length=9)
    ref = jax.jit(loop.apply)({"params": params}, ids)
    scan_cfg = cfg.replace(scan_layers=True, remat="full")
    stacked = convert.stack_layers(scan_cfg, params)
    scanned = bertjax.BertForPreTraining(scan_cfg)
    # The scanned module's own init has the same tree as the stacked loop params.
    assert jax.tree.structure(_init(scanned, length=9)) == jax.tree.structure(stacked)
    out = jax.jit(scanned.apply)({"params": stacked}, ids)
    np.testing.assert_allclose(out["mlm_logits"], ref["mlm_logits"], atol=1e-5)

    def loss(p, m):
        return jnp.sum(m.apply({"params": p}, ids)["mlm_logits"] ** 2)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_loop = grad(params, loop)
    g_scan = convert.unstack_layers(scan_cfg, grad(stacked, scanned))
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5), g_loop, g_scan
    )


def test_albert_one_group_has_one_layer_of_parameters():
    albert = _cfg(embedding_size=16, num_hidden_groups=1, num_hidden_layers=6)
    params = _init(bertjax.BertForPreTraining(albert))
    assert list(params["bert"]["encoder"]) == ["layer_0"]
    bert_params = _init(bertjax.BertForPreTraining(albert.replace(num_hidden_groups=None)))
    layer = sum(x.size for x in jax.tree.leaves(bert_params["bert"]["encoder"]["layer_0"]))
    count = lambda p: sum(x.size for x in jax.tree.leaves(p))  # noqa: E731
    assert count(bert_params) - count(params) == 5 * layer
    assert params["bert"]["embeddings"]["word_embeddings"].shape == (61, 16)
    assert params["bert"]["embeddings"]["projection"]["kernel"].shape == (16, 32)


@pytest.mark.parametrize(
    "overrides", [dict(), dict(embedding_size=16, num_hidden_groups=1), dict(pre_layer_norm=True)]
)
def test_every_parameter_gets_a_gradient(overrides):
    cfg = _cfg(**overrides)
    model = bertjax.BertForPreTraining(cfg)
    params = _init(model)
    ids = _ids(4, (4, 12))
    types = jnp.asarray(np.repeat([[0] * 6 + [1] * 6], 4, 0), jnp.int32)
    positions = jnp.asarray(np.random.default_rng(0).integers(1, 12, (4, 3)), jnp.int32)
    labels = jnp.take_along_axis(ids, positions, 1)

    def loss(p):
        out = model.apply({"params": p}, ids, types, masked_positions=positions)
        mlm = optax.softmax_cross_entropy_with_integer_labels(out["mlm_logits"], labels).mean()
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out["nsp_logits"], jnp.asarray([0, 1, 0, 1])
        ).mean()
        return mlm + nsp

    grads = jax.jit(jax.grad(loss))(params)
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    # Every parameter tensor moves; position rows past the sequence length cannot.
    for path, g in flat:
        name = jax.tree_util.keystr(path)
        if "position_embeddings" in name:
            g = g[:12]
        if "token_type_embeddings" in name or "word_embeddings" in name:
            continue  # rows of unused ids legitimately get zero; checked below
        assert float(jnp.max(jnp.abs(g))) > 0, f"zero gradient for {name}"
    word = grads["bert"]["embeddings"]["word_embeddings"]
    assert float(jnp.min(jnp.max(jnp.abs(word), axis=1))) > 0  # tied decoder reaches every row
    assert (
        float(jnp.min(jnp.max(jnp.abs(grads["bert"]["embeddings"]["token_type_embeddings"]), 1)))
        > 0
    )


def test_exact_attention_equals_fused():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 3, 4)), jnp.float32) for _ in range(3))
    seg = jnp.asarray([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)
    mask = make_attention_mask(None, seg, 2, 6)
    fused = jax.nn.dot_product_attention(q, k, v, mask=jnp.broadcast_to(mask, (2, 1, 6, 6)))
    exact = exact_attention(q, k, v, mask)
    np.testing.assert_allclose(exact[:, :5], fused[:, :5], atol=1e-6)
    np.testing.assert_allclose(exact[1], fused[1], atol=1e-6)


def test_tied_decoder_backward_equals_autodiff_of_the_plain_product():
    """The hand-written VJP (table gradient as one product, bias gradient as ones x rows) gives
    what autodiff of x @ table.T + bias gives, in float64 on numpy's side."""
    rng = np.random.default_rng(3)
    x, table, bias, cotangent = (
        rng.normal(size=shape) for shape in [(2, 3, 8), (11, 8), (11,), (2, 3, 11)]
    )
    out, vjp = jax.vjp(tied_decoder, *(jnp.asarray(a, jnp.float32) for a in (x, table, bias)))
    np.testing.assert_allclose(out, x @ table.T + bias, rtol=1e-5, atol=1e-5)
    d_x, d_table, d_bias = vjp(jnp.asarray(cotangent, jnp.float32))
    np.testing.assert_allclose(d_x, cotangent @ table, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        d_table, np.einsum("btv,bte->ve", cotangent, x), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(d_bias, cotangent.sum((0, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("explicit", [True, False], ids=["cpu-transposes", "accelerator-form"])
def test_project_backward_equals_autodiff_of_the_plain_products(explicit, monkeypatch):
    """`project`'s hand-written VJP (on the CPU one shared transpose of x for kernels at least as
    wide as x, the gradient's transpose for narrower ones; on accelerators the plain transposed-
    operand product) gives the float64 products' gradients; so does a bf16 call within bf16's
    rounding."""
    from bertjax.ops import dense as products

    monkeypatch.setattr(products.platform, "on_cpu", lambda: explicit)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 5, 8))
    kernels = [rng.normal(size=(8, n)) for n in (8, 12, 3)]  # equal, wider, narrower than x
    cotangents = [rng.normal(size=(2, 5, k.shape[1])) for k in kernels]
    want_x = sum(c @ k.T for c, k in zip(cotangents, kernels))
    want_kernels = [np.einsum("btk,btn->kn", x, c) for c in cotangents]
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)):
        outs, vjp = jax.vjp(project, *(jnp.asarray(a, dtype) for a in [x, *kernels]))
        for out, kernel in zip(outs, kernels):
            assert out.dtype == dtype
            np.testing.assert_allclose(np.float64(out), x @ kernel, rtol=tol, atol=tol * 8)
        d_x, *d_kernels = vjp(tuple(jnp.asarray(c, dtype) for c in cotangents))
        assert d_x.dtype == dtype and all(d.dtype == dtype for d in d_kernels)
        np.testing.assert_allclose(np.float64(d_x), want_x, rtol=tol, atol=tol * 8)
        for got, want in zip(d_kernels, want_kernels):
            np.testing.assert_allclose(np.float64(got), want, rtol=tol, atol=tol * 8)


def test_bf16_matmuls_read_bf16_and_accumulate_in_float32():
    """project with operand_dtype=bfloat16 on float32 arrays: float32 outputs and gradients equal
    to the products of the bf16-rounded operands (float64 reference), not to bf16-rounded
    results; and far from them would be a float32 product (the rounding is really applied)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 4, 16))
    kernels = [rng.normal(size=(16, n)) for n in (32, 8)]
    cotangents = [rng.normal(size=(3, 4, k.shape[1])) for k in kernels]

    def r(a):  # bf16 rounding
        return np.float64(jnp.asarray(a, jnp.float32).astype(jnp.bfloat16))

    outs, vjp = jax.vjp(
        lambda *a: project(*a, operand_dtype="bfloat16"),
        *(jnp.asarray(a, jnp.float32) for a in [x, *kernels]),
    )
    d_x, *d_kernels = vjp(tuple(jnp.asarray(c, jnp.float32) for c in cotangents))
    for out, kernel in zip(outs, kernels):
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, r(x) @ r(kernel), rtol=1e-5, atol=1e-4)
        assert np.abs(np.float64(out) - x @ kernel).max() > 1e-3  # rounded operands, not fp32
    assert d_x.dtype == jnp.float32 and all(d.dtype == jnp.float32 for d in d_kernels)
    np.testing.assert_allclose(
        d_x, sum(r(c) @ r(k).T for c, k in zip(cotangents, kernels)), rtol=1e-5, atol=1e-4
    )
    for got, c in zip(d_kernels, cotangents):
        np.testing.assert_allclose(got, np.einsum("btk,btn->kn", r(x), r(c)), rtol=1e-5, atol=1e-4)


def test_matmul_dtype_bfloat16_model_stays_within_bf16_error_of_float32(bert):
    """BertConfig.matmul_dtype='bfloat16' (fp32 activations, bf16 products): same parameters,
    MLM logits within bf16's error of the fp32 model's, and float32 outputs."""
    cfg, model, params = bert
    ids = _ids(13, (2, 9))
    want = jax.jit(model.apply)({"params": params}, ids)["mlm_logits"]
    fast = bertjax.BertForPreTraining(cfg.replace(matmul_dtype="bfloat16"))
    got = jax.jit(fast.apply)({"params": params}, ids)["mlm_logits"]
    assert got.dtype == jnp.float32
    error = float(jnp.abs(got - want).max() / jnp.abs(want).max())
    assert 1e-5 < error < 3e-2, error  # rounded (not the fp32 path), within bf16's ~3 digits


def test_dense_layers_and_attention_go_through_project(bert, monkeypatch):
    """Every Dense product and the Q/K/V and output projections of a layer use `project` (Q, K and V
    in one call sharing x's transpose), and the model's outputs equal plain products'."""
    from bertjax.ops import dense as products

    cfg, model, params = bert
    ids = _ids(12, (2, 7))
    fast = model.apply({"params": params}, ids)["mlm_logits"]
    calls = []
    monkeypatch.setattr(
        products,
        "project",
        lambda x, *kernels, operand_dtype: (
            calls.append(len(kernels)) or tuple(jnp.einsum("...k,kn->...n", x, k) for k in kernels)
        ),
    )
    plain = model.apply({"params": params}, ids)["mlm_logits"]
    layers = cfg.num_hidden_layers
    # per layer: Q/K/V (3 kernels), attention output, intermediate, output; then the MLM transform
    assert calls.count(3) == layers and calls.count(1) >= 3 * layers + 1
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def test_fused_attention_gets_lengths_for_padded_rows_and_a_full_mask_for_packed(bert, monkeypatch):
    """On accelerators padded rows reach `jax.nn.dot_product_attention` as sequence lengths (no
    T x S mask; cuDNN's padding path) and packed rows as a [B, 1, T, S] mask (cuDNN refuses a
    [B, 1, 1, S] one). Run here through XLA: the same outputs at every real position."""
    cfg, model, params = bert
    fused, calls = jax.nn.dot_product_attention, []

    def recording(q, k, v, *, implementation, mask=None, **kwargs):
        calls.append((implementation, None if mask is None else mask.shape, sorted(kwargs)))
        return fused(q, k, v, mask=mask, implementation="xla", **kwargs)

    ids = _ids(11, (2, 9))
    attention_mask = jnp.asarray([[1] * 9, [1] * 6 + [0] * 3], jnp.int32)
    segments = jnp.asarray([[1] * 4 + [2] * 5, [1] * 6 + [0] * 3], jnp.int32)
    want_padded = model.apply({"params": params}, ids, attention_mask=attention_mask)["mlm_logits"]
    want_packed = model.apply({"params": params}, ids, segment_ids=segments)["mlm_logits"]
    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    cudnn = bertjax.BertForPreTraining(dataclasses.replace(cfg, attention_implementation="cudnn"))
    padded = cudnn.apply({"params": params}, ids, attention_mask=attention_mask)["mlm_logits"]
    lengths = ["key_value_seq_lengths", "local_window_size", "query_seq_lengths"]
    assert calls and all(c == ("cudnn", None, lengths) for c in calls)
    calls.clear()
    packed = cudnn.apply({"params": params}, ids, segment_ids=segments)["mlm_logits"]
    assert calls and all(c == ("cudnn", (2, 1, 9, 9), ["local_window_size"]) for c in calls)
    real = np.asarray(attention_mask) > 0
    np.testing.assert_allclose(np.asarray(padded)[real], np.asarray(want_padded)[real], atol=1e-6)
    np.testing.assert_allclose(np.asarray(packed)[real], np.asarray(want_packed)[real], atol=1e-6)


def test_dropout_is_active_only_when_asked(bert):
    cfg = _cfg(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = bertjax.BertForPreTraining(cfg)
    params = bert[2]
    ids = _ids(5, (2, 10))
    a = jit_apply(model, {"params": params}, ids)["mlm_logits"]
    b = jit_apply(model, {"params": params}, ids)["mlm_logits"]
    np.testing.assert_array_equal(a, b)
    want = jit_apply(bert[1], {"params": params}, ids)["mlm_logits"]
    np.testing.assert_allclose(a, want, atol=1e-6)
    c = jit_apply(
        model, {"params": params}, ids, deterministic=False, rngs={"dropout": jax.random.key(1)}
    )["mlm_logits"]
    assert np.max(np.abs(np.asarray(c) - np.asarray(a))) > 1e-3


def test_bfloat16_compute_keeps_float32_params_and_tracks_float32(bert):
    cfg, model, params = bert
    ids = _ids(6, (2, 10))
    half = bertjax.BertForPreTraining(cfg.replace(dtype="bfloat16"))
    out = jax.jit(half.apply)({"params": params}, ids)
    assert out["mlm_logits"].dtype == jnp.bfloat16
    ref = jax.jit(model.apply)({"params": params}, ids)["mlm_logits"]
    assert float(jnp.max(jnp.abs(out["mlm_logits"].astype(jnp.float32) - ref))) < 0.1
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(_init(half)))


def test_token_classification_and_sequence_classification_shapes(bert):
    cfg = bert[0]
    ids = _ids(7, (3, 8))
    seq = bertjax.BertForSequenceClassification(cfg, num_labels=1)
    out = jax.jit(seq.apply)({"params": _init(seq)}, ids)
    assert out.shape == (3, 1)
    tok = bertjax.BertForTokenClassification(cfg, num_labels=7)
    tok_params = _init(tok)
    assert "pooler" not in tok_params["bert"]
    assert jax.jit(tok.apply)({"params": tok_params}, ids).shape == (3, 8, 7)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("hidden_size", 30, "hidden_size .* divisible by num_attention_heads"),
        ("hidden_act", "gelu_fast", "hidden_act"),
        ("num_hidden_layers", -1, "num_hidden_layers"),
        ("vocab_size", 0, "vocab_size"),
        ("hidden_dropout_prob", 1.5, "hidden_dropout_prob"),
        ("num_hidden_groups", 5, "num_hidden_groups"),
        ("dtype", "float8", "dtype"),
        ("matmul_dtype", "int8", "matmul_dtype"),
        ("remat", "everything", "remat"),
        ("mask_token_id", 100, "mask_token_id"),
        ("position_embedding_init", "rotary", "position_embedding_init"),
        ("local_attention_offsets", (-1, 1), "needs position_embedding_init='fourier'"),
        ("local_attention_offsets", (-1, 1, 2, 3, 4), "5 offsets for 4 heads"),
        ("local_attention_offsets", (8,), "shorter than head_dim"),
    ],
)
def test_bad_config_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        _cfg(**{field: value})


def test_sinusoidal_position_init_is_sin_cos_at_the_configured_scale():
    cfg = _cfg(position_embedding_init="sinusoidal", initializer_range=0.05)
    table = np.asarray(_init(bertjax.BertModel(cfg))["embeddings"]["position_embeddings"])
    width = cfg.hidden_size
    positions = np.arange(cfg.max_position_embeddings)[:, None]
    angles = positions / 10000.0 ** (np.arange(0, width, 2)[None, :] / width)
    amplitude = 0.05 * np.sqrt(2.0)
    np.testing.assert_allclose(table[:, 0::2], amplitude * np.sin(angles), atol=1e-6)
    np.testing.assert_allclose(table[:, 1::2], amplitude * np.cos(angles), atol=1e-6)
    # Only the position table changes: the word embeddings are the normal init of the same seed.
    normal = _init(bertjax.BertModel(_cfg(initializer_range=0.05)))["embeddings"]
    np.testing.assert_array_equal(
        _init(bertjax.BertModel(cfg))["embeddings"]["word_embeddings"], normal["word_embeddings"]
    )
    assert not np.allclose(normal["position_embeddings"], table, atol=1e-3)


LOCAL = dict(
    hidden_size=64,
    num_attention_heads=2,
    intermediate_size=64,
    initializer_range=0.05,
    position_embedding_init="fourier",
)


def test_fourier_position_rows_are_orthogonal_within_head_dim():
    cfg = _cfg(**LOCAL)
    table = np.asarray(
        _init(bertjax.BertModel(cfg))["embeddings"]["position_embeddings"], np.float64
    )
    head_dim = cfg.head_dim
    assert not table[:, head_dim:].any()
    gram = table @ table.T
    # Rows as long as a normal(0.05) row of width 64; orthogonal for 0 < |t - s| < head_dim.
    np.testing.assert_allclose(np.diag(gram), 0.05**2 * 64, rtol=1e-5)
    t, s = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    near = (np.abs(t - s) > 0) & (np.abs(t - s) < head_dim)
    np.testing.assert_allclose(gram[near], 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="fourier.*even head_dim"):
        _cfg(hidden_size=36, num_attention_heads=4, position_embedding_init="fourier")


@functools.partial(jax.jit, static_argnums=0)
def _first_layer_attention(cfg, params, ids):
    """Layer-0 attention probabilities [B, heads, T, S] computed from the parameters by hand."""
    model = bertjax.BertModel(cfg)
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    x = model.apply(
        {"params": params},
        ids,
        jnp.zeros_like(ids),
        positions,
        True,
        method=lambda m, *a: m.embeddings(*a),
    )
    attention = params["encoder"]["layer_0"]["attention"]
    q = jnp.einsum("bte,enh->btnh", x, attention["query_kernel"]) + attention["query_bias"]
    k = jnp.einsum("bte,enh->btnh", x, attention["key_kernel"]) + attention["key_bias"]
    return jax.nn.softmax(jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(cfg.head_dim), axis=-1)


def test_local_attention_init_points_first_layer_heads_at_their_offsets():
    cfg = _cfg(**LOCAL, local_attention_offsets=[-1, 2])  # a list (JSON) becomes a tuple
    assert cfg.local_attention_offsets == (-1, 2)
    # The model's own init sets the heads; with the same key every other value is BERT's init.
    no_offsets = cfg.replace(local_attention_offsets=())
    random_init = {"bert": _init(bertjax.BertModel(no_offsets), length=32)}
    params = _init(bertjax.BertModel(cfg), length=32)
    ids = jax.random.randint(jax.random.key(3), (4, 32), 5, cfg.vocab_size)
    probs = np.asarray(_first_layer_attention(cfg, params, ids))
    t = np.arange(4, 28)
    for head, offset in enumerate(cfg.local_attention_offsets):
        assert probs[:, head, t, t + offset].mean() > 0.6, (head, offset)
    before = np.asarray(_first_layer_attention(cfg, random_init["bert"], ids))
    assert before[:, :, t, t - 1].mean() < 0.1  # BERT's init: about uniform over 32 positions
    # Only the first layer's query/key kernels change, and only their position rows.
    changed = jax.tree_util.tree_map(
        lambda a, b: not np.array_equal(a, b), random_init["bert"], params
    )
    flat = {
        jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(changed)
    }
    assert {k for k, v in flat.items() if v} == {
        "['encoder']['layer_0']['attention']['query_kernel']",
        "['encoder']['layer_0']['attention']['key_kernel']",
    }
    kernel = params["encoder"]["layer_0"]["attention"]["query_kernel"]
    np.testing.assert_array_equal(
        kernel[cfg.head_dim :],
        random_init["bert"]["encoder"]["layer_0"]["attention"]["query_kernel"][cfg.head_dim :],
    )


def test_local_attention_init_on_a_scanned_stack_sets_layer_zero_only():
    cfg = _cfg(**LOCAL, num_hidden_layers=3, local_attention_offsets=(1,))
    scanned_cfg = cfg.replace(scan_layers=True)
    loop = {"bert": _init(bertjax.BertModel(cfg))}
    stack = {"bert": _init(bertjax.BertModel(scanned_cfg))}
    for name in ("query_kernel", "key_kernel"):
        stacked = stack["bert"]["encoder"]["layers"]["attention"][name]
        np.testing.assert_array_equal(
            stacked[0, : cfg.head_dim, :1],
            loop["bert"]["encoder"]["layer_0"]["attention"][name][: cfg.head_dim, :1],
        )
        assert not np.allclose(stacked[1, : cfg.head_dim, :1], stacked[0, : cfg.head_dim, :1])


def test_config_rejects_unknown_keys_and_presets():
    with pytest.raises(ValueError, match="unknown BertConfig field.*hiden_size"):
        bertjax.BertConfig.from_dict({"hiden_size": 8})
    with pytest.raises(ValueError, match="unknown BertConfig preset 'huge'"):
        bertjax.BertConfig.preset("huge")
    with pytest.raises(dataclasses.FrozenInstanceError):
        _cfg().hidden_size = 64
    sizes = {
        name: bertjax.BertConfig.preset(name)
        for name in ("tiny", "mini", "small", "medium", "base", "large")
    }
    assert [
        (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) for c in sizes.values()
    ] == [(2, 128, 2), (4, 256, 4), (4, 512, 8), (8, 512, 8), (12, 768, 12), (24, 1024, 16)]


def test_sequence_longer_than_positions_is_refused(bert):
    cfg, model, params = bert
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        model.apply({"params": params}, jnp.ones((1, 40), jnp.int32))


def _np_attention(q, k, v, mask, keep=None, rate=0.0):
    """float64 numpy softmax attention: [B,T,N,H] x3, boolean mask [B|1,1|N,T|1,S]."""
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -1e300)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if keep is not None:
        probs = np.where(keep, probs / (1 - rate), 0.0)
    return np.einsum("bnts,bsnh->btnh", probs, v)


@pytest.mark.parametrize("chains", [1, 2, 4])
@pytest.mark.parametrize("dropout", [False, True])
def test_products_attention_equals_float64_attention_and_its_gradient(chains, dropout):
    """products.attention (hand-written backward, rows split into chains) against a float64
    numpy forward and central differences of it: packed rows (block-diagonal masks, a fully
    masked padding row), with and without a dropout keep mask."""
    from bertjax.ops import attention as products

    rng = np.random.default_rng(7)
    b, t, n, h = 4, 6, 3, 4
    q, k, v, cot = (rng.normal(size=(b, t, n, h)) for _ in range(4))
    seg = np.asarray([[1, 1, 2, 2, 2, 0], [1] * 6, [1, 1, 1, 0, 0, 0], [3, 3, 3, 3, 1, 1]])
    mask = np.asarray(make_attention_mask(None, jnp.asarray(seg), b, t))
    keep, rate = (rng.random((b, n, t, t)) > 0.3, 0.3) if dropout else (None, 0.0)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    fn = lambda q_, k_, v_: products.attention(  # noqa: E731
        q_, k_, v_, jnp.asarray(mask), None if keep is None else jnp.asarray(keep), rate, chains
    )
    out, vjp = jax.vjp(fn, f32(q), f32(k), f32(v))
    np.testing.assert_allclose(out, _np_attention(q, k, v, mask, keep, rate), atol=2e-5)
    grads = vjp(f32(cot))
    eps = 1e-6
    for i, (arg, grad) in enumerate(zip((q, k, v), grads)):
        for _ in range(3):  # directional derivatives of <out, cot>
            direction = rng.normal(size=arg.shape)

            def moved(s, i=i, direction=direction):
                return [a + s * eps * direction if j == i else a for j, a in enumerate((q, k, v))]

            numeric = (
                (_np_attention(*moved(1), mask, keep, rate) * cot).sum()
                - (_np_attention(*moved(-1), mask, keep, rate) * cot).sum()
            ) / (2 * eps)
            np.testing.assert_allclose(
                float(jnp.sum(grad * f32(direction))), numeric, rtol=1e-4, atol=1e-4
            )


def test_cpu_attention_path_equals_dot_product_attention(bert):
    """On the CPU the model's attention is products.attention; attention_implementation="xla"
    takes jax.nn.dot_product_attention: same outputs and gradients on padded rows (at real
    tokens: the fused path reads the padding by its lengths and leaves padded queries at 0)."""
    cfg, model, params = bert
    assert jax.default_backend() == "cpu"
    ids = _ids(12, (4, 9))
    attention_mask = jnp.asarray([[1] * 9, [1] * 6 + [0] * 3, [1] * 9, [1] * 2 + [0] * 7])
    fused = bertjax.BertForPreTraining(dataclasses.replace(cfg, attention_implementation="xla"))

    def loss(m, p):
        logits = m.apply({"params": p}, ids, attention_mask=attention_mask)["mlm_logits"]
        return jnp.sum(logits**2 * attention_mask[..., None])

    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
    (ours_loss, ours), (theirs_loss, theirs) = (
        value_and_grad(model, params),
        value_and_grad(fused, params),
    )
    np.testing.assert_allclose(ours_loss, theirs_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_cpu_chains_divide_the_batch():
    from bertjax.ops.attention import cpu_chains

    for batch in (1, 2, 3, 7, 12, 32):
        chains = cpu_chains(batch)
        assert batch % chains == 0 and 1 <= chains <= min(batch, 8)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_mask_rate_independence_and_determinism(rate):
    """16-bit decisions: the kept fraction is 1 - rate (to sampling error); neighbours (the two
    halves of one random word) and elements half the array apart (words from one threefry hash)
    are uncorrelated; the same key gives the same mask, another key another."""
    from bertjax.ops.elementwise import keep_mask

    shape = (64, 3, 257)  # odd last axis: the final word's upper half is unused
    keep = np.asarray(keep_mask(jax.random.key(3), shape, 1 - rate))
    assert keep.shape == shape and keep.dtype == bool
    n = keep.size
    assert abs(keep.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    flat = keep.reshape(-1).astype(np.float64)
    pairs = np.corrcoef(flat[0:-1:2], flat[1::2])[0, 1]  # the two halves of each word
    assert abs(pairs) < 5 / np.sqrt(n / 2)
    half = n // 2  # n/2 words (even): word w and word w + n/4 come from one hash
    same_hash = np.corrcoef(flat[:half], flat[half:])[0, 1]
    assert abs(same_hash) < 5 / np.sqrt(half)
    assert keep_mask(jax.random.key(3), (5,), 1.0).all()
    np.testing.assert_array_equal(keep, keep_mask(jax.random.key(3), shape, 1 - rate))
    assert (keep != np.asarray(keep_mask(jax.random.key(4), shape, 1 - rate))).mean() > 0.05


def test_dropout_module_scales_kept_values_and_is_identity_when_deterministic():
    from bertjax.modeling.layers import Dropout

    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 130)), jnp.float32)
    layer = Dropout(0.25)
    np.testing.assert_array_equal(layer.apply({}, x, True), x)
    y = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(1)}))
    kept = y != 0
    np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
    assert 0.6 < kept.mean() < 0.9
    np.testing.assert_array_equal(
        Dropout(1.0).apply({}, x, False, rngs={"dropout": jax.random.key(1)}), 0
    )


def test_erf_gelu_and_its_derivative_equal_float64():
    from math import erf, exp, pi, sqrt

    from bertjax.ops.elementwise import erf_gelu

    xs = np.linspace(-9, 9, 2001)
    want = np.asarray([x * 0.5 * (1 + erf(x / sqrt(2))) for x in xs])
    slope = np.asarray(
        [0.5 * (1 + erf(x / sqrt(2))) + x * exp(-x * x / 2) / sqrt(2 * pi) for x in xs]
    )
    x32 = jnp.asarray(xs, jnp.float32)
    np.testing.assert_allclose(erf_gelu(x32), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda x: jnp.sum(erf_gelu(x)))(x32), slope, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(erf_gelu(x32), jax.nn.gelu(x32, approximate=False), atol=2e-6)


@pytest.mark.parametrize(
    "overrides,packed,nsp",
    [
        (dict(), False, True),
        (dict(pre_layer_norm=True), True, False),
        (dict(num_hidden_layers=3, num_hidden_groups=1), True, True),  # ALBERT: one shared layer
        (dict(remat="dots"), False, True),
    ],
)
def test_sparse_last_layer_gives_the_full_models_logits_and_gradients(overrides, packed, nsp):
    """The last layer run only at the masked positions (and [CLS]) against the full model:
    fp32 both, same parameters; tolerance 1e-5 of each output's / gradient's largest entry. The
    sparse layer's rows are padded to a multiple of 16 (XLA:GPU's tile sizes): 4 or 5 rows run
    as 16, the padding dropped, the loss the full model's."""
    cfg = _cfg(**overrides)
    full = bertjax.BertForPreTraining(cfg, next_sentence=nsp)
    sparse = full.clone(sparse_last_layer=True)
    ids = _ids(1, (3, 16))
    segments = jnp.asarray(np.repeat([[1] * 6 + [2] * 7 + [0] * 3], 3, 0)) if packed else None
    mask = (
        None
        if packed
        else jnp.asarray(np.arange(16)[None] < np.array([[16], [11], [7]]), jnp.int32)
    )
    positions = jnp.asarray([[1, 4, 4, 0], [2, 9, 3, 5], [6, 1, 0, 0]], jnp.int32)  # repeats, pads
    params = nn.unbox(
        jax.jit(full.init)(jax.random.key(0), ids, masked_positions=positions)["params"]
    )
    weights = jax.random.normal(jax.random.key(2), (3, 4, cfg.vocab_size))

    def loss(model, p):
        out = model.apply(
            {"params": p},
            ids,
            attention_mask=mask,
            segment_ids=segments,
            masked_positions=positions,
        )
        total = jnp.sum(out["mlm_logits"] * weights)
        return total + (jnp.sum(out["nsp_logits"] ** 2) if nsp else 0.0), out

    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=1, has_aux=True), static_argnums=0)
    (_, want), want_grads = value_and_grad(full, params)
    with attention_kernels.recording() as record:
        (_, got), got_grads = value_and_grad(sparse, params)
    assert record[-1][0].gathered_rows and record[-1][0].query_length == 16  # padded from 4 or 5
    assert "sequence_output" in want and "sequence_output" not in got
    for key in ("mlm_logits", "nsp_logits") if nsp else ("mlm_logits",):
        scale = float(jnp.max(jnp.abs(want[key])))
        np.testing.assert_allclose(got[key], want[key], atol=1e-5 * scale, rtol=0)
    top = max(float(jnp.max(jnp.abs(w))) for w in jax.tree_util.tree_leaves(want_grads))
    for (path, w), g in zip(
        jax.tree_util.tree_leaves_with_path(want_grads), jax.tree_util.tree_leaves(got_grads)
    ):
        # the key bias's gradient is zero in exact arithmetic (softmax ignores a shift per row):
        # leaves that small are held to 1e-4 of the largest gradient instead of their own size
        scale = max(float(jnp.max(jnp.abs(w))), 1e-4 * top)
        np.testing.assert_allclose(g, w, atol=1e-5 * scale, rtol=0, err_msg=str(path))


def test_the_sparse_last_layer_pads_its_rows_to_what_xla_gpu_tiles():
    """Row counts XLA:GPU refused (77, 21, 2480: encoder.py's comment) run as counts it compiled
    (80, 32, 2496); a count already a multiple is kept, and the padded rows repeat the first."""
    from bertjax.modeling.encoder import pad_rows, padded_row_count

    assert [padded_row_count(r) for r in (21, 77, 80, 256, 257, 320, 2480)] == [
        32, 80, 80, 256, 320, 320, 2496
    ]  # fmt: skip
    rows = jnp.arange(2 * 77).reshape(2, 77)
    padded = pad_rows(rows)
    assert padded.shape == (2, 80)
    np.testing.assert_array_equal(padded[:, :77], rows)
    np.testing.assert_array_equal(padded[:, 77:], jnp.repeat(rows[:, :1], 3, axis=1))


def test_sparse_last_layer_saves_the_flops_the_count_says():
    """The compiled forward of the sparse model does fewer FLOPs than the full one, by what
    metrics.train_flops_per_sequence subtracts for it (its fwd + bwd count / 3, products only):
    XLA's count also has the skipped rows' LayerNorms, GELUs and softmax, so up to 20% more.
    The layer runs its rows rounded up by `encoder.padded_row_count` (the model's FLOPs, which
    MFU is of, count the real ones)."""
    from bertjax.modeling.encoder import padded_row_count
    from bertjax.training import metrics

    cfg = _cfg()
    batch, length, masked = 4, 32, 5
    full = bertjax.BertForPreTraining(cfg)
    sparse = full.clone(sparse_last_layer=True)
    ids, positions = _ids(3, (batch, length)), jnp.tile(jnp.arange(1, masked + 1), (batch, 1))
    params = nn.unbox(
        jax.jit(full.init)(jax.random.key(0), ids, masked_positions=positions)["params"]
    )

    def flops(model):
        fn = jax.jit(lambda p: model.apply({"params": p}, ids, masked_positions=positions))
        return fn.lower(params).compile().cost_analysis()["flops"]

    objective = Pretraining(next_sentence=True, sparse_last_layer=True)
    rows = objective.last_layer_rows(cfg, masked)
    assert rows == masked + 1
    assert Pretraining(sparse_last_layer=False).last_layer_rows(cfg, masked) is None
    assert objective.last_layer_rows(cfg.replace(scan_layers=True), masked) is None
    run = padded_row_count(rows)
    counted = (
        batch
        * (
            metrics.train_flops_per_sequence(cfg, length, masked)
            - metrics.train_flops_per_sequence(cfg, length, masked, run)
        )
        / 3
    )
    measured = flops(full) - flops(sparse)
    assert counted > 0
    assert counted <= measured <= 1.2 * counted, (measured, counted)


def test_pretraining_objective_runs_the_sparse_last_layer_unless_configured_off():
    from bertjax import objectives
    from bertjax.training.step import default_step_config

    config = default_step_config()
    assert objectives.make_objective(config).model(_cfg()).sparse_last_layer
    config.loss.sparse_last_layer = False
    assert not objectives.make_objective(config).model(_cfg()).sparse_last_layer
