"""The disk cache's entry files: which files are entries, and reading, placing and removing
them without ever going through a symbolic link.

A cache directory is shared by every job on a node, so anything may be planted in it: a
link in place of an entry or of a folder of entries, a stranger's file, a FIFO. Each
operation opens the entry's folder with ``O_NOFOLLOW`` and works relative to that
descriptor, so no link is followed, whatever is swapped in meanwhile; only regular files
with the names the cache gives (a key's SHA-256, in a folder named by its first two hex
digits) are read or deleted. Anything else is handed to the cache's ``stranger`` callback,
which names it, and is left alone. Also here: removing the leftovers of writers that died
in the cache's ``tmp/`` folder, and opening the cache's own lock and size files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from stoker.core.perprocess import pid_alive

#: Names of the cache's folders and entries: ``ab/ab12...`` (a key's SHA-256).
_FOLDER_NAME = re.compile(r"[0-9a-f]{2}")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
#: Opens a folder only if it is one, not a link to one.
_NO_LINK_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
#: An entry: (last use, size, folder, name).
Entry = tuple[float, int, str, str]


class EntryFiles:
    """The ``entries/`` folder of a disk cache.

    Args:
        root: The folder (the cache checks that it is not itself a link).
        stranger: Called with paths met that the cache did not write; they are left alone.
    """

    def __init__(self, root: Path, stranger: Callable[[list[str]], None]) -> None:
        self.root = root
        self._stranger = stranger

    def locate(self, key: str) -> tuple[str, str]:
        """``(folder, name)`` of the entry for ``key``."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        return digest[:2], digest

    def _folder(self, folder: str) -> int | None:
        """A descriptor of ``FOLDER``, opened only if it is a real folder (None when it is
        missing, or a link or a file, which is left alone)."""
        try:
            return os.open(self.root / folder, _NO_LINK_DIR)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            self._stranger([str(self.root / folder)])
            return None

    def _open(self, folder: str, name: str) -> int | None:
        """A read descriptor of a regular entry file in a real folder, or None."""
        folder_fd = self._folder(folder)
        if folder_fd is None:
            return None
        try:
            # O_NONBLOCK: a FIFO planted here must not block the open.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            self._stranger([str(self.root / folder / name)])
            return None
        finally:
            os.close(folder_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self._stranger([str(self.root / folder / name)])
            return None
        return fd

    @staticmethod
    def _touch(fd: int, touch_after_s: float | None) -> None:
        now = time.time()
        if touch_after_s is not None and now - os.fstat(fd).st_mtime > touch_after_s:
            os.utime(fd, (now, now))

    def read(self, folder: str, name: str, *, touch_after_s: float | None = None) -> bytes | None:
        """An entry's bytes, read only from a regular file in a real folder (None if there
        is none). With ``touch_after_s``, a last use (the mtime) older than that is set to
        now: the LRU order."""
        fd = self._open(folder, name)
        if fd is None:
            return None
        with open(fd, "rb") as f:
            data = f.read()
            self._touch(fd, touch_after_s)
        return data

    def read_at(
        self,
        folder: str,
        name: str,
        spans: list[tuple[int, int]],
        *,
        touch_after_s: float | None = None,
    ) -> tuple[int, list[bytes]] | None:
        """The entry's size and its bytes at each ``(offset, length)`` (one ``pread`` each;
        shorter where the file ends sooner), or None if there is no entry; the same checks
        and last use as :meth:`read`."""
        fd = self._open(folder, name)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            pieces = [os.pread(fd, length, offset) for offset, length in spans]
            self._touch(fd, touch_after_s)
        finally:
            os.close(fd)
        return size, pieces

    def remove(self, folder: str, name: str) -> bool:
        """Delete an entry if it is a regular file in a real folder; whether it did."""
        folder_fd = self._folder(folder)
        if folder_fd is None:
            return False
        try:
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                self._stranger([str(self.root / folder / name)])
                return False
            os.unlink(name, dir_fd=folder_fd)  # unlink never follows a link
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(folder_fd)

    def exists(self, folder: str, name: str) -> bool:
        """Whether anything is at ``FOLDER/NAME`` (a link too; one is never written over)."""
        return os.path.lexists(self.root / folder / name)

    def place(self, tmp: Path, folder: str, name: str) -> bool:
        """Rename the finished file ``tmp`` to ``FOLDER/NAME``; False, leaving ``tmp``, when
        something is there already or the folder is not a real one."""
        with contextlib.suppress(FileExistsError):
            (self.root / folder).mkdir()
        folder_fd = self._folder(folder)
        if folder_fd is None:
            return False
        try:
            os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(tmp, name, dst_dir_fd=folder_fd)
            return True
        else:
            return False
        finally:
            os.close(folder_fd)

    def scan(self) -> tuple[list[Entry], list[str]]:
        """The entries, least recently used first, and the sorted paths that the cache did
        not write (links, other files and folders). Reports nothing: the caller decides."""
        found: list[Entry] = []
        strangers: list[str] = []
        with os.scandir(self.root) as folders:
            for folder in folders:
                if not (_FOLDER_NAME.fullmatch(folder.name) and _is_dir(folder)):
                    strangers.append(folder.path)
                    continue
                with contextlib.suppress(FileNotFoundError), os.scandir(folder.path) as names:
                    for entry in names:
                        ours = _ENTRY_NAME.fullmatch(entry.name) and entry.name[:2] == folder.name
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if ours and stat.S_ISREG(info.st_mode):
                            found.append((info.st_mtime, info.st_size, folder.name, entry.name))
                        else:
                            strangers.append(entry.path)
        found.sort()
        strangers.sort()
        return found, strangers


def describe_path(path: str) -> str:
    """``path`` and what it is, for the messages about what the cache left alone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} (gone)"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} (a symbolic link to {Path(path).readlink()})"
    if stat.S_ISDIR(info.st_mode):
        return f"{path} (a folder the cache did not make)"
    if stat.S_ISREG(info.st_mode):
        return f"{path} (a file the cache did not write)"
    return f"{path} (not a regular file)"


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


#: The names of the files a cache writes to its ``tmp/`` folder: ``PID-RANDOM``.
_TMP_NAME = re.compile(r"[0-9]+-.+")


def remove_stale_tmp(folder: Path, *, stale_s: float, abandoned_s: float) -> None:
    """Remove a cache's leftover temporary files: those of writers that died (their pid
    gone) older than ``stale_s``, and any older than ``abandoned_s``. Only regular files
    with the names the cache gives are removed (``folder`` is checked to be a real one)."""
    now = time.time()
    with os.scandir(folder) as found:
        for entry in found:
            if not _TMP_NAME.fullmatch(entry.name):
                continue  # not a name this cache writes
            alive = pid_alive(int(entry.name.split("-", 1)[0]))
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                age = now - info.st_mtime
                stale = (not alive and age > stale_s) or age > abandoned_s
                if stale and stat.S_ISREG(info.st_mode):
                    Path(entry.path).unlink()


def open_own(path: Path) -> int:
    """Open (or make) one of the cache's own files, never through a link."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise OSError(
            exc.errno,
            f"{path} is a symbolic link (to {path.readlink()}): the cache never writes "
            "through a link; remove it, or give the cache another directory",
        ) from exc
