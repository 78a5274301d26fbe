"""Prediction rows and the files they go to: one output row an input row, in input order, with
its ``row`` number and the input's id; `predict_file` streams a whole input through a predictor
``window`` rows at a time (what `python -m bertjax.predict` runs on one host, and what each Beam
worker runs on its part of the input)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from bertjax.data.text import records
from bertjax.inference import sorted_apply

ID_COLUMNS = ("_id", "id")


def output_rows(predictor, rows: list[dict], start: int) -> list[dict]:
    """``predictor``'s outputs of ``rows`` (input rows ``start``...), each with its ``row``
    number and the input's id."""
    out = []
    for number, (row, result) in enumerate(zip(rows, predictor.predict(rows)), start=start):
        named = [str(row[k]) for k in ID_COLUMNS if k in row][:1]
        out.append({"row": number, **({"id": named[0]} if named else {}), **result})
    return out


def checked(predictor, located: Iterable[tuple[str, dict]]):
    """The rows of ``located`` ((where, row) pairs), each checked for the predictor's columns:
    a row without one stops with a ValueError naming the file and line."""
    for where, row in located:
        try:
            predictor.check(row)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        yield row


def write_predictions(predictor, rows: Iterable[dict], output: str, start: int = 0, window=None):
    """Writes ``predictor``'s output rows of ``rows`` (input rows ``start``...) to ``output``
    (JSONL or Parquet, published whole: nothing appears there if this fails); the row count."""
    writer = records.RecordWriter(output)
    began = time.perf_counter()
    try:
        for chunk in sorted_apply.windows(rows, window or sorted_apply.WINDOW):
            writer.write(output_rows(predictor, chunk, start + writer.count))
            speed = writer.count / (time.perf_counter() - began)
            logging.info("%d rows, %.1f rows/s", writer.count, speed)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return writer.count


def predict_file(predictor, input_path: str, output: str, window: int = sorted_apply.WINDOW) -> int:
    """Writes ``output`` from ``input_path``, ``window`` rows at a time; the number of rows."""
    rows = checked(predictor, records.iter_located(input_path, "--input"))
    return write_predictions(predictor, rows, output, window=window)
