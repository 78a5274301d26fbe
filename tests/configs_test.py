"""Every recipe in configs/ runs a few shrunken steps end to end (same code, tiny sizes)."""

import importlib.util
import os

import pytest
from helpers import DOCS as ZH_DOCS

from bertjax import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_is_covered_and_documented():
    assert {
        "bert_tiny",
        "bert_base",
        "bert_large",
        "roberta_base",
        "albert_base",
        "bert_wwm_zh",
        "macbert_zh",
        "pert_zh",
        "roberta_zh_long",
    } <= set(CONFIGS)
    for name in CONFIGS:
        doc = _load(name).__doc__
        assert "Run:" in doc and "Expect:" in doc, name


@pytest.fixture(scope="module")
def zh_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("zh")
    corpus = root / "zh.txt"
    corpus.write_text("\n\n".join("\n".join(doc) for doc in ZH_DOCS * 8) + "\n", encoding="utf-8")
    similar = root / "similar.tsv"
    similar.write_text(
        "公园\t花园 乐园\n学习\t学会 读书\n今天\t明天 昨天\n非常\t十分 很\n", encoding="utf-8"
    )
    return str(corpus), str(similar)


def _smoke(name, zh_files, spm):
    """The recipe's own `smoke` variant (run_config.smoke_config), on the session's tokenizer;
    Chinese recipes read the test corpus (they have no built-in one)."""
    config = trainer.load_config_file(os.path.join(ROOT, "configs", f"{name}.py:smoke"))
    if config.data.language == "zh":
        config.data.corpus = zh_files[0]
        config.data.similar_words_file = zh_files[1] if config.data.correction else ""
    else:
        config.data.tokenizer_model = spm
    return config


def test_a_smoke_variant_is_the_recipe_at_toy_sizes():
    """`:smoke` keeps the recipe's objective, data plan, optimizer and phases; only sizes, steps
    and the tokenizer change; an unknown variant is named."""
    full = trainer.load_config_file(os.path.join(ROOT, "configs", "bert_base.py"))
    smoke = trainer.load_config_file(os.path.join(ROOT, "configs", "bert_base.py:smoke"))
    assert (smoke.model.num_hidden_layers, smoke.model.hidden_size) == (2, 32)
    assert (full.model.num_hidden_layers, full.model.hidden_size) == (12, 768)
    assert smoke.num_train_steps == 3 and list(smoke.phase_order) == list(full.phase_order)
    for key in ("loss", "optim.name", "data.sample_plan", "mlm_bias_init"):
        a, b = smoke, full
        for part in key.split("."):
            a, b = a[part], b[part]
        assert a == b, key
    assert smoke.phases.seq512.set.data.max_seq_length == 64
    with pytest.raises(ValueError, match="unknown recipe variant 'tiny'"):
        trainer.load_config_file(os.path.join(ROOT, "configs", "bert_base.py:tiny"))


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_config_runs_shrunken(name, zh_files, small_spm, tmp_path):
    config = _smoke(name, zh_files, small_spm)
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    if config.budget_flops:  # the budget sets the length: a few steps
        assert 1 <= summary["step"] <= 10
    else:
        assert summary["step"] == (2 * len(config.phase_order) or config.num_train_steps)
    assert summary["train/loss"] == summary["train/loss"]  # not NaN
    if config.loss.objective == "pretraining":
        assert 0.0 <= summary["eval/mlm_accuracy"] <= 1.0
        pairs = config.data.sample_plan in ("nsp", "sop")
        assert ("eval/nsp_accuracy" in summary) == pairs
    else:  # diffusion, fine-tuning, distillation report their own held-out metrics
        assert any(key.startswith("eval/") for key in summary), sorted(summary)
