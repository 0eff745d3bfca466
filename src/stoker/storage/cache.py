"""A node-local disk cache of byte strings, shared by every process on the node.

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

:class:`~stoker.storage.cached.CachedStore` serves a store's ranged reads through it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

from stoker.core.metrics import Counters

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

    @classmethod
    def for_data(
        cls, directory: str | os.PathLike[str], *, data_bytes: int, max_bytes: int | None = None
    ) -> DiskCache:
        """A cache for ``data_bytes`` of data: bounded by ``max_bytes`` if given, else by the
        data and a margin (1.1x + 64 MiB), within 80 % of the directory's free space."""
        if max_bytes is None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            wanted = int(data_bytes * 1.1) + (64 << 20)
            max_bytes = min(wanted, int(shutil.disk_usage(directory).free * 0.8))
        return cls(directory, max_bytes=max_bytes)

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
                used = os.fstat(f.fileno()).st_mtime
                now = time.time()
                if now - used > _TOUCH_EVERY_S:  # last use is the mtime: LRU order
                    os.utime(f.fileno(), (now, now))
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
        self.counters.add("cache.hits")
        self.counters.add("cache.bytes_hit", len(payload))
        return payload

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` (a no-op if already there or if it cannot fit)."""
        size = _HEADER.size + len(data)
        if not self._writable or size > self.max_bytes:
            return
        path = self._path(key)
        if path.exists():  # another process wrote it meanwhile: no need to write it again
            return
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
