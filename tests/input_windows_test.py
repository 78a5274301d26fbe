"""The Beam runner's byte windows (bertjax/inference/input_windows.py): whatever the window size,
the windows in order give every row of the file once, located as the single-host reader locates
it, each window reading about its own bytes only; a quoted field across lines is named."""

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data.text import records
from bertjax.inference import input_windows

ROWS = [{"id": f"r{i}", "text": "word " * (i % 7) + f"number {i}"} for i in range(40)]


def _files(tmp_path):
    tsv = tmp_path / "in.tsv"
    lines = ["id\ttext"] + [f"{r['id']}\t{r['text']}" for r in ROWS]
    lines.insert(9, "")  # an empty line is no row
    tsv.write_text("\n".join(lines) + "\n")
    jsonl = tmp_path / "in.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines.insert(3, "  ")  # neither is a blank line
    jsonl.write_text("\n".join(lines) + "\n")
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet, row_group_size=6)
    return [str(tsv), str(jsonl), str(parquet)]


def _windowed(path, shard_bytes):
    windows = input_windows.plan(path, shard_bytes)
    counts = [input_windows.count(path, w) for w in windows]
    located, before = [], 0
    for window, (lines, _) in zip(windows, counts):
        located += input_windows.located_rows(path, window, before)
        before += lines
    return windows, counts, located


@pytest.mark.parametrize("shard_bytes", [1, 23, 200, 1 << 20])
def test_windows_give_every_row_once_where_the_reader_finds_it(tmp_path, shard_bytes):
    for path in _files(tmp_path):
        windows, counts, located = _windowed(path, shard_bytes)
        assert located == list(records.iter_located(path)), (path, shard_bytes)
        assert sum(rows for _, rows in counts) == len(ROWS)
        if path.endswith(".parquet"):  # whole row groups: 7 groups of <= 6 rows
            assert len(windows) == (7 if shard_bytes < 1 << 20 else 1)


def test_a_window_reads_about_its_own_bytes(tmp_path, monkeypatch):
    path = _files(tmp_path)[1]
    windows = input_windows.plan(path, 64)
    read = []

    class Counting(io.FileIO):
        def readline(self, *args):
            line = super().readline(*args)
            read.append(len(line))
            return line

    monkeypatch.setattr(
        input_windows.paths, "Path", lambda p: type("P", (), {"open": lambda _, m: Counting(p)})()
    )
    for window in windows:
        input_windows.count(path, window)
    longest = max(len(line) + 1 for line in open(path).read().splitlines())
    size = sum(1 for _ in open(path, "rb").read())
    assert len(windows) > 10 and sum(read) <= size + len(windows) * 2 * longest


def test_a_quoted_field_across_lines_is_named(tmp_path):
    path = tmp_path / "quoted.tsv"
    path.write_text('id\ttext\nr0\t"a text\nover two lines"\n')
    (window,) = input_windows.plan(str(path), 1 << 20)
    with pytest.raises(ValueError, match=r"quoted.tsv line 2: .*each row is one line"):
        list(input_windows.located_rows(str(path), window, 0))
