"""A node-local disk cache of byte ranges, shared by every process on the node.

:class:`DiskCache` keeps immutable byte strings under a directory, bounded in bytes with
least-recently-used eviction. Any number of processes (ranks, loader workers, separate jobs)
may use one directory at once:

- an entry is written to ``tmp/`` and renamed into place, so it is either whole or absent;
  each entry carries its length and CRC-32, checked on every read (a bad entry is deleted
  and counted as a miss, never returned);
- the running total lives in a small file updated under an ``flock``; the kernel drops the
  lock when its holder dies, so a crash never leaves a stale lock;
- when the total passes the limit, the oldest entries (by last use, kept in their mtime)
  are deleted down to 90 % of it, so the limit holds to within one entry;
- leftovers of writers that died mid-write are removed when a cache is opened.

:class:`CachedStore` wraps any :class:`~stoker.storage.base.Store` and serves ranged reads
through a ``DiskCache``. Entries are keyed by the object's version (a content hash the caller
knows, such as a shard's SHA-256 from the index, or else the ETag and size from one HEAD),
so a rewritten object never hits stale bytes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path

from stoker.core.metrics import Counters
from stoker.storage.base import Listing, ObjectMeta, PutData, Store, check_range

logger = logging.getLogger(__name__)

_LAYOUT = "v1"
_HEADER = struct.Struct("<4sQI")  # magic, payload length, CRC-32 of the payload
_MAGIC = b"STKC"
#: Eviction frees down to this fraction of the limit, so scans are rare.
LOW_WATER = 0.9
#: A temporary file this old whose writer's pid is gone is a crash leftover; one older than
#: ``_ABANDONED_TMP_S`` is removed whoever wrote it.
_STALE_TMP_S = 60.0
_ABANDONED_TMP_S = 3600.0
#: Last-use times closer than this to now are not rewritten (saves a syscall per hit).
_TOUCH_EVERY_S = 10.0


class DiskCache:
    """A byte-bounded LRU of immutable byte strings in a directory, safe across processes.

    Args:
        directory: Where entries live (created if missing). Share it between processes.
        max_bytes: Upper bound on the bytes of all entries (headers included).
        counters: Where ``cache.*`` counters go (hits, misses, bytes, evictions, errors).

    Writes are best effort: when the disk is full or unwritable, the cache logs one warning
    naming the directory and the reason, stops writing in this process, and reads go on
    working from the network.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int,
        counters: Counters | None = None,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.counters = counters if counters is not None else Counters()
        self._root = self.directory / _LAYOUT
        self._entries = self._root / "entries"
        self._tmp = self._root / "tmp"
        try:
            self._entries.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot create cache directory {self._root}: {exc}") from exc
        self._thread_lock = threading.Lock()
        self._fds: tuple[int, int, int] | None = None  # (pid, lock fd, size fd)
        self._writable = True
        with self._locked():
            self._remove_stale_tmp()

    def __repr__(self) -> str:
        return f"DiskCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    # -- cross-process lock and running total ---------------------------------------------

    def _files(self) -> tuple[int, int]:
        # Descriptors are per process: after a fork, the child must not share the parent's
        # open file description (flock would then not exclude the two).
        pid = os.getpid()
        if self._fds is None or self._fds[0] != pid:
            lock_fd = os.open(self._root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            size_fd = os.open(self._root / "size", os.O_RDWR | os.O_CREAT, 0o644)
            self._fds = (pid, lock_fd, size_fd)
        return self._fds[1], self._fds[2]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """Hold this process's thread lock and the directory's flock; yield the size fd."""
        with self._thread_lock:
            lock_fd, size_fd = self._files()
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                yield size_fd
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    @staticmethod
    def _read_total(size_fd: int) -> int | None:
        raw = os.pread(size_fd, 8, 0)
        return struct.unpack("<Q", raw)[0] if len(raw) == 8 else None

    @staticmethod
    def _write_total(size_fd: int, total: int) -> None:
        os.pwrite(size_fd, struct.pack("<Q", max(0, total)), 0)

    # -- entries ---------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self._entries / digest[:2] / digest

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (a miss, or a damaged entry removed)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self.counters.add("cache.misses")
            return None
        payload = _unwrap(data)
        if payload is None:
            logger.warning("disk cache %s: damaged entry %s removed", self.directory, path.name)
            self.counters.add("cache.damaged")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self.counters.add("cache.misses")
            return None
        now = time.time()
        with contextlib.suppress(OSError):  # evicted meanwhile: the bytes are still good
            if now - path.stat().st_mtime > _TOUCH_EVERY_S:
                os.utime(path, (now, now))
        self.counters.add("cache.hits")
        self.counters.add("cache.bytes_hit", len(payload))
        return payload

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` (a no-op if already there or if it cannot fit)."""
        size = _HEADER.size + len(data)
        if not self._writable or size > self.max_bytes:
            return
        path = self._path(key)
        tmp = self._tmp / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, len(data), zlib.crc32(data)))
                f.write(data)
            with self._locked() as size_fd:
                if path.exists():
                    tmp.unlink()
                    return
                path.parent.mkdir(exist_ok=True)
                tmp.replace(path)
                total = self._read_total(size_fd)
                total = (total if total is not None else self._scan_total()) + size
                if total > self.max_bytes:
                    total = self._evict(total)
                self._write_total(size_fd, total)
            self.counters.add("cache.writes")
            self.counters.add("cache.bytes_written", len(data))
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._writable = False
            self.counters.add("cache.errors")
            reason = "no space left on the device" if exc.errno == errno.ENOSPC else str(exc)
            logger.warning(
                "disk cache %s: cannot write (%s); caching is off in this process, reads go on "
                "from the store",
                self.directory,
                reason,
            )

    def _entries_by_age(self) -> list[tuple[float, int, str]]:
        found = []
        for sub in os.scandir(self._entries):
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    found.append((st.st_mtime, st.st_size, entry.path))
        found.sort()
        return found

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self._entries_by_age())

    def _evict(self, total: int) -> int:
        """Delete least recently used entries down to the low-water mark (under the lock)."""
        entries = self._entries_by_age()
        total = sum(size for _, size, _ in entries)  # the truth, in case a writer died
        target = int(self.max_bytes * LOW_WATER)
        evicted = 0
        for _, size, path in entries:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                Path(path).unlink()
                total -= size
                evicted += 1
        self.counters.add("cache.evictions", evicted)
        return total

    def _remove_stale_tmp(self) -> None:
        now = time.time()
        for entry in os.scandir(self._tmp):
            pid_text = entry.name.split("-", 1)[0]
            alive = pid_text.isdigit() and _pid_alive(int(pid_text))
            with contextlib.suppress(FileNotFoundError):
                age = now - entry.stat().st_mtime
                if (not alive and age > _STALE_TMP_S) or age > _ABANDONED_TMP_S:
                    Path(entry.path).unlink()

    @property
    def bytes(self) -> int:
        """Bytes of all entries now (headers included), by a scan of the directory."""
        with self._locked():
            return self._scan_total()

    def entries(self) -> int:
        """Number of entries now."""
        return len(self._entries_by_age())

    def verify(self) -> tuple[int, int]:
        """Check every entry's length and CRC-32; remove damaged ones.

        Returns:
            ``(entries checked, damaged entries removed)``.
        """
        checked = damaged = 0
        for _, _, path in self._entries_by_age():
            try:
                data = Path(path).read_bytes()
            except FileNotFoundError:
                continue
            checked += 1
            if _unwrap(data) is None:
                damaged += 1
                with contextlib.suppress(FileNotFoundError):
                    Path(path).unlink()
        return checked, damaged

    def clear(self) -> None:
        """Delete every entry."""
        with self._locked() as size_fd:
            for _, _, path in self._entries_by_age():
                with contextlib.suppress(FileNotFoundError):
                    Path(path).unlink()
            self._write_total(size_fd, 0)

    def close(self) -> None:
        """Close this process's lock and size files (the cache reopens them if used again)."""
        with self._thread_lock:
            if self._fds is not None and self._fds[0] == os.getpid():
                os.close(self._fds[1])
                os.close(self._fds[2])
            self._fds = None


def _unwrap(data: bytes) -> bytes | None:
    if len(data) < _HEADER.size:
        return None
    magic, length, crc = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
        return None
    return payload


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CachedStore:
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
        self._lock = threading.Lock()
        self._in_flight: dict[str, asyncio.Future[bytes]] = {}

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def counters(self) -> Counters:
        return self.inner.counters

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

    def _assemble(self, pages: dict[int, bytes], start: int, end: int) -> memoryview:
        first = min(pages) * self.page_bytes
        joined = b"".join(pages[p] for p in sorted(pages))
        return memoryview(joined)[start - first : end - first]

    def _missing_runs(self, missing: list[int], size: int) -> list[tuple[int, int, list[int]]]:
        """Adjacent missing pages as (start, end, pages) of one ranged read each."""
        runs: list[tuple[int, int, list[int]]] = []
        for page in missing:
            if runs and runs[-1][2][-1] == page - 1:
                runs[-1][2].append(page)
            else:
                runs.append((0, 0, [page]))
        return [
            (p[0] * self.page_bytes, min((p[-1] + 1) * self.page_bytes, size), p)
            for _, _, p in runs
        ]

    def _split(self, data: memoryview, pages: list[int], run_start: int) -> dict[int, bytes]:
        out = {}
        for page in pages:
            offset = page * self.page_bytes - run_start
            out[page] = bytes(data[offset : offset + self.page_bytes])
        return out

    # -- cached reads ----------------------------------------------------------------------

    def get_range(self, path: str, *, start: int, end: int) -> memoryview:
        version, size = self._known(path) or self._remember(path, self.inner.head(path))
        pages: dict[int, bytes] = {}
        missing = []
        for page in self._pages(path, start, end, size):
            hit = self.cache.get(self._page_key(path, version, page))
            if hit is None:
                missing.append(page)
            else:
                pages[page] = hit
        for run_start, run_end, run in self._missing_runs(missing, size):
            data = self.inner.get_range(path, start=run_start, end=run_end)
            for page, payload in self._split(data, run, run_start).items():
                self.cache.put(self._page_key(path, version, page), payload)
                pages[page] = payload
        return self._assemble(pages, start, end)

    def get_ranges(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        if len(starts) != len(ends):
            raise ValueError(f"{path}: {len(starts)} starts but {len(ends)} ends")
        return [self.get_range(path, start=s, end=e) for s, e in zip(starts, ends, strict=True)]

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        known = self._known(path) or self._remember(path, await self.inner.head_async(path))
        version, size = known
        keys = {
            page: self._page_key(path, version, page)
            for page in self._pages(path, start, end, size)
        }
        # Claim the pages no other read of this process is already getting; wait for the rest.
        owned: list[int] = []
        waits: dict[int, asyncio.Future[bytes]] = {}
        loop = asyncio.get_running_loop()
        with self._lock:
            for page, key in keys.items():
                pending = self._in_flight.get(key)
                if pending is None:
                    self._in_flight[key] = loop.create_future()
                    owned.append(page)
                else:
                    waits[page] = pending
        pages: dict[int, bytes] = {}
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

    def _get_all(self, keys: list[str]) -> list[bytes | None]:
        return [self.cache.get(key) for key in keys]

    def _put_all(self, path: str, version: str, fetched: dict[int, bytes]) -> None:
        for page, payload in fetched.items():
            self.cache.put(self._page_key(path, version, page), payload)

    def _settle(self, key: str, payload: bytes | None, error: BaseException | None) -> None:
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
        if len(starts) != len(ends):
            raise ValueError(f"{path}: {len(starts)} starts but {len(ends)} ends")
        return list(
            await asyncio.gather(
                *(
                    self.get_range_async(path, start=s, end=e)
                    for s, e in zip(starts, ends, strict=True)
                )
            )
        )

    # -- everything else goes straight through -----------------------------------------------

    def get(self, path: str) -> memoryview:
        return self.inner.get(path)

    def head(self, path: str) -> ObjectMeta:
        return self.inner.head(path)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        return self.inner.list(prefix)

    def list_dir(self, prefix: str = "") -> Listing:
        return self.inner.list_dir(prefix)

    def put(self, path: str, data: PutData) -> ObjectMeta:
        self._forget(path)
        return self.inner.put(path, data)

    def delete(self, path: str) -> None:
        self._forget(path)
        self.inner.delete(path)

    async def get_async(self, path: str) -> memoryview:
        return await self.inner.get_async(path)

    async def head_async(self, path: str) -> ObjectMeta:
        return await self.inner.head_async(path)

    def list_async(self, prefix: str = "") -> AsyncIterator[builtins.list[ObjectMeta]]:
        return self.inner.list_async(prefix)

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        self._forget(path)
        return await self.inner.put_async(path, data)

    async def delete_async(self, path: str) -> None:
        self._forget(path)
        await self.inner.delete_async(path)
