"""`python -m bertjax.export` of fine-tuned models: a classifier, a tagger and an embedding model
(bertjax workdirs written directly: a checkpoint of a 2-layer model with every parameter drawn at
random, its run config and SentencePiece tokenizer), each reloaded by the library a Hub user
loads it with (transformers' Auto classes, sentence-transformers) and compared with bertjax's
outputs and ids; the SentencePiece conversion against SentencePiece on the built-in corpus; the
card's Hub metadata for a Hub dataset; bad input. A real run's export and card:
tests/run_outputs_test.py."""

import os
import types

import jax
import numpy as np
import pytest
import transformers

from bertjax.export import main
from bertjax.inference import loading
from bertjax.interop import model_card, run_facts
from bertjax.interop.tokenizer_export import sentencepiece_to_tokenizers

TOL = 1e-4
TEXTS = [
    "Return the number of items in a container.",
    "The with statement wraps a block in the methods of a context manager.",
    "Raise an error when the file does not exist",
]
LABELS = ("concurrency", "files", "network", "text")
TAGS = ("O", "B-NAME", "I-NAME")


def _write_workdir(path: str, run, module, tokenizer_file: str) -> str:
    """A workdir with one checkpoint (step 7) of ``module`` at random values, ``run`` its run
    config: what a fine-tuning run leaves, without the training."""
    from flax import linen as nn

    from bertjax.data.tokenizer import Tokenizer
    from bertjax.interop.checkpoints import tokenizer_meta
    from bertjax.training.checkpoint import Checkpointer

    ids = np.full((1, 8), 2, np.int32)
    params = nn.unbox(jax.jit(module.init)(jax.random.key(0), ids)["params"])
    rng = np.random.default_rng(0)  # every value drawn: biases and norms matter too
    params = jax.tree.map(lambda x: np.asarray(x) + 0.1 * rng.standard_normal(x.shape), params)
    params = jax.tree.map(lambda x: x.astype(np.float32), params)
    meta = {
        "config": run.to_dict(),
        "model_config": module.cfg.to_dict(),
        "data_fingerprint": "-",
        **tokenizer_meta(Tokenizer(tokenizer_file)),
    }
    checkpoints = Checkpointer(os.path.join(path, "checkpoints"), keep=1, async_save=False)
    state = types.SimpleNamespace(step=np.int32(7), params=params, opt_state={})
    checkpoints.save(state, meta, force=True)
    checkpoints.close()
    return path


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory, small_spm):
    from bertjax import trainer
    from bertjax.data.tokenizer import Tokenizer
    from bertjax.modeling import heads
    from bertjax.modeling.bert_config import BertConfig
    from bertjax.modeling.embedder import BertForEmbedding
    from bertjax.objectives.embedding import add_embedding_config
    from bertjax.objectives.finetune import add_finetune_config

    tokenizer = Tokenizer(small_spm)
    cfg = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_id,
        unk_token_id=tokenizer.unk_id,
        cls_token_id=tokenizer.cls_id,
        sep_token_id=tokenizer.sep_id,
        mask_token_id=tokenizer.mask_id,
    )
    root = tmp_path_factory.mktemp("workdirs")
    classify = add_finetune_config(trainer.default_run_config(), "classification", len(LABELS))
    classify.task.labels = LABELS
    tag = add_finetune_config(trainer.default_run_config(), "token_classification", len(TAGS))
    tag.task.labels = TAGS
    embed = add_embedding_config(trainer.default_run_config())  # pooling "auto": mean
    for run in (classify, tag, embed):
        run.data.max_seq_length = 32
    return {
        "classify": _write_workdir(
            str(root / "classify"), classify, heads.BertForSequenceClassification(cfg, 4), small_spm
        ),
        "tag": _write_workdir(
            str(root / "tag"), tag, heads.BertForTokenClassification(cfg, 3), small_spm
        ),
        "embed": _write_workdir(
            str(root / "embed"), embed, BertForEmbedding(cfg, ("mean",), True), small_spm
        ),
    }


@pytest.fixture(scope="module")
def exported(workdirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported")
    folders = {}
    for name, workdir in workdirs.items():
        folders[name] = str(out / name)
        main(["export", f"--model={workdir}", f"--output={folders[name]}", "--license=mit"])
    return folders


def _inputs(folder: str, model) -> dict:
    """The exported tokenizer's rows of TEXTS, checked against bertjax's ids."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    ours = model.tokenizer.encode(TEXTS)
    for row, ids, mask in zip(inputs["input_ids"], ours, inputs["attention_mask"]):
        framed = [model.tokenizer.cls_id, *ids.tolist(), model.tokenizer.sep_id]
        assert row[mask.bool()].tolist() == framed
    return inputs


@pytest.mark.parametrize("task", ["classify", "tag"])
def test_classifiers_reload_with_their_label_names_within_1e4(workdirs, exported, task):
    import torch

    from bertjax.modeling import heads
    from bertjax.modeling.heads import BertForSequenceClassification

    model = loading.load(workdirs[task])
    inputs = _inputs(exported[task], model)
    if task == "classify":
        auto, names = transformers.AutoModelForSequenceClassification, LABELS
        module = BertForSequenceClassification(model.cfg, num_labels=len(LABELS))
    else:
        auto, names = transformers.AutoModelForTokenClassification, TAGS
        module = heads.BertForTokenClassification(model.cfg, num_labels=len(TAGS))
    hf = auto.from_pretrained(exported[task]).eval()
    assert tuple(hf.config.id2label[i] for i in range(len(names))) == names
    with torch.no_grad():
        theirs = hf(**inputs).logits.numpy()
    arrays = {k: v.numpy() for k, v in inputs.items()}
    ours = np.asarray(jax.jit(module.apply)({"params": model.params}, **arrays))
    real = arrays["attention_mask"].astype(bool)
    error = np.abs(ours - theirs)[real] if task == "tag" else np.abs(ours - theirs)
    assert error.max() < TOL, error.max()
    from huggingface_hub import metadata_load

    meta = metadata_load(os.path.join(exported[task], "README.md"))
    kind = "text-classification" if task == "classify" else "token-classification"
    assert (meta["pipeline_tag"], meta["license"], meta["bertjax"]["steps"]) == (kind, "mit", 7)
    assert "model-index" not in meta  # the run recorded no evaluation, and the card says so


def test_the_embedding_model_loads_in_sentence_transformers_within_1e4(workdirs, exported):
    from huggingface_hub import metadata_load
    from sentence_transformers import SentenceTransformer

    from bertjax.inference.embedder import load

    folder = exported["embed"]
    assert {"modules.json", "1_Pooling", "2_Normalize", "tokenizer.json"} <= set(os.listdir(folder))
    theirs = SentenceTransformer(folder, device="cpu").encode(TEXTS)
    ours = load(workdirs["embed"], matmul_dtype="float32").encode(TEXTS)
    assert np.abs(ours - theirs).max() < TOL
    meta = metadata_load(os.path.join(folder, "README.md"))
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"


def test_a_cased_wordpiece_run_exports_its_vocabulary_as_it_tokenizes(tmp_path):
    """A workdir with a cased vocab.txt (tests/inference_fixtures.py): the exported tokenizer
    keeps the case (ids equal bertjax's), beside its vocab.txt; the MLM logits agree."""
    import torch
    from inference_fixtures import CASED_WORDS, write_cased_workdir

    from bertjax.modeling.heads import BertForPreTraining

    workdir = write_cased_workdir(str(tmp_path))
    main(["export", f"--model={workdir}", f"--output={tmp_path}/out"])
    assert "vocab.txt" in os.listdir(tmp_path / "out")
    model = loading.load(workdir)
    texts = [" ".join(CASED_WORDS), "The apple is in Paris", "café cafe"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    for row, ids, mask in zip(
        inputs["input_ids"], model.tokenizer.encode(texts), inputs["attention_mask"]
    ):
        assert row[mask.bool()].tolist() == [
            model.tokenizer.cls_id,
            *ids.tolist(),
            model.tokenizer.sep_id,
        ]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        theirs = hf(**inputs).logits.numpy()
    arrays = {k: v.numpy() for k, v in inputs.items()}
    module = BertForPreTraining(model.cfg, next_sentence=False)
    ours = np.asarray(jax.jit(module.apply)({"params": model.params}, **arrays)["mlm_logits"])
    real = arrays["attention_mask"].astype(bool)
    assert np.abs(ours - theirs)[real].max() < TOL


def test_a_hub_dataset_is_named_with_its_revision_in_the_card(tmp_path):
    """A run on hf://datasets/... names the dataset (YAML ``datasets``), its revision (the
    bertjax block and the model-index dataset) and links it in the text."""
    from huggingface_hub import metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    sha = "0123456789abcdef0123456789abcdef01234567"
    run = {"data": {"corpus": f"hf://datasets/HuggingFaceFW/fineweb-edu@{sha}/data/*.parquet"}}
    (dataset,) = run_facts.training_datasets(run)
    assert (dataset.hub_id, dataset.revision) == ("HuggingFaceFW/fineweb-edu", sha)
    glue = run_facts.training_datasets({"task": {"source": "tfds:glue/sst2"}})
    assert glue == [run_facts.Dataset("GLUE sst2", "nyu-mll/glue", "sst2")]
    task = {"source": "glue:sst2", "glue_repo": "nyu-mll/glue", "glue_revision": sha}
    hub_glue = run_facts.training_datasets({"task": task})  # GLUE from the Hub, pinned
    assert hub_glue == [run_facts.Dataset("GLUE sst2", "nyu-mll/glue", "sst2", sha)]
    facts = run_facts.RunFacts(
        "pretraining", 10, 80, 2560, 32, 8, [dataset], ["8 x TPU v5 lite (2 processes)"], "abc",
        "", {"mlm_accuracy": 0.5}, 10, dataset,
    )  # fmt: skip
    text = model_card.model_card(
        facts, name="m", task="fill_mask", family="bert", architecture="BertForMaskedLM",
        parameters=100, license="mit",
    )  # fmt: skip
    (tmp_path / "README.md").write_text(text)
    meta = metadata_load(tmp_path / "README.md")
    assert meta["datasets"] == ["HuggingFaceFW/fineweb-edu"] and meta["license"] == "mit"
    assert meta["bertjax"]["training_data"][0]["revision"] == sha
    (result,) = model_index_to_eval_results(meta["model-index"])[1]
    assert (result.dataset_type, result.dataset_revision) == ("HuggingFaceFW/fineweb-edu", sha)
    assert (result.metric_type, result.metric_value) == ("mlm_accuracy", 0.5)
    assert f"at revision `{sha}`" in text and "8 x TPU v5 lite (2 processes)" in text


def test_the_sentencepiece_conversion_gives_bertjax_s_ids(small_spm):
    """Sentences of the built-in corpus: the same ids, or (a tie between equally scored
    segmentations, e.g. a run of '=') ids of the same total score and text."""
    import sentencepiece as spm

    from bertjax.data.text import corpus
    from bertjax.data.tokenizer import Tokenizer

    sentences = [s for _, d in corpus.iter_documents("builtin") for s in d][:4000]
    sentences += ["  two  spaces ", "Ünïcödé café ﬁ", "tab\there", "x\ny ", "全角ＡＢＣ", ""]
    ours = Tokenizer(small_spm).encode(sentences)
    converted = sentencepiece_to_tokenizers(small_spm)
    theirs = [e.ids for e in converted.encode_batch(sentences, add_special_tokens=False)]
    processor = spm.SentencePieceProcessor(model_file=small_spm)
    ties = 0
    for a, b in zip(ours, theirs):
        if a.tolist() != b:
            ties += 1
            score = sum(processor.get_score(int(i)) for i in a)
            assert score == pytest.approx(sum(processor.get_score(i) for i in b), abs=1e-9)
            assert processor.decode(a.tolist()) == processor.decode(b)
    assert ties < len(sentences) // 50
    # "[MASK]" in a text is the mask token in place of a word, framed as the word was
    tokenizer = Tokenizer(small_spm)
    masked = converted.encode("The answer is [MASK].", add_special_tokens=False).ids
    word = tokenizer.encode(["The answer is Paris."])[0].tolist()
    dot = tokenizer.encode(["."])[0].tolist()[-1]
    assert masked == word[: len(masked) - 2] + [tokenizer.mask_id, dot] and word[-1] == dot


def test_bad_input_is_one_line(workdirs, exported, tmp_path, capsys):
    def fails(*argv):
        with pytest.raises(SystemExit) as stop:
            main(["export", *argv])
        assert stop.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    model = f"--model={workdirs['classify']}"
    assert fails(model) == "error: --output needed (see --help)"
    taken = fails(model, f"--output={exported['classify']}")
    assert taken.startswith(f"error: --output={exported['classify']!r} exists and is not an")
    assert "is not a directory" in fails(f"--model={tmp_path}/none", f"--output={tmp_path}/o")
    again = fails(f"--model={exported['classify']}", f"--output={tmp_path}/again")
    assert "is a hf directory already" in again
    assert not os.path.exists(f"{tmp_path}/again")
    assert "OWNER/NAME" in fails(model, f"--output={tmp_path}/x", "--push_to=x")
    assert "--private needs --push_to" in fails(model, f"--output={tmp_path}/x", "--private")
