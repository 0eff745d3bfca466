"""Which files an input folder holds, local or in a bucket, under one rule for hidden
names, for every reader and pack.

A path with a part that begins with ``.`` or ``_`` is hidden and left out: dot files and
folders (``.DS_Store``, ``.cache/``, macOS's ``._x.jpg``), and the metadata that Hadoop,
Spark, Delta and stoker's own packs write beside data (``_SUCCESS``, ``_temporary/``,
``_delta_log/``, ``_stoker/``), the convention Arrow's dataset discovery follows too. The
same rule holds for a local walk and for a bucket's listed keys. Each reader says how many
it left out (:func:`say_left_out`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path

from stoker.storage.files import regular_file_size

#: Name prefixes of hidden files and folders.
HIDDEN_PREFIXES = (".", "_")
#: Hidden names a notice of what was left out names before "and N more".
_NAMED = 5


def hidden(relative: str) -> bool:
    """Whether a path relative to the input folder (``/``-separated) has a hidden part."""
    return any(part.startswith(HIDDEN_PREFIXES) for part in relative.split("/"))


def walk_local(root: Path, left_out: list[str] | None = None) -> Iterator[tuple[Path, str]]:
    """The files under ``root`` that are not hidden, as ``(path, relative path)``, in
    sorted order (folders depth first). Hidden folders are not entered; each hidden name
    (a folder's with a trailing ``/``) is appended to ``left_out`` when it is given."""
    for directory, folders, names in os.walk(root):
        kept = []
        for folder in sorted(folders):
            if folder.startswith(HIDDEN_PREFIXES):
                if left_out is not None:
                    left_out.append(Path(directory, folder).relative_to(root).as_posix() + "/")
            else:
                kept.append(folder)
        folders[:] = kept
        for name in sorted(names):
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if not name.startswith(HIDDEN_PREFIXES):
                yield path, relative
            elif left_out is not None:
                left_out.append(relative)


def say_left_out(logger: logging.Logger, location: str, left_out: list[str]) -> None:
    """Log, once per listing, the hidden names left out of ``location`` (none: nothing)."""
    if not left_out:
        return
    named = ", ".join(map(repr, left_out[:_NAMED]))
    more = f" and {len(left_out) - _NAMED} more" if len(left_out) > _NAMED else ""
    logger.info(
        "%s: left out %d hidden name(s) (beginning with '.' or '_'): %s%s",
        location,
        len(left_out),
        named,
        more,
    )


def regular_files(
    root: Path,
    *,
    problems: list[dict[str, str]],
    on_dangling: Callable[[str, str, str], None],
    suffixes: tuple[str, ...] = (),
    logger: logging.Logger,
) -> list[tuple[str, int]]:
    """The regular files under ``root`` that are not hidden (and end in one of
    ``suffixes``, if given), as ``(relative path, size)``: a dangling link goes to
    ``on_dangling(relative, path, what)`` (which raises, or skips and lists); a FIFO,
    socket or device (reading one would block) is always left out, listed in ``problems``;
    the hidden names left out are logged."""
    found: list[tuple[str, int]] = []
    left_out: list[str] = []
    for path, relative in walk_local(root, left_out):
        if suffixes and not relative.lower().endswith(suffixes):
            continue
        size, what = regular_file_size(path)
        if size is not None:
            found.append((relative, size))
        elif what == "a dangling symbolic link":
            on_dangling(relative, str(path), what)
        else:
            reason = f"{what}, not a regular file"
            problems.append({"key": relative, "source": str(path), "reason": reason})
    say_left_out(logger, str(root), left_out)
    return found


#: Characters that make a location's segment a pattern (``train-*.parquet``).
GLOB_CHARACTERS = frozenset("*?[")


def split_glob(location: str) -> tuple[str, str | None]:
    """``location`` cut at its first segment holding a pattern: the folder or prefix to
    list, and the pattern its relative names must match (None: no pattern).

    Raises:
        ValueError: A pattern in a bucket's name.
    """
    parts = location.split("/")
    for n, part in enumerate(parts):
        if GLOB_CHARACTERS & set(part):
            if "://" in location and n < 3:  # scheme://bucket: no pattern in the bucket
                raise ValueError(f"{location}: a pattern must come after the bucket's name")
            root = "/".join(parts[:n]) or ("/" if location.startswith("/") else ".")
            return root, "/".join(parts[n:])
    return location, None


def glob_match(relative: str, pattern: str) -> bool:
    """Whether ``relative`` (a ``/``-separated name under the listed folder) matches
    ``pattern``: segment by segment, ``*``, ``?`` and ``[...]`` within one segment (as a
    shell's), ``**`` any number of whole segments."""
    names, parts = relative.split("/"), pattern.split("/")

    def match(i: int, j: int) -> bool:
        if j == len(parts):
            return i == len(names)
        if parts[j] == "**":
            return any(match(k, j + 1) for k in range(i, len(names) + 1))
        return i < len(names) and fnmatchcase(names[i], parts[j]) and match(i + 1, j + 1)

    return match(0, 0)
