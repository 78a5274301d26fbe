"""`python -m bertjax.predict` on Apache Beam (`pip install 'bertjax[beam]'`): the same predictions
beyond one host.

    python -m bertjax.predict --model=gs://B/run/best --input=gs://B/corpus.jsonl \\
        --output=gs://B/out/predictions.jsonl --runner=DataflowRunner --project=... ...

The driver counts the input's rows and cuts them into windows of ``--window`` rows; Beam spreads
the windows over workers; each worker loads the model once (`DoFn.setup`) and writes window k as
shard ``predictions-0000k-of-0000K.jsonl`` beside ``--output`` (written whole, then renamed or
uploaded once). The shards in order hold the single-host output row for row (``row`` numbers
included). A rerun of a killed job keeps every finished shard and writes the missing ones: the
same output, since each shard depends only on its rows and the model.
"""

from __future__ import annotations

import itertools
import math
import os

from bertjax import paths
from bertjax.data.text import records


def shard_paths(output: str, count: int) -> list[str]:
    """``DIR/NAME-0000k-of-0000K.EXT`` for each of ``count`` shards of ``output``."""
    stem, ext = os.path.splitext(output)
    return [f"{stem}-{k:05d}-of-{count:05d}{ext}" for k in range(count)]


def settings_of(flags) -> dict:
    """What a worker needs to load the predictor (plain values)."""
    names = ("model", "input", "task", "labels", "top_k", "window")
    columns = ("text_column", "text_pair_column", "tokens_column")
    return {
        **{name: flags[name].value for name in names},
        "columns": {c: flags[c].value for c in columns if flags[c].present},
    }


def load_predictor(settings: dict):
    from bertjax.inference import predictors

    labels = [s for s in settings["labels"].split(",") if s] or None
    predictor = predictors.load(settings["model"], settings["task"], labels, settings["top_k"])
    for column, value in settings["columns"].items():
        setattr(predictor, column, value)
    return predictor


def write_shard(predictor, settings: dict, shard: tuple[int, str]) -> str:
    """Predicts window ``k`` of the input into its shard (kept when it exists already)."""
    from bertjax.inference import predictors

    k, path = shard
    if paths.exists(path):
        return path
    window = int(settings["window"])
    rows = list(
        itertools.islice(records.iter_records(settings["input"]), k * window, (k + 1) * window)
    )
    writer = records.RecordWriter(path)
    try:
        writer.write(predictors.output_rows(predictor, rows, k * window))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return path


def _predict_fn():
    import apache_beam as beam

    class PredictWindow(beam.DoFn):
        """Loads the model once per worker; writes one window's shard per element."""

        def __init__(self, settings: dict):
            self.settings = settings

        def setup(self):
            self.predictor = load_predictor(self.settings)

        def process(self, shard):
            yield write_shard(self.predictor, self.settings, shard)

    return PredictWindow


def run(settings: dict, output: str, beam_args: list[str]) -> int:
    """Runs the prediction of ``settings`` (`settings_of`) as a Beam pipeline writing the shards
    of ``output``; the number of rows written."""
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise ImportError(
            "python -m bertjax.predict with Beam options needs Apache Beam: "
            "pip install 'bertjax[beam]'"
        ) from None
    count = sum(1 for _ in records.iter_records(settings["input"]))
    shards = shard_paths(output, max(1, math.ceil(count / int(settings["window"]))))
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        _ = (
            pipeline
            | "windows" >> beam.Create(list(enumerate(shards)))
            | "spread" >> beam.Reshuffle()
            | "predict" >> beam.ParDo(_predict_fn()(settings))
        )
    return count
