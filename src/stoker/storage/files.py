"""Local files as a source: only regular files are read.

A FIFO, socket or device in a source folder would block a read forever (or never end it),
and a dangling symbolic link has nothing to read: listings classify each entry first.
"""

from __future__ import annotations

import stat
from pathlib import Path


def regular_file_size(path: Path) -> tuple[int | None, str | None]:
    """``(size, None)`` for a regular file (symbolic links followed), else ``(None, what)``.

    ``what`` says what the entry is instead: ``"a dangling symbolic link"``, ``"a FIFO"``,
    ``"a socket"``, ``"a device"``, or why it could not be looked at.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        return None, "a dangling symbolic link" if path.is_symlink() else "gone"
    except OSError as exc:
        return None, f"cannot be looked at ({exc.strerror})"
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return info.st_size, None
    if stat.S_ISFIFO(mode):
        return None, "a FIFO"
    if stat.S_ISSOCK(mode):
        return None, "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return None, "a device"
    return None, "not a regular file"
