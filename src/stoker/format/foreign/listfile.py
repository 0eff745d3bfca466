"""Read a CSV or JSONL list of files (local paths or object URLs) with optional labels.

A CSV list has a header row naming a path column (``path``, ``file``, ``filename``, ``url``
or ``image``, first match wins, case-insensitive) and optionally a label column (``label``,
``class`` or ``target``); a JSONL list has one object per line with the same keys. Relative
paths resolve against the list file's own directory or prefix; absolute paths and URLs are
used as they are.

Every row must name a file inside the list's own folder (or bucket prefix): a row such as
``/home/u/.aws/credentials``, ``../x``, a symbolic link leading out, or a URL elsewhere is
refused, naming its row, unless ``allow_outside=True`` (``stoker pack
--allow-outside-list``): a list from someone else must not make a pack read, and perhaps
publish, files its author chose.

Labels are integers (kept; -1 or an empty value means none) or class names (strings),
which map to their index in the ``class_names`` given to the reader, or, if none were
given, in the sorted set of names found.

A sample's key is the file's path relative to the list's folder without its extension
(:func:`~stoker.format.foreign.base.sample_key`), the key the same file gets in an image
folder, streamed or packed: a list of ``astronaut/ast_00004.jpg`` and the folder beside it
give ``astronaut/ast_00004`` either way, whatever the order of the rows. Two rows that give
one key (a file named twice, or ``a.jpg`` beside ``a.png``) are refused, naming both.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef, sample_key
from stoker.format.foreign.locations import LocationReader, is_remote
from stoker.format.spec import normalise_extension

logger = logging.getLogger(__name__)

PATH_COLUMNS = ("path", "file", "filename", "url", "image")
LABEL_COLUMNS = ("label", "class", "target")
_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    path: str
    label: int | str | None


class ListFileReader:
    """Read the files named by a CSV or JSONL list, one sample per row.

    A ``.jsonl``/``.ndjson`` name means JSON lines and ``.csv``/``.tsv`` comma- or
    tab-separated values; any other name is JSON lines if its first character is ``{``.
    Each sample has the file's bytes under its extension (``jpeg`` becomes ``jpg``; no
    extension gives ``bin``) and, if it has a label, the label as ``cls`` text.

    Args:
        location: The list file: a local path or an object URL.
        storage_options: Options for the stores opened for object URLs.
        class_names: Class names indexed by label. Names in the list must be among them.
        allow_outside: Read rows naming files outside the list's folder (absolute paths,
            ``..``, other prefixes or buckets); refused by default.
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        class_names: Sequence[str] | None = None,
        allow_outside: bool = False,
    ) -> None:
        self._location = location
        self._allow_outside = allow_outside
        self._locations = LocationReader(storage_options)
        self._given_names = tuple(class_names) if class_names is not None else None
        self._found_names: tuple[str, ...] | None = None
        self._counts = ""
        self._row_of: dict[str, int] = {}  # key -> row (from 1), for messages

    @property
    def description(self) -> str:
        """What was read, for summaries."""
        return f"list file {self._location}{self._counts}"

    @property
    def class_names(self) -> Sequence[str]:
        """The given class names, else the sorted names in the list (reads it if needed)."""
        if self._given_names is not None:
            return self._given_names
        if self._found_names is None:
            self._labels(self._rows())
        return self._found_names or ()

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._locations.requests()

    def refs(self) -> list[SampleRef]:
        """One reference per row, in list order; local files are checked and sized.

        A key is the file's path relative to the list's folder without its extension,
        dots made ``_`` (as an image folder keys its files); a file outside the folder
        (``allow_outside``) is keyed by its whole path or URL without the scheme
        (``bucket/other/b`` for ``s3://bucket/other/b.webp``). Files behind object URLs
        are not checked here and have size 0.

        Raises:
            SourceError: The list is unreadable, empty or lacks a path column, a label
                cannot be parsed, a row names a file outside the list's folder (unless
                ``allow_outside``), a local file does not exist, or two rows give one key.
        """
        rows = self._rows()
        labels = self._labels(rows)
        refs: list[SampleRef] = []
        self._row_of = {}
        for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
            where = f"{self._location}: row {i + 1} (line {row.line})"
            if "\0" in row.path:
                raise SourceError(f"{where}: {row.path!r} holds a NUL character")
            location = self._resolve(row)
            if not self._allow_outside and not self._inside(location):
                raise SourceError(
                    f"{where}: {row.path!r} lies outside the list's folder {self._folder()}; "
                    "refused unless --allow-outside-list (allow_outside=True)"
                )
            size = 0
            if not is_remote(location):
                local = Path(location.removeprefix("file://"))
                if not local.is_file():
                    raise SourceError(
                        f"{self._location}: row {i + 1} (line {row.line}): "
                        f"file not found: {row.path}"
                    )
                size = local.stat().st_size
            key = sample_key(self._relative(location))
            if key in self._row_of:
                first = self._row_of[key]
                raise SourceError(
                    f"{where}: {row.path!r} gives the key {key!r}, as row {first} does: a "
                    "sample's key is its path without the extension, one per sample; list "
                    "each file once"
                )
            self._row_of[key] = i + 1
            refs.append(SampleRef(key=key, location=location, size=size, label=label))
        self._counts = f" ({len(refs):,} rows)"
        return refs

    def read(self, ref: SampleRef) -> Sample:
        """Fetch one file's bytes.

        Raises:
            SourceError: The file cannot be read; the message names its row and path.
        """
        try:
            data = self._locations.read(ref.location)
        except SourceError as exc:
            row = self._row_of.get(ref.key)
            where = f"row {row}" if row is not None else f"sample {ref.key!r}"
            raise SourceError(f"{self._location}: {where}: {exc}") from exc
        suffix = PurePosixPath(ref.location).suffix.lower().lstrip(".")
        fields = {normalise_extension(suffix) or "bin": data}
        if ref.label >= 0:
            fields["cls"] = str(ref.label).encode()
        return Sample(ref.key, fields, ref.label)

    def _rows(self) -> list[_Row]:
        raw = self._locations.read(self._location)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise SourceError(f"{self._location}: not UTF-8 text: {exc}") from exc
        if not text.strip():
            raise SourceError(f"{self._location}: the list is empty")
        name = self._location.lower()
        if name.endswith((".jsonl", ".ndjson")) or (
            not name.endswith((".csv", ".tsv")) and text.lstrip().startswith("{")
        ):
            rows = self._parse_jsonl(text)
        else:
            rows = self._parse_csv(text, delimiter="\t" if name.endswith(".tsv") else ",")
        if not rows:
            raise SourceError(f"{self._location}: the list has no rows")
        return rows

    def _parse_csv(self, text: str, *, delimiter: str) -> list[_Row]:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        try:
            header = [column.strip() for column in next(reader, [])]
            path_at = _pick(header, PATH_COLUMNS)
            if path_at is None:
                raise SourceError(
                    f"{self._location}: no path column; expected one of {list(PATH_COLUMNS)}, "
                    f"found columns {header}"
                )
            label_at = _pick(header, LABEL_COLUMNS)
            rows: list[_Row] = []
            for cells in reader:
                if not any(cell.strip() for cell in cells):
                    continue
                path = cells[path_at].strip() if path_at < len(cells) else ""
                label = (
                    cells[label_at].strip()
                    if label_at is not None and label_at < len(cells)
                    else ""
                )
                if not path:
                    raise SourceError(f"{self._location}: line {reader.line_num}: empty path")
                rows.append(_Row(reader.line_num, path, label or None))
        except csv.Error as exc:
            raise SourceError(f"{self._location}: line {reader.line_num}: bad CSV: {exc}") from exc
        return rows

    def _parse_jsonl(self, text: str) -> list[_Row]:
        rows: list[_Row] = []
        for line, content in enumerate(text.splitlines(), start=1):
            if not content.strip():
                continue
            try:
                record = json.loads(content)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{self._location}: line {line}: bad JSON: {exc}") from exc
            if not isinstance(record, dict):
                raise SourceError(f"{self._location}: line {line}: expected a JSON object")
            keys = list(record)
            path_at = _pick(keys, PATH_COLUMNS)
            if path_at is None:
                raise SourceError(
                    f"{self._location}: line {line}: no path key; expected one of "
                    f"{list(PATH_COLUMNS)}, found keys {keys}"
                )
            path = record[keys[path_at]]
            if not isinstance(path, str) or not path.strip():
                raise SourceError(f"{self._location}: line {line}: path is not a string")
            label_at = _pick(keys, LABEL_COLUMNS)
            label = record[keys[label_at]] if label_at is not None else None
            if label is not None and (isinstance(label, bool) or not isinstance(label, int | str)):
                raise SourceError(
                    f"{self._location}: line {line}: unparseable label {label!r}; "
                    "expected an integer or a class name"
                )
            rows.append(
                _Row(line, path.strip(), label.strip() if isinstance(label, str) else label)
            )
        return rows

    def _labels(self, rows: list[_Row]) -> list[int]:
        """Label per row; also settles the class names found in the list."""
        parsed: list[int | str] = []
        for row in rows:
            value = row.label
            if isinstance(value, str) and _INTEGER.fullmatch(value):
                value = int(value)
            elif isinstance(value, str) and _NUMBER.fullmatch(value):
                raise SourceError(
                    f"{self._location}: line {row.line}: unparseable label {value!r}; "
                    "expected an integer or a class name"
                )
            if isinstance(value, int) and value < -1:
                raise SourceError(
                    f"{self._location}: line {row.line}: label {value} is negative "
                    "(-1 means no label)"
                )
            parsed.append(-1 if value is None or value == "" else value)
        names = sorted({value for value in parsed if isinstance(value, str)})
        if names and any(isinstance(value, int) and value >= 0 for value in parsed):
            raise SourceError(
                f"{self._location}: labels mix integers and class names ({names[0]!r}); "
                "use one or the other"
            )
        self._found_names = tuple(names)
        known = self._given_names if self._given_names is not None else tuple(names)
        index = {name: i for i, name in enumerate(known)}
        labels: list[int] = []
        for row, value in zip(rows, parsed, strict=True):
            if isinstance(value, str):
                if value not in index:
                    raise SourceError(
                        f"{self._location}: line {row.line}: unknown class {value!r}; "
                        f"class_names are {list(known)[:10]}"
                    )
                value = index[value]
            elif self._given_names is not None and value >= len(self._given_names):
                raise SourceError(
                    f"{self._location}: line {row.line}: label {value} is out of range for "
                    f"{len(self._given_names)} class names"
                )
            labels.append(value)
        return labels

    def _resolve(self, row: _Row) -> str:
        path = row.path
        if "://" in path or path.startswith("/"):
            return path
        if is_remote(self._location):
            scheme, _, rest = self._location.partition("://")
            bucket, _, key = rest.partition("/")
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(key), path))
            if joined == ".." or joined.startswith("../"):
                raise SourceError(
                    f"{self._location}: line {row.line}: {path!r} points outside the bucket"
                )
            return f"{scheme}://{bucket}/{joined}"
        base = Path(self._location.removeprefix("file://")).absolute().parent
        return str(base / path)

    def _relative(self, location: str) -> str:
        """``location``'s path under the list's folder (as given, links not followed), or
        for one outside it, its whole path without the scheme and leading ``/``."""
        if is_remote(location):
            folder = self._folder() if is_remote(self._location) else None
            if folder is not None and location.startswith(f"{folder}/"):
                return posixpath.normpath(location[len(folder) + 1 :])
            return posixpath.normpath(location.partition("://")[2]).lstrip("/")
        path = posixpath.normpath(Path(location.removeprefix("file://")).absolute().as_posix())
        folder = Path(self._location.removeprefix("file://")).absolute().parent.as_posix()
        folder = posixpath.normpath(folder)
        if path.startswith(f"{folder.rstrip('/')}/"):
            return path[len(folder.rstrip("/")) + 1 :]
        return path.lstrip("/")

    def _folder(self) -> str:
        if is_remote(self._location):
            return self._location.rsplit("/", 1)[0]
        return str(Path(self._location.removeprefix("file://")).resolve().parent)

    def _inside(self, location: str) -> bool:
        """Whether ``location`` lies in the list's folder (symbolic links followed)."""
        folder = self._folder()
        if is_remote(self._location):
            return location.startswith(f"{folder}/") and "/../" not in location
        if is_remote(location):
            return False
        target = Path(location.removeprefix("file://")).resolve()
        return target.is_relative_to(folder)


def _pick(columns: Sequence[str], wanted: Sequence[str]) -> int | None:
    lowered = [column.strip().lower() for column in columns]
    for name in wanted:
        if name in lowered:
            return lowered.index(name)
    return None
