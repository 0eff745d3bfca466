"""Each shard's size checked against the index once: from the size a ranged read gives
(:func:`~stoker.storage.sized.get_parts_sized`), else by one HEAD shared by the reads that
start before it answers. A shard of another size is refused as a whole from then on."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from stoker.errors import CorruptShardError, ShardFormatError
from stoker.format.index import DatasetIndex
from stoker.storage.base import Store
from stoker.storage.sized import SizeChangedError, get_parts_sized


class ShardSizes:
    """The size checks of one dataset's shards (by shard number)."""

    def __init__(self, store: Store, index: DatasetIndex) -> None:
        self._store = store
        self._index = index
        self._checked: set[int] = set()  # shard numbers whose size matched the index
        self._bad: dict[int, str] = {}  # shard number -> what is wrong with it
        # One HEAD per shard however many reads of it start before the first one answers.
        self._heads: dict[int, asyncio.Future[int]] = {}

    def error(self, number: int) -> CorruptShardError | None:
        """The error of shard ``number`` if its size was found wrong, else None."""
        return CorruptShardError(self._bad[number]) if number in self._bad else None

    def _raise_if_bad(self, number: int) -> None:
        error = self.error(number)
        if error is not None:
            raise error

    def _record(self, number: int, actual: int) -> None:
        entry = self._index.shards[number]
        if actual == entry.size:
            self._checked.add(number)
            return
        self._bad[number] = (
            f"{self._store.url}/{entry.name}: shard is {actual} bytes, but the index says "
            f"{entry.size} (a truncated or replaced shard, or an index from another dataset)"
        )
        self._raise_if_bad(number)

    async def read_parts_async(
        self, number: int, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        """See :meth:`~stoker.format.reader.ShardDataset.read_parts_async`."""
        self._raise_if_bad(number)
        name = self._index.shards[number].name
        try:
            got, size = await get_parts_sized(self._store, name, start=start, end=end, parts=parts)
        except SizeChangedError as exc:
            self._record(number, exc.actual)  # raises, unless the index agrees
            raise
        except ValueError as exc:
            # A range past the object's end: a shorter shard than the index's, most likely.
            if number not in self._checked and not isinstance(exc, ShardFormatError):
                await self._explain(number)
            raise
        if size is None:
            await self.check_async(number)
        else:
            self._record(number, size)
        return got

    async def _explain(self, number: int) -> None:
        """Raise the size error of shard ``number`` if a HEAD finds one (a truncated shard
        fails its reads); any other problem the failed read's own error says better."""
        try:
            await self.check_async(number)
        except CorruptShardError:
            raise
        except Exception:  # the caller re-raises the read's own error
            return

    async def check_async(self, number: int) -> None:
        """See :meth:`~stoker.format.reader.ShardDataset.check_size_async`."""
        self._raise_if_bad(number)
        if number not in self._checked:
            head = self._heads.get(number)
            if head is None or head.get_loop() is not asyncio.get_running_loop():
                # None yet, or one on a parent's loop (before a fork): its answer goes there.
                name = self._index.shards[number].name
                head = asyncio.ensure_future(self._shard_size(name))
                self._heads[number] = head
            try:
                size = await asyncio.shield(head)
            finally:
                if head.done():
                    self._heads.pop(number, None)
            self._record(number, size)

    async def _shard_size(self, name: str) -> int:
        return (await self._store.head_async(name)).size
