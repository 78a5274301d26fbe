"""`bertjax.predict`: HF classification, token classification and fill-mask directories give the
labels, probabilities, word tags and top-k tokens of transformers (its pipelines on the same or
the exported model), in input order, from TSV/JSONL/Parquet input."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertTokenizerFast,
    pipeline,
)

from bertjax import convert, predict
from bertjax.inference import beam, predictors

# two workers of the local runner in this process (two processes would each import JAX and
# load the model: ~30 s more of CI for the same DoFn)
BEAM_2_WORKERS = [
    "--runner=DirectRunner",
    "--direct_num_workers=2",
    "--direct_running_mode=multi_threading",
]
WORDS = (
    "the a of to and in is it that for on with as be by this are or from function returns "
    "value object list string file name new data type module class call time set"
).split()
TEXTS = [
    "the function returns a new list",
    "this module is for data and time " * 6,
    "a class of object type",
    "set the file name to a string value or list",
    "call it",
]


def _save(root, model, labels=None):
    os.makedirs(root)
    vocab = os.path.join(root, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    if labels:
        model.config.id2label = dict(enumerate(labels))
        model.config.label2id = {n: i for i, n in enumerate(labels)}
    model.save_pretrained(root)
    BertTokenizerFast(vocab).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=5 + len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    made = {}
    for name, cls, labels in (
        ("classify", BertForSequenceClassification, ["neg", "neu", "pos"]),
        ("tag", BertForTokenClassification, ["O", "B-X", "I-X"]),
        ("fill_mask", BertForMaskedLM, None),
    ):
        model = cls(BertConfig(**cfg, num_labels=len(labels or [1, 2]))).eval()
        made[name] = _save(str(root / name), model, labels)
    return made


def test_classification_equals_the_transformers_pipeline(models, tmp_path):
    source = tmp_path / "in.tsv"
    source.write_text("id\ttext\n" + "".join(f"r{i}\t{t}\n" for i, t in enumerate(TEXTS)))
    predictor = predictors.load(models["classify"])
    assert predictor.task == "classify"
    out = tmp_path / "out.parquet"
    assert predict.predict_file(predictor, str(source), str(out), window=3) == len(TEXTS)
    rows = pq.read_table(out).to_pylist()
    assert [r["row"] for r in rows] == list(range(len(TEXTS)))
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(len(TEXTS))]
    classify = pipeline("text-classification", model=models["classify"], device="cpu")
    for row, want in zip(rows, classify(TEXTS, top_k=None)):
        want = {w["label"]: w["score"] for w in want}
        assert row["label"] == max(want, key=want.get)
        assert row["probabilities"] == pytest.approx(want, abs=1e-5)


def test_word_tags_are_the_first_pieces_argmax(models, tmp_path):
    source = tmp_path / "in.jsonl"
    sentences = [t.split() for t in TEXTS]
    source.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in sentences))
    predictor = predictors.load(models["tag"])
    out = tmp_path / "out.jsonl"
    predict.predict_file(predictor, str(source), str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    model = BertForTokenClassification.from_pretrained(models["tag"]).eval()
    tokenizer = BertTokenizerFast.from_pretrained(models["tag"])
    names = ["O", "B-X", "I-X"]
    for row, words in zip(rows, sentences):
        encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            tags = model(**encoded).logits[0].argmax(-1).numpy()
        firsts = [encoded.word_ids().index(j) for j in range(len(words))]
        assert row["tokens"] == words
        assert row["tags"] == [names[tags[p]] for p in firsts]


def test_fill_mask_equals_the_pipeline_on_the_exported_model(models, tmp_path):
    predictor = predictors.load(models["fill_mask"], top_k=3)
    assert predictor.task == "fill_mask"
    exported = str(tmp_path / "exported")
    convert.to_hf(predictor.cfg, predictor.params, exported)
    BertTokenizerFast.from_pretrained(models["fill_mask"]).save_pretrained(exported)
    fill = pipeline("fill-mask", model=exported, device="cpu", top_k=3)
    texts = ["the function [MASK] a new list", "[MASK] module is for [MASK] and time"]
    got = predictor.predict([{"text": t} for t in texts])
    for row, text in zip(got, texts):
        want = fill(text)
        want = [want] if isinstance(want[0], dict) else want
        assert len(row["masks"]) == len(want)
        for ours, theirs in zip(row["masks"], want):
            assert [o["token_id"] for o in ours] == [t["token"] for t in theirs]
            assert [o["score"] for o in ours] == pytest.approx(
                [t["score"] for t in theirs], abs=1e-5
            )


def test_bad_input_is_named(models, tmp_path):
    predictor = predictors.load(models["classify"])
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"sentence": "a"}) + "\n")
    with pytest.raises(ValueError, match="no column 'text'"):
        predict.predict_file(predictor, str(source), str(tmp_path / "o.jsonl"))
    assert os.listdir(tmp_path) == ["in.jsonl"]  # no output, no temporary file
    with pytest.raises(ValueError, match="expected one of"):
        predict.predict_file(predictor, str(source), str(tmp_path / "o.txt"))
    np.testing.assert_equal(len(predictor.predict([{"text": "call it"}])), 1)


def test_beam_shards_equal_the_single_host_output_and_a_rerun_completes_them(models, tmp_path):
    """Windows by byte offset: the shards in order equal the single-host output; a killed job
    rerun completes the same shards; another model beside them is refused (the manifest)."""
    source = tmp_path / "in.jsonl"
    texts = TEXTS * 3
    source.write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    single = tmp_path / "single.jsonl"
    predict.predict_file(predictors.load(models["classify"]), str(source), str(single), window=4)
    want = [json.loads(line) for line in single.read_text().splitlines()]
    output = tmp_path / "beam" / "out.jsonl"
    settings = {"model": models["classify"], "input": str(source), "task": "", "labels": ""}
    settings.update(top_k=5, window=2, shard_bytes=300, columns={})
    assert beam.run(settings, str(output), BEAM_2_WORKERS) == len(texts)
    shards = beam.shard_paths(str(output), -(-source.stat().st_size // 300))
    manifest = beam.manifest_path(str(output))
    assert sorted(os.listdir(output.parent)) == sorted(
        os.path.basename(s) for s in [*shards, manifest]
    )
    assert json.loads(open(manifest).read())["complete"]

    def rows():
        return [json.loads(line) for s in shards for line in open(s).read().splitlines()]

    got = rows()
    assert [(r["row"], r["id"], r["label"]) for r in got] == [
        (w["row"], w["id"], w["label"]) for w in want
    ]
    for g, w in zip(got, want):
        assert g["probabilities"] == pytest.approx(w["probabilities"], abs=1e-6)
    # a killed job: one shard never written, another left as a temporary file
    os.remove(shards[1])
    (output.parent / (os.path.basename(shards[2]) + ".tmp-1")).write_text("{")
    os.remove(shards[2])
    assert beam.run(settings, str(output), ["--runner=DirectRunner"]) == len(texts)
    assert rows() == got
    with pytest.raises(ValueError, match="made with another model, model_fingerprint"):
        beam.run({**settings, "model": models["tag"]}, str(output), BEAM_2_WORKERS)
    assert rows() == got
