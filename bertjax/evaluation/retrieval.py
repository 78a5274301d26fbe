"""Retrieval metrics as pytrec_eval (trec_eval) defines them, and exact dense search.

- NDCG@k: sum over the top k of rel / log2(rank + 1), over the same sum for the ideal ordering
  of the judged documents (linear gain, as trec_eval's ``ndcg_cut``).
- MRR@k: 1 / rank of the first relevant (rel > 0) document in the top k, else 0 (BEIR's MRR@k;
  trec_eval's ``recip_rank`` on a run cut at k).
- Recall@k: relevant documents in the top k over all relevant documents (``recall_k``).

Each is averaged over the queries that have at least one relevant document. Runs are ranked by
score, highest first; the tests use distinct scores (trec_eval breaks ties by document id).
"""

from __future__ import annotations

import numpy as np

CUTOFFS = {"ndcg": 10, "mrr": 10, "recall": 100}


def search(queries_QE: np.ndarray, docs_NE: np.ndarray, k: int, block: int = 1024):
    """(indices [Q, k'], scores [Q, k']) of the k' = min(k, N) highest dot products per query,
    best first (exact; queries in blocks to bound memory)."""
    k = min(k, docs_NE.shape[0])
    docs_NE = np.asarray(docs_NE, np.float32)
    indices, scores = [], []
    for start in range(0, queries_QE.shape[0], block):
        scores_BN = np.asarray(queries_QE[start : start + block], np.float32) @ docs_NE.T
        top = np.argpartition(-scores_BN, k - 1, axis=1)[:, :k]
        top_scores = np.take_along_axis(scores_BN, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        indices.append(np.take_along_axis(top, order, axis=1))
        scores.append(np.take_along_axis(top_scores, order, axis=1))
    return np.concatenate(indices), np.concatenate(scores)


def query_metrics(ranked: list[str], judged: dict[str, int]) -> dict[str, float]:
    """NDCG@10, MRR@10 and Recall@100 of one query's ranked document ids."""
    relevant = {d for d, rel in judged.items() if rel > 0}
    gains = [max(judged.get(d, 0), 0) for d in ranked]
    discounts = 1.0 / np.log2(np.arange(2, len(ranked) + 2))
    k = CUTOFFS["ndcg"]
    ideal = sorted((max(r, 0) for r in judged.values()), reverse=True)[:k]
    idcg = float(np.dot(ideal, discounts[: len(ideal)])) if ranked else 0.0
    dcg = float(np.dot(gains[:k], discounts[: min(k, len(gains))]))
    first = next((i for i, d in enumerate(ranked[: CUTOFFS["mrr"]]) if d in relevant), None)
    found = len(relevant & set(ranked[: CUTOFFS["recall"]]))
    return {
        "ndcg@10": dcg / idcg if idcg > 0 else 0.0,
        "mrr@10": 0.0 if first is None else 1.0 / (first + 1),
        "recall@100": found / len(relevant),
    }


def evaluate_run(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict:
    """Mean metrics of ``run`` (query -> {doc: score}) over the judged queries with a relevant
    document (a query missing from the run scores 0)."""
    totals: dict[str, float] = {}
    count = 0
    for query_id, judged in qrels.items():
        if not any(rel > 0 for rel in judged.values()):
            continue
        scored = run.get(query_id, {})
        ranked = sorted(scored, key=lambda d: -scored[d])
        for name, value in query_metrics(ranked, judged).items():
            totals[name] = totals.get(name, 0.0) + value
        count += 1
    if not count:
        raise ValueError("no judged query has a relevant document: nothing to evaluate")
    return {name: value / count for name, value in totals.items()}


def dense_run(
    query_ids: list[str], queries_QE, doc_ids: list[str], docs_NE, k: int = 100
) -> dict[str, dict[str, float]]:
    """The top-k run of exact dot-product search."""
    indices, scores = search(np.asarray(queries_QE), np.asarray(docs_NE), k)
    return {
        q: {doc_ids[int(i)]: float(s) for i, s in zip(row, row_scores)}
        for q, row, row_scores in zip(query_ids, indices, scores)
    }
