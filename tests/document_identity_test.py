"""A corpus's identity does not depend on where it is read from (issue 71): the same files in
another folder, behind a file:// URL or converted to Parquet give the same held-out documents,
tokenizer and batches; and a small corpus never trains with an empty held-out split."""

import json
import shutil

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data import default_data_config, make_pipeline
from bertjax.data.text import corpus
from bertjax.data.text import sentences as text

DOCS = 60  # ~2,400 sentences of the built-in corpus: a small corpus


@pytest.fixture(scope="module")
def texts():
    docs = [d for _, (_, d) in zip(range(DOCS), corpus.iter_documents("builtin"))]
    return [" ".join(d) for d in docs]


def _jsonl(folder, texts, parts=3):
    """The texts as JSON Lines files part-0.jsonl ... in ``folder``; its glob."""
    folder.mkdir(parents=True)
    for p in range(parts):
        rows = texts[p::parts]
        (folder / f"part-{p}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in rows)
        )
    return str(folder / "*.jsonl")


def _config(corpus_glob, cache, corpus_format="jsonl", **data):
    config = ml_collections.ConfigDict()
    config.seed, config.batch_size = 3, 8
    config.data = default_data_config()
    settings = dict(vocab_size=300, max_seq_length=32, max_predictions=5, prefetch=0)
    settings = {**settings, "heldout_fraction": 0.05, **data}
    config.data.update(corpus=corpus_glob, corpus_format=corpus_format, cache_dir=str(cache))
    config.data.update(**settings)
    return config


def _run(config, workdir):
    """(tokenizer fingerprint, held-out texts, the first two batches) of a pipeline."""
    held = [" ".join(d) for _, d in corpus.split_documents(config.data, "eval")]
    pipeline = make_pipeline(config, str(workdir), process_index=0, process_count=1)
    batches = [pipeline.batch(step) for step in (0, 1)]
    evals = next(pipeline.eval_batches(1))
    pipeline.close()
    return pipeline.tokenizer.fingerprint(), held, batches, evals


def test_a_moved_corpus_keeps_its_split_tokenizer_and_batches(texts, tmp_path):
    first = _jsonl(tmp_path / "a" / "corpus", texts)
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "deeper" / "b")
    moved = str(tmp_path / "elsewhere" / "deeper" / "b" / "corpus" / "*.jsonl")
    runs = [
        _run(_config(glob, tmp_path / f"cache{i}"), tmp_path / f"work{i}")
        for i, glob in enumerate((first, moved, f"file://{moved}"))
    ]
    reference = runs[0]
    assert reference[1], "the held-out split is empty"
    for run in runs[1:]:
        assert run[0] == reference[0]  # the tokenizer trained on the training split
        assert run[1] == reference[1]  # the held-out documents
        for ours, theirs in zip(run[2] + [run[3]], reference[2] + [reference[3]]):
            for key in theirs:
                np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_the_same_records_as_parquet_are_the_same_documents(texts, tmp_path):
    lines = _jsonl(tmp_path / "lines", texts, parts=1)
    (tmp_path / "table").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "table" / "part-0.parquet")
    ids = [[i for i, _ in corpus.iter_documents(spec, fmt)] for spec, fmt in (
        (lines, "jsonl"), (str(tmp_path / "table" / "*.parquet"), "parquet"))]  # fmt: skip
    assert ids[0] == ids[1] and len(ids[0]) == DOCS


def test_a_small_corpus_always_holds_out_a_document(texts, tmp_path):
    """The same small corpus under 50 folder names holds out the same documents, never none;
    and 50 small corpora each hold out at least one document and train on the rest, where the
    hash alone left most of them without one."""
    forced, held = 0, []
    for i in range(50):
        glob = _jsonl(tmp_path / f"run-{i}" / f"corpus {i}", texts[:20], parts=2)
        held.append([d for d, _ in corpus.split_documents(_config(glob, tmp_path).data, "eval")])
        small = _jsonl(tmp_path / f"small-{i}", texts[i : i + 2 + i % 5], parts=1)
        c = _config(small, tmp_path, heldout_fraction=0.02).data
        split = {d: s for s in ("train", "eval") for d, _ in corpus.split_documents(c, s)}
        assert "eval" in split.values() and "train" in split.values(), i
        forced += bool(corpus.forced_document(c))
    assert held[0] and all(h == held[0] for h in held)
    assert forced >= 40


@pytest.mark.parametrize("plan,documents", [("full_sentences", 4), ("nsp", 2)])
def test_a_run_on_a_corpus_the_hash_holds_nothing_of_evaluates(texts, tmp_path, plan, documents):
    """A corpus of 2 documents holds out one: NSP evaluates on it (random next segments from
    the same document, as BERT when it has no other)."""
    glob = _jsonl(tmp_path / "tiny", texts[:documents], parts=1)
    config = _config(glob, tmp_path, heldout_fraction=0.02, sample_plan=plan)
    assert not any(text.is_heldout(d, 0.02) for d, _ in corpus.config_documents(config.data))
    pipeline = make_pipeline(config, str(tmp_path / "work"), process_index=0, process_count=1)
    assert next(pipeline.eval_batches(1))["attention_mask"].sum() > 0
    pipeline.close()


def test_without_a_heldout_split_the_run_says_what_to_set(texts, tmp_path):
    glob = _jsonl(tmp_path / "none", texts[:10], parts=1)
    config = _config(glob, tmp_path, heldout_fraction=0.0)
    pipeline = make_pipeline(config, str(tmp_path / "work"), process_index=0, process_count=1)
    with pytest.raises(ValueError, match=r"heldout_fraction=0.0.*config.eval_every=0"):
        next(pipeline.eval_batches(1))
    pipeline.close()
