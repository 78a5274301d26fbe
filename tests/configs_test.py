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


def _shrink(config, zh_files, spm):
    """Same recipe, toy sizes: 2 layers of width 32, 3 steps, lengths scaled into [16, 64]; the
    session's SentencePiece model for English recipes."""
    config.batch_size, config.num_train_steps = 8, 3
    width = config.model.hidden_size
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size, config.model.num_hidden_layers = 64, 2
    config.model.dtype = "float32"
    if config.model.embedding_size:
        config.model.embedding_size = 16
    longest = config.data.max_seq_length
    config.data.max_seq_length = 64 if config.data.length_schedule else 32
    config.data.length_schedule = tuple(
        (f, max(16, t * 64 // longest)) for f, t in config.data.length_schedule
    )
    config.model.max_position_embeddings = 64 + config.model.position_offset
    config.data.max_predictions = 6
    config.data.tokenizer_model = spm
    config.optim.warmup_steps = 1
    config.optim.warmup_tokens = config.optim.decay_tokens = 0
    config.log_every, config.eval_every, config.eval_batches = 1, 3, 1
    config.checkpoint_every = 0
    config.progress_bar = False
    if config.batch_warmup.tokens or config.batch_warmup.budget_fraction:
        # batches of 8, then 16 (8 devices here)
        config.batch_size = 16
        config.batch_warmup.update(tokens=min(config.batch_warmup.tokens, 32 * 8), quantum=8)
    if config.budget_flops:  # a few steps of the shrunken model
        config.budget_flops = 1.5e8
    config.init_from, config.init_tiling = "", False
    for loss in [config.loss] + [config.phases[n].set.get("loss", {}) for n in config.phase_order]:
        if loss.get("matryoshka_dims"):  # embedding widths shrink with the model (768 -> 32)
            loss.matryoshka_dims = tuple(max(1, d * 32 // width) for d in loss.matryoshka_dims)
    for name in config.phase_order:  # every phase two steps, its lengths shrunk the same way
        entry = config.phases[name]
        entry.steps, entry.tokens = 2, 0
        changes = entry.set
        if "batch_size" in changes:
            changes.batch_size = 8
        if "data" in changes and "max_seq_length" in changes.data:
            changes.data.max_seq_length = 64
            changes.data.max_predictions = 6
    if config.data.language == "zh":
        config.data.corpus = zh_files[0]
        config.data.tokenizer_model = ""
        config.data.vocab_size = 320
        config.data.heldout_fraction = 0.2
        config.data.similar_words_file = zh_files[1] if config.data.correction else ""
    return config


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_config_runs_shrunken(name, zh_files, small_spm, tmp_path):
    config = _shrink(_load(name).get_config(), zh_files, small_spm)
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
