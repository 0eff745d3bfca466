"""BlockingForms: a store's blocking methods, derived from its async ones.

A backend writes each operation once, as its ``_async`` method, and inherits from
:class:`BlockingForms` the blocking form of each, which runs the async one on the store's I/O
engine (:attr:`~stoker.storage.base.Store.engine`) and waits for it. Both forms therefore
behave alike: the same checks, the same counters, the same de-duplication of concurrent reads.
It also gives the default ``get_parts_async`` (one ranged read, cut into the parts), which
a store that can read parts more cheaply overrides.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence

from stoker.storage.base import Listing, ObjectMeta, PutData, Store, get_parts_by_range


class BlockingForms:
    """Base class giving a store the blocking form of each of its async methods.

    The blocking forms must not be called from the store's engine thread (there, await the
    async form instead); :meth:`IOEngine.run <stoker.storage.engine.IOEngine.run>` refuses.
    """

    def get(self: Store, path: str) -> memoryview:
        return self.engine.run(self.get_async(path))

    def get_range(self: Store, path: str, *, start: int, end: int) -> memoryview:
        return self.engine.run(self.get_range_async(path, start=start, end=end))

    def get_ranges(
        self: Store, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        return self.engine.run(self.get_ranges_async(path, starts=starts, ends=ends))

    def get_parts(
        self: Store, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> builtins.list[memoryview]:
        return self.engine.run(self.get_parts_async(path, start=start, end=end, parts=parts))

    async def get_parts_async(
        self: Store, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> builtins.list[memoryview]:
        # The default: one ranged read through this store's own get_range_async (so a
        # wrapper's checks apply), cut into the parts. CachedStore reads parts of pages.
        return await get_parts_by_range(self, path, start=start, end=end, parts=parts)

    def head(self: Store, path: str) -> ObjectMeta:
        return self.engine.run(self.head_async(path))

    def list(self: Store, prefix: str = "") -> Iterator[ObjectMeta]:
        pages = self.list_async(prefix)

        async def next_page() -> builtins.list[ObjectMeta] | None:
            try:
                return await anext(pages)
            except StopAsyncIteration:
                return None

        # One engine round trip per page, fetched only as the caller iterates.
        while (page := self.engine.run(next_page())) is not None:
            yield from page

    def list_dir(self: Store, prefix: str = "") -> Listing:
        return self.engine.run(self.list_dir_async(prefix))

    def put(self: Store, path: str, data: PutData) -> ObjectMeta:
        return self.engine.run(self.put_async(path, data))

    def delete(self: Store, path: str) -> None:
        self.engine.run(self.delete_async(path))
