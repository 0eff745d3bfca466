"""What a Parquet table holds, from its files' footers alone (``stoker inspect`` of Parquet
read in place): files, rows, row groups, and for each column its type, the sample field it
becomes, its bytes stored and decoded, and its nulls."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stoker.format.foreign.columns import ColumnRule, plan_columns
from stoker.format.foreign.locations import LocationReader
from stoker.format.foreign.parquet_files import ParquetFiles
from stoker.format.foreign.parquet_labels import class_label_names


@dataclass(slots=True)
class ParquetColumn:
    """One column of the table, summed over its files.

    Attributes:
        name: The column's name.
        type: Its Arrow type.
        field: The sample field it becomes (see :mod:`stoker.format.foreign.columns`).
        stored_bytes: Its column chunks' compressed bytes: what a read of it fetches.
        decoded_bytes: Their uncompressed bytes.
        nulls: Null values, where the footers' statistics count them (else None).
    """

    name: str
    type: str
    field: str
    stored_bytes: int = 0
    decoded_bytes: int = 0
    nulls: int | None = 0


@dataclass(slots=True)
class ParquetSummary:
    """A Parquet table: its files (name, rows, row groups, bytes), totals and columns."""

    url: str
    files: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    row_groups: int = 0
    bytes: int = 0
    columns: list[ParquetColumn] = field(default_factory=list)
    class_names: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def summarise_parquet(
    location: str, *, storage_options: Mapping[str, Any] | None = None
) -> ParquetSummary:
    """Summarise the Parquet file, or folder or prefix of them, at ``location``: one listing
    and one footer read per file; no row group is read.

    Raises:
        SourceError: No Parquet files, or one that cannot be read (named).
    """
    locations = LocationReader(storage_options)
    files = ParquetFiles(location, locations)
    listed = files.listed()
    schema = files.open(listed[0][0])[0].schema_arrow
    rules = plan_columns(schema, where=listed[0][0])
    summary = ParquetSummary(url=files.location)
    summary.columns = [
        ParquetColumn(rule.column, str(schema.field(rule.column).type), _field(rule))
        for rule in rules
    ]
    summary.class_names = list(class_label_names(schema, rules))
    by_name = {column.name: column for column in summary.columns}
    for at, name in listed:
        metadata = files.open(at)[0].metadata
        size = files.size(at)
        summary.files.append(
            {
                "name": name,
                "rows": metadata.num_rows,
                "row_groups": metadata.num_row_groups,
                "bytes": size,
            }
        )
        summary.rows += metadata.num_rows
        summary.row_groups += metadata.num_row_groups
        summary.bytes += size
        for group in range(metadata.num_row_groups):
            _add_chunks(metadata.row_group(group), by_name)
    summary.requests = locations.requests()
    return summary


def _add_chunks(row_group: Any, columns: dict[str, ParquetColumn]) -> None:
    """Add a row group's column chunks to their columns (a struct's leaves to the struct)."""
    for i in range(row_group.num_columns):
        chunk = row_group.column(i)
        column = columns.get(chunk.path_in_schema.split(".", 1)[0])
        if column is None:  # a top-level name holding a dot: its leaves are not split
            column = columns.get(chunk.path_in_schema)
        if column is None:
            continue
        column.stored_bytes += chunk.total_compressed_size
        column.decoded_bytes += chunk.total_uncompressed_size
        stats = chunk.statistics
        nested = "." in chunk.path_in_schema  # a struct's leaves each count its nulls
        if column.nulls is not None and not nested and stats is not None and stats.has_null_count:
            column.nulls += stats.null_count
        else:
            column.nulls = None


def _field(rule: ColumnRule) -> str:
    """The sample field a column becomes, said for a reader."""
    if rule.kind in ("label", "label_name"):
        return "label (cls)"
    if rule.kind in ("binary", "media"):
        return "image (jpg, png, ...)" if rule.short else f"{rule.stem}.<ext of its bytes>"
    extension = {"text": "txt", "array": "npy"}.get(rule.kind, "json")
    return extension if rule.short else f"{rule.stem}.{extension}"
