"""Reads that bring the object's whole size with its bytes: a size check with no HEAD.

A ranged GET's answer says how large the whole object is (S3's ``Content-Range: bytes
a-b/SIZE``; obstore gives it as ``GetResult.meta["size"]``, for a local file too), so a
reader that must know an object's size (a dataset's shard, checked against its index) can
take it from its first read instead of a HEAD request beside it.

A store that can do this has ``get_parts_sized_async`` (the parts of
:meth:`~stoker.storage.base.Store.get_parts_async` and the size);
:func:`get_parts_sized` asks it, and gives ``None`` for the size from any other store (a
store in memory, a wrapper that does not pass it on), whose caller checks the size as
before.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from stoker.errors import StorageError
from stoker.storage.base import Store


class SizeChangedError(StorageError):
    """A read found an object of another size than the one its reader was given (the
    disk cache's, from a dataset's index): nothing of it was cached.

    Attributes:
        path: The object's key.
        expected: The size given.
        actual: The size the read found.
    """

    def __init__(self, where: str, path: str, *, expected: int, actual: int) -> None:
        super().__init__(f"{where}: object is {actual} bytes, expected {expected}")
        self.path = path
        self.expected = expected
        self.actual = actual


async def get_parts_sized(
    store: Store, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
) -> tuple[builtins.list[memoryview], int | None]:
    """``store.get_parts_async(...)`` and the object's whole size as that read found it,
    or None where the store cannot tell without another request.

    Raises:
        SizeChangedError: The store was given the object's size and found another.
    """
    sized = getattr(store, "get_parts_sized_async", None)
    if sized is None:
        return await store.get_parts_async(path, start=start, end=end, parts=parts), None
    got: tuple[builtins.list[memoryview], int | None] = await sized(
        path, start=start, end=end, parts=parts
    )
    return got


async def get_range_sized(
    store: Store, path: str, *, start: int, end: int
) -> tuple[memoryview, int | None]:
    """Bytes ``[start, end)`` of the object and its whole size (see :func:`get_parts_sized`)."""
    parts, size = await get_parts_sized(store, path, start=start, end=end, parts=[(start, end)])
    return parts[0], size
