"""Text inputs of a token pack, to be tokenized: one document per non-blank line of JSONL
files (read in chunks, so a file of any size streams), or per row of a Parquet text column
(only that column is read; a bucket's file through ranged reads, opened as every Parquet
reader opens files, :class:`~stoker.format.foreign.parquet_files.ParquetFiles`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from stoker.format.foreign.columns import import_pyarrow
from stoker.format.foreign.locations import LocationReader
from stoker.format.foreign.parquet_files import ParquetFiles
from stoker.pack.token_sources import InputFile, Item, document_key

#: Bytes of a JSONL file read at once.
JSONL_CHUNK_BYTES = 16 << 20
#: Rows of a Parquet text column decoded at once.
PARQUET_BATCH_ROWS = 4096


def read_jsonl(
    files: list[InputFile], reader: LocationReader, *, text_field: str
) -> Iterator[Item]:
    """One item of text per non-blank line of each JSONL file, read in chunks."""
    for f in files:
        for number, line in _lines(f, reader):
            if not line.strip():
                continue
            key = document_key(f.relative, f"_{number:08d}")
            where = f"{f.location} line {number}"
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                yield Item(key, where, problem=f"not JSON: {exc}")
                continue
            if not isinstance(record, dict) or text_field not in record:
                yield Item(key, where, problem=f"no {text_field!r} field")
            elif not isinstance(record[text_field], str):
                kind = type(record[text_field]).__name__
                yield Item(key, where, problem=f"{text_field!r} is a {kind}, not text")
            else:
                yield Item(key, where, record[text_field])


def _lines(f: InputFile, reader: LocationReader) -> Iterator[tuple[int, bytes]]:
    rest, number, position = b"", 0, 0
    while position < f.size:
        data = reader.read(f.location, position, min(JSONL_CHUNK_BYTES, f.size - position))
        position += len(data)
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        for line in lines:
            number += 1
            yield number, line
    if rest:
        yield number + 1, rest


def read_parquet(
    files: list[InputFile], reader: LocationReader, *, text_field: str
) -> Iterator[Item]:
    """One item of text per row of each Parquet file's ``text_field`` column (only that
    column is read; a bucket's file through ranged reads).

    Raises:
        ValueError: A file without that column, or with one that is not text.
    """
    pa = import_pyarrow()
    listed = [(f.location, f.relative, f.size) for f in files]
    parquet_files = ParquetFiles.of(files[0].location if files else "", listed, reader)
    for f in files:
        parquet, _ = parquet_files.open(f.location)
        schema = parquet.schema_arrow
        if text_field not in schema.names:
            raise ValueError(
                f"{f.location}: no column {text_field!r} (columns: {schema.names[:20]}); "
                "name the text column (--text-field)"
            )
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ValueError(f"{f.location}: column {text_field!r} is {kind}, not text")
        row = 0
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field]):
            for text in batch.column(0).to_pylist():
                key = document_key(f.relative, f"_{row:08d}")
                where = f"{f.location} row {row}"
                if text is None:
                    yield Item(key, where, problem=f"null {text_field!r}")
                else:
                    yield Item(key, where, text)
                row += 1
