"""The units a streamed corpus is read in: a Parquet file's row groups, a byte range of an
uncompressed JSON Lines or one-document-a-line file (about UNIT_BYTES, its lines assigned by
where they start, so splits that do not fall on a line's start still give every line to exactly
one unit), or a whole file (compressed, or the "sentences" format, whose documents span lines).

Units are what lanes (lanes.py) share out, so a corpus of fewer files than processes, or of a
file count that does not divide by them, still gives each unit, and so each document, to one
lane only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from bertjax.data.text import corpus as corpus_lib
from bertjax.data.text import corpus_files
from bertjax.data.text.records import decode_line
from bertjax.data.text.sentences import CorpusStats, document_id

UNIT_BYTES = 32 << 20  # bytes of an uncompressed text file a unit reads, at most
MIN_UNIT_BYTES = 64 << 10  # ... and at least (a small corpus: 4 units a row of the batch)


@dataclasses.dataclass(frozen=True)
class Unit:
    file: str  # a path or URL (hf:// at its commit)
    size: int  # the file's bytes
    part: int  # its row group, or byte range, of ``parts``
    parts: int

    def as_list(self) -> list:
        return [self.file, self.size, self.part, self.parts]


def corpus_units(c, batch_size: int) -> list[Unit]:
    """The units of config.data's corpus, in corpus order (Parquet files' footers are read for
    their row groups; nothing else is). Text files are cut in units of UNIT_BYTES, or finer for
    a small corpus: 4 units a row of the batch, so that every row can have a lane of its own."""
    files = corpus_files.sizes(c.corpus)
    splittable = sum(size for path, size, _ in files if not _whole(path, c.corpus_format))
    unit_bytes = min(UNIT_BYTES, max(MIN_UNIT_BYTES, splittable // (4 * batch_size)))
    units = []
    for path, size, _ in files:
        corpus_files.check_format(path, c.corpus_format)
        if c.corpus_format == "parquet":
            import pyarrow.parquet as pq

            with corpus_files.open_file(path, size) as f:
                table = pq.ParquetFile(f)
                corpus_lib.check_column(table, c.text_feature, path)
                parts = table.num_row_groups
        elif _whole(path, c.corpus_format):
            parts = 1
        else:
            parts = max(1, math.ceil(size / unit_bytes))
        units.extend(Unit(path, size, part, parts) for part in range(parts))
    return units


def _whole(path: str, corpus_format: str) -> bool:
    """Whether a file is read whole: compressed, Parquet (row groups), or blank-line documents."""
    return corpus_format in ("sentences", "parquet") or path.endswith(corpus_files.COMPRESSED)


def unit_documents(unit: Unit, c, stats: CorpusStats | None = None):
    """(doc_id, sentences) of one unit, as the local store would name and split them."""
    stats = stats if stats is not None else CorpusStats()
    fmt, feature = c.corpus_format, c.text_feature
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with corpus_files.open_file(unit.file, unit.size) as f:
            column = pq.ParquetFile(f).read_row_group(unit.part, columns=[feature]).column(0)
        for text in column.to_pylist():
            doc = corpus_lib.text_document(text or "", stats)
            if doc:
                yield document_id(text), doc
    elif _whole(unit.file, fmt):
        yield from corpus_lib.file_documents(unit.file, fmt, stats, feature)
    else:
        for position, line in _lines(unit):
            if not line.strip():
                continue
            if fmt == "jsonl":
                text = corpus_lib.jsonl_text(line, f"{unit.file} (byte {position})", feature)
                doc = corpus_lib.text_document(text, stats)
            else:
                text, doc = line, corpus_lib.line_document(line, stats)
            if doc:
                yield document_id(text), doc


def _lines(unit: Unit) -> Iterator[tuple[int, str]]:
    """(byte position, text) of the lines that start in the unit's byte range."""
    span = math.ceil(unit.size / unit.parts)
    start, end = unit.part * span, min(unit.size, (unit.part + 1) * span)
    with corpus_files.open_file(unit.file, unit.size, stop=end) as f:
        if start > 0:  # the line running into the range belongs to the unit before
            f.seek(start - 1)
            f.readline()
        position = f.tell()
        while position < end:
            raw = f.readline()
            if not raw:
                break
            line = decode_line(raw, f"{unit.file} (byte {position})", 1).rstrip("\r\n")
            yield position, line.lstrip("\ufeff") if position == 0 else line
            position += len(raw)
