"""``stoker inspect`` of Parquet read in place: the table's files, rows, row groups and
columns (type, field, bytes stored and decoded, nulls), from the footers alone."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stoker.core.units import format_bytes
from stoker.format.foreign.parquet_summary import ParquetSummary


def inspect_parquet(summary: ParquetSummary, *, as_json: bool) -> None:
    """Print ``summary`` as text, or as JSON."""
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
        return
    console = Console()
    gets = summary.requests.get("requests.get", 0)
    console.print(
        f"[bold]{escape(summary.url)}[/]: Parquet read in place, {summary.rows:,} rows in "
        f"{summary.row_groups:,} row groups of {len(summary.files):,} files, "
        f"{format_bytes(summary.bytes)}" + (f"; {gets} GETs (the footers)" if gets else "")
    )
    columns = Table("column", "type", "field", "stored", "decoded", "share", "nulls")
    for column in summary.columns:
        share = column.stored_bytes / summary.bytes if summary.bytes else 0.0
        nulls = "?" if column.nulls is None else f"{column.nulls:,}"
        columns.add_row(
            escape(column.name),
            escape(column.type),
            escape(column.field),
            format_bytes(column.stored_bytes),
            format_bytes(column.decoded_bytes),
            f"{share:.1%}",
            nulls,
        )
    console.print(columns)
    if summary.class_names:
        names = ", ".join(summary.class_names[:20])
        more = f" and {len(summary.class_names) - 20} more" if len(summary.class_names) > 20 else ""
        console.print(f"classes (the label's ClassLabel): {escape(names)}{more}")
    files = Table("file", "rows", "row groups", "bytes")
    for entry in summary.files[:50]:
        files.add_row(
            escape(entry["name"]),
            f"{entry['rows']:,}",
            f"{entry['row_groups']:,}",
            format_bytes(entry["bytes"]),
        )
    console.print(files)
    if len(summary.files) > 50:
        console.print(f"... and {len(summary.files) - 50} more files (--json lists all)")
    console.print(
        "A read of some columns fetches their stored bytes alone: "
        "stoker.SourceConfig(url, columns=[...])."
    )
