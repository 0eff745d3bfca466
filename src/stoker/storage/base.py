"""The Store protocol: the one interface every storage backend implements.

A store is rooted at a location (a bucket and prefix, a local directory, an in-memory
namespace); paths given to its methods are keys relative to that root, with ``/`` as the
separator. Reads return ``memoryview`` objects over the received bytes (no copy); compare them
with ``bytes`` directly or call ``bytes(view)``.

Every operation comes in a blocking form and an ``_async`` form. The blocking form is for
ordinary callers; the async form runs on the store's I/O engine (:attr:`Store.engine`) and
lets transfer and loader code keep hundreds of requests in flight from one thread. Backends
write the async forms and inherit the blocking ones from
:class:`~stoker.storage.blocking.BlockingForms`.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from stoker.core.metrics import Counters
from stoker.storage.cache import DiskCache
from stoker.storage.engine import IOEngine
from stoker.storage.options import StorageOptions
from stoker.storage.url import key_problem as key_problem  # its home before url.py used it

#: What ``put`` accepts: bytes-like data, or the path of a local file to upload.
PutData = bytes | bytearray | memoryview | Path


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a listing or a HEAD request says about one object.

    Attributes:
        key: Key relative to the store's root.
        size: Size in bytes.
        etag: The entity tag with its quotes removed, or None if the store has none.
        last_modified: Modification time (timezone-aware), if the store reports one.
    """

    key: str
    size: int
    etag: str | None = None
    last_modified: datetime | None = None


@dataclass(frozen=True, slots=True)
class Listing:
    """One level of a hierarchical listing: sub-prefixes and the objects directly under it."""

    prefixes: builtins.list[str]
    objects: builtins.list[ObjectMeta]


@runtime_checkable
class Store(Protocol):
    """An object store rooted at a bucket/prefix (or directory, or memory namespace)."""

    @property
    def url(self) -> str:
        """The URL of the store's root, without credentials."""
        ...

    @property
    def counters(self) -> Counters:
        """Request, byte, retry and error counters of this store."""
        ...

    @property
    def engine(self) -> IOEngine:
        """The I/O engine this store's async methods run on (and only on)."""
        ...

    @property
    def cache(self) -> DiskCache | None:
        """The disk cache this store reads through, or None."""
        ...

    @property
    def options(self) -> StorageOptions:
        """The options the store was opened with (the defaults where it takes none)."""
        ...

    def get(self, path: str) -> memoryview:
        """Return the whole object at ``path``.

        Raises:
            FileNotFoundError: The object (or its bucket) does not exist.
        """
        ...

    def get_range(self, path: str, *, start: int, end: int) -> memoryview:
        """Return bytes ``[start, end)`` of the object; ``end`` past the object is an error."""
        ...

    def get_ranges(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        """Return several ranges of one object; nearby ranges may share one request."""
        ...

    def get_parts(
        self, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> builtins.list[memoryview]:
        """Return the bytes of each ``(part_start, part_end)`` of ``[start, end)``.

        The range is what one request would read (parts with gaps between them, coalesced
        into one ranged GET by the caller); the parts are what the caller needs of it. A
        store reading from the network fetches the range in one request and cuts the parts
        out of it (:func:`get_parts_by_range`); a store reading through a disk cache reads
        only the parts from the pages it has (see
        :class:`~stoker.storage.cached.CachedStore`), so bytes between parts, such as
        another loader worker's samples, are never read from the cache.

        Raises:
            ValueError: A part is empty or not inside ``[start, end)``.
        """
        ...

    def head(self, path: str) -> ObjectMeta:
        """Return the object's metadata without its bytes."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Yield every object under the path segment(s) ``prefix``, recursively.

        S3 and memory stores yield keys in lexicographic order; a local directory yields
        them in filesystem order.
        """
        ...

    def list_dir(self, prefix: str = "") -> Listing:
        """Return the sub-prefixes and objects directly under ``prefix``."""
        ...

    def put(self, path: str, data: PutData) -> ObjectMeta:
        """Write an object atomically (multipart for large data) and return its metadata."""
        ...

    def delete(self, path: str) -> None:
        """Delete the object; deleting a missing object is not an error."""
        ...

    async def get_async(self, path: str) -> memoryview:
        """Async form of :meth:`get`."""
        ...

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        """Async form of :meth:`get_range`."""
        ...

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        """Async form of :meth:`get_ranges`."""
        ...

    async def get_parts_async(
        self, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> builtins.list[memoryview]:
        """Async form of :meth:`get_parts`."""
        ...

    async def head_async(self, path: str) -> ObjectMeta:
        """Async form of :meth:`head`."""
        ...

    def list_async(self, prefix: str = "") -> AsyncIterator[builtins.list[ObjectMeta]]:
        """Async form of :meth:`list`, yielding pages of objects."""
        ...

    async def list_dir_async(self, prefix: str = "") -> Listing:
        """Async form of :meth:`list_dir`."""
        ...

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        """Async form of :meth:`put`."""
        ...

    async def delete_async(self, path: str) -> None:
        """Async form of :meth:`delete`."""
        ...


def check_ranges(path: str, starts: Sequence[int], ends: Sequence[int]) -> None:
    """Raise ValueError unless ``starts`` and ``ends`` pair up."""
    if len(starts) != len(ends):
        raise ValueError(f"{path}: {len(starts)} starts but {len(ends)} ends")


def check_parts(path: str, start: int, end: int, parts: Sequence[tuple[int, int]]) -> None:
    """Raise ValueError unless ``[start, end)`` is a range and every part a range in it."""
    check_range(path, start, end)
    for part_start, part_end in parts:
        if not start <= part_start < part_end <= end:
            raise ValueError(
                f"{path}: bad part [{part_start}, {part_end}) of [{start}, {end}); need "
                "start <= part_start < part_end <= end"
            )


async def get_parts_by_range(
    store: Store, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
) -> builtins.list[memoryview]:
    """:meth:`Store.get_parts_async` as one ranged read of ``[start, end)``, cut into the
    parts (views, no copies): what a store with no cache does."""
    check_parts(path, start, end, parts)
    if not parts:
        return []
    data = memoryview(await store.get_range_async(path, start=start, end=end))
    return [data[s - start : e - start] for s, e in parts]


def check_range(path: str, start: int, end: int) -> None:
    """Raise ValueError unless ``0 <= start < end``."""
    if start < 0 or end <= start:
        raise ValueError(f"{path}: bad byte range [{start}, {end}); need 0 <= start < end")
