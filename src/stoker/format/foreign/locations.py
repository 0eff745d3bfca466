"""Read bytes from a location that is either a local path or an object URL.

Foreign readers name their inputs by location strings (``/data/train.tfrecord``,
``s3://bucket/train/00001.tar``). :class:`LocationReader` opens one store per bucket lazily
and reads whole objects or byte ranges; local files are read with plain file I/O. It holds
no open connections when pickled, so readers that carry one can be sent to other processes.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from stoker.core.metrics import merge_snapshots
from stoker.core.perprocess import ForkSafeLock
from stoker.errors import SourceError
from stoker.format.foreign.walk import hidden, say_left_out, walk_local
from stoker.storage import StorageOptions, Store, open_store, parse_url
from stoker.storage.base import ObjectMeta

logger = logging.getLogger(__name__)


def is_remote(location: str) -> bool:
    """Whether ``location`` is an object URL rather than a local path."""
    return "://" in location and not location.startswith("file://")


class LocationReader:
    """Reads local files and objects by location string.

    Args:
        storage_options: Options for every store it opens (see :func:`stoker.open_store`).
    """

    def __init__(self, storage_options: Mapping[str, Any] | StorageOptions | None = None) -> None:
        self._options = storage_options
        self._stores: dict[str, Store] = {}
        self._opening = ForkSafeLock()  # readers share one from several threads

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]  # no stores open yet

    def store_for(self, location: str) -> tuple[Store, str]:
        """The store of ``location``'s bucket and the key inside it."""
        url = parse_url(location)
        return self.store_at(f"{url.scheme}://{url.bucket}"), url.prefix

    def store_at(self, root: str) -> Store:
        """The store rooted at the bucket URL ``root`` (opened once, then kept: threads
        asking for it at once share one store, and so its counters)."""
        store = self._stores.get(root)
        if store is None:
            with self._opening:
                store = self._stores.get(root)
                if store is None:
                    store = open_store(root, storage_options=self._options)
                    self._stores = {**self._stores, root: store}  # readers see old or new
        return store

    def requests(self) -> dict[str, int]:
        """Request, byte, retry and error counters of the stores opened so far, summed
        (local files are read without a store and count nothing)."""
        return merge_snapshots(store.counters.snapshot() for store in self._stores.values())

    def read(self, location: str, start: int = 0, length: int = -1) -> bytes:
        """Bytes ``[start, start + length)`` of the location (all of it for length -1).

        Raises:
            SourceError: The file or object cannot be read; the message names it.
        """
        try:
            if not is_remote(location):
                path = Path(location.removeprefix("file://"))
                with open(path, "rb") as f:
                    if start:
                        f.seek(start)
                    data = f.read() if length < 0 else f.read(length)
                if length >= 0 and len(data) != length:
                    raise SourceError(
                        f"{location}: expected {length} bytes at offset {start}, "
                        f"file ends after {len(data)}"
                    )
                return data
            store, key = self.store_for(location)
            return read_object(store, key, start, length)
        except SourceError:
            raise
        except (OSError, ValueError) as exc:
            raise SourceError(f"{location}: cannot read: {exc}") from exc

    async def read_async(self, location: str, start: int = 0, length: int = -1) -> bytes:
        """Async form of :meth:`read` for object URLs (local paths are read inline)."""
        if not is_remote(location):
            return self.read(location, start, length)
        try:
            store, key = self.store_for(location)
        except ValueError as exc:
            raise SourceError(f"{location}: cannot read: {exc}") from exc
        return await read_object_async(store, key, start, length)

    def list(self, location: str, suffixes: tuple[str, ...] = ()) -> list[tuple[str, int]]:
        """Files or objects under ``location`` (recursively) as ``(location, size)``, sorted.

        Only names ending in one of ``suffixes`` are kept, if any are given; hidden names
        are left out (:mod:`stoker.format.foreign.walk`).
        """
        found: list[tuple[str, int]] = []
        left_out: list[str] = []
        if not is_remote(location):
            root = Path(location.removeprefix("file://"))
            if root.is_file():
                return [(str(root), root.stat().st_size)]
            for path, _ in walk_local(root, left_out):
                if not suffixes or path.name.lower().endswith(suffixes):
                    found.append((str(path), path.stat().st_size))
            say_left_out(logger, str(root), left_out)
            return sorted(found)
        url = parse_url(location)
        store = open_store(str(url), storage_options=self._options)
        metas: Iterator[ObjectMeta] = store.list("")
        for meta in metas:
            if hidden(meta.key):
                left_out.append(meta.key)
            elif not suffixes or meta.key.lower().endswith(suffixes):
                found.append((url.child(meta.key), meta.size))
        say_left_out(logger, location, left_out)
        if not found and url.prefix:
            # Perhaps the URL names one object rather than a prefix.
            store, key = self.store_for(location)
            try:
                return [(location, store.head(key).size)]
            except FileNotFoundError:
                return []
        return sorted(found)


def read_object(store: Store, key: str, start: int = 0, length: int = -1) -> bytes:
    """Bytes ``[start, start + length)`` of the object ``key`` of ``store``, the key
    used as it is (never through a URL).

    Raises:
        SourceError: The object cannot be read; the message names it.
    """
    try:
        if length < 0 and start == 0:
            return bytes(store.get(key))
        if length < 0:
            length = store.head(key).size - start
        if length == 0:
            return b""
        return bytes(store.get_range(key, start=start, end=start + length))
    except (OSError, ValueError) as exc:
        raise SourceError(f"{_object_url(store, key)}: cannot read: {exc}") from exc


async def read_object_async(store: Store, key: str, start: int = 0, length: int = -1) -> bytes:
    """Async form of :func:`read_object`."""
    try:
        if length < 0 and start == 0:
            return bytes(await store.get_async(key))
        if length < 0:
            length = (await store.head_async(key)).size - start
        if length == 0:
            return b""
        return bytes(await store.get_range_async(key, start=start, end=start + length))
    except (OSError, ValueError) as exc:
        raise SourceError(f"{_object_url(store, key)}: cannot read: {exc}") from exc


class ObjectFile(io.RawIOBase):
    """A read-only, seekable file over one object of ``store`` (for libraries that take
    a file, as pyarrow does): each read is one ranged GET of ``key``, used as it is.

    Args:
        store: The store holding the object.
        key: The object's key, as listed.
        size: The object's size in bytes.
    """

    def __init__(self, store: Store, key: str, size: int) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._size = size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._position + size)
        if end <= self._position:
            return b""
        data = read_object(self._store, self._key, self._position, end - self._position)
        self._position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


def _object_url(store: Store, key: str) -> str:
    shown = key if key.isprintable() else repr(key)  # a listed key may hold a control character
    return f"{store.url.rstrip('/')}/{shown}"
