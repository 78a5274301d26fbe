"""Corpora on the Hugging Face Hub (hf://), read by huggingface_hub's real client from the local
Hub (tests/hub_server.py): a run on a Hub copy is the run on the local copy, pinned at the commit
its revision named at the start (recorded in the workdir; a resumed run reads the same bytes
after the branch moved, asking the Hub nothing), each file fetched once; the dataset card's
subsets and splits; the Beam prepare with each worker reading its own files, and a killed
prepare resumed; a burst of 429s waited out to the same store; bad input in one line."""

import gzip
import io
import json
import os

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertjax.data import default_data_config, make_pipeline
from bertjax.data.store import beam_prepare, shard_writer
from bertjax.data.text import corpus
from bertjax.data.text import hub as hf

REPO = "bertjax-test/prose"
CARD = """---
configs:
- config_name: lines
  data_files:
  - split: train
    path: data/*.jsonl*
- config_name: table
  default: true
  data_files:
  - split: train
    path: table/train-*.parquet
  - split: validation
    path: table/validation-*.parquet
---
# prose
"""


@pytest.fixture
def short_retries():
    """Storage requests outside a run are retried for 20 s (not 600)."""
    from bertjax import retry

    retry.configure(20)
    yield
    retry.configure(retry.BUDGET_S)


def _lines(texts) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def _parquet(texts, column="text") -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({column: texts}), out, row_group_size=10)
    return out.getvalue()


@pytest.fixture(scope="module")
def texts():
    docs = [d for _, (_, d) in zip(range(60), corpus.iter_documents("builtin"))]
    return [" ".join(d) for d in docs]


@pytest.fixture(scope="module")
def repo(hub, texts, tmp_path_factory):
    """The corpus as 3 JSON Lines files on the Hub (plain, gzip, zstd; tag v1), the same as a
    local folder, and a card with a Parquet subset; then main moves on (v2)."""
    parts = [_lines(texts[p::3]) for p in range(3)]
    files = {
        "README.md": CARD,
        "data/part-0.jsonl": parts[0],
        "data/part-1.jsonl.gz": gzip.compress(parts[1], mtime=0),
        "data/part-2.jsonl.zst": zstandard.ZstdCompressor().compress(parts[2]),
        "table/train-00000-of-00001.parquet": _parquet(texts[:40]),
        "table/validation-00000-of-00001.parquet": _parquet(texts[40:]),
    }
    v1 = hub.commit(REPO, files)
    hub.tag(REPO, "v1", v1)
    local = tmp_path_factory.mktemp("prose")
    for p, data in enumerate(parts):
        (local / f"part-{p}.jsonl").write_bytes(data)
    return {"v1": v1, "local": str(local / "*.jsonl")}


def _config(spec, cache, **data):
    config = ml_collections.ConfigDict()
    config.seed, config.batch_size = 3, 8
    config.storage_retry_seconds = 20  # a test that fails does so in seconds
    config.data = default_data_config()
    config.data.update(corpus=spec, corpus_format="jsonl", cache_dir=str(cache), vocab_size=300)
    config.data.update(max_seq_length=32, max_predictions=5, prefetch=0, heldout_fraction=0.05)
    config.data.update(**data)
    return config


def _run(config, workdir):
    pipeline = make_pipeline(config, str(workdir), process_index=0, process_count=1)
    out = pipeline.tokenizer.fingerprint(), [pipeline.batch(s) for s in (0, 1)]
    out += (next(pipeline.eval_batches(1)),)
    pipeline.close()
    return out


def _equal(ours, theirs):
    assert ours[0] == theirs[0]  # the tokenizer trained on the training split
    for a, b in zip(ours[1] + [ours[2]], theirs[1] + [theirs[2]]):
        for key in b:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _file_reads(hub):
    """Bodies served per file (a non-LFS file's GET, an LFS file's GET on the CDN)."""
    reads = {}
    for r in hub.requests:
        if r.method == "GET" and (r.kind == "cdn" or (r.kind == "resolve" and r.status < 300)):
            name = r.path.rsplit("/", 1)[-1]
            reads[name] = reads.get(name, 0) + 1
    return reads


def test_a_hub_corpus_is_its_local_copy_pinned_at_its_commit(hub, repo, tmp_path):
    local = _run(_config(repo["local"], tmp_path / "cache-local"), tmp_path / "local")
    hub.reset()
    spec = f"hf://datasets/{REPO}/data/*.jsonl*"  # main: v1 for now
    workdir = tmp_path / "hub"
    _equal(_run(_config(spec, tmp_path / "cache"), workdir), local)
    record = json.loads((workdir / "corpus.json").read_text())
    assert record["pinned"] == f"hf://datasets/{REPO}@{repo['v1']}/data/*.jsonl*"
    # read three times (the held-out rule's first documents, the tokenizer, the store): one fetch
    assert _file_reads(hub) == {"part-0.jsonl": 1, "part-1.jsonl.gz": 1, "part-2.jsonl.zst": 1}

    hub.commit(REPO, {"data/part-3.jsonl": _lines(["A new document on main."] * 5)})
    hub.reset()
    _equal(_run(_config(spec, tmp_path / "cache"), workdir), local)  # resumed: as recorded
    assert hub.count() == 0
    moved = _run(_config(spec, tmp_path / "cache"), tmp_path / "fresh")  # a new run: main now
    assert (
        json.loads((tmp_path / "fresh" / "corpus.json").read_text())["pinned"] != record["pinned"]
    )
    assert hub.count("info") == 1 and moved[0] != local[0]


def test_the_dataset_card_names_the_files_of_a_subset_and_split(hub, repo, short_retries):
    base = f"hf://datasets/{REPO}@v1"
    table = f"hf://datasets/{REPO}@{repo['v1']}/table/"
    assert hub_pin(base) == table + "train-*.parquet"  # the card's default subset
    assert hub_pin(base, split="validation") == table + "validation-*.parquet"
    assert hub_pin(base, "lines") == f"hf://datasets/{REPO}@{repo['v1']}/data/*.jsonl*"
    with pytest.raises(hf.HubError, match=r"hf_subset='wiki'.*\['lines', 'table'\]"):
        hub_pin(base, "wiki")
    with pytest.raises(hf.HubError, match=r"hf_split='test'.*\['train', 'validation'\]"):
        hub_pin(base, split="test")
    docs = list(corpus.iter_documents(hub_pin(base, split="validation"), "parquet"))
    assert len(docs) == 20


def hub_pin(url, subset="", split="train"):
    return hf.pin(url, subset, split)


def test_beam_prepares_a_hub_corpus_each_worker_its_own_files(hub, repo, tmp_path, small_spm):
    """A killed job left item 0 done; the rerun reads only the other files, once each, and the
    store equals a one-shot prepare of the local copy."""
    from bertjax.data import corpus_pin

    settings = dict(tokenizer_model=small_spm, shard_bytes=8 << 10, heldout_fraction=0.0)
    local = _config(repo["local"], tmp_path / "cache", **settings)
    reference = beam_prepare.run(local, str(tmp_path / "reference"))

    config = _config(f"hf://datasets/{REPO}@v1/data/*", tmp_path / "cache", **settings)
    out = str(tmp_path / "store")
    pinned = corpus_pin.pinned_config(config, out)  # what the killed job did first
    items = shard_writer.work_items(pinned.data)
    spec = beam_prepare.make_spec(pinned, out, items)
    shard_writer.prepare_item(spec, items[0], shard_writer.local_tokenizer(spec))
    finished = os.stat(os.path.join(out, "items", "000000.json")).st_mtime_ns
    hub.reset()
    threads = ["--direct_num_workers=2", "--direct_running_mode=multi_threading"]
    manifest = beam_prepare.run(config, out, ["--runner=DirectRunner", *threads])
    assert _file_reads(hub) == {"part-1.jsonl.gz": 1, "part-2.jsonl.zst": 1}
    assert hub.count("info", "tree", "paths-info") == 0  # pinned and listed in OUTPUT/corpus.json
    assert os.stat(os.path.join(out, "items", "000000.json")).st_mtime_ns == finished
    for split in ("train", "eval"):
        ours, theirs = manifest["splits"][split], reference["splits"][split]
        assert [s["sha256"] for s in ours["shards"]] == [s["sha256"] for s in theirs["shards"]]
        assert ours["documents"] == theirs["documents"]
    assert repo["v1"] in manifest["corpus"]


def test_a_burst_of_429s_and_a_503_are_waited_out_to_the_same_run(hub, repo, tmp_path):
    import time

    from bertjax import retry

    spec = f"hf://datasets/{REPO}@v1/data/*"
    clean = _run(_config(spec, tmp_path / "clean"), tmp_path / "clean-run")
    hub.reset()
    asked = [
        hub.fail("info", 503),  # the client does not retry repo info: bertjax does
        hub.fail("tree", 429, times=2, ratelimit_reset=0),  # the client waits these out
        hub.fail("resolve", 429, times=3, ratelimit_reset=1),  # HEADs: bertjax, >= 1 s each
    ]
    before, start = retry.COUNTS.snapshot(), time.monotonic()
    spec = f"hf://datasets/{REPO}@v1/data/part-*"  # the same files, listed anew
    faulted = _run(_config(spec, tmp_path / "faulted"), tmp_path / "faulted-run")
    _equal(faulted, clean)
    assert [fault.hits for fault in asked] == [1, 2, 3]
    assert retry.COUNTS.snapshot()["recovered"] - before["recovered"] >= 1  # the repo info
    assert time.monotonic() - start >= 3.0  # the waits the RateLimit headers asked for


def test_bertjax_waits_at_least_what_a_429_asks_for():
    """A 429 that reaches bertjax's retries (the client's own gave up, or it has none: repo
    info) is tried again no sooner than its RateLimit (or Retry-After) says."""
    import random

    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    from bertjax import retry

    def answered(status, headers):
        request = httpx2.Request("GET", "http://127.0.0.1/api/datasets/o/n")
        try:
            hf_raise_for_status(httpx2.Response(status, headers=headers, request=request))
        except Exception as error:  # noqa: BLE001
            return error

    limited = answered(429, {"RateLimit": '"api";r=0;t=30', "RateLimit-Policy": "q=10;w=60"})
    later = answered(503, {"Retry-After": "12"})
    assert (retry.server_wait(limited), retry.server_wait(later)) == (30.0, 12.0)
    assert retry.server_wait(answered(429, {"RateLimit": '"api";r=5;t=30'})) == 0.0  # not out
    now, slept = [0.0], []
    policy = retry.Policy(100, clock=lambda: now[0], sleep=slept.append, rng=random.Random(0))
    errors = [limited, later]

    def request():
        if errors:
            raise errors.pop(0)
        return "ok"

    assert policy.call("hf://datasets/o/n", request) == "ok"
    assert slept[0] >= 30 and slept[1] >= 12


def _prepare_error(argv, capsys, monkeypatch):
    """The one line `python -m bertjax.data.prepare` stops with (ml_collections finds the
    --config.KEY overrides in sys.argv)."""
    from bertjax import cli

    argv = ["prepare", f"--config={TINY}", *argv]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(cli.BadInput):
        beam_prepare.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


TINY = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "bert_tiny.py")


JSONL, PARQUET = "--config.data.corpus_format=jsonl", "--config.data.corpus_format=parquet"


@pytest.mark.parametrize(
    "corpus, flags, line",
    [
        ("hf://datasets/bertjax-test/nope/data/*", [JSONL], r"no such repository on http://127"),
        (f"hf://datasets/{REPO}@v9/data/*", [JSONL], r"@v9: no such revision"),
        (f"hf://datasets/{REPO}@v1/text/*.jsonl", [JSONL], r"matches 'text/\*.jsonl' \(it has: R"),
        (f"hf://datasets/{REPO}@v1", [PARQUET, "--config.data.text_feature=body"], "no column"),
        (f"hf://datasets/{REPO}@v1/data/*", [PARQUET], "a jsonl file, but config.data.corpus_f"),
    ],
    ids=["repository", "revision", "pattern", "column", "format"],
)
def test_bad_hub_corpora_stop_with_one_line(
    hub, repo, tmp_path, capsys, monkeypatch, corpus, flags, line
):
    import re

    argv = [f"--config.data.corpus={corpus}", *flags, f"--output={tmp_path / 'out'}"]
    argv.append("--config.storage_retry_seconds=5")
    assert re.search(line, _prepare_error(argv, capsys, monkeypatch))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_gated_dataset_needs_a_token_and_reads_with_one(hub, texts, tmp_path, monkeypatch):
    from hub_server import TOKEN

    hub.commit("bertjax-test/gated", {"a.jsonl": _lines(texts[:3])}, gated=True)
    spec = "hf://datasets/bertjax-test/gated/*.jsonl"
    with pytest.raises(hf.HubError, match="is a gated dataset: .* set HF_TOKEN"):
        list(corpus.iter_documents(spec, "jsonl"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert len(list(corpus.iter_documents(spec, "jsonl"))) == 3


def test_an_offline_machine_stops_at_once_with_one_line(hub, repo, tmp_path, monkeypatch):
    from hub_server import _reread_endpoint, use_endpoint

    with use_endpoint("http://127.0.0.1:9", tmp_path / "home"):  # nothing listens there
        with pytest.raises(hf.HubError, match="cannot reach the Hub at http://127.0.0.1:9"):
            hf.pin(f"hf://datasets/{REPO}/data/*")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _reread_endpoint()
    try:
        with pytest.raises(hf.HubError, match="HF_HUB_OFFLINE is set"):
            hf.pin(f"hf://datasets/{REPO}/data/*")
    finally:
        monkeypatch.delenv("HF_HUB_OFFLINE")
        _reread_endpoint()
