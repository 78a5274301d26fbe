"""Retrieval metrics against pytrec_eval on random runs, BEIR directories, pair files and the
built-in pairs, and one clear message for each kind of bad input."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytrec_eval

from bertjax.data.text import beir, pairs
from bertjax.evaluation import retrieval


def test_metrics_match_pytrec_eval_on_random_runs():
    rs = np.random.RandomState(0)
    docs = [f"d{i}" for i in range(150)]
    qrels, run = {}, {}
    for q in range(40):
        judged = rs.choice(150, rs.randint(1, 12), replace=False)
        grades = rs.randint(0, 3, len(judged))
        grades[0] = max(grades[0], 1)  # at least one relevant document
        qrels[f"q{q}"] = {docs[d]: int(g) for d, g in zip(judged, grades)}
        retrieved = rs.choice(150, rs.randint(20, 150), replace=False)
        scores = rs.permutation(len(retrieved)) + rs.rand()  # distinct: no tie-breaking
        run[f"q{q}"] = {docs[d]: float(s) for d, s in zip(retrieved, scores)}
    ours = retrieval.evaluate_run(run, qrels)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    per_query = evaluator.evaluate(run)
    top10 = {q: dict(sorted(r.items(), key=lambda kv: -kv[1])[:10]) for q, r in run.items()}
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    np.testing.assert_allclose(
        ours["ndcg@10"], np.mean([m["ndcg_cut_10"] for m in per_query.values()]), rtol=1e-12
    )
    np.testing.assert_allclose(
        ours["recall@100"], np.mean([m["recall_100"] for m in per_query.values()]), rtol=1e-12
    )
    np.testing.assert_allclose(
        ours["mrr@10"], np.mean([m["recip_rank"] for m in mrr.values()]), rtol=1e-12
    )
    assert 0.0 < ours["ndcg@10"] < 1.0


def test_dense_search_is_exact():
    rs = np.random.RandomState(1)
    queries, docs = rs.randn(7, 5), rs.randn(300, 5)
    indices, scores = retrieval.search(queries, docs, 10, block=3)
    want = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    np.testing.assert_array_equal(indices, want)
    assert (np.diff(scores, axis=1) <= 0).all()


def _write_beir(root, qrels_lines, queries=None):
    root.mkdir()
    corpus = [
        {"_id": "d1", "title": "Coroutines", "text": "can be suspended."},
        {"_id": "d2", "text": "Lists hold items."},
    ]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in corpus) + "\n")
    queries = queries or [
        {"_id": "q1", "text": "what is a coroutine"},
        {"_id": "q2", "text": "lists"},
    ]
    (root / "queries.jsonl").write_text("\n".join(json.dumps(r) for r in queries) + "\n")
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels_lines)
    return str(root)


def test_beir_reading_and_bad_input(tmp_path):
    data = beir.read_beir(_write_beir(tmp_path / "ok", "q1\td1\t1\nq1\td2\t0\n"))
    assert data.corpus == {"d1": "Coroutines can be suspended.", "d2": "Lists hold items."}
    assert data.queries == {"q1": "what is a coroutine"}  # only judged queries
    assert data.qrels == {"q1": {"d1": 1, "d2": 0}}
    with pytest.raises(ValueError, match=r"test.tsv line 2: corpus-id 'd9' is not in .*corpus"):
        beir.read_beir(_write_beir(tmp_path / "missing", "q1\td9\t1\n"))
    empty = [{"_id": "q1", "text": "what"}, {"_id": "q2", "text": "  "}]
    with pytest.raises(ValueError, match=r"queries.jsonl line 2: query 'q2' has empty text"):
        beir.read_beir(_write_beir(tmp_path / "empty", "q1\td1\t1\n", empty))
    with pytest.raises(FileNotFoundError, match="corpus.jsonl not found"):
        beir.read_beir(str(tmp_path / "nothing"))


def test_pair_files_and_bad_input(tmp_path):
    records = [
        {"query": "what is a list", "positive": "Lists hold items.", "negatives": ["A set."]},
        {"query": "coroutines", "positive": "Coroutines can be suspended."},
    ]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    parquet = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    for path in (jsonl, parquet):
        got = pairs.read_pairs(str(path))
        assert [(p.query, p.positive, p.negatives) for p in got] == [
            ("what is a list", "Lists hold items.", ("A set.",)),
            ("coroutines", "Coroutines can be suspended.", ()),
        ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "pos": "d"}) + "\n")
    with pytest.raises(
        ValueError, match=r"bad.jsonl line 1 has no 'positive' field .*positive_field"
    ):
        pairs.read_pairs(str(bad))
    renamed = pairs.read_pairs(str(bad), positive_field="pos")
    assert renamed[0].positive == "d"
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"query": " ", "positive": "d"}) + "\n")
    with pytest.raises(ValueError, match=r"blank.jsonl line 1: field 'query' must be a non-empty"):
        pairs.read_pairs(str(blank))


def test_builtin_pairs_and_split():
    every = pairs.builtin_pairs()
    assert len(every) > 1000
    headings = [p for p in every if p.key.startswith("topic:")]
    assert headings and all("#" in p.key for p in headings)
    train, dev = pairs.split_pairs(every, 0.1)
    assert 0.05 < len(dev) / len(every) < 0.15
    assert not {p.key for p in train} & {p.key for p in dev}
    assert pairs.split_pairs(every, 0.1)[1] == dev  # the same split every time


def test_pair_data_batches_negatives_and_heldout_score(tmp_path, small_spm):
    """PairData: batch(step) is a pure function of the step; a pair's own hard negatives come
    first, missing ones are other documents; the held-out batches pad with weight-0 rows; perfect
    vectors score NDCG@10 = 1."""
    from bertjax.objectives.embedding import Embedding, add_embedding_config
    from bertjax.tasks.embedding_data import PairData
    from bertjax.trainer import default_run_config

    train = tmp_path / "train.jsonl"
    lines = [{"query": f"question {i}", "positive": f"answer number {i}"} for i in range(10)]
    lines[0]["negatives"] = ["the own negative"]
    train.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    dev = tmp_path / "dev.jsonl"
    dev.write_text(
        "\n".join(json.dumps({"query": f"q{i}", "positive": f"d{i}"}) for i in range(5)) + "\n"
    )
    config = add_embedding_config(default_run_config())
    config.batch_size = 4
    config.data.tokenizer_model = small_spm
    config.data.max_seq_length = 16
    config.pairs.update(source=str(train), dev_file=str(dev), num_negatives=2, max_query_length=8)
    data = PairData(config, str(tmp_path / "work"), Embedding.from_config(config))
    again = PairData(config, str(tmp_path / "work"), Embedding.from_config(config))
    for key, value in data.batch(3).items():
        np.testing.assert_array_equal(value, again.batch(3)[key])
    batch = data.batch(0)
    assert batch["doc_input_ids"].shape == (4, 3, 16) and batch["input_ids"].shape == (4, 8)
    rows = data.train["doc_input_ids"]
    decode = data.tokenizer.decode
    assert decode(rows[0, 1]) == "the own negative"  # its own first
    assert decode(rows[0, 2]) != decode(rows[0, 0])  # then another pair's positive
    assert decode(rows[0, 2]).startswith("answer number")
    padded = list(data.eval_batches(0))
    assert len(padded) == 2 and padded[1]["weights"].tolist() == [1.0, 0.0, 0.0, 0.0]
    perfect = np.zeros((5, 2, 5), np.float32)
    perfect[np.arange(5), :, np.arange(5)] = 1.0  # each query equals its own document
    assert data.score(perfect) == {"ndcg@10": 1.0, "mrr@10": 1.0, "recall@100": 1.0}


def test_embedding_checkpoint_loads_with_its_pooling(tmp_path, small_spm):
    """A bertjax embedding checkpoint loads with `bertjax.embed.load`: the pooling and
    normalization its run config trained, its tokenizer and weights (vectors equal the model's
    own on the same rows)."""
    import jax

    from bertjax import embed, step
    from bertjax.data.tokenizer import Tokenizer
    from bertjax.interop.checkpoints import tokenizer_meta
    from bertjax.modeling.embedder import BertForEmbedding
    from bertjax.objectives.embedding import add_embedding_config
    from bertjax.tasks.tasks import encode_pairs
    from bertjax.trainer import default_run_config
    from bertjax.training import sharding
    from bertjax.training.checkpoint import Checkpointer
    from bertjax.training.run_config import model_config

    config = add_embedding_config(default_run_config())
    config.model.update(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    config.model.update(intermediate_size=64, hidden_dropout_prob=0.0)
    config.loss.pooling, config.loss.normalize = "cls,mean", False
    config.data.max_seq_length = 16
    tokenizer = Tokenizer(small_spm)
    cfg = model_config(config, tokenizer)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    state = step.init_train_state(config, cfg, mesh, jax.random.key(0))
    meta = {"config": config.to_dict(), "model_config": cfg.to_dict(), "data_fingerprint": "-"}
    checkpoints = Checkpointer(str(tmp_path / "checkpoints"), keep=1, async_save=False)
    checkpoints.save(state, {**meta, **tokenizer_meta(tokenizer)}, force=True)
    checkpoints.close()
    embedder = embed.load(str(tmp_path), matmul_dtype="float32")
    assert embedder.pooling == ("cls", "mean") and embedder.normalize is False
    texts = ["Return the list of names.", "a coroutine can be suspended"]
    rows = encode_pairs(tokenizer, texts, ["", ""], 16)
    model = BertForEmbedding(cfg, ("cls", "mean"), False)
    want = model.apply({"params": state.params}, rows["input_ids"], rows["attention_mask"])
    np.testing.assert_allclose(embedder.encode(texts, batch_size=2), want, atol=1e-5)
