"""Every sample plan starts from a store of 2^42 tokens in 4096 shards (a synthetic filesystem that
computes each byte asked for) and serves batches at step 0, past row 2^32 and in epoch 1, reading
the index of only the pieces its rows fall in; the batches are the same on 1 and 2 hosts."""

import json
import zlib

import numpy as np
import pytest

from bertjax import trainer
from bertjax.data import make_pipeline
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
        return [self._range(s, e) for s, e in zip(starts, ends)]


@pytest.fixture(scope="module")
def web(small_spm):
    """(the synthetic filesystem, a store URL served by it, the tokenizer)."""
    tok = Tokenizer(small_spm)
    fake = _Store(tok, tok.vocab_size)
    entry = {"documents": DOCS, "sentences": DOCS * SENTENCES, "tokens": SHARD_TOKENS}
    entry.update(bytes=fake.layout["file_bytes"], sha256="", index_crc32=0)
    fake.manifest = json.dumps(
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
                for split, n in (("train", SHARDS), ("eval", 2))
            },
        }
    ).encode()
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
