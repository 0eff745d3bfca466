"""Claims on disk-cache pages being fetched, so that one process of a node fetches a page
that several miss at once, and the others wait for it in the cache.

A claim is an exclusive ``flock`` on a file in the cache's ``claims/`` folder, named as
the entry it is for (a key's SHA-256), holding its owner's pid (for a person looking at the
folder). The kernel drops the lock when its holder dies, so a dead owner's claim is taken
over by the next process that tries; the owner removes the file when it is done, and files
left by dead owners are removed when a cache is opened. Each file is opened relative to the
folder's descriptor with ``O_NOFOLLOW`` and used only if it is a regular file, so nothing
planted in the shared folder is followed, written or deleted.

A claim that cannot be made at all (a read-only or full disk, a link in the way) is a
:class:`Claim` that excludes nothing: the caller fetches, as it would with no cache.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: How long a process waits for an entry another process is fetching before fetching it too.
CLAIM_WAIT_S = 30.0

_NAME = re.compile(r"[0-9a-f]{64}")
_NO_LINK_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def poll_pauses() -> Iterator[float]:
    """The pauses between looks at the cache while another process holds a claim: from
    2 ms, doubling to 50 ms."""
    pause = 0.002
    while True:
        yield pause
        pause = min(pause * 2, 0.05)


class Claim:
    """A held claim (or, with no descriptor, one that excludes nothing); :meth:`release`
    it when the page is in the cache or its fetch failed."""

    def __init__(self, folder: Path | None = None, name: str = "", fd: int | None = None) -> None:
        self._folder = folder
        self._name = name
        self._fd = fd

    @property
    def exclusive(self) -> bool:
        """Whether this claim keeps other processes from fetching the page."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the claim's file (if it is still this claim's) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None or self._folder is None:
            return
        try:
            with contextlib.suppress(OSError):
                _unlink_if_same(self._folder, self._name, fd)
            fcntl.flock(fd, fcntl.LOCK_UN)  # explicit: a forked child may share the fd
        finally:
            os.close(fd)


class PageClaims:
    """The ``claims/`` folder of a disk cache.

    Args:
        folder: The folder (made on first use).
        stranger: Called with paths met that the cache did not write; they are left alone.
    """

    def __init__(self, folder: Path, stranger: Callable[[list[str]], None]) -> None:
        self.folder = folder
        self._stranger = stranger

    def _open_folder(self) -> int | None:
        with contextlib.suppress(FileExistsError):
            self.folder.mkdir()
        try:
            return os.open(self.folder, _NO_LINK_DIR)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._stranger([str(self.folder)])
            return None

    def try_claim(self, name: str) -> Claim | None:
        """Claim the page whose entry is ``name``: a held :class:`Claim`, None when another
        process holds it, or a claim that excludes nothing when none can be made."""
        try:
            folder_fd = self._open_folder()
        except OSError:  # a read-only or full disk: no claims, every process fetches
            return Claim()
        if folder_fd is None:
            return Claim()
        try:
            for _ in range(3):  # the owner may remove the file between our open and lock
                try:
                    fd = os.open(
                        name,
                        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                        0o644,
                        dir_fd=folder_fd,
                    )
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        self._stranger([str(self.folder / name)])
                    return Claim()
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    self._stranger([str(self.folder / name)])
                    return Claim()
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return None
                if _same_file(folder_fd, name, fd):
                    with contextlib.suppress(OSError):  # the pid is for people only
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                    return Claim(self.folder, name, fd)
                os.close(fd)  # locked a file its owner had just removed: try again
            return None
        finally:
            os.close(folder_fd)

    def remove_stale(self, older_than_s: float) -> None:
        """Remove claim files older than ``older_than_s`` that no process holds (their
        owners died, the kernel dropped their locks)."""
        if not self.folder.is_dir() or self.folder.is_symlink():
            return
        now = time.time()
        with os.scandir(self.folder) as found:
            for entry in found:
                if not _NAME.fullmatch(entry.name):
                    continue
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < older_than_s:
                        continue
                    held = self.try_claim(entry.name)
                    if held is not None:
                        held.release()


def _same_file(folder_fd: int, name: str, fd: int) -> bool:
    try:
        found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino)


def _unlink_if_same(folder: Path, name: str, fd: int) -> None:
    folder_fd = os.open(folder, _NO_LINK_DIR)
    try:
        if _same_file(folder_fd, name, fd):
            os.unlink(name, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
