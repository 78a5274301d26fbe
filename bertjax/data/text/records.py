"""Rows of a TSV/CSV/JSONL/Parquet file (local or a URL) read one at a time, and JSONL/Parquet
output written as it comes: what fine-tuning reads and `python -m bertjax.predict` streams."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterator

from bertjax import paths

READ_FORMATS = (".tsv", ".csv", ".jsonl", ".json", ".parquet")
WRITE_FORMATS = (".jsonl", ".parquet")


def parquet():
    """(pyarrow, pyarrow.parquet), or an ImportError that says what to install."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("Parquet files need pyarrow: pip install pyarrow") from None
    return pa, pq


def decode_line(raw: bytes, path: str, number: int) -> str:
    """A line of a text file as str; invalid UTF-8 raises ValueError naming the file and line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} line {number}: invalid UTF-8 (byte {e.start} of the line: "
            f"{raw[e.start : e.start + 4]!r}); "
            "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`"
        ) from None


def iter_records(path: str, what: str = "input file") -> Iterator[dict]:
    """Each row of ``path`` as a dict (its columns), in file order."""
    for _, record in iter_located(path, what):
        yield record


def iter_located(path: str, what: str = "input file") -> Iterator[tuple[str, dict]]:
    """(where, row) of each row of ``path`` in file order: where is ``PATH line N`` (the line the
    row starts on) in a text file, ``PATH row N`` in a Parquet file. A line that is not UTF-8
    or JSON stops with a ValueError naming the file and line."""
    if not path.endswith(READ_FORMATS):
        raise ValueError(f"{what} {path!r}: expected one of {READ_FORMATS}")
    if not paths.exists(path):
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    local = paths.local_copy(path)
    if path.endswith(".parquet"):
        _, pq = parquet()
        rows = (
            r for b in pq.ParquetFile(local).iter_batches(batch_size=4096) for r in b.to_pylist()
        )
        for number, record in enumerate(rows, start=1):
            yield f"{path} row {number}", record
        return
    with open(local, "rb") as f:
        lines = (decode_line(raw, path, n) for n, raw in enumerate(f, start=1))
        if path.endswith((".jsonl", ".json")):
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    try:
                        yield f"{path} line {number}", json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path} line {number}: not JSON ({e})") from None
            return
        reader = csv.reader(lines, delimiter="\t" if path.endswith(".tsv") else ",")
        header = None
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise ValueError(f"{path} line {reader.line_num}: {e}") from None
            if header is None:
                header = row
            elif row:  # an empty line is no row (as csv.DictReader reads them)
                yield f"{path} line {start}", as_dict(header, row)


def as_dict(header: list[str], row: list[str]) -> dict:
    """``row`` by column name, as csv.DictReader makes it (extra values under None, missing
    ones None)."""
    record = dict(zip(header, row))
    if len(row) > len(header):
        record[None] = row[len(header) :]
    for name in header[len(row) :]:
        record[name] = None
    return record


class RecordWriter:
    """Appends dict rows to a JSONL or Parquet file; `close` publishes it (written beside and
    renamed, or uploaded once for a URL, so a killed run leaves no half file at ``path``)."""

    def __init__(self, path: str):
        if not path.endswith(WRITE_FORMATS):
            raise ValueError(f"--output={path!r}: expected one of {WRITE_FORMATS}")
        self.path, self.count = path, 0
        if paths.is_url(path):
            self._local = os.path.join(tempfile.mkdtemp(), os.path.basename(path))
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._local = f"{path}.tmp-{os.getpid()}"
        self._buffer = open(self._local, "wb")
        self._parquet = None

    def write(self, rows: list[dict]) -> None:
        if not rows:
            return
        self.count += len(rows)
        if self.path.endswith(".jsonl"):
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            self._buffer.write(text.encode("utf-8"))
            return
        pa, pq = parquet()
        table = pa.Table.from_pylist(rows)
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self._buffer, table.schema)
        self._parquet.write_table(table.cast(self._parquet.schema))

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
        self._buffer.close()
        if paths.is_url(self.path):
            paths.upload(self._local, self.path)
            os.remove(self._local)
        else:
            os.replace(self._local, self.path)

    def abort(self) -> None:
        """Drops what was written (nothing appears at ``path``)."""
        self._buffer.close()
        if os.path.exists(self._local):
            os.remove(self._local)
