"""Task metrics as GLUE and CoNLL report them (numpy only), and which direction is better.

Sequence tasks: accuracy, binary F1 (positive class 1), Matthews correlation (CoLA), Pearson and
Spearman (STS-B; Spearman = Pearson of average-tie ranks). Token tasks: entity-level F1 over BIO
spans with exact (start, end, type) match, as seqeval's default mode counts them.

Each agrees with its reference on any input (tests/task_metrics_test.py: scikit-learn's
accuracy_score, f1_score, matthews_corrcoef; SciPy's pearsonr, spearmanr; seqeval). Degenerate
inputs: an F1 without true or predicted positives is 0 and Matthews with constant predictions or
labels is 0, as scikit-learn returns them; a correlation with a constant side is 0 with a logged
warning, where SciPy returns NaN (a NaN would poison a GLUE average and the best-checkpoint
comparison).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

# Metrics where lower is better; every other dev metric is maximised.
_LOWER_IS_BETTER = ("loss", "mse")


def accuracy(predictions, labels) -> float:
    """Fraction of predictions equal to the labels."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float(np.mean(predictions == labels)) if len(labels) else 0.0


def f1_binary(predictions, labels, positive: int = 1) -> float:
    """F1 of the positive class (MRPC/QQP style); 0 without true or predicted positives."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    tp = float(np.sum((predictions == positive) & (labels == positive)))
    fp = float(np.sum((predictions == positive) & (labels != positive)))
    fn = float(np.sum((predictions != positive) & (labels == positive)))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def macro_f1(predictions, labels) -> float:
    """Unweighted mean of each class's F1 over the classes present in the labels or the
    predictions (scikit-learn's average="macro"); a class absent from both is not averaged."""
    classes = np.union1d(np.asarray(predictions), np.asarray(labels))
    if not len(classes):
        return 0.0
    return float(np.mean([f1_binary(predictions, labels, c) for c in classes]))


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation (multi-class form of Gorodkin 2004); 0 when undefined."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    classes = np.union1d(predictions, labels)
    confusion = np.zeros((len(classes), len(classes)), np.float64)
    np.add.at(
        confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, predictions)), 1
    )
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    denominator = np.sqrt((n * n - p @ p) * (n * n - t @ t))
    return float((correct * n - t @ p) / denominator) if denominator else 0.0


def pearson(x, y, name: str = "pearson") -> float:
    """Pearson correlation of predictions ``x`` and labels ``y``; 0 (and a logged warning) when
    either side is constant (where SciPy returns NaN)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    constant = [side for side, v in (("predictions", x), ("labels", y)) if np.all(v == v[:1])]
    if constant:
        logging.warning(
            "%s: the %s are constant (%d values); reporting 0", name, constant[0], len(x)
        )
        return 0.0
    x, y = x - x.mean(), y - y.mean()
    return float(np.sum(x * y) / np.sqrt(np.sum(x * x) * np.sum(y * y)))


def average_ranks(x) -> np.ndarray:
    """1-based ranks with ties sharing the mean of their positions (as scipy.stats.rankdata)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return ranks


def spearman(x, y) -> float:
    """Spearman correlation: Pearson of average-tie ranks."""
    return pearson(average_ranks(x), average_ranks(y), name="spearman")


def bio_spans(tags: Sequence[str]) -> set:
    """(start, end_exclusive, type) spans of a BIO sequence; an I- without a matching open span
    starts a new one (seqeval's default, non-strict behaviour)."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and kind == label
        if start is not None and not continues:
            spans.add((start, i, kind))
            start = kind = None
        if prefix in ("B", "I") and not continues:
            start, kind = i, label
    return spans


def entity_f1(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> dict:
    """Entity-level precision/recall/F1 over sentences: a span counts only on an exact match."""
    tp = n_pred = n_gold = 0
    for p, g in zip(predicted, gold):
        p_spans, g_spans = bio_spans(p), bio_spans(g)
        tp += len(p_spans & g_spans)
        n_pred += len(p_spans)
        n_gold += len(g_spans)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"entity_precision": precision, "entity_recall": recall, "entity_f1": f1}


def sequence_metrics(predictions, labels, num_labels: int) -> dict:
    """GLUE's metrics for a sequence task: regression (num_labels=1) or classification."""
    if num_labels == 1:
        predictions, labels = np.asarray(predictions, np.float64), np.asarray(labels, np.float64)
        return {
            "pearson": pearson(predictions, labels),
            "spearman": spearman(predictions, labels),
            "mse": float(np.mean((predictions - labels) ** 2)),
        }
    result = {
        "accuracy": accuracy(predictions, labels),
        "matthews": matthews_corrcoef(predictions, labels),
    }
    if num_labels == 2:
        result["f1"] = f1_binary(predictions, labels)
    else:
        result["macro_f1"] = macro_f1(predictions, labels)
    return result


def better(metric: str, new: float, old: float | None) -> bool:
    """Whether ``new`` beats ``old`` on ``metric`` (losses and MSE: lower is better)."""
    if old is None:
        return True
    return new < old if metric in _LOWER_IS_BETTER else new > old
