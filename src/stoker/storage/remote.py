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
    BucketNotFoundError,
    CredentialsError,
    EndpointError,
    ListingStalledError,
    ObjectNotFoundError,
    RetriesExhaustedError,
    StorageError,
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
from stoker.storage.hedge import HedgePolicy, Hedger
from stoker.storage.native import native, rebuild
from stoker.storage.obstorelist import ObstoreListing, meta_of
from stoker.storage.options import StorageOptions
from stoker.storage.retry import (
    RETRYABLE,
    ShortBodyError,
    call_with_retries,
    classify,
    error_code,
    summarise_error,
)
from stoker.storage.s3 import NativeConfig, open_local
from stoker.storage.shaping import PrefixShaper, prefix_of
from stoker.storage.url import StorageUrl, redact_userinfo

T = TypeVar("T")


class _RangeBeyondEnd(Exception):
    # Not retried and not mapped: the caller turns it into ValueError (or a plain GET).
    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


def _is_unsatisfiable_range(exc: Exception) -> bool:
    text = str(exc)
    if "Requested range was invalid" in text:  # obstore's local filesystem
        return True
    return "416" in text and ("Range Not Satisfiable" in text or "InvalidRange" in text)


class _Connection:
    """What a store uses in one process: its obstore client, counters and shapers."""

    __slots__ = ("counters", "hedger", "native", "reported_rate", "shapers")

    def __init__(self, native: Any, hedge: HedgePolicy | None) -> None:
        self.native = native  # None until a missing local folder is written to
        self.hedger = None if hedge is None else Hedger(hedge)
        self.counters = Counters()
        self.shapers: dict[str, PrefixShaper] = {}
        self.reported_rate = 0  # what counters["shaping.rate_per_s"] holds now


def _reconnect(opened: Any, hedge: HedgePolicy | None) -> _Connection:
    # A process forked from the one that opened the store: the client made there runs on
    # the parent's obstore runtime, which did not survive the fork; make it again here.
    return _Connection(None if opened is None else rebuild(opened), hedge)


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
        reconnect = functools.partial(_reconnect, native.store, hedge)
        self._here = PerProcess(reconnect, initial=_Connection(native.store, hedge))
        self._source = native.credentials_source
        self._endpoint = redact_userinfo(native.endpoint)  # for messages: never a password
        self._url = url
        self._options = options
        self._engine = engine or default_engine()
        self._ranged_first = url.scheme != "file"

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

    def _report(self, shaper: PrefixShaper) -> None:
        # shaping.rate_per_s is a level, not a total: the rate of the prefix last used.
        here = self._here.get()
        rate = shaper.rate
        level = 0 if rate is None else max(1, round(rate))
        if level != here.reported_rate:
            here.counters.add("shaping.rate_per_s", level - here.reported_rate)
            here.reported_rate = level

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
        hedger = self._here.get().hedger

        def tracked() -> Awaitable[T]:
            return self._engine.track(attempt())

        call: Callable[[], Awaitable[T]] = tracked
        if hedger is not None and hedge_bytes is not None:
            # Each request tracked apart: the loser's native request goes on (it cannot be
            # stopped from Python) and the engine's close waits for it.
            call = functools.partial(hedger.run, tracked, size=hedge_bytes, counters=self.counters)

        async def one_attempt() -> T:
            sent_at, waited_s = await shaper.acquire()
            try:
                async with self._engine.slot():
                    if shaper.outdated(sent_at):  # throttled while this one waited for a slot
                        sent_at, more_s = await shaper.take_token()
                        waited_s += more_s
                    if waited_s > 0:
                        self.counters.add("shaping.waits")
                        self.counters.add("shaping.wait_ms", round(waited_s * 1000))
                    self.counters.add(f"requests.{op}")
                    try:
                        result = await call()
                    except Exception as exc:
                        if classify(exc) == "throttle":
                            shaper.throttled(sent_at)
                        else:
                            shaper.succeeded()  # the server answered: not over its limit
                        self._report(shaper)
                        raise
                    shaper.succeeded()
                    self._report(shaper)
                    return result
            finally:
                shaper.release()

        try:
            return await call_with_retries(
                one_attempt,
                policy=self._options.retry,
                counters=self.counters,
                what=f"{op.upper()} {self._url.child(path)}",
            )
        except (_RangeBeyondEnd, ListingStalledError):  # already says what and where
            raise
        except Exception as exc:
            raise self._map_error(exc, op, path) from exc

    def _map_error(self, exc: Exception, op: str, path: str) -> Exception:
        where = self._url.child(path) if path else self.url
        kind = classify(exc)
        text = str(exc)
        code = error_code(text)
        if kind == "not_found":
            if code == "NoSuchBucket" or "NoSuchBucket" in text:
                return BucketNotFoundError(
                    f"{where}: bucket {self._url.bucket!r} does not exist at {self._endpoint}"
                )
            if self._missing():
                return BucketNotFoundError(f"{where}: folder {self._url.prefix} does not exist")
            return ObjectNotFoundError(f"{where}: no such object")
        if kind == "auth":
            reason = code or "access denied"
            return CredentialsError(
                f"{op.upper()} {where} was refused ({reason}); credentials came from "
                f"{self._source}, endpoint {self._endpoint}"
            )
        if kind == "connect":
            return EndpointError(
                f"cannot reach {self._endpoint} for {op.upper()} {where} "
                f"({kind}, gave up after retrying)"
            )
        if kind == "reset" and "error sending request" in text:
            # No response at all, every time: a proxy or load balancer with nothing behind it.
            return EndpointError(
                f"{self._endpoint} closed the connection before answering {op.upper()} {where} "
                f"(gave up after retrying)"
            )
        if kind == "timeout":
            return EndpointError(
                f"{op.upper()} {where}: no complete response from {self._endpoint} within "
                f"timeout_s={self._options.timeout_s:g} (gave up after retrying)"
            )
        summary = summarise_error(text)
        if kind in RETRYABLE:
            return RetriesExhaustedError(f"{op.upper()} {where}: gave up after retries: {summary}")
        return StorageError(f"{op.upper()} {where} failed: {summary}")

    # -- reads -----------------------------------------------------------------------------

    async def _get_ranged(self, path: str, start: int, end: int) -> tuple[memoryview, int]:
        """One GET of bytes [start, end); returns the data and the object's full size."""

        async def attempt() -> tuple[memoryview, int]:
            try:
                result = await native().functions.get_async(
                    self._store(), path, options={"range": (start, end)}
                )
            except Exception as exc:
                if _is_unsatisfiable_range(exc):
                    raise _RangeBeyondEnd(None) from exc
                raise
            size = int(result.meta["size"])
            if end > size:
                raise _RangeBeyondEnd(size)
            data = memoryview(await result.bytes_async())
            if len(data) != end - start:
                raise ShortBodyError(f"got {len(data)} of {end - start} bytes")
            self.counters.add("bytes.read", len(data))
            return data, size

        return await self._request("get", path, attempt, hedge_bytes=end - start)

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
                if _is_unsatisfiable_range(exc):
                    raise _RangeBeyondEnd(0) from exc
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
        except _RangeBeyondEnd:
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
            data = memoryview(await result.bytes_async())
            if len(data) != int(result.meta["size"]):
                raise ShortBodyError(f"got {len(data)} of {result.meta['size']} bytes")
            self.counters.add("bytes.read", len(data))
            return data

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
        except _RangeBeyondEnd as exc:
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
