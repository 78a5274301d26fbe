"""An input file cut into windows by byte offset, for the Beam runner: each worker reads only its
window's bytes, and the driver reads none of the rows.

A JSONL/TSV/CSV file is cut into byte ranges of ``shard_bytes``; a window holds the lines that
start in its range (the line that crosses its start belongs to the window before), so a row is
one line here: a quoted CSV field that runs past its line stops with a message. A TSV/CSV
header (the file's first line) is read by every window and is a row of none. A Parquet file is
cut into runs of whole row groups of about ``shard_bytes``, from its footer. `count` gives a
window's (lines, rows) from its own bytes; the rows before a window are the counts of the
windows before it, so `located_rows` numbers lines as the single-host reader does.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterator

from bertjax import paths
from bertjax.data.text import records


@dataclasses.dataclass(frozen=True)
class Window:
    """Window ``index`` of a file: bytes [start, end), or row groups [start, end) of Parquet."""

    index: int
    start: int
    end: int


def _parquet_file(path: str):
    _, pq = records.parquet()
    return pq.ParquetFile(paths.Path(path).open("rb"))  # the footer only, by range reads


def plan(path: str, shard_bytes: int) -> list[Window]:
    """The windows of ``path`` (at least one), from its size or its Parquet footer alone."""
    if not path.endswith(records.READ_FORMATS):
        raise ValueError(f"--input={path!r}: expected one of {records.READ_FORMATS}")
    if not paths.isfile(path):
        raise FileNotFoundError(f"--input={path!r} does not exist")
    if path.endswith(".parquet"):
        meta = _parquet_file(path).metadata
        windows, first, size = [], 0, 0
        for group in range(meta.num_row_groups):
            size += meta.row_group(group).total_byte_size
            if size >= shard_bytes or group == meta.num_row_groups - 1:
                windows.append(Window(len(windows), first, group + 1))
                first, size = group + 1, 0
        return windows or [Window(0, 0, 0)]
    size = paths.Path(path).stat().length
    count = max(1, math.ceil(size / shard_bytes))
    return [Window(k, k * shard_bytes, min(size, (k + 1) * shard_bytes)) for k in range(count)]


def _lines(path: str, window: Window) -> Iterator[bytes]:
    """The raw lines that start in the window's byte range (the header line excepted)."""
    with paths.Path(path).open("rb") as f:
        position = window.start
        if position > 0:  # the line crossing the start belongs to the window before
            f.seek(position - 1)
            position += len(f.readline()) - 1
        elif not path.endswith((".jsonl", ".json")):  # the header line
            position += len(f.readline())
        while position < window.end:
            line = f.readline()
            if not line:
                return
            position += len(line)
            yield line


def _is_row(path: str, raw: bytes) -> bool:
    """Whether a line is a row: JSONL skips blank lines, CSV/TSV empty ones (as the single-host
    readers do)."""
    if path.endswith((".jsonl", ".json")):
        return bool(raw.strip())
    return bool(raw.rstrip(b"\r\n"))


def count(path: str, window: Window) -> tuple[int, int]:
    """(lines, rows) of the window (a Parquet window: its rows twice)."""
    if path.endswith(".parquet"):
        meta = _parquet_file(path).metadata
        rows = sum(meta.row_group(g).num_rows for g in range(window.start, window.end))
        return rows, rows
    lines = rows = 0
    for raw in _lines(path, window):
        lines += 1
        rows += _is_row(path, raw)
    return lines, rows


def header(path: str) -> list[str]:
    """The column names of a TSV/CSV file (its first line)."""
    with paths.Path(path).open("rb") as f:
        line = records.decode_line(f.readline(), path, 1)
    return next(csv.reader([line], delimiter=_delimiter(path)), [])


def _delimiter(path: str) -> str:
    return "\t" if path.endswith(".tsv") else ","


def located_rows(path: str, window: Window, lines_before: int) -> Iterator[tuple[str, dict]]:
    """(where, row) of each row of the window, as `records.iter_located` names them;
    ``lines_before``: the lines (Parquet: rows) of the windows before it."""
    if path.endswith(".parquet"):
        table = _parquet_file(path).read_row_groups(list(range(window.start, window.end)))
        for number, row in enumerate(table.to_pylist(), start=lines_before + 1):
            yield f"{path} row {number}", row
        return
    jsonl = path.endswith((".jsonl", ".json"))
    names = None if jsonl else header(path)
    first = lines_before + 1 + (0 if jsonl else 1)  # the header is line 1
    for number, raw in enumerate(_lines(path, window), start=first):
        if not _is_row(path, raw):
            continue
        line, where = records.decode_line(raw, path, number), f"{path} line {number}"
        if jsonl:
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
            continue
        try:
            (row,) = csv.reader([line], delimiter=_delimiter(path), strict=True)
        except csv.Error as e:
            raise ValueError(
                f"{where}: {e} (on Beam each row is one line: a quoted field may not hold a "
                "line break)"
            ) from None
        yield where, records.as_dict(names, row)
