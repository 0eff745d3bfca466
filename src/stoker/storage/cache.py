"""A node-local disk cache of byte strings, shared by every process on the node.

:class:`DiskCache` keeps immutable byte strings under a directory, bounded in bytes with
least-recently-used eviction. Any number of processes (ranks, loader workers, separate jobs)
may use one directory at once:

- an entry is written to ``tmp/`` and renamed into place, so it is either whole or absent;
  each entry carries its length and CRC-32, checked on every read (a bad entry is deleted
  and counted as a miss, never returned);
- the running total lives in a small file updated under an ``flock``; the kernel drops the
  lock when its holder dies, so a crash never leaves a stale lock
  (:mod:`stoker.storage.cache_total`);
- when the total passes the limit, the oldest entries (by last use, kept in their mtime)
  are deleted down to 90 % of it, so the limit holds to within one entry;
- leftovers of writers that died mid-write are removed when a cache is opened;
- :meth:`DiskCache.read_spans` reads parts of an entry without reading all of it: the
  entry's header (magic and length, against the file's size) is checked, but the CRC-32
  covers the whole payload and cannot check a part; the caller checks what it reads
  (:class:`~stoker.format.reader.ShardDataset` checks each sample's CRC-32 from the index,
  and on a mismatch reads the whole entry again, which the CRC-32 checks);
- :meth:`DiskCache.claim` lets one process of the node fetch a missing entry while the
  others wait for it (:mod:`stoker.storage.cache_claims`);
- the cache reads and deletes only regular files it wrote (named by a key's digest), never
  through a symbolic link: a link or a stranger's file planted under ``entries/`` is left
  alone and named in a warning (the directory is shared by every job on the node).

:class:`~stoker.storage.cached.CachedStore` serves a store's ranged reads through it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import struct
import uuid
from pathlib import Path

from stoker.core.crc import crc32
from stoker.core.metrics import Counters
from stoker.storage.cache_claims import Claim, PageClaims
from stoker.storage.cache_files import EntryFiles, describe_path, remove_stale_tmp
from stoker.storage.cache_total import SharedTotal, read_total, write_total

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
        create: Make the cache's folders if missing; without it, a directory that is not
            already a cache is refused (read-only uses never write into a stranger's folder).

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
        create: bool = True,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.counters = counters if counters is not None else Counters()
        self._root = self.directory / _LAYOUT
        self._entries = self._root / "entries"
        self._tmp = self._root / "tmp"
        if create:
            try:
                self._entries.mkdir(parents=True, exist_ok=True)
                self._tmp.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot create cache directory {self._root}: {exc}"
                ) from exc
        elif not is_disk_cache(self.directory):
            raise FileNotFoundError(
                f"{self.directory} is not a stoker disk cache (it has no "
                f"{Path(_LAYOUT, 'entries')}, {Path(_LAYOUT, 'tmp')} and {Path(_LAYOUT, 'lock')})"
            )
        for folder in (self._root, self._entries, self._tmp):
            if folder.is_symlink():
                raise ValueError(
                    f"{folder} is a symbolic link (to {folder.readlink()}): the cache never "
                    "works through a link; remove it, or give the cache another directory"
                )
        self._total = SharedTotal(self._root)
        self._writable = True
        self._told: set[str] = set()  # paths left alone and already named in a warning
        self._files = EntryFiles(self._entries, self._leave_alone)
        self._claims = PageClaims(self._root / "claims", self._leave_alone)
        with self._total.locked():
            remove_stale_tmp(self._tmp, stale_s=_STALE_TMP_S, abandoned_s=_ABANDONED_TMP_S)
            if create:
                self._claims.remove_stale(_STALE_TMP_S)

    @classmethod
    def for_data(
        cls, directory: str | os.PathLike[str], *, data_bytes: int, max_bytes: int | None = None
    ) -> DiskCache:
        """A cache for ``data_bytes`` of data: bounded by ``max_bytes`` if given, else by the
        data and a margin (1.1x + 64 MiB), within 80 % of the directory's free space."""
        if max_bytes is None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            wanted = int(data_bytes * 1.1) + (64 << 20)
            room = int(shutil.disk_usage(directory).free * 0.8)
            if room < 1:
                raise ValueError(
                    f"disk cache {directory}: no free space there to hold a cache; "
                    "give another dir (on a local disk)"
                )
            max_bytes = min(wanted, room)
        return cls(directory, max_bytes=max_bytes)

    def __repr__(self) -> str:
        return f"DiskCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    # -- entries ---------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        folder, name = self._files.locate(key)
        return self._entries / folder / name

    def _leave_alone(self, paths: list[str]) -> None:
        # Each path once per cache object: a loader evicts often.
        new = [path for path in paths if path not in self._told]
        if not new:
            return
        self._told.update(new)
        logger.warning(
            "disk cache %s: left alone %d path(s) it did not write (it never reads, writes or "
            "deletes through them): %s%s",
            self.directory,
            len(new),
            "; ".join(describe_path(path) for path in new[:10]),
            f"; and {len(new) - 10} more" if len(new) > 10 else "",
        )

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (a miss, or a damaged entry removed)."""
        folder, name = self._files.locate(key)
        data = self._files.read(folder, name, touch_after_s=_TOUCH_EVERY_S)
        if data is None:
            self.counters.add("cache.misses")
            return None
        payload = _unwrap(data)
        if payload is None:
            self._drop_damaged(folder, name)
            return None
        self.counters.add("cache.hits")
        self.counters.add("cache.bytes_hit", len(payload))
        return payload

    def read_spans(
        self, key: str, spans: list[tuple[int, int]], *, length: int | None = None
    ) -> list[bytes] | None:
        """The bytes at each ``(offset, length)`` of the payload stored under ``key``, or
        None (a miss, or a damaged entry removed).

        Only the header is checked (its magic, and its length against the file's size and
        against ``length`` if given): the payload's CRC-32 covers all of it, so the caller
        must check what it reads. ``cache.bytes_hit`` counts the bytes read.

        Raises:
            ValueError: A span is not inside the entry's payload.
        """
        if any(offset < 0 or want < 0 for offset, want in spans):
            raise ValueError(f"disk cache {self.directory}: negative span in {spans}")
        folder, name = self._files.locate(key)
        found = self._files.read_at(
            folder,
            name,
            [(0, _HEADER.size), *((_HEADER.size + at, n) for at, n in spans)],
            touch_after_s=_TOUCH_EVERY_S,
        )
        if found is None:
            self.counters.add("cache.misses")
            return None
        size, (header, *pieces) = found
        stored = _HEADER.unpack(header)[1] if len(header) == _HEADER.size else -1
        if header[:4] != _MAGIC or stored != size - _HEADER.size or length not in (None, stored):
            self._drop_damaged(folder, name)
            return None
        for (offset, want), piece in zip(spans, pieces, strict=True):
            if offset + want > stored or len(piece) != want:
                raise ValueError(
                    f"disk cache {self.directory}: span ({offset}, {want}) is not inside "
                    f"entry {name} ({stored} bytes)"
                )
        self.counters.add("cache.hits")
        self.counters.add("cache.bytes_hit", sum(len(piece) for piece in pieces))
        return pieces

    def _drop_damaged(self, folder: str, name: str) -> None:
        logger.warning("disk cache %s: damaged entry %s removed", self.directory, name)
        self.counters.add("cache.damaged")
        self._files.remove(folder, name)
        self.counters.add("cache.misses")

    def contains(self, key: str) -> bool:
        """Whether an entry for ``key`` is there now (counted as neither hit nor miss)."""
        return self._files.exists(*self._files.locate(key))

    def claim(self, key: str) -> Claim | None:
        """Claim the fetch of the entry for ``key`` among the node's processes.

        Returns:
            A :class:`~stoker.storage.cache_claims.Claim` to release once the entry is
            stored (or its fetch failed); None while another process holds it (wait for
            the entry, then claim again). A cache this process cannot write to gives a
            claim that excludes nothing.
        """
        if not self._writable:
            return Claim()
        return self._claims.try_claim(self._files.locate(key)[1])

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` (a no-op if already there or if it cannot fit)."""
        size = _HEADER.size + len(data)
        if not self._writable or size > self.max_bytes:
            return
        folder, name = self._files.locate(key)
        if self._files.exists(folder, name):  # another process wrote it meanwhile
            return
        tmp = self._tmp / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            with open(tmp, "xb") as f:  # x: a new file, never through a link
                f.write(_HEADER.pack(_MAGIC, len(data), crc32(data)))
                f.write(data)
            with self._total.locked() as size_fd:
                if not self._files.place(tmp, folder, name):
                    tmp.unlink()
                    return
                total = read_total(size_fd)
                total = (total if total is not None else self._scan_total()) + size
                if total > self.max_bytes:
                    total = self._evict(total)
                write_total(size_fd, total)
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

    def _scan_total(self) -> int:
        return sum(size for _, size, _, _ in self._files.scan()[0])

    def _evict(self, total: int) -> int:
        """Delete least recently used entries down to the low-water mark (under the lock)."""
        entries, strangers = self._files.scan()
        self._leave_alone(strangers)  # the one place a loader would meet them
        total = sum(size for _, size, _, _ in entries)  # the truth, in case a writer died
        target = int(self.max_bytes * LOW_WATER)
        evicted = 0
        for _, size, folder, name in entries:
            if total <= target:
                break
            if self._files.remove(folder, name):
                total -= size
                evicted += 1
        self.counters.add("cache.evictions", evicted)
        return total

    @property
    def bytes(self) -> int:
        """Bytes of all entries now (headers included), by a scan of the directory."""
        with self._total.locked():
            return self._scan_total()

    def entries(self) -> int:
        """Number of entries now."""
        return len(self._files.scan()[0])

    def left_alone(self) -> list[str]:
        """Paths under the cache's ``entries/`` that it did not write (symbolic links, other
        files and folders, as :func:`describe_path` says): never read, written through or
        deleted."""
        return self._files.scan()[1]

    def verify(self) -> tuple[int, int]:
        """Check every entry's length and CRC-32; remove damaged ones.

        Returns:
            ``(entries checked, damaged entries removed)``.
        """
        checked = damaged = 0
        for _, _, folder, name in self._files.scan()[0]:
            data = self._files.read(folder, name)
            if data is None:
                continue
            checked += 1
            if _unwrap(data) is None and self._files.remove(folder, name):
                damaged += 1
        return checked, damaged

    def clear(self) -> int:
        """Delete every entry; returns how many were deleted."""
        removed = 0
        with self._total.locked() as size_fd:
            for _, _, folder, name in self._files.scan()[0]:
                removed += self._files.remove(folder, name)
            write_total(size_fd, self._scan_total())
        return removed

    def close(self) -> None:
        """Close this process's lock and size files (the cache reopens them if used again)."""
        self._total.close()


def is_disk_cache(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a :class:`DiskCache` (its folders and lock file)."""
    root = Path(directory) / _LAYOUT
    return (
        _is_real_dir(root / "entries") and _is_real_dir(root / "tmp") and (root / "lock").is_file()
    )


def _is_real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _unwrap(data: bytes) -> bytes | None:
    if len(data) < _HEADER.size:
        return None
    magic, length, crc = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or length != len(payload) or crc32(payload) != crc:
        return None
    return payload
