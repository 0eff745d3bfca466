"""Read Parquet files, local or in a bucket, one sample per row (needs ``stoker[parquet]``).

A bucket's file is read through the store with ranged reads of the column chunks a row
group needs (never through a URL made from a listed key); a local one by pyarrow itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stoker.core.units import format_bytes
from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef
from stoker.format.foreign.columns import (
    ColumnRule,
    import_pyarrow,
    plain_array,
    plan_columns,
    row_members,
)
from stoker.format.foreign.locations import LocationReader
from stoker.format.foreign.parquet_files import (
    PARQUET_SUFFIX,
    ParquetFiles,
    ParquetTable,
    RowGroup,
)
from stoker.format.foreign.parquet_labels import TableLabels, check_rows, class_label_names
from stoker.format.foreign.rowgroups import DEFAULT_CACHE_BYTES, RowGroupCache
from stoker.storage import StorageOptions, Store
from stoker.storage.cache import DiskCache

logger = logging.getLogger(__name__)


class ParquetReader:
    """Read a ``.parquet`` file, or every one under a folder or bucket prefix.

    Files are read in sorted order of their paths (the Hugging Face layout,
    ``data/train-00000-of-00002.parquet``, works as it is; names starting with ``.`` or
    ``_``, as Spark's ``_SUCCESS``, are left out) and must share one schema. Rows come in
    row-group order; the key of a row is the file's path under the folder without
    ``.parquet`` (dots made ``_``), ``_`` and its row number in the file:
    ``data/train-00000-of-00002_00000041``.

    Columns become members, in column order, by their Arrow type, as
    :mod:`~stoker.format.foreign.columns` says (an image column's bytes are ``jpg``, a
    caption ``txt``, an integer ``label`` the label and its ``cls`` member, lists of
    numbers ``COLUMN.npy``, ...); class names come from the Hugging Face ``ClassLabel`` in
    the file's metadata unless given. A null value gives no member for that row.

    Packing reads rows in a shuffled order: each row group is decoded once and kept in a
    cache of ``cache_bytes`` per process; a row group pushed out is decoded again when
    one of its rows is next asked for (:meth:`refs` warns when the input is larger than
    the cache).

    A file whose footer claims more rows than it could hold (see
    :mod:`~stoker.format.foreign.parquet_labels`) is refused before a row is read.

    Args:
        location: A ``.parquet`` file or object, or a folder or bucket prefix of them.
        storage_options: Options for the stores opened for object URLs.
        class_names: Class names indexed by label, if known.
        cache_bytes: Decoded row groups held per process; None keeps none past the one
            being read, for a reader of whole row groups (:meth:`read_group`).
        columns: Read only these columns (each row group's chunks of the others are never
            fetched); None reads every column.
        footer_cache: The node's disk cache, to read a bucket's listing and footers once a
            node (see :class:`ParquetFiles`).

    Raises:
        ImportError: pyarrow is not installed (``pip install 'stoker[parquet]'``).
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | StorageOptions | None = None,
        class_names: Sequence[str] | None = None,
        cache_bytes: int | None = DEFAULT_CACHE_BYTES,
        columns: Sequence[str] | None = None,
        footer_cache: DiskCache | None = None,
    ) -> None:
        import_pyarrow()
        self._columns = tuple(columns) if columns is not None else None
        self._location = location.rstrip("/")
        self._locations = LocationReader(storage_options)
        self._given_names = tuple(class_names) if class_names else None
        self._cache_bytes = cache_bytes
        self._parquet = ParquetFiles(self._location, self._locations, cache=footer_cache)
        self._rules: list[ColumnRule] | None = None
        self._table_labels: TableLabels | None = None
        self._counts = ""
        self._table: ParquetTable | None = None
        self._cache = RowGroupCache(cache_bytes or 1)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_cache")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # decoded row groups stay behind
        self._cache = RowGroupCache(self._cache_bytes or 1)

    @property
    def location(self) -> str:
        """The file, folder or prefix read."""
        return self._location

    @property
    def description(self) -> str:
        """What was read, for summaries."""
        return f"parquet {self._location}{self._counts}"

    @property
    def class_names(self) -> Sequence[str]:
        """The given class names, else the label column's Hugging Face ``ClassLabel``
        names, else empty."""
        labels = self._labels()
        if labels.strings:
            labels.index()
        return labels.names

    @property
    def row_groups_decoded(self) -> int:
        """Row groups decoded by this process so far (each cache miss decodes one)."""
        return self._cache.loads

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._locations.requests()

    def files(self) -> list[str]:
        """The Parquet files read, in order.

        Raises:
            SourceError: There are none, or a bucket key no request can name.
        """
        return [location for location, _ in self._parquet.listed()]

    def table(self) -> ParquetTable:
        """The table's row groups, in file and row order, and every row's label, without
        a reference per row (the footers and the label column are read).

        Raises:
            SourceError: A file is unreadable or claims more rows than it could hold,
                files differ in schema, two files give one key, a label is below -1 or a
                class name is none of those given, or there are no rows.
        """
        if self._table is None:
            self._table = self._read_table()
        return self._table

    def refs(self) -> list[SampleRef]:
        """One reference per row, file by file, in row order (see :meth:`table`).

        Raises:
            SourceError: As :meth:`table`.
        """
        table = self.table()
        refs: list[SampleRef] = []
        for group in table.groups:
            size = group.decoded_bytes // max(group.rows, 1)
            for in_group in range(group.rows):
                label = -1 if table.labels is None else int(table.labels[group.start + in_group])
                refs.append(
                    SampleRef(
                        key=group.key(in_group),
                        location=group.location,
                        size=size,
                        label=label,
                        extra=(("row", group.group, in_group),),
                    )
                )
        decoded_bytes = sum(group.decoded_bytes for group in table.groups)
        if (
            self._cache_bytes is not None
            and decoded_bytes > self._cache_bytes
            and len(table.groups) > 1
        ):
            logger.warning(
                "%s: %d row groups, %s decoded, more than the %s kept decoded: packed in a "
                "shuffled order, row groups are decoded again as rows are read (pack with "
                "--keep-order, or shuffle_seed=None, to decode each once)",
                self._location,
                len(table.groups),
                format_bytes(decoded_bytes),
                format_bytes(self._cache_bytes),
            )
        return refs

    def _read_table(self) -> ParquetTable:
        files = self._parquet.listed()
        self._column_rules()
        first = files[0][0]
        schema = self._parquet.open(first)[0].schema_arrow
        stems: dict[str, str] = {}
        for location, name in files:
            parquet = self._parquet.open(location)[0]
            if not parquet.schema_arrow.equals(schema, check_metadata=False):
                raise SourceError(
                    f"{location}: its columns differ from {first}'s: "
                    f"{_schema_text(parquet.schema_arrow)} against {_schema_text(schema)}"
                )
            stem = name[: -len(PARQUET_SUFFIX)].replace(".", "_")
            if stem in stems:
                raise SourceError(f"{location} and {stems[stem]} give the same keys ({stem}_...)")
            stems[stem] = location
            check_rows(location, self._parquet.size(location), parquet.metadata)
        groups: list[RowGroup] = []
        labels: list[list[int]] | None = None
        columns = self._labels().class_columns()
        start = 0
        for (location, _), stem in zip(files, stems, strict=True):
            column = (
                columns.pop(location) if location in columns else self._labels().column(location)
            )
            numbered = self._labels().numbered(location, column)
            if numbered is not None:
                labels = (labels or []) + [numbered]
            metadata = self._parquet.open(location)[0].metadata
            row = 0
            for group in range(metadata.num_row_groups):
                info = metadata.row_group(group)
                groups.append(
                    RowGroup(location, stem, group, row, start, info.num_rows, info.total_byte_size)
                )
                row += info.num_rows
                start += info.num_rows
        if not start:
            raise SourceError(f"{self._location}: no rows in {len(files)} Parquet file(s)")
        self._counts = f" ({len(files):,} file{'s' if len(files) > 1 else ''}, {start:,} rows)"
        found = (
            None
            if labels is None
            else np.concatenate([np.asarray(part, dtype=np.int64) for part in labels])
        )
        return ParquetTable(groups, found)

    def read(self, ref: SampleRef) -> Sample:
        """Read one row's members (from its row group, decoded once while cached).

        Raises:
            SourceError: The reference names no row of the file, the row group cannot
                be read, or a value cannot become its member (see the class docstring).
        """
        name, group, row = ref.extra[0] if ref.extra else ("", -1, -1)
        if name != "row" or group < 0:
            raise SourceError(f"{ref.location}: sample {ref.key!r} names no row of the file")
        found = self._samples(ref.location, group, [(row, ref.key)])[0]
        if isinstance(found, SourceError):
            raise found
        return found

    def read_rows(self, group: RowGroup, rows: Sequence[int]) -> list[Sample | SourceError]:
        """Rows of one row group (numbers within it), which is fetched and decoded once for
        them: each row's sample, or the error that names why it cannot be one (the row
        group's own error for every row when the row group cannot be read)."""
        return self._samples(group.location, group.group, [(row, group.key(row)) for row in rows])

    def _samples(
        self, location: str, group: int, rows: Sequence[tuple[int, str]]
    ) -> list[Sample | SourceError]:
        """The samples of ``rows`` (each its number in row group ``group`` and its key)."""
        if not rows:
            return []
        try:
            arrays = self._row_group(location, group)
        except SourceError as exc:
            return [exc for _ in rows]
        rules = self._column_rules()
        index = self._labels().index() if self._labels().strings else None
        out: list[Sample | SourceError] = []
        for row, key in rows:
            where = f"{location}: sample {key!r} (row group {group}, row {row})"
            if not arrays or not 0 <= row < len(arrays[0]):
                out.append(SourceError(f"{location}: sample {key!r} names no row of the file"))
                continue
            try:
                members = row_members(rules, arrays, row, where=where, label_index=index)
            except SourceError as exc:
                out.append(exc)
                continue
            if not members:
                out.append(SourceError(f"{where}: every column is null"))
                continue
            out.append(Sample(key, members, int(members["cls"]) if "cls" in members else -1))
        return out

    def member_names(self) -> list[str] | None:
        """The member names the chosen columns give a row (``txt``, ``cls``,
        ``tokens.npy``, ...); None where a binary or image column is chosen, whose
        members are named by their bytes (``jpg``, ``png``, ``audio.flac``)."""
        names = []
        for rule in self._column_rules():
            if rule.kind in ("binary", "media"):
                return None
            if rule.kind in ("label", "label_name"):
                names.append("cls")
            else:
                extension = {"text": "txt", "array": "npy"}.get(rule.kind, "json")
                names.append(extension if rule.short else f"{rule.stem}.{extension}")
        return names

    def store(self) -> Store:
        """The store the files are read through (see :meth:`ParquetFiles.store`)."""
        return self._parquet.store()

    def chunk_bytes(self, location: str, group: int) -> int:
        """Bytes of row group ``group`` of ``location`` that a read of the chosen columns
        fetches: their column chunks' compressed sizes, as the file's footer records them."""
        chosen = [rule.column for rule in self._column_rules()]
        metadata = self._parquet.open(location)[0].metadata.row_group(group)
        total = 0
        for i in range(metadata.num_columns):
            chunk = metadata.column(i)
            path = chunk.path_in_schema
            if any(path == name or path.startswith(f"{name}.") for name in chosen):
                total += chunk.total_compressed_size
        return total

    def _column_rules(self) -> list[ColumnRule]:
        if self._rules is None:
            first = self.files()[0]
            schema = self._parquet.open(first)[0].schema_arrow
            rules = plan_columns(schema, where=first)
            if not rules:
                raise SourceError(f"{first}: the file has no columns")
            if self._columns is not None:
                missing = [name for name in self._columns if name not in schema.names]
                if missing or not self._columns:
                    raise SourceError(
                        f"{first}: no column {missing[0]!r}; it has {schema.names[:20]}"
                        if missing
                        else f"{first}: columns=[] asks for no column"
                    )
                # Named as in the whole file (the first text column is txt, ...), so a
                # selection gives the members a pack of the whole file gives.
                rules = [rule for rule in rules if rule.column in self._columns]
            rule = next((r for r in rules if r.kind in ("label", "label_name")), None)
            names = self._given_names or class_label_names(schema, rules)
            self._table_labels = TableLabels(
                self._parquet, rule, given=self._given_names is not None, names=names
            )
            self._rules = rules
        return self._rules

    def _labels(self) -> TableLabels:
        """The rows' labels (the label column, numbered; the class names)."""
        self._column_rules()
        if self._table_labels is None:  # set by _column_rules
            raise RuntimeError("the column rules set no labels")
        return self._table_labels

    def _row_group(self, location: str, group: int) -> list[Any]:
        def load() -> tuple[list[Any], int]:
            parquet, lock = self._parquet.open(location)
            if group >= parquet.metadata.num_row_groups:
                return [], 0
            with lock:
                try:
                    columns = [rule.column for rule in self._column_rules()]
                    table = parquet.read_row_group(group, columns=columns)
                except (OSError, ValueError, import_pyarrow().ArrowException) as exc:
                    raise SourceError(f"{location}: cannot read row group {group}: {exc}") from exc
            arrays = [plain_array(table.column(i)) for i in range(table.num_columns)]
            return arrays, sum(array.nbytes for array in arrays)

        arrays: list[Any] = self._cache.get((location, group), load)
        return arrays


def _schema_text(schema: Any) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"
