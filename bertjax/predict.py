"""Label, tag, embed or fill masks with a trained model, one command:

    python -m bertjax.predict --model=WORKDIR --input=test.tsv --output=predictions.jsonl
    python -m bertjax.predict --model=ST_DIR --input=corpus.jsonl --output=vectors.parquet
    python -m bertjax.predict --model=PRETRAIN_WORKDIR --task=fill_mask --input=masked.jsonl \
        --output=tokens.jsonl

``--model``: a fine-tuning workdir (its ``best/`` when present), a ``best/`` or checkpoints
directory, a Hugging Face directory or a sentence-transformers directory
(bertjax/inference/predictors.py says which task each gives; ``--task`` forces one: classify,
tag, embed, fill_mask). ``--input``: TSV/CSV/JSONL/Parquet (local or a URL) with the task's text
columns (a workdir's ``config.task`` columns; else ``--text_column`` / ``--text_pair_column`` /
``--tokens_column``), or a BEIR corpus.jsonl (title + text). ``--output``: JSONL or Parquet, one
row an input row, in input order: ``id`` (the input's ``_id``/``id`` when it has one), then
``label`` + ``probabilities``, ``value`` (regression), ``tokens`` + ``tags`` (word-level),
``embedding``, or ``masks`` (per mask: the ``top_k`` tokens with ``token_id`` and ``score``).
Input is read and output written ``--window`` rows at a time (bounded memory).

With Beam options (``--runner=...``) the same predictions run as a Beam pipeline
(bertjax/inference/beam.py): one output shard per input window, equal row for row.
"""

from __future__ import annotations

import logging
import time

from bertjax.data.text import records
from bertjax.inference import predictors, sorted_apply


def predict_file(predictor, input_path: str, output: str, window: int = sorted_apply.WINDOW) -> int:
    """Writes ``output`` from ``input_path``; returns the number of rows."""
    writer = records.RecordWriter(output)
    start = time.perf_counter()
    try:
        for chunk in sorted_apply.windows(records.iter_records(input_path), window):
            writer.write(predictors.output_rows(predictor, chunk, writer.count))
            speed = writer.count / (time.perf_counter() - start)
            logging.info("%d rows, %.1f rows/s", writer.count, speed)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return writer.count


def _run(flags, beam_args: list[str]) -> None:
    if beam_args:
        from bertjax.inference import beam

        count = beam.run(beam.settings_of(flags), flags.output, beam_args)
        print(f"wrote {count} rows to the shards of {flags.output}")
        return
    predictor = predictors.load(
        flags.model,
        flags.task,
        [s for s in flags.labels.split(",") if s] or None,
        flags.top_k,
    )
    for column in ("text_column", "text_pair_column", "tokens_column"):
        if flags[column].present:
            setattr(predictor, column, flags[column].value)
    count = predict_file(predictor, flags.input, flags.output, flags.window)
    print(f"wrote {count} {predictor.task} rows to {flags.output}")


def define_flags():
    from absl import flags

    flags.DEFINE_string("model", None, "workdir, best/, HF or sentence-transformers directory")
    flags.DEFINE_string("input", None, "TSV/CSV/JSONL/Parquet file or URL (BEIR corpus.jsonl too)")
    flags.DEFINE_string("output", None, "JSONL or Parquet file or URL")
    flags.DEFINE_string("task", "", f"force one of {predictors.TASKS} ('' = the model's own)")
    flags.DEFINE_string("text_column", "text", "column of the (first) text")
    flags.DEFINE_string("text_pair_column", "", "column of the second text of a pair")
    flags.DEFINE_string("tokens_column", "tokens", "tag task: column of a row's list of words")
    flags.DEFINE_string("labels", "", "label names in id order (a workdir whose data is gone)")
    flags.DEFINE_integer("top_k", 5, "fill_mask: tokens kept per mask")
    flags.DEFINE_integer(
        "window", sorted_apply.WINDOW, "rows read, predicted and written at a time"
    )
    return flags


def main(argv: list[str] | None = None) -> None:
    """`python -m bertjax.predict` (the module docstring's flags; every other ``--flag`` is a
    Beam pipeline option, and any makes it a Beam run)."""
    import sys

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    flags = define_flags()
    argv = list(sys.argv if argv is None else argv)
    beam_args = flags.FLAGS(argv, known_only=True)[1:]
    missing = [f"--{n}" for n in ("model", "input", "output") if not flags.FLAGS[n].value]
    if missing:
        raise SystemExit(f"python -m bertjax.predict needs {' '.join(missing)} (see --help)")
    _run(flags.FLAGS, beam_args)


if __name__ == "__main__":
    main()
