"""What a Parquet file's footer and label column may claim: rows bounded by the file's
size, labels numbered (string labels as class names) and checked, each naming the row,
and the class names of a Hugging Face ``ClassLabel`` in its metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.columns import ColumnRule, import_pyarrow, plain_array
from stoker.format.foreign.parquet_files import ParquetFiles

#: The most rows a file may claim per byte of it: a reference is made per row before any
#: is read. (A row of one small number, run-length encoded, can take less; no dataset
#: stoker packs is made of those.)
MAX_ROWS_PER_BYTE = 16


def check_rows(location: str, size: int, metadata: Any) -> None:
    """Refuse a file whose footer (``metadata``, pyarrow's) claims more rows than
    :data:`MAX_ROWS_PER_BYTE` a byte of its ``size``.

    Raises:
        SourceError: Naming the file, the rows claimed and its size.
    """
    groups = (metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
    claimed = max(metadata.num_rows, sum(groups))
    if claimed > MAX_ROWS_PER_BYTE * max(size, 1):
        raise SourceError(
            f"{location}: its footer claims {claimed:,} rows in a file of {size:,} bytes "
            f"(more than {MAX_ROWS_PER_BYTE} rows a byte): damaged, or not written as it "
            "says; not read"
        )


def class_index(given: Sequence[str] | None, columns: Sequence[Sequence[Any]]) -> list[str]:
    """The class names of a column of string labels: those given, else the distinct
    values of every file's column (``columns``), sorted, as an image folder's classes."""
    if given is not None:
        return list(given)
    return sorted({value for column in columns for value in column if value is not None})


def numbered(
    location: str, column: str, raw: Sequence[Any], index: dict[str, int] | None
) -> list[int]:
    """The labels of one file's label column: integers as they are, names (with
    ``index``) as their place among the class names; null is -1.

    Raises:
        SourceError: A label below -1, or a name that is none of the classes, naming the
            file, column and row.
    """
    if index is not None:
        for row, value in enumerate(raw):
            if value is not None and value not in index:
                raise SourceError(
                    f"{location}: label {value[:80]!r} in column {column!r}, row {row}, is "
                    f"not one of the {len(index)} class names given"
                )
        return [-1 if value is None else index[value] for value in raw]
    values = [-1 if value is None else int(value) for value in raw]
    low = min(values, default=-1)
    if low < -1:
        raise SourceError(
            f"{location}: label {low} in column {column!r}, row {values.index(low)}, is "
            "below -1 (no label)"
        )
    return values


def class_label_names(schema: Any, rules: list[ColumnRule]) -> tuple[str, ...]:
    """The class names of the label column's Hugging Face ``ClassLabel``, or none."""
    # Hugging Face datasets keep a ClassLabel's names in the schema's "huggingface" metadata.
    column = next((rule.column for rule in rules if rule.kind == "label"), None)
    raw = (schema.metadata or {}).get(b"huggingface")
    if column is None or raw is None:
        return ()
    try:
        feature = json.loads(raw)["info"]["features"][column]
    except (ValueError, KeyError, TypeError):
        return ()
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return ()
    names = feature.get("names")
    if not isinstance(names, list):
        return ()
    return tuple(str(name) for name in names)


class TableLabels:
    """The labels of a table's rows: its label column in each file (integers, or class
    names numbered by their place among the names given, the files' ``ClassLabel``
    names, or the column's distinct values sorted), read once a file.

    Args:
        files: The table's files.
        rule: The label column's rule; None where the table has none.
        given: Whether ``names`` were given (else found in the files' metadata, or none).
        names: The class names known so far.
    """

    def __init__(
        self, files: ParquetFiles, rule: ColumnRule | None, *, given: bool, names: Sequence[str]
    ) -> None:
        self._files, self._rule, self._given = files, rule, given
        #: Names of the labels, indexed by label.
        self.names: tuple[str, ...] = tuple(names)
        self._index: dict[str, int] | None = None

    @property
    def strings(self) -> bool:
        """Whether the label column holds class names."""
        return self._rule is not None and self._rule.kind == "label_name"

    def column(self, location: str) -> tuple[str, list[Any]] | None:
        """The label column's name and values in one file (None: no label column)."""
        rule = self._rule
        if rule is None:
            return None
        parquet, lock = self._files.open(location)
        with lock:
            try:
                table = parquet.read(columns=[rule.column])
            except (OSError, ValueError, import_pyarrow().ArrowException) as exc:
                raise SourceError(f"{location}: cannot read column {rule.column!r}: {exc}") from exc
        return rule.column, plain_array(table.column(0)).to_pylist()

    def class_columns(self) -> dict[str, tuple[str, list[Any]] | None]:
        """Each file's label column where the class names are still to be found from them
        (string labels, no names given), kept for numbering; else none read."""
        if self._index is not None or self._given or not self.strings:
            return {}
        columns = self._columns()
        self.index(columns)
        return columns

    def index(
        self, columns: Mapping[str, tuple[str, list[Any]] | None] | None = None
    ) -> dict[str, int]:
        """The label of each class name of a column of string labels (read once, unless
        each file's label column is given in ``columns``)."""
        if self._index is None:
            values: list[list[Any]] = []
            if not self._given:
                found = self._columns() if columns is None else columns
                values = [c[1] for c in found.values() if c is not None]
            names = class_index(self.names if self._given else None, values)
            if not self._given:
                self.names = tuple(names)
            self._index = {name: label for label, name in enumerate(names)}
        return self._index

    def numbered(self, location: str, column: tuple[str, list[Any]] | None) -> list[int] | None:
        """The labels of one file's rows, from its label column (None: no column)."""
        if column is None:
            return None
        return numbered(location, column[0], column[1], self.index() if self.strings else None)

    def _columns(self) -> dict[str, tuple[str, list[Any]] | None]:
        return {location: self.column(location) for location, _ in self._files.listed()}
