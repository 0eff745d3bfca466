"""ObstoreStore: the Store for S3, GCS, Azure and local paths, built on obstore.

All requests run on the process's I/O engine (one asyncio loop in a background thread),
bounded by its in-flight limit, paced by the rate shaper of their prefix
(:mod:`stoker.storage.shaping`), retried by :mod:`stoker.storage.retry` and counted in
:attr:`ObstoreStore.counters`. obstore's exceptions are mapped to stoker's tree with the
object's URL in the message.

A store works in a process forked from the one that opened it (a DataLoader worker): there
it makes its obstore client again from the same configuration, with the child's obstore
(:mod:`stoker.storage.native`), and starts its counters and rate shapers anew; the engine
does the same for its loop (:mod:`stoker.storage.engine`).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from stoker.core.metrics import Counters
from stoker.core.perprocess import PerProcess
from stoker.errors import (
    ListingStalledError,
)
from stoker.storage.base import (
    Listing,
    ObjectMeta,
    PutData,
    check_parts,
    check_range,
    check_ranges,
)
from stoker.storage.blocking import BlockingForms
from stoker.storage.cache import DiskCache
from stoker.storage.engine import IOEngine, default_engine
from stoker.storage.native import native
from stoker.storage.obstorelist import ObstoreListing, meta_of
from stoker.storage.options import StorageOptions
from stoker.storage.remote_attempt import Connection, reconnect, shaped_attempt
from stoker.storage.remote_errors import ErrorMapper, RangeBeyondEnd, is_unsatisfiable_range
from stoker.storage.retry import (
    ShortBodyError,
    call_with_retries,
)
from stoker.storage.s3 import NativeConfig, open_local
from stoker.storage.shaping import PrefixShaper, prefix_of
from stoker.storage.url import StorageUrl, redact_userinfo

T = TypeVar("T")


class ObstoreStore(BlockingForms):
    """A :class:`~stoker.storage.base.Store` over an obstore store.

    Build one with :func:`stoker.open_store`; the constructor is for code that already has
    the pieces.

    Args:
        native: The obstore store and how its credentials were resolved.
        url: The parsed URL of the store's root.
        options: Retry policy, part sizes and thresholds.
        engine: I/O engine to run on; the process's shared engine by default.
    """

    def __init__(
        self,
        native: NativeConfig,
        url: StorageUrl,
        *,
        options: StorageOptions,
        engine: IOEngine | None = None,
    ) -> None:
        # A local folder answers from the page cache: nothing to hedge.
        hedge = options.hedge if url.scheme != "file" else None
        again = functools.partial(reconnect, native.store, hedge)
        self._here = PerProcess(again, initial=Connection(native.store, hedge))
        self._source = native.credentials_source
        self._endpoint = redact_userinfo(native.endpoint)  # for messages: never a password
        self._url = url
        self._options = options
        self._engine = engine or default_engine()
        self._ranged_first = url.scheme != "file"
        self._errors = ErrorMapper(
            url=url,
            endpoint=self._endpoint,
            source=self._source,
            timeout_s=options.timeout_s,
            folder_missing=self._missing,
        )

    @property
    def url(self) -> str:
        return str(self._url)

    @property
    def counters(self) -> Counters:
        """The requests, retries and bytes of this store in this process."""
        return self._here.get().counters

    @property
    def engine(self) -> IOEngine:
        return self._engine

    @property
    def cache(self) -> DiskCache | None:
        return None

    @property
    def options(self) -> StorageOptions:
        return self._options

    @property
    def endpoint(self) -> str:
        """Where requests go, resolved from the options, the environment or a profile (a
        local folder's path); any password in it shown as ``***``."""
        return self._endpoint

    def __repr__(self) -> str:
        return (
            f"ObstoreStore({self.url!r}, endpoint={self._endpoint!r}, credentials={self._source!r})"
        )

    @property
    def _native(self) -> Any:
        """This process's obstore client (None: a local folder not written to yet)."""
        return self._here.get().native

    def _store(self, *, create: bool = False) -> Any:
        here = self._here.get()
        if here.native is None:  # a local folder that did not exist when opened
            here.native = open_local(Path(self._url.prefix), create=create)
        return here.native

    def _missing(self) -> bool:
        # A local folder that does not exist lists as empty, as a bucket prefix would.
        return self._native is None and not Path(self._url.prefix).is_dir()

    # -- the request wrapper ---------------------------------------------------------------

    def _shaper(self, path: str) -> PrefixShaper:
        prefix = prefix_of(self._url.prefix if self._url.scheme != "file" else "", path)
        shapers = self._here.get().shapers
        shaper = shapers.get(prefix)
        if shaper is None:
            key = (self._endpoint, self._url.bucket or self._url.prefix, prefix)
            shaper = self._engine.shapers.get(
                key, policy=self._options.shaping, cap=self._options.max_requests_per_s
            )
            shapers[prefix] = shaper
        return shaper

    async def _request(
        self,
        op: str,
        path: str,
        attempt: Callable[[], Awaitable[T]],
        *,
        hedge_bytes: int | None = None,
    ) -> T:
        """Run ``attempt`` shaped, in an engine slot, retried and counted; a read of
        ``hedge_bytes`` (ranged GETs only: idempotent) is hedged when the store hedges."""
        shaper = self._shaper(path)
        here = self._here.get()
        hedger = here.hedger

        def tracked() -> Awaitable[T]:
            return self._engine.track(attempt())

        call: Callable[[], Awaitable[T]] = tracked
        if hedger is not None and hedge_bytes is not None:
            # Each request tracked apart: the loser's native request goes on (it cannot be
            # stopped from Python) and the engine's close waits for it.
            call = functools.partial(hedger.run, tracked, size=hedge_bytes, counters=self.counters)

        one_attempt = functools.partial(
            shaped_attempt, call, op=op, shaper=shaper, engine=self._engine, here=here
        )

        try:
            return await call_with_retries(
                one_attempt,
                policy=self._options.retry,
                counters=self.counters,
                what=f"{op.upper()} {self._url.child(path)}",
            )
        except (RangeBeyondEnd, ListingStalledError):  # already says what and where
            raise
        except Exception as exc:
            raise self._errors.map(exc, op, path) from exc

    # -- reads -----------------------------------------------------------------------------

    async def _get_ranged(self, path: str, start: int, end: int) -> tuple[memoryview, int]:
        """One GET of bytes [start, end); returns the data and the object's full size."""

        async def attempt() -> tuple[memoryview, int]:
            try:
                result = await native().functions.get_async(
                    self._store(), path, options={"range": (start, end)}
                )
            except Exception as exc:
                if is_unsatisfiable_range(exc):
                    raise RangeBeyondEnd(None) from exc
                raise
            size = int(result.meta["size"])
            if end > size:
                raise RangeBeyondEnd(size)
            return await self._body(result, end - start), size

        return await self._request("get", path, attempt, hedge_bytes=end - start)

    async def _body(self, result: Any, size: int) -> memoryview:
        """The body of a GET's ``result``, which must be ``size`` bytes, counted as read."""
        data = memoryview(await result.bytes_async())
        if len(data) != size:
            raise ShortBodyError(f"got {len(data)} of {size} bytes")
        self.counters.add("bytes.read", len(data))
        return data

    async def get_async(self, path: str) -> memoryview:
        part = self._options.part_size_bytes
        if not self._ranged_first:
            return await self._get_whole(path)

        async def first_part() -> tuple[memoryview, int]:
            try:
                result = await native().functions.get_async(
                    self._store(), path, options={"range": (0, part)}
                )
            except Exception as exc:
                # An empty object has no byte 0: S3 answers 416 to any range.
                if is_unsatisfiable_range(exc):
                    raise RangeBeyondEnd(0) from exc
                raise
            size = int(result.meta["size"])
            data = memoryview(await result.bytes_async())
            low, high = result.range
            if len(data) != high - low or len(data) != min(part, size):
                raise ShortBodyError(f"got {len(data)} of {min(part, size)} bytes")
            self.counters.add("bytes.read", len(data))
            return data, size

        try:
            head, size = await self._request("get", path, first_part)
        except RangeBeyondEnd:
            return await self._get_whole(path)
        if size <= part:
            return head
        # Large object: the rest as concurrent ranged GETs, one request per part.
        starts = list(range(part, size, part))
        parts = await asyncio.gather(
            *(self._get_ranged(path, s, min(s + part, size)) for s in starts)
        )
        buffer = bytearray(size)
        buffer[:part] = head
        for s, (data, _) in zip(starts, parts, strict=True):
            buffer[s : s + len(data)] = data
        return memoryview(buffer)

    async def _get_whole(self, path: str) -> memoryview:
        async def attempt() -> memoryview:
            result = await native().functions.get_async(self._store(), path)
            return await self._body(result, int(result.meta["size"]))

        return await self._request("get", path, attempt)

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        check_range(path, start, end)
        data, _ = await self._get_checked_range(path, start, end)
        return data

    async def get_parts_sized_async(
        self, path: str, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> tuple[builtins.list[memoryview], int | None]:
        """:meth:`get_parts_async`'s parts and the object's whole size, both from the one
        ranged GET (its ``Content-Range``), so a reader checks the size with no HEAD
        (:func:`~stoker.storage.sized.get_parts_sized`)."""
        check_parts(path, start, end, parts)
        if not parts:
            return [], None
        data, size = await self._get_checked_range(path, start, end)
        return [data[s - start : e - start] for s, e in parts], size

    async def _get_checked_range(self, path: str, start: int, end: int) -> tuple[memoryview, int]:
        try:
            return await self._get_ranged(path, start, end)
        except RangeBeyondEnd as exc:
            size = f"{exc.size} bytes" if exc.size is not None else "it is shorter"
            raise ValueError(
                f"{self._url.child(path)}: range [{start}, {end}) ends past the object ({size})"
            ) from None

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        check_ranges(path, starts, ends)
        for s, e in zip(starts, ends, strict=True):
            check_range(path, s, e)

        async def attempt() -> builtins.list[memoryview]:
            buffers = await native().functions.get_ranges_async(
                self._store(), path, starts=list(starts), ends=list(ends)
            )
            views = [memoryview(b) for b in buffers]
            for view, s, e in zip(views, starts, ends, strict=True):
                if len(view) != e - s:
                    raise ShortBodyError(f"range [{s}, {e}): got {len(view)} bytes")
            self.counters.add("bytes.read", sum(len(v) for v in views))
            return views

        total = sum(e - s for s, e in zip(starts, ends, strict=True))
        return await self._request("get", path, attempt, hedge_bytes=total)

    async def head_async(self, path: str) -> ObjectMeta:
        async def attempt() -> ObjectMeta:
            return meta_of(await native().functions.head_async(self._store(), path))

        return await self._request("head", path, attempt)

    def _listing(self) -> ObstoreListing:
        return ObstoreListing(
            url=self._url,
            options=self._options,
            client=self._store,
            request=functools.partial(self._request, "list"),
        )

    async def list_async(self, prefix: str = "") -> AsyncIterator[builtins.list[ObjectMeta]]:
        if self._missing():
            return
        async for page in self._listing().pages(prefix):
            yield page

    async def list_dir_async(self, prefix: str = "") -> Listing:
        if self._missing():
            return Listing(prefixes=[], objects=[])
        return await self._listing().level(prefix)

    # -- writes ----------------------------------------------------------------------------

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        if not path or path.endswith("/"):
            raise ValueError(f"{self.url}: invalid object key {path!r}")
        size = data.stat().st_size if isinstance(data, Path) else len(memoryview(data))
        multipart = size >= self._options.multipart_threshold_bytes

        async def attempt() -> ObjectMeta:
            payload: Any = data if isinstance(data, Path) else memoryview(data)
            result = await native().functions.put_async(
                self._store(create=True),
                path,
                payload,
                use_multipart=multipart,
                chunk_size=self._options.part_size_bytes,
                max_concurrency=8,
            )
            self.counters.add("bytes.written", size)
            etag = result.get("e_tag")
            return ObjectMeta(key=path, size=size, etag=etag.strip('"') if etag else None)

        return await self._request("put", path, attempt)

    async def delete_async(self, path: str) -> None:
        async def attempt() -> None:
            try:
                await native().functions.delete_async(self._store(), path)
            except FileNotFoundError:
                return

        await self._request("delete", path, attempt)
