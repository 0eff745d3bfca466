"""The local side of a transfer: safe file names, partial files, checks against ETags."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import os
from pathlib import Path

from stoker.storage.base import ObjectMeta, key_problem
from stoker.storage.checksum import etag_matches, md5_file, md5_hex
from stoker.storage.files import regular_file_size
from stoker.storage.transfer.config import TransferConfig

PARTIAL_SUFFIX = ".stoker-partial"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def safe_local_path(root: Path, key: str) -> Path:
    """Map an object key to a path under ``root``, refusing keys that would escape it.

    Raises:
        ValueError: The key is absolute, has ``.``, ``..`` or empty segments, or contains a
            control character (NUL, newline, ...).
    """
    problem = key_problem(key)
    if problem is None and os.sep != "/" and os.sep in key:
        problem = f"has {os.sep!r}"
    if problem is not None:
        raise ValueError(f"object key {key!r} cannot be a local file name (unsafe path: {problem})")
    return root.joinpath(*key.split("/"))


def partial_path(path: Path) -> Path:
    """Where ``path`` is written until it is complete."""
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}")


def refuse_partial_name(key: str, path: Path) -> None:
    """Refuse an object whose local name is the partial-file name of another
    (``.NAME.stoker-partial``): its download and NAME's would write the same file, one
    losing the other, and an upload never sends such a file.

    Raises:
        ValueError: Naming the object and the file it collides with.
    """
    name = path.name
    if (
        name.startswith(".")
        and name.endswith(PARTIAL_SUFFIX)
        and len(name) > len(PARTIAL_SUFFIX) + 1
    ):
        other = name[1 : -len(PARTIAL_SUFFIX)]
        raise ValueError(
            f"object key {key!r} is not downloaded: {name!r} is the name stoker writes "
            f"{other!r} under until it is complete, so the two would overwrite each other; "
            "rename the object"
        )


def local_is_current(path: Path, meta: ObjectMeta, *, part_size_bytes: int) -> bool:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return False
    if stat.st_size != meta.size:
        return False
    if meta.last_modified is not None and int(stat.st_mtime) == int(meta.last_modified.timestamp()):
        return True
    return bool(etag_matches(path, meta.etag, part_size_bytes=part_size_bytes))


class DiskFullError(OSError):
    """The destination filled up: the download stops."""


async def local_is_current_async(path: Path, meta: ObjectMeta, part_size: int) -> bool:
    if meta.size < 4 * 1024 * 1024:
        return local_is_current(path, meta, part_size_bytes=part_size)
    # A large file may need its MD5 computed: off the I/O loop.
    return await asyncio.to_thread(local_is_current, path, meta, part_size_bytes=part_size)


def write_file(path: Path, data: memoryview) -> None:
    with open(path, "wb") as f:
        f.write(data)


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def check_md5(meta: ObjectMeta, data: memoryview) -> None:
    if len(data) != meta.size:
        raise ValueError(f"size mismatch: got {len(data)} bytes, listing says {meta.size}")
    if meta.etag and md5_hex(data) != meta.etag.lower():
        raise ValueError(f"checksum mismatch: MD5 of the bytes received != ETag {meta.etag}")


async def check_file(meta: ObjectMeta, path: Path) -> None:
    digest = await asyncio.to_thread(md5_file, path)
    if meta.etag and digest != meta.etag.lower():
        raise ValueError(f"checksum mismatch: MD5 of the bytes received != ETag {meta.etag}")


def reserve(fd: int, size: int) -> None:
    """Give the file its size, allocating the blocks where the file system can (so that a
    full disk fails here, before any byte is downloaded)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise
        os.ftruncate(fd, size)  # no fallocate on this file system: a sparse file


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def walk(
    src: Path, config: TransferConfig
) -> tuple[builtins.list[tuple[str, Path, int]], builtins.list[tuple[str, str]]]:
    """``(key, path, size)`` of each regular file under ``src`` that ``config`` selects, in
    order, and ``(key, what it is)`` of each selected entry that is not one (a FIFO, a
    socket, a device, a dangling symbolic link): reading those would block or fail."""
    found = []
    others = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(PARTIAL_SUFFIX):
                continue
            path = Path(dirpath, name)
            key = path.relative_to(src).as_posix()
            if not config.selects(key):
                continue
            size, what = regular_file_size(path)
            if size is None:
                others.append((key, what or "not a regular file"))
            else:
                found.append((key, path, size))
    return found, others
