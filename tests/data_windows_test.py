"""The token_windows sample plan and the stateless shuffle it reads in: every row of an epoch once,
rows as windows of the token stream, and a store of 2^42 tokens (7 * 10^10 rows) opened from its
manifest alone, its batches read by byte ranges from a few shards."""

import json
import zlib

import numpy as np
import pytest

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.plans.epoch_order import TokenWindowOrder
from bertjax.data.plans.index_shuffle import IndexShuffle
from bertjax.data.store import shard_format as fmt
from bertjax.data.tokenizer import Tokenizer


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 4097, 65536])
def test_index_shuffle_is_a_keyed_permutation(n):
    order = IndexShuffle(n, key=7)[np.arange(n)]
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    if n >= 1000:
        other = IndexShuffle(n, key=8)[np.arange(n)]
        assert np.mean(order == other) < 0.01 and np.mean(order == np.arange(n)) < 0.01
        # A shuffle, not a rotation: neighbours land far apart, about uniformly.
        gaps = np.abs(np.diff(order))
        assert np.median(gaps) > n / 8
    with pytest.raises(IndexError):
        IndexShuffle(n, key=7)[np.array([n])]


def test_index_shuffle_reaches_beyond_2_to_the_32():
    n = 3 * 2**33 + 5
    shuffle = IndexShuffle(n, key=1)
    picked = shuffle[np.array([0, 1, n - 1, 2**32 + 3])]
    assert picked.dtype == np.int64 and picked.min() >= 0 and picked.max() < n
    assert len(set(picked.tolist())) == 4 and picked.max() > 2**32


def _config(spm, plan="token_windows"):
    config = trainer.default_run_config()
    config.batch_size = 8
    config.data.tokenizer_model = spm
    config.data.sample_plan = plan
    config.data.max_seq_length, config.data.max_predictions = 64, 8
    config.data.prefetch = 0
    return config


def test_token_windows_are_the_token_stream_cut_every_t_minus_2(small_spm):
    """Epoch e's rows are tokens [shift_e + r w, shift_e + (r + 1) w), each exactly once, in a
    shuffled order; the shift differs between epochs; batch rows are those windows."""
    pipeline = make_pipeline(_config(small_spm), "", process_index=0, process_count=1)
    store, width = pipeline.store, 62
    split = pipeline._split
    shifts = []
    for epoch in (0, 1):
        plan, order, packing = split.epoch(64, epoch)
        assert packing is None and len(plan) == (len(store.tokens) - plan.shift) // width
        starts = plan.a_start[order[np.arange(len(order))]]
        np.testing.assert_array_equal(np.sort(starts), plan.shift + width * np.arange(len(plan)))
        assert not np.array_equal(starts, np.sort(starts))  # shuffled
        shifts.append(plan.shift)
    assert shifts[0] != shifts[1]
    rows = pipeline.sample_rows(64, np.arange(8), np.arange(8), "mask")
    plan, order, _ = split.epoch(64, 0)
    first = plan.a_start[order[np.arange(8)]]
    expected = np.asarray(store.tokens[first[:, None] + np.arange(width)])
    np.testing.assert_array_equal(rows["input_ids"][:, 1 : width + 1], expected)
    assert (rows["input_ids"][:, 0] == pipeline.tokenizer.cls_id).all()
    assert (rows["input_ids"][:, -1] == pipeline.tokenizer.sep_id).all()
    assert rows["attention_mask"].all() and not rows["next_sentence_label"].any()
    config = _config(small_spm)
    config.data.pack_rows = True
    with pytest.raises(ValueError, match="config.data.pack_rows"):
        make_pipeline(config, "", process_index=0, process_count=1)


SHARD_TOKENS, BLOCK, PERIOD, FIRST_ID = 2**30, 4096, 256, 10


class _SyntheticStore:
    """A filesystem serving a store of 4096 shards of 2^30 tokens (2^42 in all, 12 TiB) computed
    on the fly: token at global position g is FIRST_ID + g % PERIOD, every block alike. It counts
    the bytes it serves."""

    def __init__(self, manifest: bytes, vocab: int):
        self.manifest, self.vocab, self.served = manifest, vocab, 0
        tokens = FIRST_ID + np.arange(BLOCK) % PERIOD
        self.block = tokens.astype("<u2").tobytes() + np.ones(BLOCK, np.uint8).tobytes()
        entry = {"documents": 1, "sentences": 1, "tokens": SHARD_TOKENS}
        self.layout = fmt.index_layout(entry, vocab, BLOCK, 2)
        crcs = np.full(self.layout["blocks"], zlib.crc32(self.block), "<u4")
        self.index = b"".join(
            [
                np.array([0, 1], "<i8").tobytes(),
                np.array([0, SHARD_TOKENS - 1], "<i8").tobytes(),
                np.zeros(vocab, "<i8").tobytes(),
                crcs.tobytes(),
            ]
        )

    def cat_file(self, path):
        assert path.endswith(fmt.MANIFEST), path
        return self.manifest

    def _range(self, start, end):
        index_bytes = len(self.index)
        out = self.index[start:end] if start < index_bytes else b""
        if end > index_bytes:
            first = max(start, index_bytes) - index_bytes
            skip = first % len(self.block)
            count = (end - index_bytes - first + skip) // len(self.block) + 1
            out += (self.block * count)[skip : skip + end - index_bytes - first]
        self.served += len(out)
        return out

    def cat_ranges(self, paths, starts, ends):
        return [self._range(s, e) for s, e in zip(starts, ends)]


def test_a_store_of_2_to_the_42_tokens_opens_from_its_manifest(small_spm, monkeypatch):
    tok = Tokenizer(small_spm)
    vocab = tok.vocab_size
    data_bytes = SHARD_TOKENS * 3
    entry = {"documents": 1, "sentences": 1, "tokens": SHARD_TOKENS, "sha256": ""}
    fake = _SyntheticStore(b"", vocab)
    entry.update(bytes=fake.layout["file_bytes"], index_crc32=zlib.crc32(fake.index))
    assert fake.layout["file_bytes"] == len(fake.index) + data_bytes

    def shards(split, count):
        return [dict(entry, path=f"{split}/{k:06d}.shard") for k in range(count)]

    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "tokenizer_fingerprint": tok.fingerprint(),
        "tokenizer_file": "tokenizer/spm.model",
        "language": "en",
        "lowercase": True,
        "vocab_size": vocab,
        "token_dtype": "uint16",
        "block_tokens": BLOCK,
        "splits": {"train": {"shards": shards("train", 4096)}, "eval": {"shards": shards("e", 2)}},
    }
    fake.manifest = json.dumps(manifest).encode()
    monkeypatch.setattr(fmt, "filesystem", lambda url: (fake, url.split("://", 1)[-1]))
    config = _config(small_spm)
    config.data.store = "synthetic://store"

    def pipeline(index, count):
        return make_pipeline(config, "", process_index=index, process_count=count)

    one = pipeline(0, 1)
    assert len(one.store.tokens) == 2**42 and one.steps_per_epoch > 2**32
    assert fake.served < 4096  # the manifest only: no shard has been touched
    late = one.steps_per_epoch + 3  # epoch 1, samples beyond 2^32 in the order
    for step in (0, 5_000_000_000, late):
        before = fake.served
        batch = one.batch(step)
        # Up to 8 shards touched: each one's block checksums (1 MiB) and a block or two.
        assert fake.served - before <= 8 * (len(fake.index) + 2 * len(fake.block))
        ids = batch["input_ids"].copy()
        rows = np.arange(8)[:, None]
        weights = batch["masked_weights"] > 0
        ids[np.broadcast_to(rows, weights.shape)[weights], batch["masked_positions"][weights]] = (
            batch["masked_ids"][weights]
        )
        assert (ids[:, 0] == tok.cls_id).all() and (ids[:, -1] == tok.sep_id).all()
        window = ids[:, 1:-1] - FIRST_ID
        assert ((window >= 0) & (window < PERIOD)).all()
        np.testing.assert_array_equal(np.diff(window, axis=1) % PERIOD, 1)  # contiguous
    assert one.store._index is None  # no sentence index was ever read
    halves = [pipeline(i, 2).batch(late) for i in (0, 1)]
    for key, value in one.batch(late).items():
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), value, key)


def test_rows_of_a_large_store_are_read_in_windows_of_pieces():
    """token_windows beyond WINDOW pieces' worth of rows: every row of the epoch once (pieces of
    500 consecutive rows, 2 lanes of 4 rows), a step's 8 rows in at most 2 windows of 4 pieces,
    and the same windows step after step."""
    order = TokenWindowOrder(10_000, 500, piece_key=3, window_key=lambda w: w + 11, lanes=2,
                             lane_rows=4)  # fmt: skip
    rows = order[np.arange(len(order))]
    np.testing.assert_array_equal(np.sort(rows), np.arange(10_000))
    steps = rows.reshape(-1, 8) // 500  # the piece of each row, a step a line
    for step in steps[:20]:
        assert len(np.unique(step[:4])) <= 4 and len(np.unique(step[4:])) <= 4
        assert not set(step[:4]) & set(step[4:])  # each lane its own pieces
    assert len(np.unique(steps[:250, :4])) == 4  # lane 0: one window for its first 250 steps
    short = TokenWindowOrder(9_800, 500, piece_key=3, window_key=lambda w: w, lanes=2,
                             lane_rows=4)  # fmt: skip
    covered = np.unique(short[np.arange(len(short))])
    assert covered.max() < 9_800 and len(covered) > 0.97 * 9_800  # the short piece wraps
