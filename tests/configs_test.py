"""Every recipe in configs/ runs a few shrunken steps end to end (same code, tiny sizes): its
`:smoke` variant here, or, for the recipes another test already trains end to end (RUN_ELSEWHERE),
in that test (one run a recipe, not two: each costs ~5-12 s of the suite's CPU)."""

import importlib.util
import os

import pytest
from helpers import DOCS as ZH_DOCS

from bertjax import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))


# Recipes another test runs end to end as the recipe (all steps, held-out eval): where, and a
# line of that file (or of the runnable blocks of README.md and docs/, which tests/docs_test.py
# runs: a recipe named there runs as its smoke variant); test_recipes_run_elsewhere_are_run_there
# keeps the list honest.
PAGES = "README.md and docs/"
RUN_ELSEWHERE = {
    "bert_tiny": (PAGES, "pip install -e . && python train.py\n"),
    "finetune_glue": (PAGES, "python train.py --config=configs/finetune_glue.py"),
    "finetune_ner": (PAGES, "python train.py --config=configs/finetune_ner.py"),
    "embed_tiny": (PAGES, "python train.py --config=configs/embed_tiny.py"),
    "modernbert_tiny": (PAGES, "python train.py --config=configs/modernbert_tiny.py"),
    "modernbert_base": (PAGES, "python train.py --config=configs/modernbert_base.py:smoke"),
    "distilbert": (PAGES, "python train.py --config=configs/distilbert.py"),
    "diffusion_tiny": ("tests/diffusion_test.py", '"diffusion_tiny.py"'),
    "glue": ("tests/glue_test.py", '"bertjax.glue"'),
    "phases_tiny": (
        "tests/phases_test.py",
        'CONFIG = os.path.join(ROOT, "configs", "phases_tiny.py")',
    ),
    "clm_mlm_tiny": (
        "tests/phases_test.py",
        'CLM_MLM = os.path.join(ROOT, "configs", "clm_mlm_tiny.py")',
    ),
    "electra_tiny": ("tests/electra_test.py", '"electra_tiny.py"'),
}


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


def test_recipes_run_elsewhere_are_run_there():
    """Each recipe left out of test_config_runs_shrunken is named by the test (or the page's
    runnable block) said to run it end to end."""
    from runnable_blocks import all_blocks

    pages = "".join(b.text.replace("\\\n", " ") for b in all_blocks() if b.runnable)
    for name, (where, line) in RUN_ELSEWHERE.items():
        assert name in CONFIGS, name
        text = pages if where == PAGES else open(os.path.join(ROOT, where)).read()
        assert line in text, (name, where, line)
    from glue_test import _command

    assert "--config=" not in " ".join(_command("g", "w", "s"))  # the glue command's own recipe
    from bertjax import glue

    assert glue.DEFAULT_CONFIG.endswith(os.path.join("configs", "glue.py"))


@pytest.fixture
def reads_ahead(monkeypatch) -> list:
    """[(prefetch, the steps it read ahead)] of every `Prefetch` made while the test runs."""
    from bertjax.data.prefetch import Prefetch

    made, init = [], Prefetch.__init__

    def recording(self, compute, *args, **kwargs):
        steps = []

        def compute_recorded(batch_steps):
            steps.extend(batch_steps)
            return compute(batch_steps)

        init(self, compute_recorded, *args, **kwargs)
        made.append((self, steps))

    monkeypatch.setattr(Prefetch, "__init__", recording)
    return made


@pytest.mark.slow
@pytest.mark.parametrize("name", [c for c in CONFIGS if c not in RUN_ELSEWHERE])
def test_config_runs_shrunken(name, zh_files, small_spm, tmp_path, reads_ahead):
    """A few steps of each phase, held-out metrics; no phase's data read ahead past its last
    step (the trainer's `end_at`)."""
    config = _smoke(name, zh_files, small_spm)
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    for prefetch, steps in reads_ahead:
        if steps:
            assert prefetch.end is not None and max(steps) < prefetch.end, (prefetch.end, steps)
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


WEB_SCALE = (  # the recipes written for web-scale corpora (every one of them: a sentence plan)
    "albert_base",
    "bert_base",
    "bert_large",
    "bert_wwm_zh",
    "clm_mlm_base",
    "cramming",
    "diffusion_base",
    "distilbert",
    "electra_base",
    "electra_small",
    "macbert_zh",
    "modernbert_base",
    "modernbert_large",
    "pert_zh",
    "roberta_base",
    "roberta_zh_long",
)


def _prepare(config, output, shard_bytes):
    """A sharded store of the config's corpus in small shards, as the Beam job's units make it."""
    from bertjax.data.store import beam_prepare, shard_writer

    config.data.shard_bytes, config.data.block_tokens = shard_bytes, 256
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, output, items)
    tok = shard_writer.local_tokenizer(spec)
    records = [shard_writer.prepare_item(spec, item, tok) for item in items]
    return shard_writer.write_manifest(records, spec)


@pytest.fixture(scope="module")
def sharded_stores(zh_files, small_spm, tmp_path_factory):
    """{language: a sharded store URL}: the built-in corpus, and the Chinese test corpus."""
    root = tmp_path_factory.mktemp("sharded_recipes")
    stores = {}
    from bertjax.data.text import corpus

    zh = root / "zh.txt"  # the Chinese test corpus three times over: ~50 shards
    zh.write_text(open(zh_files[0], encoding="utf-8").read() * 3, encoding="utf-8")
    en = root / "en.txt"  # 300 built-in documents: ~50 shards
    docs = [doc for _, (_, doc) in zip(range(300), corpus.iter_documents("builtin"))]
    en.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n")
    for language, name, shard_bytes in (("en", "bert_base", 4 << 10), ("zh", "bert_wwm_zh", 400)):
        config = _smoke(name, (str(zh), zh_files[1]), small_spm)
        config.data.corpus = str(en) if language == "en" else config.data.corpus
        stores[language] = str(root / language)
        _prepare(config, stores[language], shard_bytes)
    return stores


@pytest.mark.parametrize("name", WEB_SCALE)
def test_web_scale_recipes_start_from_a_sharded_store_without_every_shard_index(
    name, zh_files, small_spm, sharded_stores
):
    """Each recipe's `:smoke` variant, its own sample plan, on a store of many shards: the first
    batch reads the indexes of one window of pieces, never the whole store's."""
    from bertjax.data import make_pipeline
    from bertjax.data.plans import piece_plans
    from bertjax.data.store import shard_format as fmt

    assert set(WEB_SCALE) <= set(CONFIGS)
    config = _smoke(name, zh_files, small_spm)
    config.data.store, config.data.tokenizer_model = sharded_stores[config.data.language], ""
    pipeline = make_pipeline(config, "", process_index=0, process_count=1)
    batch = pipeline.batch(0)
    assert batch["input_ids"].shape[0] == pipeline.step_batch_size(0)
    store = pipeline.store
    assert store._index is None  # the whole index was never loaded
    assert len(store.shards) > 2 * piece_plans.WINDOW
    manifest = fmt.read_manifest(config.data.store)
    index_bytes = sum(
        fmt.index_layout(s, manifest["vocab_size"], manifest["block_tokens"], 2)["index_bytes"]
        for s in manifest["splits"]["train"]["shards"]
    )
    assert store.blocks.index_bytes_read < index_bytes / 2
    # a window of pieces per row length in use (two with mixed lengths), a shard each at most
    assert len(store.blocks.crcs) <= 2 * piece_plans.WINDOW < len(store.shards)
