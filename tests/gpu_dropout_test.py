"""GPU attention dropout made right (bertjax/ops/cudnn_dropout.py, bertjax/ops/dropout_check.py),
as far as a CPU shows it: each device's cuDNN call gets a seed of its own (the GPU code path's
folding, run here with a stand-in call that draws its mask from the seed, and traced with cuDNN's
real call); GradCache refuses cuDNN; the forward/backward agreement check passes the exact path
and catches a backward that draws another mask; and a failed start-up check turns cuDNN's
dropout off for the run, with one line."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import bertjax
from bertjax.modeling import attention_kernels as kernels
from bertjax.modeling.attention_mask import AttentionMask
from bertjax.modeling.embeddings import position_ids
from bertjax.modeling.encoder import Encoder
from bertjax.objectives import gradcache
from bertjax.ops import cudnn_dropout, dropout_check, keep_bits, platform
from bertjax.training import sharding

RATE = 0.25


def _stand_in(seed, q, k, v, lengths):
    """A CPU stand-in for one device's cuDNN call: exact attention whose keep mask is a function
    of the static seed alone (as cuDNN's bits are, for a given execution count)."""
    words = jnp.asarray([seed, seed ^ 0x5BD1E995], jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(q.shape[1], dtype=jnp.int32), q.shape[:2])
    keep = keep_bits.dense(words, positions, k.shape[1], q.shape[2], RATE)
    mask = (jnp.arange(k.shape[1])[None, :] < lengths[:, None])[:, None, None, :]
    return kernels.exact_attention(q, k, v, mask, keep, RATE)


@pytest.fixture(scope="module")
def mesh8():
    return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def test_each_device_draws_its_own_mask_through_the_gpu_paths_seed_folding(mesh8):
    """8 data-parallel devices holding equal rows: every device's output differs (its own seed:
    before, all eight dropped the same elements), and device d's is the call with
    ``device_seed(base, d)``; the same under the step's per-replica shard_map and under plain
    jit (the call's own shard_map)."""
    rng = np.random.default_rng(0)
    row = [rng.normal(size=(1, 8, 2, 4)).astype(np.float32) for _ in range(3)]
    q, k, v = (jnp.asarray(np.repeat(x, 8, axis=0)) for x in row)
    lengths = jnp.full((8,), 8, jnp.int32)
    rows = NamedSharding(mesh8, PartitionSpec("data"))
    q, k, v, lengths = jax.device_put((q, k, v, lengths), rows)
    partition = PartitionSpec("data", None, None, None)

    def attention(q, k, v, lengths):
        return cudnn_dropout.attention(q, k, v, RATE, lengths, partition=partition, call=_stand_in)

    in_step = jax.shard_map(attention, mesh=mesh8, in_specs=PartitionSpec("data"),
                            out_specs=PartitionSpec("data"), check_vma=False)  # fmt: skip
    with jax.set_mesh(mesh8):
        outs = [np.asarray(jax.jit(f)(q, k, v, lengths)) for f in (attention, in_step)]
    expected = [
        np.asarray(_stand_in(cudnn_dropout.device_seed(0, d), *(x[:1] for x in (q, k, v)),
                             lengths[:1]))[0]
        for d in range(8)
    ]  # fmt: skip
    for out in outs:
        np.testing.assert_allclose(out, np.stack(expected), rtol=1e-5, atol=1e-6)
        assert len({o.tobytes() for o in out}) == 8  # equal rows, eight different masks


def test_the_real_cudnn_call_gets_a_seed_per_layer_and_device_in_the_traced_step(monkeypatch):
    """cuDNN's own call in a 2-layer encoder's gradient traced for 8 GPUs (data parallel): a
    switch over the device index with 8 branches a layer, 16 distinct seeds, each shared by its
    forward and backward; GradCache refuses the kernel (the exact path serves it)."""
    cfg = bertjax.BertConfig.preset(
        "tiny", vocab_size=32, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=2, dtype="bfloat16", attention_probs_dropout_prob=0.125,
    )  # fmt: skip
    x = jnp.zeros((8, 8, 32), jnp.bfloat16)
    mask = AttentionMask.build(jnp.ones((8, 8), jnp.int32), None, position_ids(None, 8, 8, 0))
    monkeypatch.setattr(platform, "current", lambda: "gpu")
    monkeypatch.setattr(kernels, "_cudnn_installed", lambda: True)
    monkeypatch.setattr(cudnn_dropout.fused(), "check_cudnn_version", lambda: 91000)
    params = jax.eval_shape(lambda: Encoder(cfg).init(jax.random.key(0), x, mask, True))
    mesh = sharding.make_mesh(sharding.default_mesh_config())  # the run's: 8 data replicas

    def loss(params):
        out = Encoder(cfg).apply(params, x, mask, False, rngs={"dropout": jax.random.key(1)})
        return jnp.sum(out.astype(jnp.float32))

    def traced(fn):
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            nn.logical_axis_rules(sharding.logical_axis_rules()),
            kernels.recording() as record,
        ):
            return str(jax.make_jaxpr(fn)(params)), kernels.summary(record)

    text, used = traced(jax.grad(loss))
    assert used == {"cudnn: global, T=8, dropout": 2}
    seeds = re.findall(r"seed=(\d+)", text)
    assert len(set(seeds)) == 16 and len(seeds) == 32  # each in a forward and a backward
    assert text.count("axis_index") >= 2
    with cudnn_dropout.refused(gradcache.REFUSAL):
        _, used = traced(jax.grad(loss))
    assert set(used) == {"exact: global, T=8, dropout"}


def _another_mask(attend):
    """``attend`` whose backward draws its mask from another key: what the check must catch."""

    def broken(q, k, v, key):
        @jax.custom_vjp
        def run(v):
            return attend(q, k, v, key)

        def forward(v):
            return run(v), v

        def backward(v, d_out):
            return jax.vjp(lambda v: attend(q, k, v, jax.random.fold_in(key, 1)), v)[1](d_out)

        run.defvjp(forward, backward)
        return run(v)

    return broken


def test_the_agreement_check_passes_the_exact_path_and_catches_another_mask():
    exact = dropout_check.default_attend("exact")
    shapes = {"modes": ("plain",), "batch": 1, "length": 32, "heads": 1}
    [good] = dropout_check.check(exact, **shapes)
    [bad] = dropout_check.check(_another_mask(exact), **shapes)
    assert good.ok and good.error < 1e-2 and abs(good.dropped - dropout_check.RATE) < 0.05
    assert not bad.ok and bad.error > 0.2, bad.line()


def test_a_failed_startup_check_turns_cudnn_dropout_off_with_one_line(monkeypatch):
    """The start-up check forced to fail (a backward with another mask): one line, and cuDNN no
    longer serves attention dropout in this process (the exact path does); CPU runs and runs
    without attention dropout check nothing."""
    cfg = bertjax.BertConfig.preset("tiny", attention_probs_dropout_prob=0.1)
    monkeypatch.setattr(kernels, "_cudnn_installed", lambda: True)
    spec = kernels.AttentionSpec(2, 64, 64, 2, 64, dropout=True, dtype="bfloat16")
    broken = _another_mask(dropout_check.default_attend("exact"))
    assert dropout_check.startup("cpu", cfg, broken) is None
    assert (
        dropout_check.startup("gpu", cfg.replace(attention_probs_dropout_prob=0.0), broken) is None
    )
    try:
        line = dropout_check.startup("gpu", cfg, broken)
        assert line is not None and "\n" not in line and "exact path" in line, line
        assert "start-up check" in kernels.BY_NAME["cudnn"].cannot_serve(spec)
        monkeypatch.setattr(platform, "current", lambda: "gpu")
        assert kernels.choose(spec).name == "exact"
        with pytest.raises(ValueError, match="start-up check"):
            kernels.choose(spec, "cudnn")
    finally:
        cudnn_dropout.enable()
    assert kernels.choose(spec).name == "cudnn"


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_hidden_dropout_bits_on_an_accelerator_come_from_a_counter_hash(rate, monkeypatch):
    """On a GPU or TPU a threefry key's dropout bits are a counter hash of the element's place
    (`elementwise.hashed_words`: no threefry kernel writing words to HBM, only the two seed
    words drawn from the key): the kept fraction is 1 - rate, neighbours, rows and the two
    halves of a word are uncorrelated, the same key gives the same mask, another key another.
    Each element's 16 bits are its word's half taken by shifts (`hashed_halves`), the halves a
    bitcast to uint16 gives, with no 16-bit array in the program (XLA did not fuse that
    bitcast: the words went through HBM)."""
    from bertjax.ops import elementwise

    monkeypatch.setattr(platform, "on_cpu", lambda: False)
    shape = (32, 16, 257)

    def mask(seed):
        return np.asarray(elementwise.keep_mask(jax.random.key(seed), shape, 1 - rate))

    keep = mask(3)
    n = keep.size
    assert keep.shape == shape and abs(keep.mean() - (1 - rate)) < 5 * np.sqrt(
        rate * (1 - rate) / n
    )
    flat = keep.reshape(-1, shape[-1]).astype(np.float64)
    for a, b in ((flat[:, 0:-1:2], flat[:, 1::2]), (flat[:-1], flat[1:])):  # halves; rows
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
    np.testing.assert_array_equal(keep, mask(3))
    assert (keep != mask(4)).mean() > 0.05
    text = str(jax.make_jaxpr(lambda k: elementwise.keep_mask(k, shape, 1 - rate))(
        jax.random.key(3)))  # fmt: skip
    assert re.findall(r"random_bits\[[^\]]*shape=\(([^)]*)\)", text) == ["2,"], text
    assert "u16" not in text, text
    words = elementwise.hashed_words(jax.random.key(3), (*shape[:-1], (shape[-1] + 1) // 2))
    halves = np.asarray(jax.lax.bitcast_convert_type(words, jnp.uint16))  # [..., 129, 2]
    halves = halves.reshape(*shape[:-1], -1)[..., : shape[-1]]
    np.testing.assert_array_equal(keep, halves < round((1 - rate) * 65536))


def test_the_hbm_estimate_counts_one_branch_of_a_switch():
    """A device's switch runs one branch (cuDNN's per-device seeds are 8 branches of one call):
    the HBM estimate of XLA's compiled switch counts one branch's traffic, not every branch's."""
    from bertjax.aot import hlo

    x = jnp.zeros((512, 512), jnp.float32)
    branches = [lambda x, k=k: jnp.sin(x * (k + 1.0)) for k in range(8)]
    switch = jax.jit(lambda i, x: jax.lax.switch(i, branches, x)).lower(0, x).compile()
    one = jax.jit(branches[0]).lower(x).compile()
    one_bytes = hlo.hbm_traffic(one.as_text())
    assert one_bytes >= 2 * x.nbytes  # read and written
    assert hlo.hbm_traffic(switch.as_text()) < 2 * one_bytes, switch.as_text()
