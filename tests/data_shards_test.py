"""Sharded stores: prepared on Beam's local runner (2 worker processes) into the GCS emulator,
read per host by byte ranges; batches equal the local store's; bad stores stop with one message
naming the file; a rerun prepare job keeps finished shards; 64-bit token addressing. (Two
processes training from a sharded store, killed and resumed: tests/multiprocess_test.py.)"""

import json
import os
import time
import zlib

import fsspec
import numpy as np
import pytest

from bertjax import trainer
from bertjax.data import make_pipeline, mixture
from bertjax.data.plans import piece_plans
from bertjax.data.store import beam_prepare, mds_import, shard_reader
from bertjax.data.store import shard_format as fmt
from bertjax.data.store.shard_reader import ShardedStore
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer

BEAM_2_WORKERS = [
    "--runner=DirectRunner",
    "--direct_num_workers=2",
    "--direct_running_mode=multi_processing",
]


def _config(spm, files):
    config = trainer.default_run_config()
    config.batch_size = 8
    config.data.corpus = files
    config.data.tokenizer_model = spm
    config.data.max_seq_length, config.data.max_predictions = 64, 8
    config.data.heldout_fraction = 0.05
    config.data.shard_bytes, config.data.block_tokens = 16 << 10, 256
    config.data.prefetch = 0
    return config


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, gcs_bucket, small_spm):
    """(config, gs:// store URL, a local copy of the store): four files of built-in documents
    prepared on Beam's DirectRunner with two worker processes."""
    root = tmp_path_factory.mktemp("shard_corpus")
    docs = [d for _, d in zip(range(480), corpus.iter_documents("builtin"))]
    for i in range(4):
        text = "\n\n".join("\n".join(doc) for _, doc in docs[i::4])
        (root / f"part{i}.txt").write_text(text + "\n")
    config = _config(small_spm, str(root / "part*.txt"))
    url = f"{gcs_bucket}/store"
    manifest = beam_prepare.run(config, url, BEAM_2_WORKERS)
    assert manifest["items"] == 4 and len(manifest["splits"]["train"]["shards"]) > 4
    local = str(tmp_path_factory.mktemp("store_copy") / "store")
    fs, path = fmt.filesystem(url)
    fs.get(path, local, recursive=True)
    return config, url, local


def _batches(config, store, steps, index, count):
    config = config.copy_and_resolve_references()
    config.data.store = store
    pipeline = make_pipeline(config, "", process_index=index, process_count=count)
    return pipeline, [pipeline.batch(step) for step in steps]


PLANS = {  # every sample plan, and the causal and diffusion rows built on them
    "nsp": {},
    "sop": {},
    "pairs": {},
    "full_sentences": {},
    "doc_sentences": {},
    "mlm": {},
    "packed": {"sample_plan": "full_sentences", "pack_rows": True},
    "causal": {"sample_plan": "full_sentences", "masking": "causal"},
    "diffusion": {"sample_plan": "doc_sentences", "masking": "diffusion"},
    "token_windows": {},
}


@pytest.mark.parametrize("plan", list(PLANS))
def test_store_batches_are_equal_on_every_host_count_from_a_path_or_a_url(prepared, plan):
    """The same batches from the gs:// store on 2 hosts as from its local copy on 1, in epochs
    0 and 1, with pieces of a few shards' documents (many windows); no plan reads the whole
    index. token_windows also equals today's local-cache store."""
    config, url, local = prepared
    config = config.copy_and_resolve_references()
    config.data.sample_plan = plan
    config.data.update(PLANS[plan])
    config.data.piece_tokens = 1500
    one, whole = _batches(config, local, [0, 1], 0, 1)
    steps = [0, 1, one.steps_per_epoch + 1]
    whole.append(one.batch(steps[-1]))
    if plan != "token_windows":
        assert len(one._split.pieces.pieces) > 3 * piece_plans.WINDOW
    hosts = [_batches(config, url, steps, i, 2) for i in range(2)]
    for step, reference in enumerate(whole):
        for key, value in reference.items():
            joined = np.concatenate([host[1][step][key] for host in hosts])
            np.testing.assert_array_equal(joined, value, err_msg=f"{key} step {steps[step]}")
    assert all(p.store._index is None for p in (one, *(h[0] for h in hosts)))
    if plan == "token_windows":  # today's path: tokenized into the local cache
        _, cached = _batches(config, "", steps, 0, 1)
        for reference, batch in zip(whole, cached):
            for key, value in reference.items():
                np.testing.assert_array_equal(batch[key], value, err_msg=key)


class _Counting:
    """A filesystem that counts the bytes it returns."""

    def __init__(self, fs):
        self.fs, self.bytes = fs, 0

    def cat_ranges(self, *args, **kwargs):
        out = self.fs.cat_ranges(*args, **kwargs)
        self.bytes += sum(len(b) for b in out)
        return out

    def __getattr__(self, name):
        return getattr(self.fs, name)


def test_each_host_reads_about_its_share_of_the_bytes(prepared, monkeypatch):
    """Blocks of its own rows only (no gap between two blocks read through: read_gap_bytes=0)."""
    config, url, _ = prepared
    config = config.copy_and_resolve_references()
    config.data.read_gap_bytes = 0
    opened = []
    real = fmt.filesystem

    def counting(location):
        fs, path = real(location)
        opened.append(_Counting(fs))
        return opened[-1], path

    monkeypatch.setattr(shard_reader.fmt, "filesystem", counting)
    steps = range(3)
    read = {}
    for index, count in ((0, 1), (0, 2), (1, 2)):
        opened.clear()
        pipeline, _ = _batches(config, url, steps, index, count)
        read[index, count] = sum(fs.bytes for fs in opened)
        index_bytes = read[index, count] - pipeline.store.blocks.bytes_read
    manifest = fmt.read_manifest(url)
    store_bytes = sum(s["bytes"] for split in manifest["splits"].values() for s in split["shards"])
    data_bytes = read[0, 1] - index_bytes
    assert read[0, 1] < store_bytes / 3  # not the whole store
    for host in (0, 1):
        share = (read[host, 2] - index_bytes) / data_bytes
        assert 0.3 < share < 0.75, share  # about half of one host's reads, not all of them


def test_bad_stores_stop_with_one_message_naming_the_file(prepared, tmp_path, builtin_spm):
    config, _, local = prepared
    tok = Tokenizer(config.data.tokenizer_model)
    manifest = fmt.read_manifest(local)
    first = manifest["splits"]["train"]["shards"][0]
    shard = os.path.join(local, first["path"])
    with pytest.raises(fmt.StoreError, match="was prepared with tokenizer"):
        ShardedStore(local, "train", Tokenizer(builtin_spm))
    original = open(shard, "rb").read()
    layout = fmt.index_layout(first, manifest["vocab_size"], manifest["block_tokens"], 2)
    try:
        with open(shard, "wb") as f:  # truncated
            f.write(original[:-10])
        with pytest.raises(fmt.StoreError, match=f"shard .*{first['path']} has .* bytes"):
            ShardedStore(local, "train", tok)
        for where, match in ((10, "index region"), (layout["index_bytes"] + 3, "block 0")):
            broken = bytearray(original)
            broken[where] ^= 0xFF
            with open(shard, "wb") as f:
                f.write(bytes(broken))
            with pytest.raises(fmt.StoreError, match=f"{first['path']}.*{match}"):
                ShardedStore(local, "train", tok).tokens[np.arange(10)]
    finally:
        with open(shard, "wb") as f:
            f.write(original)
    os.rename(os.path.join(local, "manifest.json"), os.path.join(local, "gone"))
    try:
        with pytest.raises(fmt.StoreError, match="manifest.json does not exist"):
            ShardedStore(local, "train", tok)
    finally:
        os.rename(os.path.join(local, "gone"), os.path.join(local, "manifest.json"))


def test_a_rerun_prepare_job_keeps_finished_shards_and_redoes_the_rest(prepared, tmp_path):
    """What kill -9 leaves (no manifest, a unit without its record, a corrupted shard, a temp
    file) is finished by a rerun; the other shards are not rewritten."""
    config, _, copied = prepared
    local = str(tmp_path / "store")
    fsspec.filesystem("file").cp(copied, local, recursive=True)
    before = fmt.read_manifest(local)
    os.remove(os.path.join(local, "manifest.json"))
    os.remove(os.path.join(local, "items", "000001.json"))  # killed before unit 1's record
    shards = before["splits"]["train"]["shards"]
    unit2 = next(s for s in shards if s["path"].startswith("train/000002-"))
    with open(os.path.join(local, unit2["path"]), "r+b") as f:  # same size, other bytes
        f.seek(unit2["bytes"] - 1)
        f.write(b"\x07")
    open(os.path.join(local, "train", "000003-00000.shard.tmp-99"), "wb").close()
    mtimes = {s["path"]: os.stat(os.path.join(local, s["path"])).st_mtime_ns for s in shards}
    manifest = beam_prepare.run(config, local, ["--runner=DirectRunner"])
    assert manifest == before
    for s in shards:
        rewritten = os.stat(os.path.join(local, s["path"])).st_mtime_ns != mtimes[s["path"]]
        assert rewritten == (s is unit2), s["path"]  # unit 1's identical shards stay as they are
    assert ShardedStore(local, "train", Tokenizer(config.data.tokenizer_model)).num_documents


def test_jsonl_and_parquet_documents_match_the_documents_format(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["First doc. It has two sentences.", "Second one!\nA new line here."]
    (tmp_path / "d.txt").write_text("\n".join(t.replace("\n", " ") for t in texts))
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in texts))
    pq.write_table(pa.table({"body": texts}), str(tmp_path / "d.parquet"))
    expected = [d for _, d in corpus.iter_documents(str(tmp_path / "d.txt"), "documents")]
    for name in ("jsonl", "parquet"):
        got = corpus.iter_documents(str(tmp_path / f"d.{name}"), name, text_feature="body")
        assert [d for _, d in got] == expected
    with pytest.raises(ValueError, match="d.jsonl:1: no string field 'text'"):
        list(corpus.iter_documents(str(tmp_path / "d.jsonl"), "jsonl"))


def test_tokens_beyond_2_to_the_32_are_addressed_with_int64(tmp_path):
    """Three sparse shards of 2^31 + 7 tokens each (12 GiB of holes): a token past 2^32 and the
    sentence offsets past 2^32 come back right."""
    vocab, block, tokens = 64, 1 << 20, (1 << 31) + 7  # block: tokens per block
    root = tmp_path / "big"
    entries = []
    for k in range(3):
        entry = {"documents": 1, "sentences": 1, "tokens": tokens}
        layout = fmt.index_layout(entry, vocab, block, 2)
        data_block = np.zeros(3 * block, np.uint8)  # tokens 0..block-1, then their word starts
        data_block[10:12] = np.frombuffer(np.uint16(40 + k).tobytes(), np.uint8)  # token 5
        crcs = np.full(layout["blocks"], zlib.crc32(bytes(3 * block)), np.uint32)
        crcs[0] = zlib.crc32(data_block.tobytes())
        crcs[-1] = zlib.crc32(bytes(3 * (tokens - (layout["blocks"] - 1) * block)))
        index = b"".join(
            [
                np.array([0, 1], np.int64).tobytes(),
                np.array([[0, tokens - 1]], np.int64).tobytes(),
                np.zeros(vocab, np.int64).tobytes(),
                crcs.tobytes(),
            ]
        )
        path = root / "train" / f"000000-{k:05d}.shard"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(index + data_block.tobytes())
            f.truncate(layout["file_bytes"])
        entry.update(path=f"train/{path.name}", bytes=layout["file_bytes"], sha256="")
        entries.append(dict(entry, index_crc32=zlib.crc32(index)))
    spm = Tokenizer.__new__(Tokenizer)  # only fingerprint() and language are asked for
    spm.fingerprint, spm.language = (lambda: "f" * 16), "en"
    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "tokenizer_fingerprint": "f" * 16,
        "tokenizer_file": "tokenizer/spm.model",
        "language": "en",
        "vocab_size": vocab,
        "token_dtype": "uint16",
        "block_tokens": block,
        "splits": {"train": {"shards": entries}, "eval": {"shards": []}},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    store = ShardedStore(str(root), "train", spm)
    assert len(store.tokens) == 3 * tokens > 2**32
    assert store.sentences.dtype == np.int64 and store.sentences[2, 0] == 2 * tokens > 2**32
    far = np.array([2 * tokens + 5, 2 * tokens + 4, 2 * tokens + 6, tokens + 5, 5])
    np.testing.assert_array_equal(store.tokens[far], [42, 0, 0, 41, 40])
    assert store.blocks.bytes_read <= 3 * 3 * block  # three blocks read, not 12 GiB
    np.testing.assert_array_equal(store.word_starts[far], 0)


def test_rows_per_store_round_by_largest_remainder():
    for weights, batch in (((0.7, 0.2, 0.1), 16), ((1, 1, 1), 8), ((5, 3), 7)):
        counts = mixture.rows_per_store(weights, batch)
        exact = batch * np.asarray(weights) / sum(weights)
        assert counts.sum() == batch and np.all(np.abs(counts - exact) < 1)
    np.testing.assert_array_equal(mixture.rows_per_store((1, 1, 1), 8), [3, 3, 2])


def _mixture(config, stores, changes=(), index=0, count=1):
    config = config.copy_and_resolve_references()
    config.data.mixture, config.data.mixture_changes = stores, changes
    return make_pipeline(config, "", process_index=index, process_count=count)


def test_a_mixture_is_a_function_of_the_step_and_a_weight_change_loses_nothing(prepared):
    """Store positions continue across a declared change (each store's samples over the steps
    are 0, 1, 2, ... without a repeat or a gap); the steps before it are unchanged; a resume
    that rewrites past weights is refused."""
    config, url, local = prepared
    stores = ((url, 3.0), (local, 1.0))
    changed = _mixture(config, stores, ((2, (1.0, 3.0)),))
    seen = {0: [], 1: []}
    for step in range(4):
        store, sample = changed.sources(step)
        for k in (0, 1):
            seen[k].extend(sample[store == k].tolist())
    assert seen == {0: list(range(6 + 6 + 2 + 2)), 1: list(range(2 + 2 + 6 + 6))}
    plain = _mixture(config, stores)
    for step in (0, 1):
        for key, value in plain.batch(step).items():
            np.testing.assert_array_equal(changed.batch(step)[key], value)
    hosts = [_mixture(config, stores, ((2, (1.0, 3.0)),), i, 2) for i in (0, 1)]
    for key, value in changed.batch(3).items():
        joined = np.concatenate([h.batch(3)[key] for h in hosts])
        np.testing.assert_array_equal(joined, value, err_msg=key)
    ahead = config.copy_and_resolve_references()  # batches read ahead, 2 steps a read
    ahead.data.update(prefetch=4, prefetch_threads=2, read_steps=2)
    ahead = _mixture(ahead, stores, ((2, (1.0, 3.0)),))
    for step in range(5):
        for key, value in changed.batch(step).items():
            np.testing.assert_array_equal(ahead.batch(step)[key], value, err_msg=key)
    ahead.close()
    saved = {"data": {"mixture": [[url, 3.0], [local, 1.0]], "mixture_changes": []}}
    changed.check_resume(saved, 2)  # the change starts at the resume step: allowed
    with pytest.raises(ValueError, match="config.data.mixture / mixture_changes"):
        changed.check_resume(saved, 3)


def _write_mds(directory, samples):
    """An MDS dataset as mosaicml-streaming's MDSWriter lays it out (columns sorted by name: a
    fixed-size int64 "id", a shape-less "ndarray:uint16" "input_ids"), two shards."""
    os.makedirs(directory)
    shards = []
    for k, part in enumerate((samples[:3], samples[3:])):
        config = {
            "column_encodings": ["int", "ndarray:uint16"],
            "column_names": ["id", "input_ids"],
            "column_sizes": [8, None],
            "compression": None,
            "format": "mds",
            "hashes": [],
            "size_limit": 1 << 26,
            "version": 2,
        }
        encoded = []
        for i, ids in enumerate(part):
            array = np.asarray(ids, np.uint16)
            value = bytes([(1 << 2) | 0]) + np.uint8(len(array)).tobytes() + array.tobytes()
            encoded.append(np.uint32(len(value)).tobytes() + np.int64(i).tobytes() + value)
        text = json.dumps(config, sort_keys=True).encode()
        offsets = np.cumsum([0] + [len(e) for e in encoded]).astype(np.uint32)
        offsets += 4 + 4 * len(offsets) + len(text)
        name = f"shard.{k:05d}.mds"
        with open(os.path.join(directory, name), "wb") as f:
            f.write(np.uint32(len(part)).tobytes() + offsets.tobytes() + text + b"".join(encoded))
        shards.append(dict(config, raw_data={"basename": name, "bytes": 0}, samples=len(part)))
    with open(os.path.join(directory, "index.json"), "w") as f:
        json.dump({"version": 2, "shards": shards}, f)


def test_mds_shards_import_into_a_store_of_the_same_tokens(tmp_path, builtin_spm):
    tok = Tokenizer(builtin_spm)
    texts = [d[0] for _, d in zip(range(5), corpus.iter_documents("builtin"))]
    samples = [tok.encode_flat([t])[0] for t in texts]
    _write_mds(str(tmp_path / "mds"), samples)
    manifest = mds_import.import_mds(str(tmp_path / "mds"), str(tmp_path / "store"), builtin_spm)
    assert manifest["splits"]["train"]["documents"] == 5 and manifest["items"] == 2
    store = ShardedStore(str(tmp_path / "store"), "train", tok)
    for d, ids in enumerate(samples):
        (first, last) = store.document_sentences(d)
        begin, end = store.sentences[first]
        np.testing.assert_array_equal(store.tokens[np.arange(begin, end)], ids)
        assert store.tokens[np.array([end])][0] == tok.sep_id
        flat, lengths = tok.encode_flat([texts[d]])
        np.testing.assert_array_equal(
            store.word_starts[np.arange(begin, end)], tok.word_starts(flat, lengths)
        )


class _Latency(_Counting):
    """A filesystem that counts requests and adds latency to each (a `cat_ranges` call is one
    request, its ranges in flight together, as gcsfs's: an asynchronous filesystem)."""

    async_impl = True

    def __init__(self, fs, latency):
        super().__init__(fs)
        self.latency, self.requests = latency, 0

    def cat_ranges(self, *args, **kwargs):
        self.requests += 1
        time.sleep(self.latency)
        return super().cat_ranges(*args, **kwargs)


def test_batches_read_four_at_a_time_on_threads_are_the_batches_read_one_by_one(
    prepared, monkeypatch
):
    """Batches computed on 2 threads, 4 a read, each read behind 20 ms a request, are the ones
    computed in order, one read each; a read of 4 batches is one request for both columns
    (tokens, word starts) of all their rows."""
    config, _, local = prepared
    config = config.copy_and_resolve_references()
    config.data.update(sample_plan="full_sentences", store_cache_bytes=4 << 10, store=local)
    fs = _Latency(fmt.filesystem(local)[0], 0.02)
    monkeypatch.setattr(shard_reader.fmt, "filesystem", lambda url: (fs, url))
    runs, requests = {}, {}
    for threads in (0, 2):
        config.data.update(prefetch=4 * threads, prefetch_threads=max(1, threads), read_steps=4)
        pipeline = make_pipeline(config, "", process_index=0, process_count=1)
        pipeline.batch(0)
        before = fs.requests
        runs[threads] = [pipeline.batch(step) for step in range(1, 13)]
        pipeline.close()
        requests[threads] = fs.requests - before
    # one read a batch, or a read of 4 (+ a new window's pieces: two reads of their indexes)
    assert requests[0] <= 12 + 2 and requests[2] <= 3 + 2, requests
    for batch, reference in zip(runs[2], runs[0]):
        for key, value in reference.items():
            np.testing.assert_array_equal(batch[key], value, err_msg=key)
