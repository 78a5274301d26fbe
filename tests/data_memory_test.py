"""A host's memory for reading a sharded store (issue 61): one bound (config.data.store_cache_bytes)
on the block caches of every split, every store of a mixture and every worker process together;
and a closed pipeline leaves no thread or process of its own behind."""

import multiprocessing
import os
import threading

import pytest

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.store import beam_prepare, shard_writer
from bertjax.data.text import corpus

BUDGET = 48 << 10  # 64 blocks of 256 tokens (3 bytes each: token id, word start)


@pytest.fixture(scope="module")
def store(tmp_path_factory, small_spm) -> str:
    """A sharded store (the Beam job's units, no engine) of 60 built-in documents, 8 KiB shards
    of 256-token blocks, a tenth held out."""
    root = tmp_path_factory.mktemp("memory")
    docs = [d for _, d in zip(range(60), corpus.iter_documents("builtin"))]
    (root / "corpus.txt").write_text("\n\n".join("\n".join(d) for _, d in docs) + "\n")
    config = trainer.default_run_config()
    config.data.corpus, config.data.tokenizer_model = str(root / "corpus.txt"), small_spm
    config.data.shard_bytes, config.data.block_tokens = 8 << 10, 256
    config.data.heldout_fraction = 0.1
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, str(root / "store"), items)
    tokenizer = shard_writer.local_tokenizer(spec)
    records = [shard_writer.prepare_item(spec, item, tokenizer) for item in items]
    shard_writer.write_manifest(records, spec)
    return str(root / "store")


def _config(**data):
    config = trainer.default_run_config()
    config.batch_size = 8
    config.data.update(max_seq_length=64, max_predictions=8, sample_plan="full_sentences")
    config.data.update(store_cache_bytes=BUDGET, read_threads=4, prefetch=4, read_steps=2)
    config.data.update(prefetch_threads=2, **data)
    return config


def _ours(before: set) -> list:
    """Threads started since ``before`` that are still alive."""
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_splits_and_stores_share_one_bound_and_close_stops_their_threads(store):
    """Train batches on prefetch threads, held-out batches, then a mixture of the store twice:
    the blocks every cache holds never exceed the bound together (and it was reached); closing
    leaves no prefetch or range thread and no cached block."""
    before = set(threading.enumerate())
    pipeline = make_pipeline(_config(store=store), "", process_index=0, process_count=1)
    caches = [pipeline.store.blocks, pipeline._eval_store.blocks]
    assert caches[0].budget is caches[1].budget is pipeline.cache
    assert pipeline.cache.limit == BUDGET
    held = []
    for step in range(12):
        pipeline.batch(step)
        held.append([c.cached for c in caches])
    for _ in pipeline.eval_batches(2):
        held.append([c.cached for c in caches])
    assert max(map(sum, held)) <= BUDGET and pipeline.cache.peak <= BUDGET
    assert max(h[0] for h in held) > 0 and held[-1][1] > 0  # both splits held blocks
    assert sum(c.bytes_read for c in caches) > 2 * BUDGET  # so the bound evicted blocks
    names = {t.name.split("_")[0] for t in _ours(before)}
    assert {"bertjax-data", "bertjax-ranges"} <= names, names
    pipeline.close()
    assert _ours(before) == [] and pipeline.cache.held == 0
    assert all(c.cached == 0 and not c.cache for c in caches)

    mixed = _config(store="", mixture=((store, 1.0), (f"file://{store}", 2.0)))
    mixture = make_pipeline(mixed, "", process_index=0, process_count=1)
    caches = [p.store.blocks for p in mixture.pipelines]
    assert caches[0].budget is caches[1].budget and caches[0].budget.limit == BUDGET
    for step in range(8):
        mixture.batch(step)
        assert caches[0].budget.held == sum(c.cached for c in caches) <= BUDGET
    assert all(c.bytes_read for c in caches)  # both stores read through the one bound (what
    # each holds at a given moment is the prefetch threads' timing: a store's blocks may all be
    # evicted just then)
    mixture.close()
    assert _ours(before) == [] and caches[0].budget.held == 0


def _worker_cache():
    """(pid, bound, most held) of the block caches of the worker process this runs in."""
    from bertjax.data import workers

    cache = workers._PIPELINE.cache
    return os.getpid(), cache.limit, cache.peak


def test_worker_processes_hold_shares_of_the_bound_and_end_with_the_pipeline(store):
    """A worker process and this one: half the bound each (logged), neither holding more than
    its share; closing the pipeline ends the worker."""
    config = _config(store=store, workers=1)
    pipeline = make_pipeline(config, "", process_index=0, process_count=1)
    try:
        for step in range(10):
            pipeline.batch(step)
        pool = pipeline._prefetch.executor
        reports = [pool.submit(_worker_cache).result()]
    finally:
        pipeline.close()
    share = BUDGET // 2
    assert pipeline.cache.limit == share and pipeline.reads.process_cache_bytes == share
    assert "in each of 2 processes" in pipeline.reads.describe()
    assert all(limit == share and 0 < peak <= share for _, limit, peak in reports), reports
    pids = {pid for pid, _, _ in reports}
    assert os.getpid() not in pids
    assert not [c for c in multiprocessing.active_children() if c.pid in pids]
