"""An image folder's listing: kept in the disk cache, and the reads it describes checked
against it.

A listing kept in the disk cache goes stale when an object of the folder is rewritten. A
ranged read of the listed size then returns the first bytes of an object that grew (a sound
image reported as a truncated JPEG) or fails past the end of one that shrank.
:class:`ListedStore` sits under the disk cache and reads a listed object whole, with one
plain GET, and compares its length with the listing's: an object of another size is a
:class:`~stoker.errors.SourceError` naming it, which the Loader's ``on_error="skip"``
skips and counts like any bad sample. A rewrite that keeps the size is not seen (telling it
would take a HEAD per object for its ETag); its new bytes are read.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence

from stoker.errors import SourceError
from stoker.storage.base import Store
from stoker.storage.blocking import BlockingForms
from stoker.storage.cache import DiskCache
from stoker.storage.wrapper import StoreWrapper, store_endpoint

_LISTING_VERSION = 3  # 2: keys no request can name are left out (issue 22.10); 3: hidden ones

#: keys, sizes, labels, ETags and class names of a folder, keys sorted.
FolderListing = tuple[list[str], list[int], list[int], list[str | None], list[str]]


def changed_object_error(
    url: str, key: str, *, listed: int, found: int, cached: bool = True
) -> SourceError:
    """The error for an object whose size is not the one its folder's listing gave
    (``cached``: a listing kept in the disk cache, which the message says how to empty)."""
    where = f"{url.rstrip('/')}/{key}: changed since the folder was listed"
    if not cached:
        return SourceError(
            f"{where} (listed {listed} bytes, now {found}): it was rewritten while being read"
        )
    return SourceError(
        f"{where} (listed {listed} bytes, now {found}): the listing kept in the disk cache "
        "is stale; empty it with `stoker cache clear DIR` and the next run lists the folder "
        "afresh"
    )


class ListedStore(StoreWrapper, BlockingForms):
    """A store whose reads of listed objects are checked against the listed sizes.

    A ranged read of a whole listed object (``[0, size)``, what the disk cache asks for
    when none of its pages is cached) is one plain GET of the object, whose length must be
    the listed size; a shorter range of an object that no longer reaches its end is the
    same error. Everything else goes straight to the wrapped store.

    Args:
        store: The store rooted at the folder.
        sizes: The listed size of each object, by key.
    """

    def __init__(self, store: Store, sizes: Mapping[str, int]) -> None:
        self.inner = store
        self._sizes = dict(sizes)

    @property
    def cache(self) -> DiskCache | None:
        return self.inner.cache

    def __repr__(self) -> str:
        return f"ListedStore({self.inner!r}, objects={len(self._sizes)})"

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        listed = self._sizes.get(path)
        if listed is None:
            return await self.inner.get_range_async(path, start=start, end=end)
        if (start, end) == (0, listed):
            data = await self.inner.get_async(path)
            if len(data) != listed:
                raise changed_object_error(self.url, path, listed=listed, found=len(data))
            return data
        try:
            return await self.inner.get_range_async(path, start=start, end=end)
        except ValueError as exc:
            if end > listed:  # the caller's range, not the listing, is wrong
                raise
            size = (await self.inner.head_async(path)).size
            if size == listed:
                raise
            raise changed_object_error(self.url, path, listed=listed, found=size) from exc

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        return list(
            await asyncio.gather(
                *(
                    self.get_range_async(path, start=s, end=e)
                    for s, e in zip(starts, ends, strict=True)
                )
            )
        )


def listing_key(store: Store) -> str:
    """The disk-cache key of the listing of the folder ``store`` is rooted at: its
    endpoint as resolved (:func:`~stoker.storage.wrapper.store_endpoint`), bucket and
    prefix, so that a folder of one name at another endpoint is listed afresh."""
    endpoint = store_endpoint(store)
    digest = hashlib.sha256(f"{endpoint}\n{store.url}".encode()).hexdigest()
    return f"folder-listing/v{_LISTING_VERSION}/{digest}"


def dump_listing(listing: FolderListing) -> bytes:
    """The listing as a disk-cache entry (compressed JSON)."""
    keys, sizes, labels, etags, class_names = listing
    body = {
        "keys": keys,
        "sizes": sizes,
        "labels": labels,
        "etags": etags,
        "class_names": class_names,
    }
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 6)


def load_listing(data: bytes | None) -> FolderListing | None:
    """The listing of a disk-cache entry, or None for none or one of another version."""
    if data is None:
        return None
    try:  # the entry passed its CRC-32: anything odd here is from another version
        body = json.loads(zlib.decompress(data))
        return (
            list(body["keys"]),
            [int(s) for s in body["sizes"]],
            [int(label) for label in body["labels"]],
            list(body["etags"]),
            list(body["class_names"]),
        )
    except (ValueError, KeyError, TypeError, zlib.error):
        return None
