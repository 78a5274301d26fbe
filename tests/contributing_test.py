"""CONTRIBUTING.md's example objective (a label-smoothed MLM) is built from the page as written
and computes the loss it claims: (1 - e) * NLL + e * cross-entropy against the uniform
distribution, checked against a float64 numpy port; the unsmoothed NLL keeps its name."""

import os

import numpy as np
import pytest
import runnable_blocks as rb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def smoothed_mlm():
    with open(os.path.join(ROOT, "CONTRIBUTING.md"), encoding="utf-8") as f:
        blocks = rb.page_blocks("CONTRIBUTING.md", f.read())
    (example,) = [b for b in blocks if "class SmoothedMLM" in b.text]
    namespace = {"__name__": "smoothed_mlm"}
    exec(compile(example.text, "CONTRIBUTING.md", "exec"), namespace)
    return namespace["SmoothedMLM"]


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_the_example_objective_computes_the_smoothed_loss(smoothed_mlm):
    e = 0.2
    objective = smoothed_mlm(label_smoothing=e, next_sentence=False)
    assert smoothed_mlm.objective_name == "mlm_smoothed"
    assert smoothed_mlm.extra_config_keys == ("label_smoothing",)  # its one config.loss key
    rs = np.random.RandomState(0)
    logits = rs.randn(3, 4, 11).astype(np.float32)
    batch = {
        "masked_ids": rs.randint(0, 11, (3, 4)).astype(np.int32),
        "masked_weights": np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32),
    }
    sums = objective.loss_sums({"mlm_logits": logits}, batch)
    norms = objective.normalizers(batch)
    logp = _log_softmax(logits.astype(np.float64))
    nll = -np.take_along_axis(logp, batch["masked_ids"][..., None], -1)[..., 0]
    uniform = -logp.mean(-1)
    w = batch["masked_weights"].astype(np.float64)
    want = np.sum(w * ((1 - e) * nll + e * uniform)) / w.sum()
    np.testing.assert_allclose(float(objective.total_loss(sums, norms)), want, rtol=1e-5)
    metrics = objective.metrics(sums, norms)
    np.testing.assert_allclose(float(metrics["mlm_smoothed_loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["mlm_loss"]), np.sum(w * nll) / w.sum(), rtol=1e-5)


def test_the_example_objective_checks_its_setting(smoothed_mlm):
    with pytest.raises(ValueError, match="config.loss.label_smoothing=1.0"):
        smoothed_mlm(label_smoothing=1.0, next_sentence=False)
    with pytest.raises(ValueError, match="config.loss.mlm_weight"):  # its parent's check runs too
        smoothed_mlm(label_smoothing=0.1, mlm_weight=-1.0, next_sentence=False)
