"""CachedStore: any Store's ranged reads served through a node-shared DiskCache.

Objects are cut into pages at fixed offsets; entries are keyed by the object's version (a
content hash the caller knows, such as a shard's SHA-256 from the index, or else the ETag
and size from one HEAD), so a rewritten object never hits stale bytes.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping, Sequence

from stoker.core.perprocess import ForkSafeLock
from stoker.storage.base import ObjectMeta, PutData, Store, check_range, check_ranges
from stoker.storage.blocking import BlockingForms
from stoker.storage.cache import DiskCache
from stoker.storage.wrapper import StoreWrapper

#: A page's bytes: from the disk cache, or a view into the ranged read that fetched it.
Page = bytes | memoryview


class CachedStore(StoreWrapper, BlockingForms):
    """A Store whose ranged reads go through a :class:`DiskCache`, in aligned pages.

    An object is cut into pages of ``page_bytes`` at fixed offsets; a ranged read takes the
    pages it touches from the cache and fetches the missing ones (adjacent missing pages in
    one ranged GET), so the cache works whatever ranges the caller asks for. Concurrent
    reads of one missing page in this process share one request.

    Everything else (whole-object reads, listings, writes) goes straight to the wrapped
    store. The store's counters count only real requests; hits and misses are counted in
    the cache's own counters.

    Args:
        store: The store to read through.
        cache: The disk cache (possibly shared with other stores and processes).
        page_bytes: Size of a cached page.
        objects: ``(version, size)`` per key for objects the caller knows (for example
            shard SHA-256s and sizes from a dataset index). Other objects are versioned by
            their ETag and size, from one HEAD per object and process.
    """

    def __init__(
        self,
        store: Store,
        cache: DiskCache,
        *,
        page_bytes: int = 1 << 20,
        objects: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        if page_bytes < 1:
            raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
        self.inner = store
        self.cache = cache
        self.page_bytes = page_bytes
        self._objects: dict[str, tuple[str, int]] = dict(objects or {})
        self._lock = ForkSafeLock()
        self._in_flight: dict[str, asyncio.Future[Page]] = {}

    def __repr__(self) -> str:
        return f"CachedStore({self.inner!r}, {self.cache!r}, page_bytes={self.page_bytes})"

    def _known(self, path: str) -> tuple[str, int] | None:
        with self._lock:
            return self._objects.get(path)

    def _remember(self, path: str, meta: ObjectMeta) -> tuple[str, int]:
        found = (f"etag:{meta.etag}", meta.size)
        with self._lock:
            self._objects[path] = found
        return found

    def _forget(self, path: str) -> None:
        with self._lock:
            self._objects.pop(path, None)

    def _pages(self, path: str, start: int, end: int, size: int) -> range:
        check_range(path, start, end)
        if end > size:
            raise ValueError(
                f"{self.url}/{path}: range [{start}, {end}) ends past the object ({size} bytes)"
            )
        return range(start // self.page_bytes, (end - 1) // self.page_bytes + 1)

    def _page_key(self, path: str, version: str, page: int) -> str:
        return f"{self.inner.url}\0{path}\0{version}\0{self.page_bytes}\0{page}"

    def _assemble(self, pages: dict[int, Page], start: int, end: int) -> memoryview:
        first = min(pages) * self.page_bytes
        if len(pages) == 1:  # the usual case for small reads: no join, no copy
            return memoryview(pages[first // self.page_bytes])[start - first : end - first]
        joined = b"".join(pages[p] for p in sorted(pages))
        return memoryview(joined)[start - first : end - first]

    def _missing_runs(self, missing: list[int], size: int) -> list[tuple[int, int, list[int]]]:
        """Adjacent missing pages as (start, end, pages) of one ranged read each."""
        groups: list[list[int]] = []
        for page in missing:
            if groups and groups[-1][-1] == page - 1:
                groups[-1].append(page)
            else:
                groups.append([page])
        return [
            (g[0] * self.page_bytes, min((g[-1] + 1) * self.page_bytes, size), g) for g in groups
        ]

    def _split(self, data: memoryview, pages: list[int], run_start: int) -> dict[int, Page]:
        """The run's bytes cut into pages (views, not copies)."""
        view = memoryview(data)
        return {
            page: view[page * self.page_bytes - run_start :][: self.page_bytes] for page in pages
        }

    # -- cached reads ----------------------------------------------------------------------

    async def _version(self, path: str) -> tuple[str, int]:
        return self._known(path) or self._remember(path, await self.inner.head_async(path))

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        version, size = await self._version(path)
        keys = {
            page: self._page_key(path, version, page)
            for page in self._pages(path, start, end, size)
        }
        # Claim the pages no other read of this process is already getting; wait for the rest.
        owned: list[int] = []
        waits: dict[int, asyncio.Future[Page]] = {}
        loop = asyncio.get_running_loop()
        with self._lock:
            for page, key in keys.items():
                pending = self._in_flight.get(key)
                if pending is None:
                    self._in_flight[key] = loop.create_future()
                    owned.append(page)
                else:
                    waits[page] = pending
        pages: dict[int, Page] = {}
        try:
            hits = await asyncio.to_thread(self._get_all, [keys[p] for p in owned])
            missing = []
            for page, hit in zip(owned, hits, strict=True):
                if hit is None:
                    missing.append(page)
                else:
                    pages[page] = hit
                    self._settle(keys[page], hit, None)
            for run_start, run_end, run in self._missing_runs(missing, size):
                data = await self.inner.get_range_async(path, start=run_start, end=run_end)
                fetched = self._split(data, run, run_start)
                await asyncio.to_thread(self._put_all, path, version, fetched)
                for page, payload in fetched.items():
                    pages[page] = payload
                    self._settle(keys[page], payload, None)
        except BaseException as exc:
            for page in owned:
                self._settle(keys[page], None, exc)
            raise
        for page, pending in waits.items():
            pages[page] = await pending
        return self._assemble(pages, start, end)

    def _get_all(self, keys: list[str]) -> list[Page | None]:
        return [self.cache.get(key) for key in keys]

    def _put_all(self, path: str, version: str, fetched: dict[int, Page]) -> None:
        for page, payload in fetched.items():
            self.cache.put(self._page_key(path, version, page), payload)

    def _settle(self, key: str, payload: Page | None, error: BaseException | None) -> None:
        with self._lock:
            future = self._in_flight.pop(key, None)
        if future is None or future.done():
            return
        if payload is not None:
            future.set_result(payload)
        elif error is not None:
            future.set_exception(error)
            future.exception()  # marked retrieved: the waiter (if any) re-raises it

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        check_ranges(path, starts, ends)
        if starts:
            await self._version(path)  # one HEAD for all the ranges, not one each
        return list(
            await asyncio.gather(
                *(
                    self.get_range_async(path, start=s, end=e)
                    for s, e in zip(starts, ends, strict=True)
                )
            )
        )

    # -- writes forget what the cache knew of the object ---------------------------------------

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        self._forget(path)
        return await super().put_async(path, data)

    async def delete_async(self, path: str) -> None:
        self._forget(path)
        await super().delete_async(path)


def cache_reads(
    store: Store,
    cache: DiskCache,
    *,
    page_bytes: int = 1 << 20,
    objects: Mapping[str, tuple[str, int]] | None = None,
) -> CachedStore:
    """Return ``store`` with its ranged reads served through ``cache``.

    A store that already reads through a cache is re-wrapped around the store it wraps, so
    that no read is cached twice. Arguments are those of :class:`CachedStore`.
    """
    inner = store.inner if isinstance(store, CachedStore) else store
    return CachedStore(inner, cache, page_bytes=page_bytes, objects=objects)
