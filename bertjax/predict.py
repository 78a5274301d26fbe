"""Label, tag, embed or fill masks with a trained model, one command:

    python -m bertjax.predict --model=WORKDIR --input=test.tsv --output=predictions.jsonl
    python -m bertjax.predict --model=ST_DIR --input=corpus.jsonl --output=vectors.parquet
    python -m bertjax.predict --model=PRETRAIN_WORKDIR --task=fill_mask --input=masked.jsonl \\
        --output=tokens.jsonl

``--model``: a fine-tuning workdir (its ``best/`` when present), a ``best/`` or checkpoints
directory, a Hugging Face directory or a sentence-transformers directory
(bertjax/inference/loading.py reads them; the task each gives is in predictors.py there;
``--task`` forces one: classify, tag, embed, fill_mask). ``--input``: TSV/CSV/JSONL/Parquet
(local or a URL) with the task's text columns (a workdir's ``config.task`` columns; else
``--text_column`` / ``--text_pair_column`` / ``--tokens_column``), or a BEIR corpus.jsonl (title
+ text). ``--output``: JSONL or Parquet, one row an input row, in input order: ``id`` (the
input's ``_id``/``id`` when it has one), then ``label`` + ``probabilities``, ``value``
(regression), ``tokens`` + ``tags`` (word-level), ``embedding``, or ``masks`` (per mask: the
``top_k`` tokens with ``token_id`` and ``score``). Input is read and output written ``--window``
rows at a time (bounded memory). ``--matmul_dtype``: the dense products' dtype; "auto" takes
bfloat16 for embeddings on a CPU with bfloat16 instructions and float32 otherwise, and logs its
choice (bertjax/inference/precision.py).

With ``--runner=...`` (and any other Beam pipeline options) the same predictions run as a Beam
pipeline (bertjax/inference/beam.py): one output shard per ``--shard_bytes`` of input, equal
row for row. Without ``--runner`` a flag that does not exist is an error, as a flag neither
bertjax nor Beam knows is with it. Bad input stops with one line (bertjax/cli.py).
"""

from __future__ import annotations

import logging

from bertjax import cli, paths
from bertjax.data.text import records
from bertjax.inference import beam, outputs, precision, predictors, sorted_apply
from bertjax.inference.outputs import predict_file

__all__ = ["define_flags", "main", "predict_file"]


def define_flags():
    """The command's flags, on a `flags.FlagValues` of its own (`bertjax.cli.new_flags`)."""
    return cli.new_flags(
        ("model", None, "workdir, best/, HF or sentence-transformers directory"),
        ("input", None, "TSV/CSV/JSONL/Parquet file or URL (BEIR corpus.jsonl too)"),
        ("output", None, "JSONL or Parquet file or URL"),
        ("task", "", f"force one of {predictors.TASKS} ('' = the model's own)"),
        ("text_column", "text", "column of the (first) text"),
        ("text_pair_column", "", "column of the second text of a pair"),
        ("tokens_column", "tokens", "tag task: column of a row's list of words"),
        ("labels", "", "label names in id order (a workdir whose data is gone)"),
        ("top_k", 5, "fill_mask: tokens kept per mask"),
        ("window", sorted_apply.WINDOW, "rows predicted and written at a time"),
        ("runner", "", "a Beam runner (DirectRunner, DataflowRunner, ...): run on Beam"),
        ("shard_bytes", beam.SHARD_BYTES, "Beam: input bytes of an output shard"),
        ("matmul_dtype", "auto", f"dense products, one of {precision.CHOICES} (precision.py)"),
    )


def _check_files(flags) -> None:
    """The input exists and both files have a format this reads and writes (before any model
    is loaded)."""
    if not flags.input.endswith(records.READ_FORMATS):
        cli.fail(f"--input={flags.input!r}: expected one of {records.READ_FORMATS}")
    if not paths.exists(flags.input):
        cli.fail(f"--input={flags.input!r} does not exist")
    if not flags.output.endswith(records.WRITE_FORMATS):
        cli.fail(f"--output={flags.output!r}: expected one of {records.WRITE_FORMATS}")


def _run(flags, rest: list[str]) -> None:
    cli.require(flags, "model", "input", "output")
    _check_files(flags)
    if flags.runner:
        beam_args = cli.beam_options([f"--runner={flags.runner}", *rest[1:]], "bertjax.predict")
        count = beam.run(beam.settings_of(flags), flags.output, beam_args)
        print(f"wrote {count} rows to the shards of {flags.output}")
        return
    labels = [s for s in flags.labels.split(",") if s] or None
    predictor = predictors.load(flags.model, flags.task, labels, flags.top_k, flags.matmul_dtype)
    for column in ("text_column", "text_pair_column", "tokens_column"):
        if flags[column].present:
            setattr(predictor, column, flags[column].value)
    count = outputs.predict_file(predictor, flags.input, flags.output, flags.window)
    print(f"wrote {count} {predictor.task} rows to {flags.output}")


def main(argv: list[str] | None = None) -> None:
    """`python -m bertjax.predict` (the module docstring's flags; with --runner every other
    ``--flag`` is a Beam pipeline option)."""
    import sys

    argv = list(sys.argv if argv is None else argv)
    beam_mode = any(a == "--runner" or a.startswith("--runner=") for a in argv[1:])
    cli.run(_run, argv, define_flags(), __doc__, known_only=beam_mode)


if __name__ == "__main__":
    from bertjax.training import runtime

    runtime.default_to_cpu_without_accelerator()  # no TPU runtime start-up where libtpu is
    runtime.cpu_device_per_core()  # calls side by side (bertjax/inference/embedder.py)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # rows and rows/s as it goes
    main()
