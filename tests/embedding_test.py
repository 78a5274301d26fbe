"""Embedding objective: the loss against a float64 numpy port of sentence-transformers'
MultipleNegativesRankingLoss and MatryoshkaLoss, GradCache against whole-batch gradients
(float64), and the train step on 8 devices (negatives from the whole mesh) against one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_process_worker as setup

from bertjax import step
from bertjax.modeling.embedder import pool
from bertjax.objectives.contrastive import matryoshka_info_nce
from bertjax.objectives.embedding import Embedding
from bertjax.objectives.gradcache import gradcache_gradients
from bertjax.training import sharding

# --- numpy port of sentence-transformers 6.3 (losses/multiple_negatives_ranking.py,
# losses/matryoshka.py): cos_sim, MNRL's compute_loss_from_embeddings, MatryoshkaLoss's shrink.


def _np_normalize(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _np_cos(a, b):
    return _np_normalize(a) @ _np_normalize(b).T


def _np_lse(x):
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def _np_mnrl(query, docs, scale, symmetric):
    """MNRL(directions=("query_to_doc"[, "doc_to_query"]), partition_mode="per_direction")."""
    batch = query.shape[0]
    docs_all = np.concatenate(docs, axis=0)
    sims = [_np_cos(query, docs_all) * scale]
    if symmetric:
        sims.append(_np_cos(query, docs[0]).T * scale)
    positive = sims[0][np.arange(batch), np.arange(batch)]
    log_z = sum(_np_lse(s) for s in sims) / len(sims)
    return -(positive - log_z).mean()


def _np_matryoshka(query, docs, scale, symmetric, dims, weights):
    def shrink(x, dim):
        return _np_normalize(x[..., :dim])

    return sum(
        w * _np_mnrl(shrink(query, d), [shrink(x, d) for x in docs], scale, symmetric)
        for d, w in zip(dims, weights)
    )


@pytest.mark.parametrize("symmetric", [False, True])
def test_loss_matches_sentence_transformers_formulas_float64(symmetric):
    rs = np.random.RandomState(0)
    query, docs = rs.randn(6, 12), rs.randn(6, 3, 12)  # a positive and two hard negatives each
    columns = [docs[:, k] for k in range(3)]
    with jax.enable_x64(True):
        loss, hits = matryoshka_info_nce(
            jnp.asarray(query), jnp.asarray(docs), 20.0, None, symmetric, "cos"
        )
        assert loss.dtype == jnp.float64
        np.testing.assert_allclose(
            float(jnp.mean(loss)), _np_mnrl(query, columns, 20.0, symmetric), rtol=1e-12
        )
        dims, weights = (12, 8, 4), (1.0, 0.5, 2.0)
        loss, _ = matryoshka_info_nce(
            jnp.asarray(query), jnp.asarray(docs), 50.0, None, symmetric, "cos", dims, weights
        )
        want = _np_matryoshka(query, columns, 50.0, symmetric, dims, weights)
        np.testing.assert_allclose(float(jnp.mean(loss)), want, rtol=1e-12)
        # a padding row (weight 0) leaves the other rows' losses as without it
        padded_loss, _ = matryoshka_info_nce(
            jnp.asarray(np.concatenate([query, query[:1]])),
            jnp.asarray(np.concatenate([docs, docs[:1]])),
            20.0,
            jnp.asarray([1.0] * 6 + [0.0]),
            symmetric,
            "cos",
        )
        full, _ = matryoshka_info_nce(
            jnp.asarray(query), jnp.asarray(docs), 20.0, None, symmetric, "cos"
        )
        np.testing.assert_allclose(np.asarray(padded_loss[:6]), np.asarray(full), rtol=1e-12)
    scores = _np_cos(query, np.concatenate(columns))
    np.testing.assert_array_equal(np.asarray(hits), scores.argmax(axis=1) == np.arange(6))
    with pytest.raises(ValueError, match="matryoshka_dims"):
        matryoshka_info_nce(jnp.asarray(query), jnp.asarray(docs), 20.0, None, False, "cos", (16,))


def test_pooling_modes_match_numpy():
    rs = np.random.RandomState(1)
    x = rs.randn(3, 5, 4).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    got = np.asarray(pool(jnp.asarray(x), jnp.asarray(mask), ("cls", "max", "mean", "lasttoken")))
    real = [x[i, : mask[i].sum()] for i in range(3)]
    want = np.stack(
        [np.concatenate([r[0], r.max(0), r.mean(0), r[-1]]) for r in real]
    )  # sentence-transformers concatenates the modes in the order given
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_gradcache_gradients_equal_whole_batch_float64():
    """A float64 toy encoder with dropout: GradCache's gradients (4 chunks, rng per chunk)
    equal autodiff through one pass over the same chunks, and equal the whole-batch gradients
    without dropout; a learned scale read by the loss gets its gradient too."""
    rs = np.random.RandomState(2)
    with jax.enable_x64(True):
        params = {
            "w1": jnp.asarray(rs.randn(6, 16)),
            "w2": jnp.asarray(rs.randn(16, 8)),
            "logit_scale": jnp.asarray(np.log(20.0)),
        }
        batch = {"x": jnp.asarray(rs.randn(16, 6)), "d": jnp.asarray(rs.randn(16, 2, 6))}
        rng = jax.random.key(3)

        def encode(p, x, key, rate):  # rate is traced: one compilation serves every rate
            h = jnp.tanh(x @ p["w1"])
            keep = jax.random.bernoulli(key, 1 - rate, h.shape)
            return jnp.where(keep, h / (1 - rate), 0.0) @ p["w2"]

        def embed_fn(rate):
            def embed(p, chunk, key):
                docs = encode(p, chunk["d"], jax.random.fold_in(key, 1), rate)
                return {"query": encode(p, chunk["x"], key, rate), "docs": docs}

            return embed

        def loss(p, e):
            per_query, _ = matryoshka_info_nce(
                e["query"], e["docs"], jnp.exp(p["logit_scale"]), None, True, "cos", (8, 4)
            )
            return jnp.mean(per_query), None

        def reference(p, rate, chunks):
            parts = [
                embed_fn(rate)(
                    p, jax.tree.map(lambda v, i=i: v[i::chunks], batch), jax.random.fold_in(rng, i)
                )
                for i in range(chunks)
            ]
            order = np.argsort(np.concatenate([np.arange(16)[i::chunks] for i in range(chunks)]))
            merged = jax.tree.map(lambda *xs: jnp.concatenate(xs)[order], *parts)
            return loss(p, merged)[0]

        @jax.jit
        def cached(p, rate):
            return gradcache_gradients(embed_fn(rate), loss, p, batch, rng, 4)[0]

        got = cached(params, 0.3)
        want = jax.jit(jax.grad(reference), static_argnums=2)(params, 0.3, 4)
        for name in params:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12)
        whole = jax.jit(jax.grad(lambda p: loss(p, embed_fn(0.0)(p, batch, rng))[0]))(params)
        got = cached(params, 0.0)
        for name in params:
            np.testing.assert_allclose(got[name], whole[name], rtol=1e-10, atol=1e-12)
        assert abs(float(got["logit_scale"])) > 1e-6


# --- the jitted train step: 8 devices (global negatives, GradCache) against one device ---

BATCH, QUERY_LENGTH, DOC_LENGTH = 16, 8, 12


def _config(**loss):
    config = setup.step_config()
    config.loss.objective = "embedding"
    for key, value in {"pooling": "mean", "symmetric": True, **loss}.items():
        config.loss[key] = value
    return config


def _batch():
    rs = np.random.RandomState(4)
    ids = rs.randint(5, setup.VOCAB, (BATCH, QUERY_LENGTH)).astype(np.int32)
    mask = (np.arange(QUERY_LENGTH) < rs.randint(3, QUERY_LENGTH + 1, (BATCH, 1))).astype(np.int32)
    doc_ids = rs.randint(5, setup.VOCAB, (BATCH, 2, DOC_LENGTH)).astype(np.int32)
    doc_lengths = rs.randint(4, DOC_LENGTH + 1, (BATCH, 2, 1))
    doc_mask = (np.arange(DOC_LENGTH) < doc_lengths).astype(np.int32)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "doc_input_ids": doc_ids,
        "doc_attention_mask": doc_mask,
        "weights": np.ones(BATCH, np.float32),
    }


def _one_step(config, devices):
    model_cfg = setup.tiny_model_config(num_hidden_layers=1)
    mesh = sharding.make_mesh(config.mesh, devices)
    state = step.init_train_state(config, model_cfg, mesh, jax.random.key(0))
    steps = step.jit_steps(state, mesh, step.FAST_COMPILE)
    batch = sharding.global_batch(_batch(), mesh, BATCH)
    state, metrics = steps.train(state, batch, jax.random.key(1))
    return jax.tree.map(np.asarray, state.params), jax.device_get(metrics)


@pytest.fixture(scope="module")
def one_device():
    return _one_step(_config(), jax.devices()[:1])


@pytest.mark.parametrize("chunk", [0, 4])
def test_sharded_step_equals_one_device(one_device, chunk):
    """On 8 devices the loss, metrics and updated params equal one device's on the same global
    batch: each query's candidates are the whole global batch's documents (with GradCache
    in chunks of 4 queries too)."""
    assert len(jax.devices()) == 8
    want_params, want = one_device
    config = _config(gradcache_chunk_size=chunk)
    params, metrics = _one_step(config, jax.devices())
    assert want["loss"] > np.log(2 * BATCH) - 1.0  # about log(candidates): a random encoder
    for key in ("loss", "grad_norm", "in_batch_accuracy"):
        np.testing.assert_allclose(metrics[key], want[key], rtol=2e-5, err_msg=key)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params, want_params
    )
    objective = Embedding.from_config(config)
    assert objective.gradcache_chunk_size == chunk and objective.symmetric


def test_learned_scale_takes_no_weight_decay():
    from bertjax.training.param_groups import weight_decay_mask

    mask = weight_decay_mask({"logit_scale": np.float32(3.0), "bert": {"kernel": np.ones((2, 2))}})
    assert mask == {"logit_scale": False, "bert": {"kernel": True}}


def test_config_errors_name_the_key():
    config = _config(pooling="sum")
    with pytest.raises(ValueError, match="config.loss.pooling"):
        Embedding.from_config(config)
    config = _config()
    config.optim.grad_accum_steps = 2  # in-batch negatives: the step refuses accumulation
    with pytest.raises(ValueError, match="grad_accum_steps=2"):
        step.StepSpec.from_config(config, setup.tiny_model_config(num_hidden_layers=1))
    config = _config(matryoshka_dims=(8, 4), matryoshka_weights=(1.0,))
    with pytest.raises(ValueError, match="matryoshka_weights"):
        Embedding.from_config(config)
