"""The speed layer is per platform: on XLA:CPU the hand-written backward passes, elsewhere the
fused/autodiff path, but for the loss's on GPUs, whose compiler does not fuse autodiff's (checked
here on CPU by switching `ops.platform`); dropout bits come from the key's own PRNG
implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.ops import elementwise, platform
from bertjax.ops.loss import cross_entropy

CUSTOM = ("custom_vjp_call", "custom_vjp_call_jaxpr", "custom_jvp_call")


def _primitives(jaxpr) -> set:
    """Every primitive name in a closed jaxpr, sub-jaxprs included."""
    names = set()

    def visit(j):
        for eqn in j.eqns:
            names.add(eqn.primitive.name)
            for value in eqn.params.values():
                for sub in value if isinstance(value, list | tuple) else [value]:
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        visit(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        visit(sub)

    visit(jaxpr.jaxpr)
    return names


@pytest.fixture(scope="module")
def tiny():
    cfg = bertjax.BertConfig.preset(
        "tiny", vocab_size=64, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    model = bertjax.BertForPreTraining(cfg)
    ids = jnp.ones((2, 8), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), ids)["params"]
    return model, params, ids


def _grad_jaxpr(model, params, ids):
    def loss(p):
        out = model.apply(
            {"params": p},
            ids,
            attention_mask=jnp.ones_like(ids),
            deterministic=False,
            rngs={"dropout": jax.random.key(1)},
        )
        logits = out["mlm_logits"]
        label = jnp.zeros(logits.shape[:-1], jnp.int32)
        return jnp.sum(cross_entropy(logits, label)[0])

    return jax.make_jaxpr(jax.grad(loss))(params)


@pytest.mark.parametrize("name", ["cpu", "gpu", "tpu"])
def test_hand_written_backward_passes_run_on_the_cpu_and_the_loss_on_gpus(tiny, monkeypatch, name):
    monkeypatch.setattr(platform, "on_cpu", lambda: name == "cpu")
    monkeypatch.setattr(platform, "on_tpu", lambda: name == "tpu")
    primitives = _primitives(_grad_jaxpr(*tiny))
    custom = primitives & set(CUSTOM)
    if name == "cpu":  # project, tied decoder, attention, GELU, the loss: hand-written
        assert custom, primitives
    elif name == "tpu":  # XLA sees plain products, gelu and log-softmax and fuses them
        assert not custom, custom
    else:  # XLA:GPU does not fuse autodiff's loss backward (a scatter-add): hand-written
        logits, labels = jnp.zeros((2, 8, 64)), jnp.ones((2, 8), jnp.int32)
        loss = jax.make_jaxpr(jax.grad(lambda x: cross_entropy(x, labels)[0].sum()))(logits)
        assert "scatter-add" not in _primitives(loss)
        monkeypatch.setattr(platform, "on_tpu", lambda: True)
        loss = jax.make_jaxpr(jax.grad(lambda x: cross_entropy(x, labels)[0].sum()))(logits)
        assert "scatter-add" in _primitives(loss)  # autodiff's, as on a TPU


def test_accelerator_path_gives_the_cpu_paths_values_and_gradients(tiny, monkeypatch):
    model, params, ids = tiny

    def value_and_grad():
        def loss(p):
            out = model.apply({"params": p}, ids, attention_mask=jnp.ones_like(ids))
            return jnp.sum(jnp.sin(out["mlm_logits"])) + jnp.sum(out["nsp_logits"] ** 2)

        return jax.jit(jax.value_and_grad(loss))(params)  # traced anew: reads on_cpu

    cpu_value, cpu_grad = value_and_grad()
    monkeypatch.setattr(platform, "on_cpu", lambda: False)
    value, grad = value_and_grad()
    np.testing.assert_allclose(value, cpu_value, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grad, cpu_grad
    )


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_dropout_bits_follow_the_keys_prng_implementation(impl):
    key = jax.random.key(3, impl=impl)
    shape, keep = (4, 5, 6), 0.75
    mask = elementwise.keep_mask(key, shape, keep)
    words = (np.prod(shape) + 1) // 2
    words += words % 2
    bits = jax.random.bits(key, (words,), jnp.uint32)  # the key's own generator
    halves = np.asarray(jax.lax.bitcast_convert_type(bits, jnp.uint16)).reshape(-1)
    expected = halves[: np.prod(shape)].reshape(shape) < round(keep * 65536)
    np.testing.assert_array_equal(np.asarray(mask), expected)
    assert abs(float(np.mean(mask)) - keep) < 0.1
    threefry = elementwise.keep_mask(jax.random.key(3), shape, keep)  # JAX's default key
    assert not np.array_equal(np.asarray(threefry), np.asarray(mask))


def test_on_an_accelerator_gelu_saves_only_its_input_for_the_backward(monkeypatch, capsys):
    """Autodiff of jax.nn.gelu keeps erf's intermediates (XLA:GPU wrote two [B, T, F] residuals
    a layer to HBM); under `jax.checkpoint` the backward recomputes them from the input."""
    from jax.ad_checkpoint import print_saved_residuals

    from bertjax.ops import elementwise

    monkeypatch.setattr(platform, "on_cpu", lambda: False)
    x = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.float32).reshape(8, 8)
    print_saved_residuals(elementwise.erf_gelu, x)
    saved = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(saved) == 1 and "argument" in saved[0], saved
    grad = jax.grad(lambda x: jnp.sum(elementwise.erf_gelu(x)))(x)
    expected = jax.grad(lambda x: jnp.sum(jax.nn.gelu(x, approximate=False)))(x)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
