"""One checkpoint loader for predict, embed and export (bertjax/inference/loading.py): a cased
vocabulary keeps its case through each of them, so the ids equal training's, and the
sentence-transformers export tokenizes as transformers loads it."""

import json
import os

import numpy as np
import pytest
from inference_fixtures import CASED_WORDS, write_cased_workdir

from bertjax import embed
from bertjax.inference import loading, predictors

TEXT = "Apple is in Paris café"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return write_cased_workdir(str(tmp_path_factory.mktemp("cased")))


def _ids(tokenizer, text=TEXT):
    return tokenizer.encode([text])[0].tolist()


def test_a_cased_vocabulary_keeps_its_case_through_predict_embed_and_export(workdir, tmp_path):
    from transformers import AutoTokenizer

    model = loading.load(workdir)
    cased = _ids(model.tokenizer)
    vocab = [*model.tokenizer.pieces]
    assert [vocab[i] for i in cased] == TEXT.split()  # every word its own (cased) piece
    assert cased != _ids(model.tokenizer, TEXT.lower())
    fill_mask, vectors = predictors.load(workdir), predictors.load(workdir, "embed")
    assert (fill_mask.task, vectors.task) == ("fill_mask", "embed")
    assert _ids(fill_mask.tokenizer) == cased and _ids(vectors.tokenizer) == cased
    embedder = embed.load(workdir)
    assert _ids(embedder.tokenizer) == cased
    apple, lower = embedder.encode(["Apple", "apple"])
    assert not np.allclose(apple, lower)  # two words to the model, as in training
    exported = str(tmp_path / "st")
    embedder.export(exported)
    with open(os.path.join(exported, "tokenizer_config.json")) as f:
        assert json.load(f)["do_lower_case"] is False
    reference = AutoTokenizer.from_pretrained(exported)
    cls, sep = model.tokenizer.cls_id, model.tokenizer.sep_id
    assert reference(TEXT)["input_ids"] == [cls, *cased, sep]
    again = loading.load(exported)  # the sentence-transformers directory reads back cased
    assert again.form == "sentence-transformers" and _ids(again.tokenizer) == cased


def test_a_vocab_txt_directory_lowercases_as_its_tokenizer_config_says(workdir, tmp_path):
    """An HF directory with only vocab.txt: do_lower_case from tokenizer_config.json, True when
    it is absent (transformers' BertTokenizer default)."""
    model = loading.load(workdir)
    hf = str(tmp_path / "hf")
    from bertjax import convert

    convert.to_hf(model.cfg, model.params, hf, tokenizer_file=model.tokenizer.path)
    assert loading.load(hf).task == "fill_mask"
    uncased = _ids(loading.load(hf).tokenizer)  # no tokenizer_config.json: lowercased
    assert uncased == _ids(model.tokenizer, "apple is in paris cafe")
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": False}, f)
    assert _ids(loading.load(hf).tokenizer) == _ids(model.tokenizer)
    assert set(CASED_WORDS) <= set(model.tokenizer.pieces)


def test_the_fingerprint_tells_models_apart_without_reading_weights(workdir, tmp_path):
    first = loading.fingerprint(workdir)
    assert first == loading.fingerprint(workdir)
    hf = str(tmp_path / "hf")
    model = loading.load(workdir)
    from bertjax import convert

    convert.to_hf(model.cfg, model.params, hf, tokenizer_file=model.tokenizer.path)
    assert loading.fingerprint(hf) != first
    with pytest.raises(FileNotFoundError, match=r"--model='.*nowhere' is not a directory"):
        loading.fingerprint(str(tmp_path / "nowhere"))


def test_a_task_the_model_has_no_head_for_is_named(workdir):
    with pytest.raises(ValueError, match=r"--task=classify: .* was trained for fill_mask"):
        predictors.load(workdir, "classify")
    with pytest.raises(ValueError, match=r"--task='sort': one of \('classify'"):
        predictors.load(workdir, "sort")


def test_an_embedding_run_s_auto_pooling_is_resolved_as_training_resolved_it(tmp_path):
    """``config.loss.pooling="auto"`` (the embedding objective's default, embed_tiny's) and an
    unset normalize: a sentence-transformers init_from's modules, else mean pooling, normalized,
    as `Embedding.from_config` chose them in training (the docs' `embed --model=WORKDIR` found
    the loader refusing "auto")."""
    st = tmp_path / "st"
    (st / "1_Pooling").mkdir(parents=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (st / "modules.json").write_text(json.dumps(modules))
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    auto = {"objective": "embedding", "pooling": "auto", "normalize": None}
    assert loading.trained_pooling({"loss": auto}) == (("mean",), True)
    assert loading.trained_pooling({"loss": auto, "init_from": str(st)}) == (("cls",), False)
    chosen = {"pooling": "cls,max", "normalize": False}
    assert loading.trained_pooling({"loss": chosen, "init_from": str(st)}) == (
        ("cls", "max"),
        False,
    )
    with pytest.raises(ValueError, match="each mode must be one of"):
        loading.trained_pooling({"loss": {"pooling": "avg"}})
