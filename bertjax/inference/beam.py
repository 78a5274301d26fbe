"""`python -m bertjax.predict --runner=...`: the same predictions on Apache Beam (`pip install
'bertjax[beam]'`), beyond one host.

    python -m bertjax.predict --model=gs://B/run/best --input=gs://B/corpus.jsonl \\
        --output=gs://B/out/predictions.jsonl --runner=DataflowRunner --project=... ...

The input is cut into windows by byte offset (`input_windows`: ranges of ``--shard_bytes`` of a
JSONL/TSV/CSV file, runs of row groups of a Parquet file); the driver reads none of its rows.
Beam counts each window's rows from its own bytes, then each worker loads the model once
(`DoFn.setup`), numbers its window's rows after the counts of the windows before it, and writes
window k as shard ``predictions-0000k-of-0000K.jsonl`` beside ``--output`` (written whole, then
renamed or uploaded once). The shards in order hold the single-host output row for row (``row``
numbers included).

``predictions.manifest.json`` beside them, written before any shard, records what they are made
of: the model's fingerprint (`bertjax.inference.loading.fingerprint`), the task's settings, the
input and its size; the pipeline's last step marks it complete with the row counts. A rerun with
the same model, settings and input keeps every finished shard and writes the missing ones (a
killed job completes); one with another model, task or input stops with a message instead of
mixing old and new predictions.
"""

from __future__ import annotations

import json
import os

from bertjax import paths
from bertjax.inference import input_windows, loading, outputs

SHARD_BYTES = 64 << 20  # input bytes a shard (a window) is made of


def shard_paths(output: str, count: int) -> list[str]:
    """``DIR/NAME-0000k-of-0000K.EXT`` for each of ``count`` shards of ``output``."""
    stem, ext = os.path.splitext(output)
    return [f"{stem}-{k:05d}-of-{count:05d}{ext}" for k in range(count)]


def manifest_path(output: str) -> str:
    """``DIR/NAME.manifest.json`` beside the shards of ``output``."""
    return f"{os.path.splitext(output)[0]}.manifest.json"


def settings_of(flags) -> dict:
    """What a worker needs to load the predictor and read its window (plain values)."""
    names = ("model", "input", "task", "labels", "top_k", "window", "shard_bytes", "matmul_dtype")
    columns = ("text_column", "text_pair_column", "tokens_column")
    return {
        **{name: flags[name].value for name in names},
        "columns": {c: flags[c].value for c in columns if flags[c].present},
    }


def load_predictor(settings: dict):
    from bertjax.inference import predictors

    labels = [s for s in settings["labels"].split(",") if s] or None
    predictor = predictors.load(
        settings["model"], settings["task"], labels, settings["top_k"], _products(settings)
    )
    for column, value in settings["columns"].items():
        setattr(predictor, column, value)
    return predictor


def _products(settings: dict) -> str:
    """The products' dtype asked for ("auto" when the settings do not say)."""
    return settings.get("matmul_dtype", "auto")


def made_of(settings: dict) -> dict:
    """What the shards' contents depend on: the model (its fingerprint), the task's settings, the
    input and how it is cut."""
    keys = ("task", "labels", "top_k", "columns", "shard_bytes")
    return {
        "model": paths.resolve(settings["model"]),
        "model_fingerprint": loading.fingerprint(settings["model"]),
        **{key: settings[key] for key in keys},
        "matmul_dtype": _products(settings),
        "input": paths.resolve(settings["input"]),
        "input_bytes": paths.Path(settings["input"]).stat().length,
    }


def claim(output: str, made: dict, shards: list[str]) -> None:
    """Checks that the shards already beside ``output`` were made of ``made`` (else stops with
    a message), then writes the manifest (not complete yet)."""
    manifest = manifest_path(output)
    if paths.exists(manifest):
        kept = json.loads(paths.read_text(manifest))["made_of"]
        changed = sorted(k for k in {*kept, *made} if kept.get(k) != made.get(k))
        if changed:
            raise ValueError(
                f"{manifest}: the shards beside --output={output!r} were made with another "
                f"{', '.join(changed)}; remove them and the manifest, or give another --output"
            )
    elif any(paths.exists(s) for s in shards):
        raise ValueError(
            f"--output={output!r}: shards exist beside it without {manifest}, so what made them "
            "is unknown; remove them, or give another --output"
        )
    _write_manifest(manifest, made, shards)


def _write_manifest(manifest: str, made: dict, shards: list[str], rows=None) -> None:
    value = {"made_of": made, "shards": [os.path.basename(s) for s in shards]}
    value.update(complete=rows is not None, shard_rows=rows, rows=sum(rows or []))
    paths.write_text(manifest, json.dumps(value, indent=1, sort_keys=True) + "\n")


def write_shard(predictor, settings: dict, path: str, window, counts: dict) -> tuple[int, int]:
    """Predicts ``window`` of the input into the shard ``path`` (kept when it exists already);
    ``counts``: (lines, rows) of every window. Returns (window index, rows)."""
    rows = counts[window.index][1]
    if paths.exists(path):
        return window.index, rows
    before = [counts[k] for k in range(window.index)]
    lines_before, rows_before = sum(c[0] for c in before), sum(c[1] for c in before)
    located = input_windows.located_rows(settings["input"], window, lines_before)
    checked = outputs.checked(predictor, located)
    outputs.write_predictions(predictor, checked, path, rows_before, int(settings["window"]))
    return window.index, rows


def _beam_functions():
    import apache_beam as beam

    class PredictWindow(beam.DoFn):
        """Loads the model once per worker; writes one window's shard per element."""

        def __init__(self, settings: dict, shards: list[str]):
            self.settings, self.shards = settings, shards

        def setup(self):
            self.predictor = load_predictor(self.settings)

        def process(self, window, counts):
            shard = self.shards[window.index]
            yield write_shard(self.predictor, self.settings, shard, window, counts)

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
    source = settings["input"]
    windows = input_windows.plan(source, int(settings["shard_bytes"]))
    shards = shard_paths(output, len(windows))
    made = made_of(settings)
    claim(output, made, shards)
    manifest = manifest_path(output)

    def finish(written):
        rows = [n for _, n in sorted(written)]
        _write_manifest(manifest, made, shards, rows)

    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        spread = pipeline | "windows" >> beam.Create(windows) | "spread" >> beam.Reshuffle()
        counts = spread | "count" >> beam.Map(lambda w: (w.index, input_windows.count(source, w)))
        _ = (
            spread
            | "predict"
            >> beam.ParDo(_beam_functions()(settings, shards), beam.pvalue.AsDict(counts))
            | "gather" >> beam.combiners.ToList()
            | "finish" >> beam.Map(finish)
        )
    return json.loads(paths.read_text(manifest))["rows"]
