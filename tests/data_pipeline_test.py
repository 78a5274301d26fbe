"""Pipeline: batch(step) is a pure function of (config, seed, step) for any host/prefetch split."""

import ml_collections
import numpy as np
import pytest

from bertjax.data import default_data_config, make_pipeline
from bertjax.data.batch_spec import pipeline_batch_shapes

KEYS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "masked_positions",
    "masked_ids",
    "masked_weights",
    "next_sentence_label",
    "mask_ratio",
)


@pytest.fixture(scope="module")
def spm_path(builtin_spm):
    return builtin_spm


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("pipeline"))


def _config(spm_path, **data):
    config = ml_collections.ConfigDict()
    config.seed = 7
    config.batch_size = 16
    config.data = default_data_config()
    config.data.tokenizer_model = spm_path
    config.data.max_seq_length = 64
    config.data.max_predictions = 10
    config.data.prefetch = 0
    config.data.heldout_fraction = 0.05
    config.data.update(data)
    return config


def _pipeline(spm_path, workdir, *, index=0, count=1, **data):
    return make_pipeline(
        _config(spm_path, **data), workdir, process_index=index, process_count=count
    )


def _equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _shapes_as_declared(batch, data, held_out=False):
    """`batch_spec.pipeline_batch_shapes` (the ahead-of-time compile's batch) is what came."""
    rows, length = batch["input_ids"].shape
    want = pipeline_batch_shapes(data, rows, length, held_out)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == want


def test_batch_keys_shapes_and_sequence_format(spm_path, workdir):
    p = _pipeline(spm_path, workdir)
    b = p.batch(0)
    _shapes_as_declared(b, p.c)
    _shapes_as_declared(next(p.eval_batches(1)), p.c, held_out=True)
    assert set(b) == set(KEYS)
    for key in KEYS[:3]:
        assert b[key].shape == (16, 64) and b[key].dtype == np.int32
    for key in KEYS[3:6]:
        assert b[key].shape == (16, 10)
    assert b["masked_weights"].dtype == np.float32 and b["mask_ratio"].dtype == np.float32
    assert b["next_sentence_label"].shape == (16,) and (b["mask_ratio"] == 1).all()
    tok = p.tokenizer
    for row in range(16):
        real = b["attention_mask"][row].sum()
        ids = b["input_ids"][row]
        assert (
            ids[0] == tok.cls_id
            and ids[real - 1] == tok.sep_id
            and (ids[real:] == tok.pad_id).all()
        )
        seps = np.flatnonzero(ids[:real] == tok.sep_id)
        first_sep = seps[0]  # [CLS] A [SEP] B [SEP]: type 0 through the first [SEP], then 1
        assert (b["token_type_ids"][row][: first_sep + 1] == 0).all() and (
            b["token_type_ids"][row][first_sep + 1 : real] == 1
        ).all()
    masked = b["masked_ids"][b["masked_weights"] > 0]
    assert not np.isin(masked, [tok.cls_id, tok.sep_id, tok.pad_id]).any()


def test_restart_at_any_step_gives_the_same_batch(spm_path, workdir):
    first = _pipeline(spm_path, workdir, prefetch=3)
    seen = {step: first.batch(step) for step in range(6)}
    first.close()
    steps = [0, 4, first.steps_per_epoch + 2]
    again = _pipeline(spm_path, workdir)
    for step in steps:
        expected = seen.get(step) or first.compute_batch(step)
        _equal(again.batch(step), expected)


@pytest.mark.parametrize("count", [2, 4])
def test_hosts_concatenate_to_the_one_host_batch(spm_path, workdir, count):
    one = _pipeline(spm_path, workdir)
    hosts = [_pipeline(spm_path, workdir, index=i, count=count) for i in range(count)]
    for step in (0, 3):
        shards = [h.batch(step) for h in hosts]
        _equal({k: np.concatenate([s[k] for s in shards]) for k in shards[0]}, one.batch(step))


def test_each_epoch_reshuffles_and_masks_differently(spm_path, workdir):
    p = _pipeline(spm_path, workdir)
    a, b = p.batch(1), p.batch(1 + p.steps_per_epoch)
    assert not np.array_equal(a["input_ids"], b["input_ids"])
    assert (a["masked_positions"] != b["masked_positions"]).any(1).mean() > 0.8


def test_pipeline_statistics_over_batches(spm_path, workdir):
    p = _pipeline(spm_path, workdir)
    batches = [p.batch(s) for s in range(60)]
    labels = np.concatenate([b["next_sentence_label"] for b in batches])
    assert (
        abs(labels.mean() - 0.5) < 0.06
    )  # 960 rows; the exact 50±2% check is in data_samples_test
    masked = sum(int(b["masked_weights"].sum()) for b in batches)
    maskable = sum(int(((b["attention_mask"] == 1) & (b["input_ids"] != 2)).sum()) for b in batches)
    assert 0.1 < masked / maskable < 0.16


def test_eval_batches_come_from_the_heldout_split_and_repeat(spm_path, workdir):
    p = _pipeline(spm_path, workdir)
    first, second = list(p.eval_batches(2)), list(p.eval_batches(2))
    assert len(first) == 2 and first[0]["input_ids"].shape == (16, 64)
    _equal(first[0], second[0])
    assert not np.array_equal(first[0]["input_ids"], p.batch(0)["input_ids"])


def test_eval_batches_can_mask_at_their_own_rate(spm_path, workdir):
    """Training at 40% while evaluating at BERT's 15%: same held-out rows, different masking."""

    def predicted_fraction(batches):
        masked = sum(float(b["masked_weights"].sum()) for b in batches)
        real = sum(float((b["attention_mask"] == 1).sum()) for b in batches)
        return masked / real

    same = list(_pipeline(spm_path, workdir, mask_rate=0.15).eval_batches(3))
    p = _pipeline(
        spm_path,
        workdir,
        mask_rate=0.4,
        max_predictions=26,
        eval_mask_rate=0.15,
        eval_max_predictions=10,
    )
    own = list(p.eval_batches(3))
    for a, b in zip(same, own):
        _equal(a, b)  # the held-out batches do not depend on the training mask rate
    assert p.batch(0)["masked_positions"].shape == (16, 26)
    train_fraction = predicted_fraction([p.batch(s) for s in range(3)])
    assert train_fraction > 2 * predicted_fraction(own)
    with pytest.raises(ValueError, match="config.data.eval_mask_rate"):
        _pipeline(spm_path, workdir, eval_mask_rate=1.5)
    with pytest.raises(ValueError, match="config.data.eval_max_predictions"):
        _pipeline(spm_path, workdir, eval_max_predictions=-1)


def test_invalid_values_name_the_key(spm_path, workdir):
    bad = {
        "mask_rate": -0.1,
        "random_token_prob": 0.5,
        "max_predictions": 0,
        "sample_plan": "clm",
        "masking": "span",
        "length_schedule": ((0.5, 64), (0.4, 32)),
        "pack_rows": True,
        "mask_token_weighting": "zipf",
        "mask_token_smoothing": -1.0,
        "read_steps": 0,
        "prefetch_threads": -2,
        "read_gap_bytes": -5,
        "lane_rows": -1,
    }
    for key, value in bad.items():
        with pytest.raises(ValueError, match=f"config.data.{key}"):
            _pipeline(spm_path, workdir, **{key: value})
    with pytest.raises(ValueError, match="config.data.mask_rate"):
        _pipeline(spm_path, workdir, mask_rate=1.5)
    with pytest.raises(ValueError, match="config.data.mask_token_weighting"):
        _pipeline(spm_path, workdir, mask_token_weighting="smoothed_unigram", masking="whole_word")
    with pytest.raises(ValueError, match="config.data.correction"):
        _pipeline(spm_path, workdir, correction=True, similar_words_file="x.tsv")
    with pytest.raises(AttributeError, match="mask_ratee"):
        _config(spm_path).data.mask_ratee = 0.2
    with pytest.raises(ValueError, match="not divisible by the process count 3"):
        _pipeline(spm_path, workdir, index=0, count=3)


def test_length_schedules(spm_path, workdir):
    config = _config(spm_path, length_schedule=((0.9, 32), (0.1, 64)))
    with pytest.raises(ValueError, match="num_train_steps"):
        make_pipeline(config, workdir, process_index=0, process_count=1)
    config.num_train_steps = 100
    p = make_pipeline(config, workdir, process_index=0, process_count=1)
    assert [p.seq_len(s) for s in (0, 89, 90, 99, 500)] == [32, 32, 64, 64, 64]
    assert p.batch(89)["input_ids"].shape == (16, 32) and p.batch(90)["input_ids"].shape == (16, 64)
    mixed = _pipeline(
        spm_path, workdir, length_schedule=((0.25, 32), (0.5, 48), (0.25, 64)), mixed_lengths=True
    )
    lengths = [mixed.seq_len(s) for s in range(300)]
    assert [lengths.count(t) for t in (32, 48, 64)] == [75, 150, 75]
    assert lengths[:100] != lengths[100:200]
    again = _pipeline(
        spm_path, workdir, length_schedule=((0.25, 32), (0.5, 48), (0.25, 64)), mixed_lengths=True
    )
    for step in (0, 1, 2, 150):
        b = again.batch(step)
        assert b["input_ids"].shape == (16, lengths[step])
        _equal(b, mixed.batch(step))


@pytest.mark.parametrize("objective", ["doc_sentences", "mlm"])
def test_packed_rows_have_numbered_segments(spm_path, workdir, objective):
    p = _pipeline(spm_path, workdir, sample_plan=objective, pack_rows=True, masking="whole_word")
    b = p.batch(2)
    seg = b["segment_ids"]
    _shapes_as_declared(b, p.c)
    assert seg.shape == (16, 64) and (b["next_sentence_label"] == 0).all()
    np.testing.assert_array_equal(seg > 0, b["attention_mask"] == 1)
    unpacked = _pipeline(spm_path, workdir, sample_plan=objective, masking="whole_word").batch(2)
    # Rows hold several samples and are fuller. Built-in documents are long (>= 100 words), so
    # doc_sentences rows are mostly full already; only their short document tails get packed.
    several, fuller = (3, 1.2) if objective == "mlm" else (1, 1.0)
    assert (seg.max(1) >= 2).sum() >= several
    assert b["attention_mask"].sum() > fuller * unpacked["attention_mask"].sum()
    for row in range(16):
        starts = np.flatnonzero(np.diff(seg[row], prepend=0) > 0)
        assert (b["input_ids"][row][starts] == p.tokenizer.cls_id).all()
        np.testing.assert_array_equal(seg[row][starts], np.arange(1, len(starts) + 1))
    _equal(
        b,
        _pipeline(
            spm_path, workdir, sample_plan=objective, pack_rows=True, masking="whole_word"
        ).batch(2),
    )


def test_diffusion_and_sop_and_full_sentences(spm_path, workdir):
    diffusion = _pipeline(spm_path, workdir, sample_plan="full_sentences", masking="diffusion")
    d = diffusion.batch(0)
    _shapes_as_declared(d, diffusion.c)
    assert (
        d["masked_positions"].shape == (16, 64)
        and 0 < d["mask_ratio"].min() < d["mask_ratio"].max() < 1
    )
    assert (d["next_sentence_label"] == 0).all() and (d["token_type_ids"] == 0).all()
    s = _pipeline(spm_path, workdir, sample_plan="sop", masking="ngram").batch(0)
    assert set(np.unique(s["next_sentence_label"])) == {0, 1}
    f = _pipeline(spm_path, workdir, sample_plan="full_sentences").batch(0)
    assert f["attention_mask"].sum() > 0.7 * f["attention_mask"].size  # rows end at sentence ends


def test_smoothed_unigram_masking_counts_the_store_and_favours_rare_tokens(spm_path, workdir):
    """DistilBERT's mlm_smoothing: weights from every token of the training split; training
    batches mask rarer tokens than uniform masking, held-out batches stay uniform."""
    p = _pipeline(spm_path, workdir, mask_token_weighting="smoothed_unigram")
    uniform = _pipeline(spm_path, workdir)
    counts = p.token_counts(chunk=12345)  # chunked counting: the same as one bincount
    np.testing.assert_array_equal(
        counts, np.bincount(np.asarray(p.store.tokens), minlength=p.tokenizer.vocab_size)
    )

    def mean_log_count(batches):
        ids = np.concatenate([b["masked_ids"][b["masked_weights"] > 0] for b in batches])
        return np.log(np.maximum(counts[ids], 1)).mean()

    weighted = mean_log_count([p.batch(s) for s in range(8)])
    plain = mean_log_count([uniform.batch(s) for s in range(8)])
    assert weighted < plain - 1.0, (weighted, plain)
    for a, b in zip(p.eval_batches(2), uniform.eval_batches(2)):
        np.testing.assert_array_equal(a["masked_positions"], b["masked_positions"])


def test_batches_from_a_worker_process_are_the_in_process_ones(spm_path, workdir):
    """config.data.workers: prefetched batches computed in a spawned process (its own pipeline
    of the same config) equal those computed here, in any order of asking."""
    here = _pipeline(spm_path, workdir)
    pool = _pipeline(spm_path, workdir, prefetch=2, workers=1)
    try:
        for step in (0, 1, 2, 5, 3):
            _equal(pool.batch(step), here.batch(step))
    finally:
        pool.close()
    with pytest.raises(ValueError, match="config.data.workers"):
        _pipeline(spm_path, workdir, prefetch=1, workers=2)
