"""Start-up does not grow with the store (DESIGN.md "Start-up never grows with the corpus"; issue
71): the requests a host sends from `make_pipeline` to its first batch, counted by a filesystem
of its own protocol over the local disk (``counting://``, every range of a synchronous
filesystem a request, as a gcsfuse mount sends them), on a store of 8 input files (a shard a
file, as the prepare job writes them) and the same store six times over (48 shards), for every
sample plan. One host of a batch of 256, the read settings chosen for a URL store. The store is
smaller than a host's start-up was: with lanes of 32 rows such a host planned 32 pieces before
its first batch, all of a store of up to 32, so its requests grew with the store to there."""

import json
import shutil
import threading

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.store import beam_prepare, shard_writer
from bertjax.data.store import shard_format as fmt
from bertjax.data.text import corpus

PROTOCOL = "counting"
FILES, COPIES = 8, 6
PLANS = {
    "nsp": {},
    "sop": {},
    "pairs": {},
    "full_sentences": {},
    "doc_sentences": {},
    "mlm": {},
    "packed": {"sample_plan": "full_sentences", "pack_rows": True},
    "token_windows": {},
}


class CountingFileSystem(LocalFileSystem):
    """The local filesystem under ``counting://``; counts the requests object storage would be
    sent: a `cat_file` (a range, or a whole file), an `info`, an `ls`, an `open` (the local
    filesystem's own calls inside one of them are not requests of their own)."""

    protocol = PROTOCOL
    requests = 0
    lock = threading.Lock()
    inside = threading.local()

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return super()._strip_protocol(path)

    def _request(self, call, *args, **kwargs):
        outer = not getattr(self.inside, "depth", 0)
        if outer:
            with self.lock:
                CountingFileSystem.requests += 1
        self.inside.depth = getattr(self.inside, "depth", 0) + 1
        try:
            return call(*args, **kwargs)
        finally:
            self.inside.depth -= 1

    def cat_file(self, path, start=None, end=None, **kwargs):
        return self._request(super().cat_file, path, start=start, end=end, **kwargs)

    def info(self, path, **kwargs):
        return self._request(super().info, path, **kwargs)

    def ls(self, path, detail=False, **kwargs):
        return self._request(super().ls, path, detail=detail, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        return self._request(super()._open, path, mode=mode, **kwargs)


fsspec.register_implementation(PROTOCOL, CountingFileSystem, clobber=True)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, builtin_spm):
    """({copies: counting:// URL of the store}, its tokenizer): 8 files of built-in documents
    (~20-37 k tokens each) prepared as the Beam job's units are (a shard a file), and the same
    store six times over (its shards copied under new names, listed six times: the store of six
    copies of the corpus, held-out documents aside, without tokenizing it again)."""
    root = tmp_path_factory.mktemp("startup")
    docs = [doc for _, (_, doc) in zip(range(320), corpus.iter_documents("builtin"))]
    for i in range(FILES):
        text = "\n\n".join("\n".join(d) for d in docs[i::FILES]) + "\n"
        (root / f"part{i}.txt").write_text(text)
    config = trainer.default_run_config()
    config.data.corpus, config.data.tokenizer_model = str(root / "*.txt"), builtin_spm
    config.data.block_tokens = 512
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, str(root / "store"), items)
    tokenizer = shard_writer.local_tokenizer(spec)
    records = [shard_writer.prepare_item(spec, item, tokenizer) for item in items]
    manifest = shard_writer.write_manifest(records, spec)
    assert len(manifest["splits"]["train"]["shards"]) == FILES
    copied = root / "store6"
    for split, entry in manifest["splits"].items():
        (copied / split).mkdir(parents=True)
        shards = []
        for copy in range(COPIES):
            for shard in entry["shards"]:
                path = f"{split}/c{copy}-{shard['path'].rsplit('/', 1)[1]}"
                shutil.copyfile(root / "store" / shard["path"], copied / path)
                shards.append(dict(shard, path=path))
        totals = {k: v * COPIES for k, v in entry.items() if isinstance(v, int)}
        manifest["splits"][split] = dict(totals, shards=shards)
    shutil.copytree(root / "store" / "tokenizer", copied / "tokenizer")
    (copied / fmt.MANIFEST).write_text(json.dumps(manifest))
    urls = {1: f"{PROTOCOL}://{root / 'store'}", COPIES: f"{PROTOCOL}://{copied}"}
    return urls, builtin_spm


def _startup(stores, copies: int, plan: str, seed: int = 0, **data) -> int:
    """Requests from `make_pipeline` through the first batch (of 256 rows, T=64)."""
    urls, spm = stores
    config = trainer.default_run_config()
    config.seed = seed
    config.batch_size = 256
    config.data.update(store=urls[copies], tokenizer_model=spm, max_seq_length=64,
                       max_predictions=8)  # fmt: skip
    config.data.update(PLANS[plan] or {"sample_plan": plan})
    config.data.update(prefetch=0, **data)  # no reads ahead: the count is the first batch's
    before = CountingFileSystem.requests
    pipeline = make_pipeline(config, "", process_index=0, process_count=1)
    pipeline.batch(0)
    counted = CountingFileSystem.requests - before
    pipeline.close()
    return counted


@pytest.mark.parametrize("plan", list(PLANS))
def test_start_up_requests_of_a_store_six_times_larger_grow_at_most_1_5_times(stores, plan):
    """The median over 5 seeds (which pieces a first batch reads is drawn: token_windows' first
    window reads 4-5 ranges of the small store, whose 8 shards often hold two of its pieces in
    one range, and 5-7 of the large one; the sentence plans 13 every time)."""
    counts = {c: [_startup(stores, c, plan, seed) for seed in range(5)] for c in (1, COPIES)}
    small, large = (sorted(counts[c])[2] for c in (1, COPIES))
    assert large <= 1.5 * small, counts
    large = max(counts[COPIES])
    # the manifest, then a window of 4 pieces: their index (2 ranges each), their blocks
    assert large <= 1 + 4 * 3, large


def test_lanes_of_32_rows_made_the_start_up_grow_with_the_store(stores):
    """The counter sees the growth issue 71 measured: the same host in lanes of 32 rows plans
    the 4 pieces of each of its 8 lanes, of which the small store has 8 pieces in all."""
    small, large = (_startup(stores, c, "full_sentences", lane_rows=32) for c in (1, COPIES))
    assert large >= 3 * small, (small, large)
