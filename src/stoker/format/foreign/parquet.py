"""Read Parquet files, local or in a bucket, one sample per row (needs ``stoker[parquet]``).

A bucket's file is read through the store with ranged reads of the column chunks a row
group needs (never through a URL made from a listed key); a local one by pyarrow itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

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
from stoker.format.foreign.parquet_files import PARQUET_SUFFIX, ParquetFiles
from stoker.format.foreign.parquet_labels import (
    check_rows,
    class_index,
    class_label_names,
    numbered,
)
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
        self._names: tuple[str, ...] = ()
        self._label_index: dict[str, int] | None = None  # for a column of string labels
        self._counts = ""
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
        if self._given_names is not None:
            return self._given_names
        self._column_rules()
        if self._string_labels():
            self._class_index()
        return self._names

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

    def refs(self) -> list[SampleRef]:
        """One reference per row, file by file, in row order.

        Raises:
            SourceError: A file is unreadable or claims more rows than it could hold,
                files differ in schema, two files give one key, a label is below -1 or a
                class name is none of those given, or there are no rows.
        """
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
        refs: list[SampleRef] = []
        decoded_bytes = groups = 0
        columns = self._class_columns()
        for (location, _), stem in zip(files, stems, strict=True):
            column = columns.pop(location) if location in columns else self._label_column(location)
            labels = self._numbered_labels(location, column)
            metadata = self._parquet.open(location)[0].metadata
            row = 0
            for group in range(metadata.num_row_groups):
                info = metadata.row_group(group)
                size = info.total_byte_size // max(info.num_rows, 1)
                decoded_bytes += info.total_byte_size
                groups += 1
                for in_group in range(info.num_rows):
                    refs.append(
                        SampleRef(
                            key=f"{stem}_{row:08d}",
                            location=location,
                            size=size,
                            label=-1 if labels is None else labels[row],
                            extra=(("row", group, in_group),),
                        )
                    )
                    row += 1
        if not refs:
            raise SourceError(f"{self._location}: no rows in {len(files)} Parquet file(s)")
        if self._cache_bytes is not None and decoded_bytes > self._cache_bytes and groups > 1:
            logger.warning(
                "%s: %d row groups, %s decoded, more than the %s kept decoded: packed in a "
                "shuffled order, row groups are decoded again as rows are read (pack with "
                "--keep-order, or shuffle_seed=None, to decode each once)",
                self._location,
                groups,
                format_bytes(decoded_bytes),
                format_bytes(self._cache_bytes),
            )
        self._counts = f" ({len(files):,} file{'s' if len(files) > 1 else ''}, {len(refs):,} rows)"
        return refs

    def read(self, ref: SampleRef) -> Sample:
        """Read one row's members (from its row group, decoded once while cached).

        Raises:
            SourceError: The reference names no row of the file, the row group cannot
                be read, or a value cannot become its member (see the class docstring).
        """
        name, group, row = ref.extra[0] if ref.extra else ("", -1, -1)
        rules = self._column_rules()
        arrays = self._row_group(ref.location, group) if name == "row" and group >= 0 else []
        if not arrays or not 0 <= row < len(arrays[0]):
            raise SourceError(f"{ref.location}: sample {ref.key!r} names no row of the file")
        where = f"{ref.location}: sample {ref.key!r} (row group {group}, row {row})"
        index = self._class_index() if self._string_labels() else None
        members = row_members(rules, arrays, row, where=where, label_index=index)
        if not members:
            raise SourceError(f"{where}: every column is null")
        return Sample(ref.key, members, int(members["cls"]) if "cls" in members else -1)

    def read_group(self, refs: Sequence[SampleRef]) -> list[Sample | SourceError]:
        """Read rows of one row group (``refs`` from :meth:`refs`, all of one row group),
        which is fetched and decoded once for them: each row's sample, or the error that
        names why it cannot be one (the row group's own error for every row when the row
        group cannot be read)."""
        if not refs:
            return []
        _, group, _ = refs[0].extra[0]
        location = refs[0].location
        try:
            arrays = self._row_group(location, group)
        except SourceError as exc:
            return [exc for _ in refs]
        rules = self._column_rules()
        index = self._class_index() if self._string_labels() else None
        out: list[Sample | SourceError] = []
        for ref in refs:
            _, ref_group, row = ref.extra[0]
            where = f"{ref.location}: sample {ref.key!r} (row group {ref_group}, row {row})"
            if ref.location != location or ref_group != group or not 0 <= row < len(arrays[0]):
                out.append(SourceError(f"{where}: not a row of {location} row group {group}"))
                continue
            try:
                members = row_members(rules, arrays, row, where=where, label_index=index)
            except SourceError as exc:
                out.append(exc)
                continue
            if not members:
                out.append(SourceError(f"{where}: every column is null"))
                continue
            label = int(members["cls"]) if "cls" in members else -1
            out.append(Sample(ref.key, members, label))
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
            self._names = class_label_names(schema, rules)
            self._rules = rules
        return self._rules

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

    def _string_labels(self) -> bool:
        return any(rule.kind == "label_name" for rule in self._column_rules())

    def _label_column(self, location: str) -> tuple[str, list[Any]] | None:
        """The label column's name and values in one file (None: no label column)."""
        rule = next((r for r in self._column_rules() if r.kind in ("label", "label_name")), None)
        if rule is None:
            return None
        parquet, lock = self._parquet.open(location)
        with lock:
            try:
                table = parquet.read(columns=[rule.column])
            except (OSError, ValueError, import_pyarrow().ArrowException) as exc:
                raise SourceError(f"{location}: cannot read column {rule.column!r}: {exc}") from exc
        return rule.column, plain_array(table.column(0)).to_pylist()

    def _class_columns(self) -> dict[str, tuple[str, list[Any]] | None]:
        """Each file's label column where the class names are still to be found from them
        (string labels, no names given), kept for numbering; else none read."""
        known = self._label_index is not None or self._given_names is not None
        if known or not self._string_labels():
            return {}
        columns = self._label_columns()
        self._class_index(columns)
        return columns

    def _label_columns(self) -> dict[str, tuple[str, list[Any]] | None]:
        return {location: self._label_column(location) for location in self.files()}

    def _class_index(
        self, columns: Mapping[str, tuple[str, list[Any]] | None] | None = None
    ) -> dict[str, int]:
        """The label of each class name of a column of string labels (read once, unless
        each file's label column is given in ``columns``)."""
        if self._label_index is None:
            values: list[list[Any]] = []
            if self._given_names is None:
                found = self._label_columns() if columns is None else columns
                values = [c[1] for c in found.values() if c is not None]
            names = class_index(self._given_names, values)
            if self._given_names is None:
                self._names = tuple(names)
            self._label_index = {name: label for label, name in enumerate(names)}
        return self._label_index

    def _numbered_labels(
        self, location: str, column: tuple[str, list[Any]] | None
    ) -> list[int] | None:
        if column is None:
            return None
        index = self._class_index() if self._string_labels() else None
        return numbered(location, column[0], column[1], index)


def _schema_text(schema: Any) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"
