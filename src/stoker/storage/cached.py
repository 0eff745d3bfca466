"""CachedStore: any Store's ranged reads served through a node-shared DiskCache.

Objects are cut into pages at fixed offsets; entries are keyed by the object's version (a
content hash the caller knows, such as a shard's SHA-256 from the index, or else the ETag
and size from one HEAD), so a rewritten object never hits stale bytes.

A read of parts (:meth:`CachedStore.get_parts_async`, what a dataset's reader asks for: the
samples of one coalesced request) reads only those parts' bytes from cached pages, so
loader workers that share pages each read only their own samples. A page missed by several
processes of the node at once is fetched by one of them, which claims it in the cache's
directory; the others wait for it there. :meth:`CachedStore.get_whole` reads a whole object
so (a dataset's index, once per node: :func:`~stoker.format.index.read_index`).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
from collections.abc import Mapping, Sequence

from stoker.core.perprocess import ForkSafeLock
from stoker.storage.base import (
    ObjectMeta,
    PutData,
    Store,
    check_parts,
    check_range,
    check_ranges,
)
from stoker.storage.blocking import BlockingForms
from stoker.storage.cache import DiskCache
from stoker.storage.cache_claims import CLAIM_WAIT_S, Claim
from stoker.storage.cache_fetch import NodeFetch
from stoker.storage.cache_inflight import PagesInFlight
from stoker.storage.cache_pages import (
    Page,
    PageBytes,
    Spans,
    assemble,
    cut,
    merge_spans,
    page_runs,
    split_pages,
)
from stoker.storage.sized import SizeChangedError, get_range_sized
from stoker.storage.wrapper import StoreWrapper, store_endpoint

logger = logging.getLogger(__name__)

_UNBOUNDED = 1 << 62


class CachedStore(StoreWrapper, BlockingForms):
    """A Store whose ranged reads go through a :class:`DiskCache`, in aligned pages.

    An object is cut into pages of ``page_bytes`` at fixed offsets; a ranged read takes the
    pages it touches from the cache and fetches the missing ones (adjacent missing pages in
    one ranged GET), so the cache works whatever ranges the caller asks for. A read of
    parts (:meth:`get_parts_async`) takes only the parts' bytes from cached pages.
    Concurrent reads of one missing page share one request: in this process by waiting for
    it, across the node's processes by a claim in the cache's directory (the others wait
    for the page in the cache, up to ``claim_wait_s``, then fetch it themselves).

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
        claim_wait_s: Longest wait for a page another process is fetching.
    """

    def __init__(
        self,
        store: Store,
        cache: DiskCache,
        *,
        page_bytes: int = 1 << 20,
        objects: Mapping[str, tuple[str, int]] | None = None,
        claim_wait_s: float = CLAIM_WAIT_S,
    ) -> None:
        if page_bytes < 1:
            raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
        if claim_wait_s < 0:
            raise ValueError(f"claim_wait_s must be >= 0, got {claim_wait_s}")
        self.claim_wait_s = claim_wait_s
        self.inner = store
        self.cache = cache
        self.page_bytes = page_bytes
        self._objects: dict[str, tuple[str, int]] = dict(objects or {})
        # Where the pages come from, the head of each page's key: made once, not per page.
        self._where = f"{store_endpoint(store)}\0{store.url}"
        self._lock = ForkSafeLock()
        self._in_flight = PagesInFlight()

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
        return f"{self._where}\0{path}\0{version}\0{self.page_bytes}\0{page}"

    # -- cached reads ----------------------------------------------------------------------

    async def _version(self, path: str) -> tuple[str, int]:
        return self._known(path) or self._remember(path, await self.inner.head_async(path))

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        version, size = await self._version(path)
        pages = self._pages(path, start, end, size)
        got = await self._read_pages(path, version, size, dict.fromkeys(pages))
        whole = {page: got[page].whole_page() for page in pages}
        return assemble(whole, start, end, self.page_bytes)

    async def get_parts_async(
        self, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> builtins.list[memoryview]:
        """Read only ``parts`` of ``[start, end)``: from the pages in the cache, just the
        parts' bytes (no page CRC-32: the caller checks what it reads, see
        :meth:`DiskCache.read_spans`); missing pages whole, as :meth:`get_range_async`
        does, and into the cache."""
        check_parts(path, start, end, parts)
        if not parts:
            return []
        version, size = await self._version(path)
        self._pages(path, start, end, size)  # the range must be inside the object
        spans: dict[int, Spans] = {}
        cuts = [cut(part_start, part_end, self.page_bytes, spans) for part_start, part_end in parts]
        got = await self._read_pages(
            path, version, size, {page: merge_spans(found) for page, found in spans.items()}
        )
        out = []
        for pieces in cuts:
            if len(pieces) == 1:
                page, a, b = pieces[0]
                out.append(memoryview(got[page].take(a, b)))
            else:
                out.append(memoryview(b"".join(got[page].take(a, b) for page, a, b in pieces)))
        return out

    async def get_parts_sized_async(
        self, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> tuple[builtins.list[memoryview], int | None]:
        """:meth:`get_parts_async` and the object's size, where the wrapped store reports
        the size of what it reads (:func:`~stoker.storage.sized.get_parts_sized`): every
        page fetched is then checked against the size the caller gave (or a HEAD found)
        and refused with :class:`~stoker.storage.sized.SizeChangedError` before it is
        cached, so a page in the cache came from an object of that size.

        Raises:
            SizeChangedError: A page fetched for this read came from an object of another
                size.
        """
        got = await self.get_parts_async(path, start=start, end=end, parts=parts)
        if not parts or getattr(self.inner, "get_parts_sized_async", None) is None:
            return got, None
        return got, (await self._version(path))[1]

    async def _read_pages(
        self, path: str, version: str, size: int, wanted: dict[int, Spans | None]
    ) -> dict[int, PageBytes]:
        """The pages of ``wanted``: each whole (None) or its spans. A page another read of
        this process is getting is waited for; the rest come from the cache, or else from
        the store (see :meth:`_fetch_missing`)."""
        keys = {page: self._page_key(path, version, page) for page in wanted}
        owned, waits = self._in_flight.take(keys)
        got: dict[int, PageBytes] = {}
        try:
            missing = await self._take_cached(keys, owned, wanted, size, got)
            if missing:
                got.update(await self._fetch_missing(path, size, keys, missing, wanted))
        except BaseException as exc:
            for page in owned:
                self._in_flight.settle(keys[page], None, exc)
            raise
        late: dict[int, Spans | None] = {}
        for page, pending_page in waits.items():
            whole = await pending_page
            if whole is None:  # in the cache now: read what this read wants of it
                late[page] = wanted[page]
            else:
                got[page] = PageBytes(whole)
        if late:
            got.update(await self._read_pages(path, version, size, late))
        return got

    async def _take_cached(
        self,
        keys: dict[int, str],
        pages: list[int],
        wanted: dict[int, Spans | None],
        size: int,
        got: dict[int, PageBytes],
    ) -> list[int]:
        """Read ``pages`` from the cache into ``got``, handing each to this process's waiting
        reads; return the pages not there."""
        hits = await asyncio.to_thread(self._read_cached, keys, pages, wanted, size)
        missing = []
        for page, hit in zip(pages, hits, strict=True):
            if hit is None:
                missing.append(page)
            else:
                got[page] = hit
                self._in_flight.settle(keys[page], hit.whole)
        return missing

    def _read_cached(
        self, keys: dict[int, str], pages: list[int], wanted: dict[int, Spans | None], size: int
    ) -> list[PageBytes | None]:
        out: list[PageBytes | None] = []
        for page in pages:
            spans = wanted[page]
            if spans is None:  # the whole page, its CRC-32 checked
                data = self.cache.get(keys[page])
                out.append(None if data is None else PageBytes(data))
                continue
            length = min(self.page_bytes, size - page * self.page_bytes)
            reads = [(a, b - a) for a, b in spans]
            pieces = self.cache.read_spans(keys[page], reads, length=length)
            out.append(
                None
                if pieces is None
                else PageBytes(None, [(a, b, d) for (a, b), d in zip(spans, pieces, strict=True)])
            )
        return out

    async def _fetch_missing(
        self,
        path: str,
        size: int,
        keys: dict[int, str],
        missing: list[int],
        wanted: dict[int, Spans | None],
    ) -> dict[int, PageBytes]:
        """Missing pages from the store, each fetched by one process of the node
        (:class:`~stoker.storage.cache_fetch.NodeFetch`)."""

        async def fetch(pages: list[int], claims: dict[int, Claim]) -> dict[int, PageBytes]:
            return await self._fetch(path, size, keys, pages, claims)

        async def take_cached(pages: list[int], got: dict[int, PageBytes]) -> list[int]:
            return await self._take_cached(keys, pages, wanted, size, got)

        node = NodeFetch(
            cache=self.cache,
            keys=keys,
            where=f"{self.url}/{path}",
            claim_wait_s=self.claim_wait_s,
            fetch=fetch,
            take_cached=take_cached,
        )
        return await node.get(missing)

    async def _fetch(
        self, path: str, size: int, keys: dict[int, str], pages: list[int], claims: dict[int, Claim]
    ) -> dict[int, PageBytes]:
        """Fetch ``pages`` whole (adjacent ones in one ranged read), store them, then
        release their claims and hand them to this process's waiting reads."""
        got: dict[int, PageBytes] = {}

        async def fetch_run(run_start: int, run_end: int, run: list[int]) -> None:
            data, found = await get_range_sized(self.inner, path, start=run_start, end=run_end)
            if found is not None and found != size:
                # Not the object its version names (a shard replaced, truncated or from
                # another dataset): none of it goes into the cache, and the reader says so.
                if (self._known(path) or ("",))[0].startswith("etag:"):
                    self._forget(path)  # changed since its HEAD: the next read HEADs again
                raise SizeChangedError(f"{self.url}/{path}", path, expected=size, actual=found)
            fetched = split_pages(data, run, run_start, self.page_bytes)
            await asyncio.to_thread(self._put_all, keys, fetched)
            for page, payload in fetched.items():
                claim = claims.pop(page, None)
                if claim is not None:
                    claim.release()
                got[page] = PageBytes(payload)
                self._in_flight.settle(keys[page], payload)

        await asyncio.gather(
            *(fetch_run(*run) for run in page_runs(sorted(pages), size, self.page_bytes))
        )
        return got

    def _put_all(self, keys: dict[int, str], fetched: dict[int, Page]) -> None:
        for page, payload in fetched.items():
            self.cache.put(keys[page], payload)

    async def get_whole_async(self, path: str) -> memoryview:
        """The whole object at ``path`` through the cache (:meth:`get_async` goes straight
        to the store): its version as the caller gave it or from one HEAD, its pages each
        fetched by one process of the node, so processes reading it at once (ranks opening
        one dataset's index) make one fetch between them."""
        _, size = await self._version(path)
        if size == 0:
            return memoryview(b"")
        return await self.get_range_async(path, start=0, end=size)

    def get_whole(self, path: str) -> memoryview:
        """Blocking form of :meth:`get_whole_async`."""
        return self.engine.run(self.get_whole_async(path))

    def size_of(self, path: str) -> int:
        """The size of the object at ``path``, as the caller gave it or from one HEAD (which
        :meth:`get_whole` then does not repeat)."""
        return self.engine.run(self._version(path))[1]

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


def index_cache(directory: str | os.PathLike[str] | None) -> DiskCache | None:
    """The node's disk cache at ``directory`` (None: none) for reading a dataset's index
    before the data's size is known (:func:`~stoker.format.index.read_index`): not bounded
    here; the data's cache, opened once the index gives the data's size, holds the
    directory to its bound. A directory that cannot hold a cache gives None: the index is
    read from the store, and the data's cache says what is wrong with the directory."""
    if directory is None:
        return None
    try:
        return DiskCache(directory, max_bytes=_UNBOUNDED)
    except (OSError, ValueError) as exc:
        logger.debug("disk cache %s: the index is read from the store: %s", directory, exc)
        return None


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
