"""Center tiling (bertjax.interop.tiling) against a numpy port of ModernBERT's procedure, and a
small ModernBERT tiled into a wider, deeper one that then runs."""

import logging

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.interop.tiling import layer_map, tile_params, tile_tensor

_TINY = dict(
    vocab_size=64,
    pad_token_id=0,
    unk_token_id=1,
    cls_token_id=2,
    sep_token_id=3,
    mask_token_id=4,
    max_position_embeddings=64,
)


# ModernBERT src/bert_layers/initialization.py, _tile_1d / _tile_2d (tile_weights_from_middle):
# the old tensor at offset (new - old) // 2, then the sides filled by wrapping, loop by loop.
def _modernbert_tile_1d(old, size):
    n = old.shape[0]
    offset = (size - n) // 2
    result = np.zeros(size, old.dtype)
    result[offset : offset + n] = old
    for i in range(offset):
        result[offset - 1 - i] = old[n - 1 - (i % n)]
    for i in range(offset + n, size):
        result[i] = old[(i - offset) % n]
    return result


def _modernbert_tile_2d(old, shape):
    (height, width), (new_height, new_width) = old.shape, shape
    h_off, w_off = (new_height - height) // 2, (new_width - width) // 2
    wide = np.zeros((height, new_width), old.dtype)
    wide[:, w_off : w_off + width] = old
    for i in range(w_off):
        wide[:, i] = wide[:, w_off + width - 1 - (w_off - i - 1) % width]
    for i in range(w_off + width, new_width):
        wide[:, i] = wide[:, w_off + (i - w_off) % width]
    result = np.zeros(shape, old.dtype)
    result[h_off : h_off + height] = wide
    for i in range(h_off):
        result[h_off - 1 - i] = wide[(height - 1) - (i % height)]
    for i in range(h_off + height, new_height):
        result[i] = wide[(i - h_off) % height]
    return result


def _config(**fields):
    return bertjax.BertConfig.preset("modernbert-tiny", **{**_TINY, **fields})


def _random_tree(model, seed, ids):
    """The model's parameter tree (plain dicts) filled with random normals, without an init."""
    shapes = flax.core.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), ids)))
    leaves, treedef = jax.tree_util.tree_flatten(shapes["params"])
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_unflatten(
        treedef, [rng.normal(size=x.shape).astype(x.dtype) for x in leaves]
    )


@pytest.mark.parametrize("old, new", [(5, 5), (5, 8), (5, 9), (6, 17), (4, 15), (3, 20)])
def test_tile_1d_matches_modernbert(old, new):
    weights = np.random.default_rng(old * new).normal(size=old)
    np.testing.assert_array_equal(tile_tensor(weights, (new,)), _modernbert_tile_1d(weights, new))


@pytest.mark.parametrize("old, new", [((3, 4), (3, 4)), ((3, 4), (8, 7)), ((5, 2), (6, 13))])
def test_tile_2d_matches_modernbert(old, new):
    weights = np.random.default_rng(sum(new)).normal(size=old)
    np.testing.assert_array_equal(tile_tensor(weights, new), _modernbert_tile_2d(weights, new))


def test_layer_map_base_to_large():
    want = [0, 1, 2, 2, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 12, 13, 13, 14, 15, 16, 16, 17, 18]
    assert layer_map(22, 28) == want + [19, 20, 20, 21]
    assert layer_map(4, 12) == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3]  # round(11 / 3) = 4: capped


@pytest.fixture(scope="module")
def tiled():
    """modernbert-tiny (4 layers, D 128 = 2 x 64 heads, F 192) tiled into 7 layers of D 192 (3
    heads: the width grows by a head and a half) and F 251 (an odd growth)."""
    small_cfg = _config()
    large_cfg = _config(
        num_hidden_layers=7, hidden_size=192, num_attention_heads=3, intermediate_size=251
    )
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 64, size=(2, 24)), jnp.int32)
    small = _random_tree(bertjax.BertForPreTraining(small_cfg, next_sentence=False), 1, ids)
    large_model = bertjax.BertForPreTraining(large_cfg, next_sentence=False)
    fresh = flax.core.meta.unbox(large_model.init(jax.random.key(2), ids)["params"])
    params = tile_params(small_cfg, small, large_cfg, fresh)
    return dict(small=small, fresh=fresh, params=params, model=large_model, ids=ids)


def test_tiled_tree_has_the_large_structure_and_runs(tiled):
    params, fresh = tiled["params"], tiled["fresh"]
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(fresh)
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), params)
    assert shapes == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), fresh)
    out = tiled["model"].apply({"params": params}, tiled["ids"])
    assert out["mlm_logits"].shape == (2, 24, 64)
    assert np.isfinite(np.asarray(out["mlm_logits"])).all()


def test_tiled_values_follow_modernbert(tiled):
    small, params = tiled["small"], tiled["params"]
    small_layers, large_layers = small["bert"]["encoder"], params["bert"]["encoder"]
    for i, j in enumerate(layer_map(4, 7)):
        old, new = small_layers[f"layer_{j}"], large_layers[f"layer_{i}"]
        query = old["attention"]["query_kernel"].reshape(128, 128)  # [D, N*H]: Wq as a matrix
        want = _modernbert_tile_2d(query, (192, 192)).reshape(192, 3, 64)
        np.testing.assert_array_equal(new["attention"]["query_kernel"], want)
        out = old["attention"]["output_kernel"].reshape(128, 128)
        want = _modernbert_tile_2d(out, (192, 192)).reshape(3, 64, 192)
        np.testing.assert_array_equal(new["attention"]["output_kernel"], want)
        gate_in = old["mlp"]["intermediate"]["kernel"]  # [D, 2F]: input half, then gate half
        want = [_modernbert_tile_2d(half, (192, 251)) for half in np.split(gate_in, 2, axis=1)]
        np.testing.assert_array_equal(new["mlp"]["intermediate"]["kernel"], np.hstack(want))
        want = _modernbert_tile_2d(old["mlp"]["output"]["kernel"], (251, 192))
        np.testing.assert_array_equal(new["mlp"]["output"]["kernel"], want)
        want = _modernbert_tile_1d(old["output_norm"]["scale"], 192)
        np.testing.assert_array_equal(new["output_norm"]["scale"], want)
    words = small["bert"]["embeddings"]["word_embeddings"]  # [V, D]: the width only
    want = np.stack([_modernbert_tile_1d(row, 192) for row in words])
    np.testing.assert_array_equal(params["bert"]["embeddings"]["word_embeddings"], want)
    head = params["mlm_head"]
    np.testing.assert_array_equal(head["bias"], small["mlm_head"]["bias"])
    want = _modernbert_tile_2d(small["mlm_head"]["transform"]["kernel"], (192, 192))
    np.testing.assert_array_equal(head["transform"]["kernel"], want)
    # ModernBERT's init_model_from_pretrained never tiles final_norm: it keeps the fresh init
    fresh_norm = tiled["fresh"]["bert"]["encoder"]["final_norm"]["scale"]
    np.testing.assert_array_equal(params["bert"]["encoder"]["final_norm"]["scale"], fresh_norm)
    np.testing.assert_array_equal(fresh_norm, np.ones(192))
    # layer 0 has no attention norm (first_attention_norm=False) in either model
    assert "attention_norm" not in large_layers["layer_0"]


def test_equal_sizes_come_back_unchanged(tiled):
    cfg, small = _config(), tiled["small"]
    other = jax.tree_util.tree_map(np.zeros_like, small)
    same = tile_params(cfg, small, cfg, other)
    final_norm = same["bert"]["encoder"].pop("final_norm")  # never tiled: the large init stays
    jax.tree_util.tree_map(
        np.testing.assert_array_equal, final_norm, other["bert"]["encoder"]["final_norm"]
    )
    small = {**small, "bert": {**small["bert"], "encoder": dict(small["bert"]["encoder"])}}
    small["bert"]["encoder"].pop("final_norm")
    jax.tree_util.tree_map(np.testing.assert_array_equal, same, small)


def test_missing_leaves_keep_the_large_init(tiled, caplog):
    """A head the small model lacks (here the pooler and NSP head) keeps its fresh values."""
    small_cfg, large_cfg = _config(), _config(hidden_size=192, num_attention_heads=3)
    large = _random_tree(bertjax.BertForPreTraining(large_cfg), 3, tiled["ids"])
    with caplog.at_level(logging.INFO):
        params = tile_params(small_cfg, tiled["small"], large_cfg, large)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["nsp_head"], large["nsp_head"])
    pooler = params["bert"]["pooler"], large["bert"]["pooler"]
    jax.tree_util.tree_map(np.testing.assert_array_equal, *pooler)
    assert "bert/pooler/kernel" in caplog.text and "nsp_head/kernel" in caplog.text


def test_unmappable_shapes_name_the_parameter(tiled):
    small_cfg, small = _config(), tiled["small"]
    wider_vocab = _config(vocab_size=96)
    with pytest.raises(ValueError, match="bert/embeddings/word_embeddings.*vocabular"):
        tile_params(small_cfg, small, wider_vocab, tiled["fresh"])
    two, three = np.zeros((128, 2), np.float32), np.zeros((192, 3), np.float32)
    with pytest.raises(ValueError, match="classifier/kernel: .*cannot grow 2 to 3"):
        tile_params(
            small_cfg,
            {"classifier": {"kernel": two}},
            _config(hidden_size=192, num_attention_heads=3),
            {"classifier": {"kernel": three}},
        )


def test_scanned_stacks_tile_like_loops():
    """BERT-tiny in a scanned stack into a deeper, wider scanned one (and into a loop): the same
    layers as tiling the loop form."""
    ids = jnp.ones((1, 8), jnp.int32)
    small_cfg = bertjax.BertConfig.preset("tiny", vocab_size=64)
    large_cfg = small_cfg.replace(num_hidden_layers=3, hidden_size=192, num_attention_heads=3)
    scan = {"scan_layers": True}
    small = _random_tree(bertjax.BertForPreTraining(small_cfg.replace(**scan)), 4, ids)
    large = _random_tree(bertjax.BertForPreTraining(large_cfg.replace(**scan)), 5, ids)
    loop = _random_tree(bertjax.BertForPreTraining(large_cfg), 6, ids)
    stacked = tile_params(small_cfg, small, large_cfg, large)["bert"]["encoder"]["layers"]
    unrolled = tile_params(small_cfg, small, large_cfg, loop)["bert"]["encoder"]
    for i in range(3):
        layer = jax.tree_util.tree_map(lambda x, i=i: x[i], stacked)
        jax.tree_util.tree_map(np.testing.assert_array_equal, layer, unrolled[f"layer_{i}"])
    layer_1 = jax.tree_util.tree_map(lambda x: x[1], small["bert"]["encoder"]["layers"])
    want = tile_tensor(layer_1["mlp"]["output"]["kernel"], (512, 192))  # layer_map(2, 3)[2] = 1
    np.testing.assert_array_equal(unrolled["layer_2"]["mlp"]["output"]["kernel"], want)
