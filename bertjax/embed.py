"""Embed text and score retrieval with a trained encoder; export a sentence-transformers directory.

    python -m bertjax.embed --model=DIR --beir_dir=DIR --output=metrics.json
    python -m bertjax.embed --model=DIR --corpus=corpus.jsonl --output=vectors.npz
    python -m bertjax.embed --model=WORKDIR --export=st_dir/
    python -m bertjax.embed --model=DIR --mteb=SciFact,NFCorpus --output=mteb_results/

``--model`` is a sentence-transformers directory (its pooling and Normalize), a bertjax embedding
workdir (the pooling and normalization its run config trained), or a Hugging Face model
directory (mean pooling, normalized). With ``--beir_dir`` the output is the JSON of NDCG@10,
MRR@10 and Recall@100 of the split's judged queries (exact search over the whole corpus); with
``--corpus`` (BEIR's corpus.jsonl format) it is an .npz of ``ids`` and ``embeddings``;
``--export`` writes a directory ``SentenceTransformer(dir)`` loads; ``--mteb=TASKS`` runs
``mteb.evaluate`` on mteb tasks by name or local directories (a BEIR directory: nothing
downloads), writing mteb's results under ``--output`` (bertjax/evaluation/mteb_tasks.py; the
model's ModelMeta and prompts: bertjax/evaluation/mteb_model.py; ``pip install
'bertjax[mteb]'``). ``--matmul_dtype``: the dense
products' dtype ("auto": bfloat16 on a CPU with bfloat16 instructions, else float32; logged;
bertjax/inference/precision.py). The command's face; the
embedder is bertjax/inference/embedder.py. Bad input stops with one line (bertjax/cli.py).

Example::

    embedder = bertjax.embed.load("path/to/model")
    vectors = embedder.encode(["what is a coroutine", "Coroutines can be suspended."])
"""

from __future__ import annotations

import json

from bertjax import cli, paths
from bertjax.data.text.beir import read_beir
from bertjax.inference import loading, precision
from bertjax.inference.embedder import Embedder, embed_corpus, evaluate_beir, from_model, load

__all__ = ["Embedder", "embed_corpus", "evaluate_beir", "load", "main"]


def _run(flags, _) -> None:
    cli.require(flags, "model")
    if flags.matmul_dtype not in precision.CHOICES:
        cli.fail(f"--matmul_dtype={flags.matmul_dtype!r}: one of {precision.CHOICES}")
    if not (flags.beir_dir or flags.corpus or flags.export or flags.mteb):
        cli.fail(
            "give --beir_dir (metrics), --corpus (vectors), --mteb (mteb's results) or --export "
            "(a directory)"
        )
    if flags.mteb and (flags.beir_dir or flags.corpus):
        cli.fail("--mteb writes mteb's results to --output: run --beir_dir or --corpus apart")
    if flags.mteb and not flags.output:
        cli.fail("--mteb needs --output=DIR (mteb's results folder)")
    if flags.corpus and not flags.output:
        cli.fail("--corpus needs --output=FILE.npz")
    if flags.corpus and not paths.exists(flags.corpus):
        cli.fail(f"--corpus={flags.corpus!r} does not exist")
    beir = read_beir(flags.beir_dir, flags.split) if flags.beir_dir else None  # before the model
    if flags.mteb:
        try:
            from bertjax.evaluation import mteb_model, mteb_tasks
        except ImportError as error:
            cli.fail(f"--mteb needs mteb ({error}): pip install 'bertjax[mteb]'")

        names = [name.strip() for name in flags.mteb.split(",") if name.strip()]
        tasks = mteb_tasks.tasks(names, flags.split)
        for task in tasks:  # a download that fails stops here, before the model is loaded
            mteb_tasks.load_data(task)
    model = loading.load(flags.model)
    embedder = from_model(model, flags.max_seq_length or None, flags.matmul_dtype)
    if flags.export:
        embedder.export(flags.export)
        print(f"wrote the sentence-transformers directory {flags.export}")
    if beir is not None:
        metrics = evaluate_beir(embedder, beir, batch_size=flags.batch_size or None)
        text = json.dumps(metrics, indent=2, sort_keys=True)
        if flags.output:
            paths.write_text(flags.output, text + "\n")
        print(text)
    elif flags.corpus:
        embed_corpus(embedder, flags.corpus, flags.output, flags.batch_size or None)
        print(f"wrote {flags.output}")
    elif flags.mteb:
        prompts = mteb_model.prompts_of(model.path, flags.query_prompt, flags.document_prompt)
        meta = mteb_model.model_meta(model, embedder, flags.model_name, prompts)
        encoder = mteb_model.MtebEncoder(embedder, meta, prompts, flags.batch_size or None)
        summary = mteb_tasks.evaluate(encoder, tasks, flags.output)
        print(json.dumps(summary, indent=2, sort_keys=True))


def define_flags():
    """The command's flags, on a `flags.FlagValues` of its own (`bertjax.cli.new_flags`)."""
    return cli.new_flags(
        ("model", None, "sentence-transformers dir, bertjax workdir or HF dir"),
        ("beir_dir", "", "BEIR directory: corpus.jsonl, queries.jsonl, qrels/"),
        ("split", "test", "qrels split (qrels/<split>.tsv; a local --mteb task's split)"),
        ("corpus", "", "corpus.jsonl to embed (with --output=FILE.npz)"),
        ("output", "", "metrics JSON (--beir_dir), vectors .npz (--corpus), a folder (--mteb)"),
        ("mteb", "", "mteb task names or local task directories (BEIR), comma-separated"),
        ("model_name", "", "--mteb: the model's name in mteb's results (default bertjax/DIR)"),
        ("query_prompt", "", "--mteb: text put before each query (default: the model's own)"),
        ("document_prompt", "", "--mteb: text put before each document (default: the model's)"),
        ("export", "", "write a sentence-transformers directory here"),
        ("batch_size", 0, "at most this many texts a length bucket (0: ~4096 tokens a call)"),
        ("max_seq_length", 0, "token limit per text (0: the model's)"),
        ("matmul_dtype", "auto", f"dense products, one of {precision.CHOICES} (precision.py)"),
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m bertjax.embed` (the module docstring's flags)."""
    cli.run(_run, argv, define_flags(), __doc__)


if __name__ == "__main__":
    import logging

    from bertjax.training import runtime

    runtime.default_to_cpu_without_accelerator()  # no TPU runtime start-up where libtpu is
    runtime.cpu_device_per_core()  # calls side by side (bertjax/inference/embedder.py)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the products' dtype chosen
    main()
