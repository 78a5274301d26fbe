"""Every sample plan starts from a store of 2^42 tokens in 4096 shards (a synthetic filesystem that
computes each byte asked for) and serves batches at step 0, past row 2^32 and in epoch 1, reading
the index of only the pieces its rows fall in; the batches are the same on 1 and 2 hosts."""

import json
import logging
import threading
import time
import zlib

import numpy as np
import pytest

from bertjax import trainer
from bertjax.data import make_pipeline, read_settings
from bertjax.data.plans import piece_plans
from bertjax.data.store import shard_format as fmt
from bertjax.data.tokenizer import Tokenizer

SHARDS, SHARD_TOKENS, BLOCK, FIRST_ID = 4096, 2**30, 4096, 10
DOC, SENTENCE, SENTENCES = 256, 51, 5  # a document: 5 sentences of 51 tokens, then its [SEP]
DOCS = SHARD_TOKENS // DOC
PLANS = {
    "nsp": {},
    "sop": {},
    "pairs": {},
    "full_sentences": {},
    "doc_sentences": {},
    "mlm": {},
    "packed": {"sample_plan": "full_sentences", "pack_rows": True},
    "causal": {"sample_plan": "full_sentences", "masking": "causal"},
    "diffusion": {"sample_plan": "doc_sentences", "masking": "diffusion"},
}


class _Store:
    """A filesystem serving 4096 identical shards of 2^22 documents each, computed on the fly:
    token g of a shard is FIRST_ID + g % 256, but [SEP] at g % 256 = 255; it counts the bytes
    it serves."""

    def __init__(self, tok, vocab: int):
        self.sep, self.served, self.manifest = tok.sep_id, 0, b""
        self.ranges, self.lock = 0, threading.Lock()  # ranges asked for (each a request)
        q = np.arange(BLOCK) % DOC
        tokens = np.where(q == DOC - 1, tok.sep_id, FIRST_ID + q)
        self.block = tokens.astype("<u2").tobytes() + np.ones(BLOCK, np.uint8).tobytes()
        entry = {"documents": DOCS, "sentences": DOCS * SENTENCES, "tokens": SHARD_TOKENS}
        self.layout = fmt.index_layout(entry, vocab, BLOCK, 2)
        self.crc = zlib.crc32(self.block)

    def _elements(self, name, lo, hi) -> bytes:
        i = np.arange(lo, hi, dtype=np.int64)
        if name == "documents":
            return (i * SENTENCES).astype("<i8").tobytes()
        if name == "sentences":  # element i: sentence i // 2, its start (even i) or end
            start = (i // 2 // SENTENCES) * DOC + (i // 2 % SENTENCES) * SENTENCE
            return (start + SENTENCE * (i % 2)).astype("<i8").tobytes()
        if name == "token_counts":
            return np.zeros(len(i), "<i8").tobytes()
        return np.full(len(i), self.crc, "<u4").tobytes()

    def _range(self, start, end) -> bytes:
        out = []
        sections = (("documents", 8), ("sentences", 8), ("token_counts", 8), ("block_crc32", 4))
        for name, size in sections:
            lo, hi = self.layout[name]
            a, b = max(start, lo), min(end, hi)
            if a < b:
                first, last = (a - lo) // size, -(-(b - lo) // size)
                data = self._elements(name, first, last)
                out.append(data[a - lo - first * size : b - lo - first * size])
        index = self.layout["index_bytes"]
        if end > index:
            first = max(start, index) - index
            skip = first % len(self.block)
            count = (end - index - first + skip) // len(self.block) + 1
            out.append((self.block * count)[skip : skip + end - index - first])
        body = b"".join(out)
        assert len(body) == end - start
        self.served += len(body)
        return body

    def cat_file(self, path):
        assert path.endswith(fmt.MANIFEST), path
        return self.manifest

    def cat_ranges(self, paths, starts, ends):
        with self.lock:
            self.ranges += len(starts)
        return [self._range(s, e) for s, e in zip(starts, ends)]


def _manifest(fake: _Store, tok, shards: int) -> bytes:
    entry = {"documents": DOCS, "sentences": DOCS * SENTENCES, "tokens": SHARD_TOKENS}
    entry.update(bytes=fake.layout["file_bytes"], sha256="", index_crc32=0)
    return json.dumps(
        {
            "format_version": fmt.FORMAT_VERSION,
            "tokenizer_fingerprint": tok.fingerprint(),
            "tokenizer_file": "tokenizer/spm.model",
            "language": "en",
            "lowercase": True,
            "vocab_size": tok.vocab_size,
            "token_dtype": "uint16",
            "block_tokens": BLOCK,
            "splits": {
                split: {"shards": [dict(entry, path=f"{split}/{k:06d}.shard") for k in range(n)]}
                for split, n in (("train", shards), ("eval", 2))
            },
        }
    ).encode()


@pytest.fixture(scope="module")
def web(small_spm):
    """(the synthetic filesystem, a store URL served by it, the tokenizer)."""
    tok = Tokenizer(small_spm)
    fake = _Store(tok, tok.vocab_size)
    fake.manifest = _manifest(fake, tok, SHARDS)
    return fake, "synthetic://store", tok


def _position(ids, sep_id):
    """The position in its document of each token (255 for [SEP])."""
    return np.where(ids == sep_id, DOC - 1, ids - FIRST_ID)


def _check_rows(batch, tok, plan, causal):
    """Unmasked rows hold runs of consecutive document positions between their own specials."""
    ids = batch["input_ids"].copy()
    if not causal:  # causal: masked_ids are next tokens, the input is not masked
        weights = batch["masked_weights"] > 0
        rows = np.broadcast_to(np.arange(len(ids))[:, None], weights.shape)[weights]
        ids[rows, batch["masked_positions"][weights]] = batch["masked_ids"][weights]
    for r in range(len(ids)):
        if "segment_ids" in batch:
            parts = [
                batch["segment_ids"][r] == s for s in range(1, batch["segment_ids"][r].max() + 1)
            ]
        else:
            real = batch["attention_mask"][r] > 0
            parts = [real & (batch["token_type_ids"][r] == t) for t in (0, 1)]
        for part in parts:
            where = np.flatnonzero(part)
            if plan in ("nsp", "sop", "pairs") and len(where):  # A: [CLS] A [SEP]; B: B [SEP]
                where = where[1:-1] if where[0] == 0 else where[:-1]
            elif len(where):
                where = where[1:-1]  # [CLS] ... [SEP]
            q = _position(ids[r, where], tok.sep_id)
            assert ((q >= 0) & (q < DOC)).all(), (plan, r)
            np.testing.assert_array_equal(np.diff(q) % DOC, 1, err_msg=f"{plan} row {r}")


@pytest.mark.parametrize("plan", list(PLANS))
def test_every_plan_serves_a_store_of_2_to_the_42_tokens(web, monkeypatch, plan):
    fake, url, tok = web
    monkeypatch.setattr(fmt, "filesystem", lambda location: (fake, location.split("://", 1)[-1]))
    config = trainer.default_run_config()
    config.batch_size = 8
    config.data.tokenizer_model = tok.path
    config.data.store, config.data.sample_plan = url, plan
    config.data.update(PLANS[plan])
    config.data.max_seq_length, config.data.max_predictions = 64, 8
    config.data.prefetch, config.data.piece_tokens = 0, 1 << 16

    def pipeline(index, count):
        return make_pipeline(config, "", process_index=index, process_count=count)

    fake.served = 0
    one = pipeline(0, 1)
    assert len(one.store.tokens) == 2**42 and fake.served < 2 * len(fake.manifest)
    pieces = one._split.pieces.pieces
    assert len(pieces) == SHARDS * (SHARD_TOKENS >> 16)
    piece_index = 8 * (DOCS // (SHARD_TOKENS >> 16) + 1) + 16 * SENTENCES * DOCS // 2**14
    crcs = fake.layout["block_crc32"][1] - fake.layout["block_crc32"][0]
    # A window: its pieces' indexes, their shards' block checksums, a block or two per row
    window = piece_plans.WINDOW * (piece_index + crcs) + 8 * 3 * len(fake.block)
    steps_per_epoch = one.steps_per_epoch  # calibrated on epoch 0's first window
    assert steps_per_epoch * 8 > 2**32
    for step in (0, 2**32 // 8 + 5, steps_per_epoch + 3):
        before = fake.served
        batch = one.batch(step)
        assert fake.served - before <= 2 * window, (step, fake.served - before, window)
        _check_rows(batch, tok, PLANS[plan].get("sample_plan", plan), plan == "causal")
    assert one.store._index is None  # no shard's whole index is ever read
    halves = [pipeline(i, 2).batch(steps_per_epoch + 3) for i in (0, 1)]
    for key, value in one.batch(steps_per_epoch + 3).items():
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), value, key)


def _serve(monkeypatch, fake):
    monkeypatch.setattr(fmt, "filesystem", lambda location: (fake, location.split("://", 1)[-1]))


def _web_config(tok, url, plan, **data):
    config = trainer.default_run_config()
    config.data.tokenizer_model, config.data.store = tok.path, url
    config.data.update(PLANS.get(plan, {"sample_plan": plan}))
    config.data.update(max_seq_length=64, max_predictions=8, piece_tokens=1 << 14)
    config.data.update(**data)
    return config


@pytest.mark.parametrize("plan", ["nsp", "full_sentences", "packed", "token_windows"])
def test_the_first_batch_asks_as_many_ranges_of_100_shards_as_of_4096(web, monkeypatch, plan):
    """Requests (ranges) to the first batch of 32 rows in 4 lanes, with the settings chosen for
    a URL store: the same from 100 shards as from 4096 (they were one or two per shard its rows
    touched: 4-5 per shard before the first batch)."""
    fake, url, tok = web
    _serve(monkeypatch, fake)
    ranges = {}
    for shards in (100, SHARDS):
        fake.manifest = _manifest(fake, tok, shards)
        config = _web_config(tok, url, plan, lane_rows=8)
        config.batch_size = 32
        before = fake.ranges
        pipeline = make_pipeline(config, "", process_index=0, process_count=1)
        pipeline.compute_batch(0)  # what batch(0) computes first; the reads ahead come after
        ranges[shards] = fake.ranges - before
        pipeline.close()
    fake.manifest = _manifest(fake, tok, SHARDS)
    # 4 lanes of a window of 4 pieces: 2 index ranges and a run of blocks (its checksums
    # beside) a piece, the manifest aside
    assert abs(ranges[100] - ranges[SHARDS]) <= 2 and ranges[SHARDS] <= 4 * 4 * 4 + 4, ranges


def _planned(monkeypatch):
    """A list that grows by (length, epoch, piece) with every piece plan built."""
    built, real = [], piece_plans.PieceSplit._build

    def build(self, length, epoch, piece):
        built.append((length, epoch, piece))
        return real(self, length, epoch, piece)

    monkeypatch.setattr(piece_plans.PieceSplit, "_build", build)
    return built


def test_a_host_plans_and_reads_as_much_a_step_on_1_or_8_hosts(web, monkeypatch):
    """Host 0's 8 rows a step, 24 steps, of one host (a global batch of 8) or of eight (64): in
    lanes of 8 rows it builds the same pieces and reads about the same bytes; without lanes, on
    8 hosts it builds every window the job reads (8x as many rows a step); the batches of 8
    hosts are the rows of one host's batch of 64."""
    fake, url, tok = web
    _serve(monkeypatch, fake)
    built = _planned(monkeypatch)
    cost, batches = {}, {}
    for hosts, lane_rows in ((1, 8), (8, 8), (8, 0)):
        config = _web_config(tok, url, "nsp", lane_rows=lane_rows, prefetch=0)
        config.batch_size = 8 * hosts
        pipeline = make_pipeline(config, "", process_index=0, process_count=hosts)
        pipeline.batch(0)
        built.clear()
        before = fake.served
        batches[hosts, lane_rows] = [pipeline.batch(step) for step in range(1, 25)][-1]
        cost[hosts, lane_rows] = len(built), fake.served - before
    assert cost[8, 8][0] <= cost[1, 8][0] + piece_plans.WINDOW, cost
    assert cost[8, 0][0] >= 2 * piece_plans.WINDOW + cost[1, 8][0], cost
    assert cost[8, 8][1] <= 2 * cost[1, 8][1], cost
    config = _web_config(tok, url, "nsp", lane_rows=8, prefetch=0)
    config.batch_size = 64
    whole = make_pipeline(config, "", process_index=0, process_count=1).batch(24)
    for key, value in batches[8, 8].items():
        np.testing.assert_array_equal(value, whole[key][:8], err_msg=key)


def test_the_read_settings_chosen_for_a_url_store(web, monkeypatch, caplog):
    """Pinned: what a URL store is read with when config.data leaves it (logged once), and that
    a setting given is kept; a local store keeps one thread and 2 batches ahead."""
    fake, url, tok = web
    _serve(monkeypatch, fake)
    config = _web_config(tok, url, "token_windows", max_seq_length=128)
    config.batch_size = 256
    with caplog.at_level(logging.INFO):
        pipeline = make_pipeline(config, "", process_index=0, process_count=1)
    block = BLOCK * 3
    assert pipeline.reads == read_settings.ReadSettings(
        prefetch=16, prefetch_threads=4, read_steps=4, read_threads=32, read_gap_bytes=1 << 20,
        store_cache_bytes=max(256 << 20, 4 * 4 * 256 * block),
    )  # fmt: skip
    assert pipeline.store.blocks.gap_blocks == (1 << 20) // block
    assert pipeline.store.reader.threads == 32
    lines = [r.getMessage() for r in caplog.records if "data: store" in r.getMessage()]
    assert len(lines) == 1 and "16 batches ahead, read 4 at a time" in lines[0]
    pipeline.close()
    config.data.update(read_steps=1, prefetch=4)
    eight = make_pipeline(config, "", process_index=0, process_count=8)  # 32 rows a host
    assert (eight.reads.read_steps, eight.reads.prefetch, eight.reads.prefetch_threads) == (1, 4, 4)
    eight.close()
    config.data.update(read_steps=-1, prefetch=-1)
    eight = make_pipeline(config, "", process_index=0, process_count=8)
    assert (eight.reads.read_steps, eight.reads.prefetch) == (8, 32)  # 2^17 tokens a read
    eight.close()
    local = read_settings.choose(config.data, sharded=False, host_rows=256)
    assert (local.prefetch, local.prefetch_threads, local.read_steps) == (2, 1, 1)


def test_threads_build_different_pieces_at_once_and_each_piece_once(web, monkeypatch):
    """Four threads asking for pieces (one of them all four ask for) behind 50 ms a request:
    every piece is built once, and index reads of different pieces are in flight together (they
    took turns under one lock before)."""
    fake, url, tok = web
    flying, most, lock = [0], [0], threading.Lock()

    class Slow:
        def cat_ranges(self, paths, starts, ends):
            with lock:
                flying[0] += 1
                most[0] = max(most[0], flying[0])
            time.sleep(0.05)
            with lock:
                flying[0] -= 1
            return fake.cat_ranges(paths, starts, ends)

        def __getattr__(self, name):
            return getattr(fake, name)

    monkeypatch.setattr(fmt, "filesystem", lambda location: (Slow(), location.split("://", 1)[-1]))
    built = _planned(monkeypatch)
    config = _web_config(tok, url, "sop", prefetch=0)
    config.batch_size = 8
    split = make_pipeline(config, "", process_index=0, process_count=1)._split.pieces
    start = threading.Barrier(4)

    def ask(i):
        start.wait()
        return [split.piece(64, 3, p)[1] for p in (1000 + i, 7)]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p for _, _, p in built) == [7, 1000, 1001, 1002, 1003]
    assert most[0] >= 2
