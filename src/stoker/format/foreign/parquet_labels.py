"""What a Parquet file's footer and label column may claim: rows bounded by the file's
size, labels numbered (string labels as class names) and checked, each naming the row,
and the class names of a Hugging Face ``ClassLabel`` in its metadata."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.columns import ColumnRule

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
