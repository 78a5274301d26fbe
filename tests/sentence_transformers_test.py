"""sentence-transformers both ways: an all-MiniLM-style save (BERT, mean pooling, Normalize) and a
ModernBERT-shape one (CLS pooling) load into bertjax with the same embeddings as
`SentenceTransformer(dir).encode`, and bertjax's exports load back into sentence-transformers."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import xla_flags
from sentence_transformers import SentenceTransformer
from transformers import BertConfig, BertModel, BertTokenizerFast, ModernBertConfig, ModernBertModel

from bertjax import embed
from bertjax.interop import sentence_transformers as st_files

WORDS = (
    "the a of to and in is it that for on with as be by this are or from function returns "
    "value object list string file name new data type module class call time set"
).split()
TEXTS = [
    "the function returns a new list",
    "this module is for data and time",
    "a class of object type",
    "set the file name to a string value or list",
    "call it",
]


def _write_st_dir(root, model, pooling_key, normalize):
    """A save in the layout of sentence-transformers 2.x (all-MiniLM-L6-v2's): the transformer
    at the root, legacy module names and pooling keys."""
    os.makedirs(root)
    vocab = os.path.join(root, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    model.save_pretrained(root)
    BertTokenizerFast(vocab).save_pretrained(root)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
        os.makedirs(os.path.join(root, "2_Normalize"))
    os.makedirs(os.path.join(root, "1_Pooling"))
    with open(os.path.join(root, "1_Pooling", "config.json"), "w") as f:
        pooling = {k: False for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens")}
        json.dump({"word_embedding_dimension": 32, **pooling, pooling_key: True}, f)
    with open(os.path.join(root, "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(root, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 32, "do_lower_case": False}, f)
    return root


def _bert(root):
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return _write_st_dir(root, BertModel(cfg).eval(), "pooling_mode_mean_tokens", True)


def _modernbert(root):
    torch.manual_seed(1)
    cfg = ModernBertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        max_position_embeddings=64,
        local_attention=4,
        global_attn_every_n_layers=2,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
    )
    return _write_st_dir(root, ModernBertModel(cfg).eval(), "pooling_mode_cls_token", False)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_sentence_transformers_round_trip(family, tmp_path):
    source = (_bert if family == "bert" else _modernbert)(str(tmp_path / "source"))
    want = SentenceTransformer(source, device="cpu").encode(TEXTS, convert_to_numpy=True)
    embedder = embed.load(source, matmul_dtype="float32")  # fidelity: float32 products
    assert embedder.pooling == (("mean",) if family == "bert" else ("cls",))
    assert embedder.normalize == (family == "bert")
    got = embedder.encode(TEXTS, batch_size=4)  # packed rows
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    embedder.packed = False  # length buckets of at most 4 rows: two batches, in input order
    np.testing.assert_allclose(embedder.encode(TEXTS, batch_size=4), want, atol=1e-5, rtol=1e-5)
    embedder.packed = True
    exported = str(tmp_path / "exported")
    embedder.export(exported)
    again = SentenceTransformer(exported, device="cpu").encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(again, got, atol=1e-5, rtol=1e-5)
    modules = st_files.read_modules(exported)
    assert (modules.pooling, modules.normalize) == (embedder.pooling, embedder.normalize)
    if family == "bert":  # BEIR metrics: each text, asked verbatim, finds itself first
        _check_beir(embedder, tmp_path)


def _check_beir(embedder, tmp_path):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    lines = [json.dumps({"_id": f"d{i}", "text": t}) for i, t in enumerate(TEXTS)]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    lines = [json.dumps({"_id": f"q{i}", "text": t}) for i, t in enumerate(TEXTS)]
    (root / "queries.jsonl").write_text("\n".join(lines) + "\n")
    judged = "".join(f"q{i}\td{i}\t1\n" for i in range(len(TEXTS)))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
    output = tmp_path / "metrics.json"
    command = [sys.executable, "-m", "bertjax.embed", f"--model={tmp_path / 'exported'}"]
    command += [f"--beir_dir={root}", f"--output={output}", "--batch_size=4"]
    command += ["--matmul_dtype=float32"]
    env = dict(os.environ, XLA_FLAGS=xla_flags(1))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(output.read_text())
    assert metrics == pytest.approx(embed.evaluate_beir(embedder, str(root), batch_size=4))
    assert metrics["ndcg@10"] == pytest.approx(1.0) and metrics["mrr@10"] == pytest.approx(1.0)
    assert metrics["recall@100"] == 1.0 and metrics["queries"] == len(TEXTS)
    embed.embed_corpus(embedder, str(root / "corpus.jsonl"), str(tmp_path / "v.npz"), 4)
    vectors = np.load(tmp_path / "v.npz")
    assert list(vectors["ids"]) == [f"d{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose(vectors["embeddings"], embedder.encode(TEXTS, 4), atol=1e-6)


def test_unsupported_modules_are_named(tmp_path):
    root = tmp_path / "dense"
    root.mkdir()
    (root / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense",
                },
            ]
        )
    )
    with pytest.raises(ValueError, match="no Dense"):
        st_files.read_modules(str(root))


def test_sentence_transformers_6_keeps_the_length_in_the_tokenizer_config(tmp_path):
    """sentence-transformers 6 saves max_seq_length as the tokenizer's model_max_length only."""
    root = _bert(str(tmp_path / "st6"))
    with open(os.path.join(root, "sentence_bert_config.json"), "w") as f:
        json.dump({"transformer_task": "feature-extraction"}, f)
    config_file = os.path.join(root, "tokenizer_config.json")
    with open(config_file) as f:
        config = json.load(f)
    with open(config_file, "w") as f:
        json.dump({**config, "model_max_length": 7}, f)
    assert st_files.read_modules(root).max_seq_length == 7
