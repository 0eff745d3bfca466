"""The disk cache's entry files: which files are entries, and reading, placing and removing
them without ever going through a symbolic link.

A cache directory is shared by every job on a node, so anything may be planted in it: a
link in place of an entry or of a folder of entries, a stranger's file, a FIFO. Each
operation opens the entry's folder with ``O_NOFOLLOW`` and works relative to that
descriptor, so no link is followed, whatever is swapped in meanwhile; only regular files
with the names the cache gives (a key's SHA-256, in a folder named by its first two hex
digits) are read or deleted. Anything else is handed to the cache's ``stranger`` callback,
which names it, and is left alone.
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

    def read(self, folder: str, name: str, *, touch_after_s: float | None = None) -> bytes | None:
        """An entry's bytes, read only from a regular file in a real folder (None if there
        is none). With ``touch_after_s``, a last use (the mtime) older than that is set to
        now: the LRU order."""
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
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._stranger([str(self.root / folder / name)])
                return None
            data = f.read()
            now = time.time()
            if touch_after_s is not None and now - info.st_mtime > touch_after_s:
                os.utime(fd, (now, now))
        return data

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
