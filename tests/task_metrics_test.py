"""Task metrics against their reference implementations on random inputs: scikit-learn
(accuracy, F1, macro-F1, Matthews), SciPy (Pearson, Spearman) and seqeval (entity F1), which are
test-only dependencies; and the degenerate cases where bertjax defines a value."""

import logging
import warnings

import numpy as np
import pytest
import scipy.stats
import seqeval.metrics
import sklearn.metrics
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax.tasks import task_metrics

SETTINGS = settings(max_examples=150, deadline=None)


def _label_pairs(num_labels: int, min_size: int = 1):
    """(predictions, labels): equal-length lists of ids in [0, num_labels)."""
    return _pairs(st.integers(0, num_labels - 1), min_size)


def _pairs(values, min_size: int = 1):
    """Two equal-length lists of ``values``."""
    return st.integers(min_size, 40).flatmap(
        lambda n: st.tuples(*[st.lists(values, min_size=n, max_size=n)] * 2)
    )


def _sklearn(metric, *args, **kwargs):
    with warnings.catch_warnings():  # ill-defined precision/recall: scikit-learn warns, gives 0
        warnings.simplefilter("ignore")
        return float(metric(*args, **kwargs))


@SETTINGS
@given(_label_pairs(3))
def test_accuracy_matches_sklearn(pair):
    predictions, labels = pair
    expected = sklearn.metrics.accuracy_score(labels, predictions)
    assert task_metrics.accuracy(predictions, labels) == pytest.approx(expected, abs=1e-12)


@SETTINGS
@given(_label_pairs(2))
def test_binary_f1_matches_sklearn(pair):
    predictions, labels = pair
    expected = _sklearn(sklearn.metrics.f1_score, labels, predictions, pos_label=1, labels=[0, 1])
    assert task_metrics.f1_binary(predictions, labels) == pytest.approx(expected, abs=1e-12)


@SETTINGS
@given(_label_pairs(5))
def test_macro_f1_matches_sklearn_over_the_labels_present(pair):
    predictions, labels = pair
    expected = _sklearn(sklearn.metrics.f1_score, labels, predictions, average="macro")
    assert task_metrics.macro_f1(predictions, labels) == pytest.approx(expected, abs=1e-12)


def test_macro_f1_ignores_classes_absent_from_labels_and_predictions():
    # classes 0 and 1 are perfect; a third class id that never occurs does not drag the mean down
    assert task_metrics.macro_f1([0, 1, 1], [0, 1, 1]) == 1.0
    metrics = task_metrics.sequence_metrics(np.array([0, 1, 1]), np.array([0, 1, 1]), 3)
    assert metrics["macro_f1"] == 1.0


@SETTINGS
@given(_label_pairs(2) | _label_pairs(3))
def test_matthews_matches_sklearn(pair):
    predictions, labels = pair
    expected = _sklearn(sklearn.metrics.matthews_corrcoef, labels, predictions)
    assert task_metrics.matthews_corrcoef(predictions, labels) == pytest.approx(expected, abs=1e-9)


def test_matthews_is_zero_for_constant_predictions_or_labels_as_sklearn():
    for predictions, labels in (([1, 1, 1, 1], [0, 1, 0, 1]), ([0, 1, 1, 0], [1, 1, 1, 1])):
        assert task_metrics.matthews_corrcoef(predictions, labels) == 0.0
        assert _sklearn(sklearn.metrics.matthews_corrcoef, labels, predictions) == 0.0


# STS-B-like scores on a grid: either exactly constant or well-conditioned (no near-ties that
# would compare two float64 algorithms on rounding alone).
_SCORES = st.integers(0, 20).map(lambda k: k / 4.0)


@SETTINGS
@given(_pairs(_SCORES, min_size=2))
def test_correlations_match_scipy(pair):
    x, y = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SciPy's ConstantInputWarning
        pearson = scipy.stats.pearsonr(x, y).statistic
        spearman = scipy.stats.spearmanr(x, y).statistic
    for ours, theirs in (
        (task_metrics.pearson(x, y), pearson),
        (task_metrics.spearman(x, y), spearman),
    ):
        if np.isnan(theirs):  # a constant side: bertjax reports 0 (with a warning)
            assert ours == 0.0
        else:
            assert ours == pytest.approx(theirs, abs=1e-9)


def test_constant_correlations_are_zero_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert task_metrics.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
        assert task_metrics.spearman([1.0, 2.0, 3.0], [0.1, 0.1, 0.1]) == 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert any("pearson: the predictions are constant" in m for m in messages), messages
    assert any("spearman: the labels are constant" in m for m in messages), messages
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(scipy.stats.pearsonr([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]).statistic)
    # 0.1 * 3 / 3 != 0.1 in float64: the constant check must not see a tiny non-zero spread
    assert task_metrics.pearson([0.1, 0.1, 0.1], [1.0, 2.0, 3.0]) == 0.0


_TAGS = st.sampled_from(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
_SENTENCES = st.lists(st.integers(1, 12), min_size=1, max_size=6).flatmap(
    lambda lengths: st.tuples(
        st.tuples(*[st.lists(_TAGS, min_size=n, max_size=n) for n in lengths]),
        st.tuples(*[st.lists(_TAGS, min_size=n, max_size=n) for n in lengths]),
    )
)


@SETTINGS
@given(_SENTENCES)
def test_entity_f1_matches_seqeval(pair):
    predicted, gold = (list(map(list, side)) for side in pair)
    ours = task_metrics.entity_f1(predicted, gold)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns on 0/0 precision or recall, gives 0
        expected = {
            "entity_precision": seqeval.metrics.precision_score(gold, predicted),
            "entity_recall": seqeval.metrics.recall_score(gold, predicted),
            "entity_f1": seqeval.metrics.f1_score(gold, predicted),
        }
    for key, value in expected.items():
        assert ours[key] == pytest.approx(value, abs=1e-12), key
