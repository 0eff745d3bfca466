"""The disk cache directory's cross-process lock and running byte total.

Two small files under the cache's root: ``lock``, held with ``flock`` (the kernel drops it
when its holder dies, so a crash never leaves a stale lock), and ``size``, the running total
of the entries' bytes, read and written only under that lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from stoker.core.perprocess import ForkSafeLock
from stoker.storage.cache_files import open_own


class SharedTotal:
    """The ``lock`` and ``size`` files of a cache root, opened once per process."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._thread_lock = ForkSafeLock()
        self._fds: tuple[int, int, int] | None = None  # (pid, lock fd, size fd)

    def _files(self) -> tuple[int, int]:
        # Descriptors are per process: after a fork, the child must not share the parent's
        # open file description (flock would then not exclude the two).
        pid = os.getpid()
        if self._fds is None or self._fds[0] != pid:
            lock_fd = open_own(self._root / "lock")
            size_fd = open_own(self._root / "size")
            self._fds = (pid, lock_fd, size_fd)
        return self._fds[1], self._fds[2]

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """Hold this process's thread lock and the directory's flock; yield the size fd."""
        with self._thread_lock:
            lock_fd, size_fd = self._files()
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                yield size_fd
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close this process's files (they are reopened if used again)."""
        with self._thread_lock:
            if self._fds is not None and self._fds[0] == os.getpid():
                os.close(self._fds[1])
                os.close(self._fds[2])
            self._fds = None


def read_total(size_fd: int) -> int | None:
    """The running total in the size file, or None if it was never written."""
    raw = os.pread(size_fd, 8, 0)
    return struct.unpack("<Q", raw)[0] if len(raw) == 8 else None


def write_total(size_fd: int, total: int) -> None:
    os.pwrite(size_fd, struct.pack("<Q", max(0, total)), 0)
