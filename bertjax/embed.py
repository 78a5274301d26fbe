"""Embed text and score retrieval with a trained encoder; export a sentence-transformers directory.

    python -m bertjax.embed --model=DIR --beir_dir=DIR --output=metrics.json
    python -m bertjax.embed --model=DIR --corpus=corpus.jsonl --output=vectors.npz
    python -m bertjax.embed --model=WORKDIR --export=st_dir/

``--model`` is a sentence-transformers directory (its pooling and Normalize), a bertjax embedding
workdir (the pooling and normalization its run config trained), or a Hugging Face model
directory (mean pooling, normalized). With ``--beir_dir`` the output is the JSON of NDCG@10,
MRR@10 and Recall@100 of the split's judged queries (exact search over the whole corpus); with
``--corpus`` (BEIR's corpus.jsonl format) it is an .npz of ``ids`` and ``embeddings``;
``--export`` writes a directory ``SentenceTransformer(dir)`` loads. The command's face; the
embedder is bertjax/inference/embedder.py.

Example::

    embedder = bertjax.embed.load("path/to/model")
    vectors = embedder.encode(["what is a coroutine", "Coroutines can be suspended."])
"""

from __future__ import annotations

import json

from bertjax import paths
from bertjax.inference.embedder import Embedder, embed_corpus, evaluate_beir, load

__all__ = ["Embedder", "embed_corpus", "evaluate_beir", "load", "main"]


def _run(flags) -> None:
    embedder = load(flags.model, flags.max_seq_length or None)
    if flags.export:
        embedder.export(flags.export)
        print(f"wrote the sentence-transformers directory {flags.export}")
    if flags.beir_dir:
        metrics = evaluate_beir(embedder, flags.beir_dir, flags.split, flags.batch_size or None)
        text = json.dumps(metrics, indent=2, sort_keys=True)
        if flags.output:
            paths.write_text(flags.output, text + "\n")
        print(text)
    elif flags.corpus:
        if not flags.output:
            raise SystemExit("--corpus needs --output=FILE.npz")
        embed_corpus(embedder, flags.corpus, flags.output, flags.batch_size or None)
        print(f"wrote {flags.output}")
    elif not flags.export:
        raise SystemExit("give --beir_dir (metrics), --corpus (vectors) or --export (a directory)")


def main(argv: list[str] | None = None) -> None:
    """`python -m bertjax.embed` (the module docstring's flags)."""
    from absl import app, flags

    flags.DEFINE_string("model", None, "sentence-transformers dir, bertjax workdir or HF dir")
    flags.DEFINE_string("beir_dir", "", "BEIR directory: corpus.jsonl, queries.jsonl, qrels/")
    flags.DEFINE_string("split", "test", "qrels split (qrels/<split>.tsv)")
    flags.DEFINE_string("corpus", "", "corpus.jsonl to embed (with --output=FILE.npz)")
    flags.DEFINE_string("output", "", "metrics JSON (--beir_dir) or vectors .npz (--corpus)")
    flags.DEFINE_string("export", "", "write a sentence-transformers directory here")
    flags.DEFINE_integer(
        "batch_size", 0, "at most this many texts a length bucket (0: ~4096 tokens a call)"
    )
    flags.DEFINE_integer("max_seq_length", 0, "token limit per text (0: the model's)")
    flags.mark_flag_as_required("model")
    app.run(lambda _: _run(flags.FLAGS), argv=argv)


if __name__ == "__main__":
    main()
