"""The attention kernel table (bertjax/modeling/attention_kernels.py): every kernel that runs on
this machine, forced by name, against a float64 numpy port of masked softmax attention (outputs)
and autodiff of `exact_attention` (gradients) on a grid of descriptions: padded/packed rows,
global/local layers, aligned/gathered queries, dropout on/off, causal. Splash runs in Pallas
interpret mode; "cudnn" is the "xla" kernel's code with cuDNN named and needs a GPU, so it is
not in the grid. Then: a feature no fast kernel lists takes the exact path on every platform and
forcing another kernel raises; on a GPU, cuDNN serves what it can; causal attention never looks
ahead nor across packed rows."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.modeling import attention_kernels as kernels
from bertjax.modeling.attention_mask import AttentionMask
from bertjax.modeling.embeddings import position_ids
from bertjax.modeling.encoder import Encoder, layer_kinds
from bertjax.ops import platform

B, T, N, H = 2, 16, 2, 8
ROWS = 5  # gathered query rows


def _np_attention(q, k, v, visible, keep=None, rate=0.0):
    """float64 softmax(q k^T / sqrt(H)) v over the visible keys, dropout by ``keep``."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(visible, logits, -1e300)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if keep is not None:
        probs = np.where(keep, probs / (1.0 - rate), 0.0)
    return np.einsum("bnts,bsnh->btnh", probs, v)


def _np_visible(segments_q, segments_k, positions_q, positions_k, half_window, causal):
    """[B, 1, T, S] from the mask rule written out again in numpy."""
    sq, sk = segments_q[:, None, :, None], segments_k[:, None, None, :]
    offset = positions_q[:, None, :, None] - positions_k[:, None, None, :]
    visible = (sq == sk) & (sk > 0)
    if half_window:
        visible &= np.abs(offset) <= half_window
    if causal:
        visible &= offset >= 0
    return visible


@pytest.fixture(scope="module")
def rows():
    """q, k, v and the masks of padded and packed rows, and gathered query rows."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32) for _ in range(3))
    attention_mask = np.ones((B, T), np.int32)
    attention_mask[1, 11:] = 0
    segments = np.ones((B, T), np.int32)
    segments[1, 6:] = 2  # row 1: two packed sequences, then padding
    segments[1, 13:] = 0
    masks = {
        "padded": AttentionMask.build(
            jnp.asarray(attention_mask), None, position_ids(None, B, T, 0)
        ),
        "packed": AttentionMask.build(
            None, jnp.asarray(segments), position_ids(jnp.asarray(segments), B, T, 0)
        ),
    }
    gathered = jnp.asarray(np.sort(rng.permutation(T)[:ROWS]).repeat(B).reshape(ROWS, B).T)
    return q, k, v, masks, gathered


GRID = [  # kind, half_window, gathered, dropout, causal
    ("padded", 0, False, False, False),
    ("packed", 3, False, False, False),
    ("packed", 0, True, False, False),
    ("packed", 3, True, False, False),
    ("padded", 0, False, True, False),
    ("packed", 3, False, True, False),
    ("padded", 0, False, False, True),
    ("packed", 3, False, False, True),
    ("packed", 3, True, False, True),
    ("packed", 0, False, True, True),
]
RUNNABLE = [name for name in kernels.KERNEL_NAMES if name != "cudnn"]


def _spec(kind, half_window, gathered, dropout, causal):
    return kernels.AttentionSpec(
        batch=B,
        query_length=ROWS if gathered else T,
        key_length=T,
        heads=N,
        head_dim=H,
        half_window=half_window,
        causal=causal,
        packed=kind == "packed",
        gathered_rows=gathered,
        dropout=dropout,
    )


CASES = [
    pytest.param(name, case, id=f"{name}-{'-'.join(map(str, case))}")
    for case in GRID
    for name in RUNNABLE
    if kernels.BY_NAME[name].cannot_serve(_spec(*case)) is None
]


def test_every_kernel_is_in_the_grid():
    assert {name for name, _ in (p.values for p in CASES)} == set(RUNNABLE)


@pytest.mark.parametrize("name,case", CASES)
def test_kernel_equals_the_exact_reference(rows, name, case):
    q, k, v, masks, gathered = rows
    kind, half_window, gathered_rows, dropout, causal = case
    spec = _spec(*case)
    mask = masks[kind]
    real = np.asarray(mask.tokens())  # compared at real query tokens (fused: padding reads 0)
    if gathered_rows:
        q = jnp.take_along_axis(q, gathered[:, :, None, None], axis=1)
        mask = mask.at_rows(gathered)
        real = np.take_along_axis(real, np.asarray(gathered), axis=1)
    rate, keep = 0.0, None
    if dropout:
        rate = 0.25
        keep = jax.random.bernoulli(jax.random.key(2), 1 - rate, (B, N, spec.query_length, T))
    kernel = kernels.choose(spec, name)
    assert kernel.name == name

    def run(q, k, v):
        return kernel.run(spec, q, k, v, mask, keep, rate, None)

    visible = _np_visible(
        *(np.asarray(a) for a in (mask.query_segments, mask.key_segments)),
        *(np.asarray(a) for a in (mask.query_positions, mask.key_positions)),
        half_window,
        causal,
    )
    seen = (visible.any(-1)[:, 0] & real)[:, :, None, None]  # real rows that see a key
    shape = (B, spec.query_length, N, H)
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=shape) * seen, jnp.float32)

    def forward_backward(fn):  # one compile: the outputs and the gradients of <out, cotangent>
        def both(q, k, v):
            out, pullback = jax.vjp(fn, q, k, v)
            return out, pullback(cotangent)

        return both

    out, ours = jax.jit(forward_backward(run))(q, k, v)
    want = _np_attention(q, k, v, visible, None if keep is None else np.asarray(keep), rate)
    out = np.asarray(out)
    np.testing.assert_allclose(np.where(seen, out, 0), np.where(seen, want, 0), atol=3e-6)
    dense = jnp.asarray(visible)
    _, exact = jax.jit(
        forward_backward(lambda q, k, v: kernels.exact_attention(q, k, v, dense, keep, rate))
    )(q, k, v)
    for which, got, reference in zip("qkv", ours, exact):
        np.testing.assert_allclose(got, reference, atol=5e-6, err_msg=which)


@dataclasses.dataclass(frozen=True)
class _NovelSpec(kernels.AttentionSpec):
    """A description with a feature added after every kernel was written."""

    novel: bool = False


@pytest.mark.parametrize("where", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("feature", ["novel", "soft_cap", "kv_groups", "bias"])
def test_a_feature_no_fast_kernel_serves_takes_the_exact_path(monkeypatch, where, feature):
    monkeypatch.setattr(platform, "current", lambda: where)
    plain = _NovelSpec(B, T, T, N, H, half_window=3, packed=True)
    assert kernels.choose(plain).name != "exact"
    value = {"novel": True, "soft_cap": 30.0, "kv_groups": 2, "bias": True}[feature]
    spec = dataclasses.replace(plain, **{feature: value})
    assert kernels.choose(spec).name == "exact"
    for name in kernels.KERNEL_NAMES:
        if name == "exact":
            assert kernels.choose(spec, name).name == "exact"
            continue
        with pytest.raises(ValueError, match=f"'{name}'.*{name} kernel cannot serve {feature}="):
            kernels.choose(spec, name)


def test_the_exact_path_computes_soft_cap_bias_and_grouped_heads(rows):
    q, k, v, masks, _ = rows
    visible = np.asarray(masks["packed"].dense(3))
    bias = np.random.default_rng(3).normal(size=(1, N, T, T)).astype(np.float32)
    k1, v1 = k[:, :, :1], v[:, :, :1]  # one key/value head for both query heads
    out = kernels.exact_attention(q, k1, v1, visible, bias=jnp.asarray(bias), soft_cap=2.0)
    qd, kd, vd = (np.asarray(a, np.float64) for a in (q, k1, v1))
    logits = np.einsum("btnh,bsh->bnts", qd, kd[:, :, 0]) / np.sqrt(H)
    logits = 2.0 * np.tanh(logits / 2.0) + bias
    logits = np.where(visible, logits, -1e300)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bnts,bsh->btnh", probs / probs.sum(-1, keepdims=True), vd[:, :, 0])
    real = visible.any(-1)[:, 0][:, :, None, None]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, want, 0), atol=3e-6)


def test_forcing_a_kernel_outside_its_limits_raises_and_the_choice_is_logged(caplog):
    gathered = kernels.AttentionSpec(B, ROWS, T, N, H, half_window=3, gathered_rows=True)
    with pytest.raises(ValueError, match="'cpu_banded'.*cannot serve gathered_rows=True"):
        kernels.choose(gathered, "cpu_banded")
    with pytest.raises(ValueError, match="'cpu_banded'.*half_window=0"):
        kernels.choose(kernels.AttentionSpec(B, T, T, N, H), "cpu_banded")
    with pytest.raises(ValueError, match="'flash': not a kernel"):
        kernels.choose(gathered, "flash")
    with pytest.raises(ValueError, match="attention_implementation 'flash' is not one of"):
        bertjax.BertConfig.preset("tiny", attention_implementation="flash")
    spec = kernels.AttentionSpec(3, 7, 7, 1, 4)  # a description no other test uses
    q = jnp.ones((3, 7, 1, 4))
    mask = AttentionMask.build(None, None, position_ids(None, 3, 7, 0))
    with caplog.at_level(logging.INFO):
        kernels.attend(spec, q, q, q, mask)
        kernels.attend(spec, q, q, q, mask)
    logged = [r.getMessage() for r in caplog.records if "attention: the" in r.getMessage()]
    assert len(logged) == 1 and "cpu_dense kernel" in logged[0]


@pytest.mark.parametrize("implementation", [None, "cpu_blocked"])
def test_causal_outputs_never_depend_on_later_or_other_segments_tokens(implementation):
    """d out[b, i] / d x[b, j] is exactly zero for j > i and across packed sequences (and
    nonzero for j = i - 1 and i), through a two-layer causal encoder (one global layer, one
    local) on the default CPU kernel and the blocked one."""
    cfg = bertjax.BertConfig.preset(
        "tiny",
        vocab_size=32,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        causal=True,
        local_attention_window=4,
        global_attn_every_n_layers=2,
        attention_implementation=implementation,
    )
    length = 8
    segments = jnp.asarray([[1] * 8, [1] * 3 + [2] * 4 + [0]], jnp.int32)
    mask = AttentionMask.build(None, segments, position_ids(segments, 2, length, 0))
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(2, length, 16)), jnp.float32)
    encoder = Encoder(cfg)
    params = jax.jit(lambda x: encoder.init(jax.random.key(0), x, mask, True))(x)
    weights = jnp.asarray(rng.normal(size=(2, 16)), jnp.float32)

    @jax.jit
    def jacobian_rows(params, x):  # [i, B, T, D]: d <out[:, i], weights> / dx for every i
        _, pullback = jax.vjp(lambda x: encoder.apply(params, x, mask, True), x)

        def through(i):
            return pullback(jnp.zeros((2, length, 16)).at[:, i].set(weights))[0]

        return jax.vmap(through)(jnp.arange(length))

    dependence = np.abs(np.asarray(jacobian_rows(params, x))).sum(-1)
    seg = np.asarray(segments)
    for b in range(2):
        for i in range(length):
            if seg[b, i] == 0:
                continue
            for j in range(length):
                if j > i or seg[b, j] != seg[b, i]:
                    assert dependence[i, b, j] == 0.0, (b, i, j)
                elif j >= i - 1:
                    assert dependence[i, b, j] > 0.0, (b, i, j)


def test_scanned_and_unscanned_stacks_read_the_same_layer_kinds():
    """Both stacks take each layer's kind from `layer_kinds`; a scanned stack whose layers
    differ (BertConfig rejects it; forced past validation here) raises instead of repeating
    layer 0's kind."""
    cfg = bertjax.BertConfig.preset(
        "tiny", vocab_size=32, local_attention_window=4, global_attn_every_n_layers=2
    )
    kinds = layer_kinds(cfg)
    assert [k["half_window"] for k in kinds] == [0, 2]
    object.__setattr__(cfg, "scan_layers", True)
    x = jnp.zeros((1, 8, cfg.hidden_size))
    mask = AttentionMask.build(None, None, position_ids(None, 1, 8, 0))
    with pytest.raises(ValueError, match="scan_layers=True repeats one layer"):
        Encoder(cfg).init(jax.random.key(0), x, mask, True)


def test_on_a_gpu_cudnn_serves_what_it_can_and_fused_attention_the_rest(monkeypatch):
    monkeypatch.setattr(platform, "current", lambda: "gpu")
    monkeypatch.setattr(kernels, "_cudnn_installed", lambda: True)
    bf16 = kernels.AttentionSpec(B, T, T, N, H, dtype="bfloat16")
    chosen = lambda spec: kernels.choose(spec).name  # noqa: E731
    assert chosen(bf16) == "cudnn"
    assert chosen(dataclasses.replace(bf16, half_window=3, causal=True)) == "cudnn"
    assert chosen(dataclasses.replace(bf16, dtype="float32")) == "fused"  # cuDNN: bf16/fp16
    assert chosen(dataclasses.replace(bf16, half_window=3)) == "fused"  # two-sided window
    assert chosen(dataclasses.replace(bf16, packed=True)) == "fused"  # a mask, not lengths
    assert chosen(dataclasses.replace(bf16, query_length=ROWS, gathered_rows=True)) == "fused"
    assert chosen(dataclasses.replace(bf16, head_dim=12)) == "fused"  # not a multiple of 8
    assert chosen(dataclasses.replace(bf16, dropout=True)) == "exact"
    with pytest.raises(ValueError, match="'cudnn'.*a two-sided local window"):
        kernels.choose(dataclasses.replace(bf16, half_window=3), "cudnn")
    monkeypatch.setattr(kernels, "_cudnn_installed", lambda: False)
    assert chosen(bf16) == "fused"  # no cuDNN library: XLA's fused attention
