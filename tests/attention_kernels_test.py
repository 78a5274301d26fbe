"""The attention kernel table (bertjax/modeling/attention_kernels.py): every kernel that runs on
this machine, forced by name, against float64 numpy outputs and gradients
(tests/attention_reference.py) on a grid derived from `AttentionSpec`'s features: no feature,
each feature alone, and each kernel's served features all at once; a kernel runs every case it
serves. A new feature needs its grid value in `VALUES` and its computation in the references
(`_inputs`, attention_reference.py); the grid, the kernels' cases and the report
(`attention_kernels.describe`) then follow, and a feature missing from any of them fails a test
that names it. Splash and flash_dropout run in Pallas interpret mode; "cudnn" is the "xla"
kernel's code with cuDNN named and needs a GPU, so it is not in the grid. Dropout's bits are what
the kernel draws from the key (`Kernel.draw_keep`): a keep mask, or flash_dropout's seed, whose
bits the reference recomputes (`attention_reference.hashed_keep`). Then: a feature no fast
kernel lists takes the exact path on every platform and forcing another kernel raises; on a GPU,
cuDNN serves what it can; on a TPU, dropout takes flash_dropout; causal attention never looks
ahead nor across packed rows."""

import dataclasses
import inspect
import logging
import re
import types

import attention_reference as reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.modeling import attention_kernels as kernels
from bertjax.modeling.attention import SelfAttention
from bertjax.modeling.attention_mask import AttentionMask
from bertjax.modeling.embeddings import position_ids
from bertjax.modeling.encoder import Encoder, layer_kinds
from bertjax.ops import cudnn_dropout, elementwise, keep_bits, platform

B, T, N, H = 2, 16, 2, 8
ROWS = 5  # gathered query rows
RATE = 0.25  # dropout rate

# Each feature's value in the grid (a non-default that the shapes above allow).
VALUES = {
    "half_window": 3,
    "causal": True,
    "packed": True,
    "gathered_rows": True,
    "dropout": True,
    "bias": True,
    "soft_cap": 2.0,  # the logits here reach ~8: the cap bends them
    "kv_groups": 2,  # both query heads read one key/value head
}
RUNNABLE = [name for name in kernels.KERNEL_NAMES if name != "cudnn"]


def _spec(features: dict) -> kernels.AttentionSpec:
    rows = ROWS if features.get("gathered_rows") else T
    return kernels.AttentionSpec(B, rows, T, N, H, **features)


def _grid() -> list[dict]:
    """Feature sets (at their `VALUES`): none; each alone; each kernel's served ones at once."""
    known = [f for f in kernels.FEATURES if f in VALUES]  # the others fail a test by name
    sets = [(), *((f,) for f in known)]
    for kernel in kernels.KERNELS:
        sets.append(tuple(f for f in known if kernel.serves is None or f in kernel.serves))
    return [{f: VALUES[f] for f in features} for features in dict.fromkeys(sets)]


GRID = _grid()
CASES = [
    pytest.param(name, features, id=f"{name}-{'+'.join(features) or 'plain'}")
    for features in GRID
    for name in RUNNABLE
    if kernels.BY_NAME[name].cannot_serve(_spec(features)) is None
]


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
        False: AttentionMask.build(jnp.asarray(attention_mask), None, position_ids(None, B, T, 0)),
        True: AttentionMask.build(
            None, jnp.asarray(segments), position_ids(jnp.asarray(segments), B, T, 0)
        ),
    }
    gathered = jnp.asarray(np.sort(rng.permutation(T)[:ROWS]).repeat(B).reshape(ROWS, B).T)
    return q, k, v, masks, gathered


def _inputs(spec, rows, kernel=kernels.BY_NAME["exact"]) -> types.SimpleNamespace:
    """What ``kernel`` is given for ``spec``, and where its outputs are compared: at real query
    tokens that see a key (fused kernels write 0 at padding); ``dense_keep``: its dropout's keep
    mask, for the reference."""
    q, k, v, masks, gathered = rows
    mask = masks[bool(spec.packed)]
    real = np.asarray(mask.tokens())
    if spec.gathered_rows:
        q = jnp.take_along_axis(q, gathered[:, :, None, None], axis=1)
        mask = mask.at_rows(gathered)
        real = np.take_along_axis(real, np.asarray(gathered), axis=1)
    heads = N // spec.kv_groups
    k, v = k[:, :, :heads], v[:, :, :heads]
    rng = np.random.default_rng(1)
    keep, dense_keep, rate, bias = None, None, 0.0, None
    shape_BNTS = (B, N, spec.query_length, T)
    if spec.dropout:
        keep = dense_keep = kernel.draw_keep(spec, jax.random.key(2), RATE)
        rate = RATE
        if keep.dtype != bool:  # a seed: the kernel regenerates its bits
            dense_keep = reference.hashed_keep(keep, mask.query_positions, T, N, RATE)
    if spec.bias:
        bias = jnp.asarray(rng.normal(size=shape_BNTS), jnp.float32)
    visible = reference.visible(
        *(np.asarray(a) for a in (mask.query_segments, mask.key_segments)),
        *(np.asarray(a) for a in (mask.query_positions, mask.key_positions)),
        spec.half_window,
        spec.causal,
    )
    seen = (visible.any(-1)[:, 0] & real)[:, :, None, None]
    cotangent = jnp.asarray(rng.normal(size=(B, spec.query_length, N, H)) * seen, jnp.float32)
    return types.SimpleNamespace(
        q=q,
        k=k,
        v=v,
        mask=mask,
        keep=keep,
        dense_keep=dense_keep,
        rate=rate,
        bias=bias,
        visible=visible,
        seen=seen,
        cotangent=cotangent,
    )


def _want(spec, x):
    """The float64 outputs and gradients of ``spec`` on inputs ``x``."""
    return reference.attention(
        spec, x.q, x.k, x.v, x.visible, x.dense_keep, x.rate, x.bias, x.cotangent
    )


class _Reads:
    """``spec`` noting which of its fields are read."""

    def __init__(self, spec):
        self._spec, self.read = spec, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._spec, name)


def test_every_feature_has_a_grid_value_and_is_computed_by_the_references(rows):
    missing = [f for f in kernels.FEATURES if f not in VALUES]
    assert not missing, (
        f"AttentionSpec features without a value in the test grid: {missing}; give each a "
        "value in VALUES and compute it in _inputs or tests/attention_reference.py"
    )
    spec = _Reads(_spec(VALUES))  # every feature set
    _want(spec, _inputs(spec, rows))
    unread = [f for f in kernels.FEATURES if f not in spec.read]
    assert not unread, f"AttentionSpec features the numpy references never read: {unread}"


def test_every_kernel_is_checked_on_every_feature_it_serves():
    for name in RUNNABLE:
        kernel = kernels.BY_NAME[name]
        served = kernels.FEATURES if kernel.serves is None else sorted(kernel.serves)
        checked = {f for p in CASES if p.values[0] == name for f in p.values[1]}
        assert set(served) <= checked, f"{name} serves {set(served) - checked}, never checked"


def test_the_report_names_every_feature():
    """`describe` (bertjax.compile's report of kernels, train.py's line) shows every feature a
    description sets, one its code has never heard of too."""
    plain = _NovelSpec(B, T, T, N, H)
    for feature in (*kernels.FEATURES, "novel"):
        value = VALUES.get(feature, True)
        spec = dataclasses.replace(plain, **{feature: value})
        assert kernels.describe(spec) != kernels.describe(plain), f"the report omits {feature}"
    assert kernels.describe(dataclasses.replace(plain, novel=True)).endswith(", novel")
    record = [(_spec({"half_window": 3, "packed": True}), "cpu_banded")] * 2
    assert kernels.summary(record) == {"cpu_banded: local 7, T=16, packed": 2}


@pytest.mark.parametrize("name,features", CASES)
def test_kernel_equals_the_float64_reference(rows, name, features):
    spec = _spec(features)
    kernel = kernels.choose(spec, name)
    assert kernel.name == name
    x = _inputs(spec, rows, kernel)

    @jax.jit
    def forward_backward(q, k, v):  # one compile: the outputs and the gradients
        out, pullback = jax.vjp(
            lambda q, k, v: kernel.run(spec, q, k, v, x.mask, x.keep, x.rate, x.bias), q, k, v
        )
        return out, pullback(x.cotangent)

    out, grads = forward_backward(x.q, x.k, x.v)
    want, want_grads = _want(spec, x)
    np.testing.assert_allclose(np.where(x.seen, out, 0), np.where(x.seen, want, 0), atol=3e-6)
    for which, got, expected in zip("qkv", grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=5e-6, err_msg=which)


@dataclasses.dataclass(frozen=True)
class _NovelSpec(kernels.AttentionSpec):
    """A description with a feature added after every kernel was written."""

    novel: bool = False


FAST = [k for k in kernels.KERNELS if k.serves is not None]
UNSERVED = [f for f in kernels.FEATURES if not any(f in k.serves for k in FAST)]


@pytest.mark.parametrize("where", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("feature", ["novel", *UNSERVED])
def test_a_feature_no_fast_kernel_serves_takes_the_exact_path(monkeypatch, where, feature):
    monkeypatch.setattr(platform, "current", lambda: where)
    plain = _NovelSpec(B, T, T, N, H, half_window=3, packed=True)
    assert kernels.choose(plain).name != "exact"
    spec = dataclasses.replace(plain, **{feature: VALUES.get(feature, True)})
    assert kernels.choose(spec).name == "exact"
    for name in kernels.KERNEL_NAMES:
        if name == "exact":
            assert kernels.choose(spec, name).name == "exact"
            continue
        with pytest.raises(ValueError, match=f"'{name}'.*{name} kernel cannot serve {feature}="):
            kernels.choose(spec, name)


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
    assert chosen(dataclasses.replace(bf16, dropout=True)) == "cudnn"  # cuDNN draws the bits
    with pytest.raises(ValueError, match="'cudnn'.*a two-sided local window"):
        kernels.choose(dataclasses.replace(bf16, half_window=3), "cudnn")
    monkeypatch.setattr(kernels, "_cudnn_installed", lambda: False)
    assert chosen(bf16) == "fused"  # no cuDNN library: XLA's fused attention


def test_on_a_tpu_dropout_takes_the_kernel_that_regenerates_its_bits(monkeypatch, rows):
    """On a TPU attention with dropout takes flash_dropout (splash and fused attention keep
    what has none); `attend` draws from the layer's key what the chosen kernel takes: the exact
    path the keep mask it always drew, flash_dropout the seed of its own bits."""
    monkeypatch.setattr(platform, "current", lambda: "tpu")
    plain = kernels.AttentionSpec(B, T, T, N, H, dtype="bfloat16")
    gathered = dataclasses.replace(plain, query_length=ROWS, gathered_rows=True)
    chosen = lambda spec, **f: kernels.choose(dataclasses.replace(spec, **f)).name  # noqa: E731
    assert chosen(plain) == "splash" and chosen(gathered) == "fused"
    assert chosen(plain, dropout=True) == chosen(gathered, dropout=True) == "flash_dropout"
    assert chosen(plain, dropout=True, packed=True, half_window=3, causal=True) == "flash_dropout"
    assert chosen(plain, dropout=True, kv_groups=2) == "exact"
    key = jax.random.key(2)
    spec = dataclasses.replace(plain, dropout=True)
    np.testing.assert_array_equal(
        kernels.BY_NAME["exact"].draw_keep(spec, key, RATE),
        elementwise.keep_mask(key, (B, N, T, T), 1 - RATE),
    )
    seed = kernels.BY_NAME["flash_dropout"].draw_keep(spec, key, RATE)
    np.testing.assert_array_equal(seed, keep_bits.seed_words(key))
    q, k, v, masks, _ = rows
    with pytest.raises(ValueError, match="flash_dropout kernel draws its own keep-bits"):
        kernels.attend(spec, q, k, v, masks[False], jnp.ones((B, N, T, T), bool), RATE,
                       implementation="flash_dropout")  # fmt: skip


def test_a_raw_dropout_key_draws_what_its_typed_key_draws():
    """`attend` tells the layer's dropout key from a keep mask by its key type: a raw key
    (jax.random.PRNGKey's uint32 words) is wrapped first, so it drops what its typed key does."""
    cfg = bertjax.BertConfig.preset(
        "tiny", vocab_size=32, hidden_size=16, num_attention_heads=2, intermediate_size=32,
        attention_probs_dropout_prob=0.3,
    )  # fmt: skip
    layer = SelfAttention(cfg)
    x = jnp.asarray(np.random.default_rng(5).normal(size=(B, T, 16)), jnp.float32)
    mask = AttentionMask.build(None, None, position_ids(None, B, T, 0))
    variables = layer.init(jax.random.key(0), x, mask, True)

    def apply(key, deterministic=False):
        return layer.apply(variables, x, mask, deterministic, rngs={"dropout": key})

    @jax.jit
    def three(raw):  # one compile: the raw key, its typed key, no dropout
        return apply(raw), apply(jax.random.wrap_key_data(raw)), apply(raw, True)

    from_raw, from_typed, deterministic = three(jax.random.PRNGKey(3))
    np.testing.assert_array_equal(from_raw, from_typed)
    assert np.abs(from_raw - deterministic).max() > 1e-3


def test_the_private_cudnn_call_the_dropout_path_uses_is_still_there():
    """bertjax/ops/cudnn_dropout.py calls a private JAX function (jax.nn's cuDNN path takes no
    dropout): a JAX release that moves it or renames its arguments fails here, by name."""
    module = cudnn_dropout.fused()
    parameters = inspect.signature(module.dot_product_attention).parameters
    missing = [name for name in cudnn_dropout.ARGUMENTS if name not in parameters]
    assert not missing, f"{cudnn_dropout.PRIVATE}.dot_product_attention lost {missing}"
    assert {"PADDING", "PADDING_CAUSAL", "NO_MASK"} <= set(module.MaskType.__members__)
    from flax.linen import module as flax_module  # the layer's path gives its seed

    assert isinstance(flax_module._context.module_stack, list)


def test_on_a_gpu_cudnn_drops_probabilities_with_a_seed_per_layer(monkeypatch):
    """What is checked without a GPU: a BERT train step's attention with dropout goes to cuDNN's
    fused call (forward and backward), at the config's rate, with one seed per layer shared by
    the layer's forward and backward; scanned and shared stacks are refused. cuDNN's bits and
    numbers need a GPU (benchmarks/step/gpu_checks.py)."""
    cfg = bertjax.BertConfig.preset(
        "tiny", vocab_size=32, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=2, dtype="bfloat16", attention_probs_dropout_prob=0.125,
    )  # fmt: skip
    x = jnp.zeros((2, 8, 32), jnp.bfloat16)
    mask = AttentionMask.build(jnp.ones((2, 8), jnp.int32), None, position_ids(None, 2, 8, 0))
    monkeypatch.setattr(platform, "current", lambda: "gpu")
    monkeypatch.setattr(kernels, "_cudnn_installed", lambda: True)
    monkeypatch.setattr(cudnn_dropout.fused(), "check_cudnn_version", lambda: 91000)

    def gradient_program(cfg):  # traced, never compiled (no GPU here)
        params = jax.eval_shape(lambda: Encoder(cfg).init(jax.random.key(0), x, mask, True))

        def loss(params):
            out = Encoder(cfg).apply(params, x, mask, False, rngs={"dropout": jax.random.key(1)})
            return jnp.sum(out.astype(jnp.float32))

        with kernels.recording() as record:
            text = str(jax.make_jaxpr(jax.grad(loss))(params))
        return text, kernels.summary(record)

    text, used = gradient_program(cfg)
    assert used == {"cudnn: global, T=8, dropout": 2}
    call = r"dot_product_attention_(fwd|bwd)\w*\[[^\]]*?dropout_rate=([\d.]+)"
    calls = re.findall(call, text)
    assert sorted(calls) == [("bwd", "0.125")] * 2 + [("fwd", "0.125")] * 2, calls
    seeds = re.findall(r"seed=(\d+)", text)
    assert len(seeds) == 4 and len(set(seeds)) == 2  # a layer's forward and backward share one
    for change, reason in (
        ({"scan_layers": True}, "scan_layers"),
        ({"num_hidden_groups": 1}, "shared"),
    ):
        other = dataclasses.replace(cfg, **change)
        _, used = gradient_program(other)
        assert set(used) == {"exact: global, T=8, dropout"}, change  # the automatic choice
        with pytest.raises(ValueError, match=f"cudnn kernel cannot serve {reason}"):
            gradient_program(dataclasses.replace(other, attention_implementation="cudnn"))
