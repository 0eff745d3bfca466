"""The Parquet files of an input: listed once (a file, or a folder or bucket prefix of
them, under the one rule for hidden names), each opened once per process (its footer
read once) and kept, locally by pyarrow, in a bucket through ranged reads of the store
(never through a URL made from a listed key). Every Parquet reader opens files here."""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import SourceError
from stoker.format.foreign.columns import import_pyarrow
from stoker.format.foreign.locations import LocationReader, ObjectFile, is_remote
from stoker.format.foreign.parquet_footers import footer_metadata
from stoker.format.foreign.walk import glob_match, hidden, say_left_out, split_glob, walk_local
from stoker.storage import Store, open_store, parse_url
from stoker.storage.base import key_problem
from stoker.storage.cache import DiskCache
from stoker.storage.cache_once import fetch_once

logger = logging.getLogger(__name__)

PARQUET_SUFFIX = ".parquet"
# A split named in a Hugging Face file or folder name: train-00000-of-00002, test/0000.
_SPLIT = re.compile(r"(?:^|/)(train|test|validation|valid|val|dev)(?=[-_/.]|$)")


@dataclass(frozen=True, slots=True)
class RowGroup:
    """One row group of the table.

    Attributes:
        location: Its file.
        stem: The file's path under the folder, without ``.parquet``: its rows' key stem.
        group: Its number in the file.
        first_row: Its first row's number in the file.
        start: Its first row's number in the table.
        rows: Its rows.
        decoded_bytes: Its bytes decoded, as the footer records them.
    """

    location: str
    stem: str
    group: int
    first_row: int
    start: int
    rows: int
    decoded_bytes: int

    def key(self, row: int) -> str:
        """The key of row ``row`` of this row group (as a pack keys it)."""
        return f"{self.stem}_{self.first_row + row:08d}"


@dataclass(frozen=True, slots=True)
class ParquetTable:
    """A table's row groups in order, and each row's label (None: no label column)."""

    groups: list[RowGroup]
    labels: np.ndarray | None


class ParquetFiles:
    """The Parquet files at ``location``, listed and opened once.

    Args:
        location: A ``.parquet`` file or object, a folder or bucket prefix of them, or a
            pattern of them (``s3://b/data/train-*.parquet``, ``data/**/*.parquet``:
            :func:`~stoker.format.foreign.walk.glob_match`).
        locations: The reader of the stores objects are read through (its counters count
            the requests).
        cache: The node's disk cache: a bucket's listing and footers are read once for the
            node and kept there (:mod:`~stoker.format.foreign.parquet_footers`); None reads
            them once per process.
    """

    def __init__(
        self, location: str, locations: LocationReader, *, cache: DiskCache | None = None
    ) -> None:
        try:
            root, self._pattern = split_glob(location.rstrip("/"))
        except ValueError as exc:
            raise SourceError(str(exc)) from None
        self._given = location.rstrip("/")
        self._location = root.rstrip("/") or root
        self._locations = locations
        self._cache = cache
        #: location -> (store root URL, key, size) of each file in a bucket.
        self._objects: dict[str, tuple[str, str, int]] = {}
        self._etags: dict[str, str | None] = {}
        self._found: list[tuple[str, str]] | None = None  # (location, relative name)
        self._handles: dict[str, tuple[Any, threading.Lock]] = {}
        self._handles_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_handles")
        state.pop("_handles_lock")
        state["_cache"] = None  # another process reads the footers itself
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # open files stay behind
        self._handles = {}
        self._handles_lock = threading.Lock()

    @classmethod
    def of(
        cls, location: str, files: list[tuple[str, str, int]], locations: LocationReader
    ) -> ParquetFiles:
        """The Parquet files another listing found under ``location`` (each ``(location,
        path under it, size)``), kept as listed: none is listed again."""
        found = cls(location, locations)
        found._found = [(at, relative) for at, relative, _ in files]
        for at, relative, size in files:
            if is_remote(at):
                found._objects[at] = (at.removesuffix(relative).rstrip("/"), relative, size)
        return found

    @property
    def location(self) -> str:
        """The file, folder or prefix read (listed, for a pattern)."""
        return self._location

    def _wanted(self, relative: str) -> bool:
        """Whether a listed name is one of the files: a ``.parquet`` one matching the
        pattern, if any."""
        if not relative.lower().endswith(PARQUET_SUFFIX):
            return False
        return self._pattern is None or glob_match(relative, self._pattern)

    def store(self) -> Store:
        """The store the files are read through: a bucket's (its counters count every
        request), or one rooted at a local folder (local files are read by pyarrow)."""
        if is_remote(self._location):
            self.listed()
            root = next(iter(self._objects.values()))[0] if self._objects else self._location
            return self._locations.store_at(root)
        return open_store(self._location, storage_options=None)

    def listed(self) -> list[tuple[str, str]]:
        if self._found is None:
            if not is_remote(self._location):
                found = self._list_local()
            elif self._cache is None:
                found = self._list_remote()
            else:
                found = self._list_remote_once(self._cache)
            if not found:
                raise SourceError(f"{self._given}: no {PARQUET_SUFFIX} files found")
            _warn_of_splits(self._location, [name for _, name in found])
            self._found = found
        return self._found

    def size(self, location: str) -> int:
        if location in self._objects:
            return self._objects[location][2]
        return Path(location.removeprefix("file://")).stat().st_size

    def open(self, location: str) -> tuple[Any, threading.Lock]:
        with self._handles_lock:
            found = self._handles.get(location)
            if found is not None:
                return found
            pa = import_pyarrow()
            source: Any = location.removeprefix("file://")
            metadata = None
            if location in self._objects:
                root, key, size = self._objects[location]
                store = self._locations.store_at(root)
                source = ObjectFile(store, key, size)
                if self._cache is not None:
                    etag = self._etags.get(location)
                    where, cache = location, self._cache
                    metadata = footer_metadata(
                        store, key, size, where=where, etag=etag, cache=cache
                    )
            try:
                parquet = pa.parquet.ParquetFile(source, metadata=metadata)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise SourceError(f"{location}: cannot read as Parquet: {exc}") from exc
            found = self._handles[location] = (parquet, threading.Lock())
            return found

    def _list_remote_once(self, cache: DiskCache) -> list[tuple[str, str]]:
        """A bucket's listing, made by one process of the node and kept in ``cache``."""

        def listing() -> bytes:
            found = self._list_remote()
            rows = [[at, name, *self._objects[at], self._etags.get(at)] for at, name in found]
            return json.dumps(rows).encode()

        rows = json.loads(fetch_once(cache, f"parquet-listing\0{self._given}", listing))
        for at, _, root, key, size, etag in rows:
            self._objects[at] = (root, key, int(size))
            self._etags[at] = etag
        return [(at, name) for at, name, *_ in rows]

    def _list_local(self) -> list[tuple[str, str]]:
        root = Path(self._location.removeprefix("file://"))
        if root.is_file() and self._pattern is None:
            return [(str(root), root.name)]
        if not root.is_dir():
            raise SourceError(f"{root}: no such file or directory")
        left_out: list[str] = []
        found = [
            (str(path), relative)
            for path, relative in walk_local(root, left_out)
            if self._wanted(relative)
        ]
        say_left_out(logger, str(root), left_out)
        return sorted(found, key=lambda item: item[1])

    def _list_remote(self) -> list[tuple[str, str]]:
        if self._pattern is None and self._location.lower().endswith(PARQUET_SUFFIX):
            store, key = self._locations.store_for(self._location)
            try:
                size = store.head(key).size
            except FileNotFoundError:
                pass  # a folder named like a file, as Spark writes them
            else:
                url = parse_url(self._location)
                root = f"{url.scheme}://{url.bucket}"
                self._objects[self._location] = (root, key, size)
                return [(self._location, key.rsplit("/", 1)[-1])]
        store = self._locations.store_at(self._location)
        found: list[tuple[str, str]] = []
        left_out: list[str] = []
        for meta in store.list(""):  # keys relative to the folder, as listed
            if hidden(meta.key):
                left_out.append(meta.key)
                continue
            if not self._wanted(meta.key):
                continue
            problem = key_problem(meta.key)
            if problem is not None:
                raise SourceError(
                    f"{self._location}: unusable key {meta.key!r} ({problem}): no request "
                    "can name it"
                )
            location = f"{self._location}/{meta.key}"
            self._objects[location] = (self._location, meta.key, meta.size)
            self._etags[location] = meta.etag
            found.append((location, meta.key))
        say_left_out(logger, self._location, left_out)
        return sorted(found, key=lambda item: item[1])


def _warn_of_splits(location: str, names: list[str]) -> None:
    splits = sorted({m.group(1) for name in names if (m := _SPLIT.search(name.lower()))})
    if len(splits) > 1:
        logger.warning(
            "%s holds the splits %s: they are read together into one dataset (each key "
            "names its file); give one split's file or folder to pack it alone",
            location,
            ", ".join(splits),
        )
