"""StoreWrapper: the pass-through half of a store that wraps another.

A wrapper (the disk cache's :class:`~stoker.storage.cached.CachedStore`, a folder
listing's checks) changes a few of a store's methods; everything else goes straight to the
store it wraps. This base holds that "everything else" once; :func:`store_endpoint` finds
the endpoint beneath any wrappers.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence

from stoker.core.metrics import Counters
from stoker.storage.base import Listing, ObjectMeta, PutData, Store
from stoker.storage.engine import IOEngine
from stoker.storage.options import StorageOptions


class StoreWrapper:
    """Passes every request of the :class:`~stoker.storage.base.Store` protocol to
    ``self.inner``, which the subclass sets; it overrides what it changes. Used beside
    :class:`~stoker.storage.blocking.BlockingForms`, which derives the blocking forms."""

    inner: Store

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def counters(self) -> Counters:
        return self.inner.counters

    @property
    def engine(self) -> IOEngine:
        return self.inner.engine

    @property
    def options(self) -> StorageOptions:
        return self.inner.options

    async def get_async(self, path: str) -> memoryview:
        return await self.inner.get_async(path)

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        return await self.inner.get_range_async(path, start=start, end=end)

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        return await self.inner.get_ranges_async(path, starts=starts, ends=ends)

    # No get_parts_async here: BlockingForms' default reads through the wrapper's own
    # get_range_async, so the checks of a wrapper that overrides it apply to parts too.

    async def head_async(self, path: str) -> ObjectMeta:
        return await self.inner.head_async(path)

    def list_async(self, prefix: str = "") -> AsyncIterator[builtins.list[ObjectMeta]]:
        return self.inner.list_async(prefix)

    async def list_dir_async(self, prefix: str = "") -> Listing:
        return await self.inner.list_dir_async(prefix)

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        return await self.inner.put_async(path, data)

    async def delete_async(self, path: str) -> None:
        await self.inner.delete_async(path)


def store_endpoint(store: Store) -> str:
    """The endpoint ``store`` reads from (through any wrappers), for cache keys: one bucket
    and prefix at two endpoints (a test server and production) are two stores, and an ETag
    names a version at its own endpoint only. As resolved from the options,
    ``AWS_ENDPOINT_URL`` or a profile, any password shown as ``***``; else the options'
    ``endpoint_url`` or ``""`` (a store in memory)."""
    seen = 0
    while (inner := getattr(store, "inner", None)) is not None and seen < 16:
        store, seen = inner, seen + 1
    endpoint = getattr(store, "endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        return endpoint
    return store.options.endpoint_url or ""
